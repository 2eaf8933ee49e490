//! `END` encoded by hand. Every request ends with one, written by the worker and written
//! again by the dispatcher (which fills in `queue_time_us`); through serde the encoding
//! cost ~1.9k instructions, a tenth of all a worker spends on a point select (callgrind,
//! `scripts/instructions.sh worker`). The bytes are exactly serde's (`Frame::new`): the
//! same keys in the same order, each integer in its shortest form, the same fields
//! left out; `tests/roundtrip.rs` compares the two on arbitrary bodies.

use bytes::Bytes;

use crate::body::End;
use crate::frame::{Frame, Kind};

/// Strings at least this long (a server's `info` never is) go through serde instead.
const LONG: usize = 1 << 16;

impl End {
    /// The body as [`Frame::new`] encodes it.
    pub fn encode(&self) -> Vec<u8> {
        let strings = [self.gtid.as_deref(), self.info.as_deref()];
        if strings.iter().flatten().any(|s| s.len() >= LONG) {
            return rmp_serde::to_vec_named(self).expect("body types always serialise");
        }
        let texts: usize = strings.iter().flatten().map(|s| s.len() + 3).sum();
        // Everything but the texts: at most 161 bytes (108 of keys, six integers).
        let mut out = Vec::with_capacity(168 + texts);
        let fields = 6
            + usize::from(self.gtid.is_some())
            + usize::from(self.in_transaction)
            + usize::from(self.info.is_some())
            + usize::from(self.autocommit.is_some());
        out.push(0x80 | fields as u8); // fixmap: at most 10 entries
        key(&mut out, "affected_rows");
        uint(&mut out, self.affected_rows);
        key(&mut out, "last_insert_id");
        match self.last_insert_id {
            Some(id) => uint(&mut out, id),
            None => out.push(0xC0),
        }
        key(&mut out, "warnings");
        uint(&mut out, u64::from(self.warnings));
        key(&mut out, "rows");
        uint(&mut out, self.rows);
        key(&mut out, "server_time_us");
        uint(&mut out, self.server_time_us);
        key(&mut out, "queue_time_us");
        uint(&mut out, self.queue_time_us);
        if let Some(gtid) = &self.gtid {
            key(&mut out, "gtid");
            text(&mut out, gtid);
        }
        if self.in_transaction {
            key(&mut out, "in_transaction");
            out.push(0xC3);
        }
        if let Some(info) = &self.info {
            key(&mut out, "info");
            text(&mut out, info);
        }
        if let Some(on) = self.autocommit {
            key(&mut out, "autocommit");
            out.push(if on { 0xC3 } else { 0xC2 });
        }
        out
    }

    /// An `END` frame on `stream` carrying this body.
    pub fn to_frame(&self, stream: u32) -> Frame {
        Frame::with_payload(Kind::End, stream, Bytes::from(self.encode()))
    }
}

/// A field name (all are fixstr: under 32 bytes).
fn key(out: &mut Vec<u8>, name: &str) {
    out.push(0xA0 | name.len() as u8);
    out.extend_from_slice(name.as_bytes());
}

/// A string under [`LONG`] bytes, in its shortest header.
fn text(out: &mut Vec<u8>, s: &str) {
    let len = s.len();
    if len < 32 {
        out.push(0xA0 | len as u8);
    } else if let Ok(n) = u8::try_from(len) {
        out.extend_from_slice(&[0xD9, n]);
    } else {
        out.push(0xDA);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

/// An unsigned integer in its shortest form, as `rmp::encode::write_uint`.
fn uint(out: &mut Vec<u8>, v: u64) {
    if v < 128 {
        out.push(v as u8);
    } else if let Ok(n) = u8::try_from(v) {
        out.extend_from_slice(&[0xCC, n]);
    } else if let Ok(n) = u16::try_from(v) {
        out.push(0xCD);
        out.extend_from_slice(&n.to_be_bytes());
    } else if let Ok(n) = u32::try_from(v) {
        out.push(0xCE);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        out.push(0xCF);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

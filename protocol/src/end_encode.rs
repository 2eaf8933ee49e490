//! `END` encoded by hand. Every request ends with one, written by the worker and written
//! again by the dispatcher (which fills in `queue_time_us`); through serde the encoding
//! cost ~1.9k instructions, a tenth of all a worker spends on a point select (callgrind,
//! `scripts/instructions.sh worker`). The bytes are exactly serde's (`Frame::new`): the
//! same keys in the same order, each integer in its shortest form, the same fields
//! left out; `tests/roundtrip.rs` compares the two on arbitrary bodies.

use bytes::Bytes;

use crate::body::End;
use crate::frame::{Frame, Kind};
use crate::msgpack_write::Writer;

impl End {
    /// The body as [`Frame::new`] encodes it.
    pub fn encode(&self) -> Vec<u8> {
        let texts: usize = [self.gtid.as_deref(), self.info.as_deref()]
            .iter()
            .flatten()
            .map(|s| s.len() + 5)
            .sum();
        // Everything but the texts: at most 161 bytes (108 of keys, six integers).
        let mut w = Writer::with_capacity(168 + texts);
        let fields = 6
            + usize::from(self.gtid.is_some())
            + usize::from(self.in_transaction)
            + usize::from(self.info.is_some())
            + usize::from(self.autocommit.is_some());
        w.map(fields);
        w.key("affected_rows");
        w.uint(self.affected_rows);
        w.key("last_insert_id");
        match self.last_insert_id {
            Some(id) => w.uint(id),
            None => w.nil(),
        }
        w.key("warnings");
        w.uint(u64::from(self.warnings));
        w.key("rows");
        w.uint(self.rows);
        w.key("server_time_us");
        w.uint(self.server_time_us);
        w.key("queue_time_us");
        w.uint(self.queue_time_us);
        if let Some(gtid) = &self.gtid {
            w.key("gtid");
            w.str(gtid);
        }
        if self.in_transaction {
            w.key("in_transaction");
            w.bool(true);
        }
        if let Some(info) = &self.info {
            w.key("info");
            w.str(info);
        }
        if let Some(on) = self.autocommit {
            w.key("autocommit");
            w.bool(on);
        }
        w.finish()
            .unwrap_or_else(|| rmp_serde::to_vec_named(self).expect("body types always serialise"))
    }

    /// An `END` frame on `stream` carrying this body.
    pub fn to_frame(&self, stream: u32) -> Frame {
        Frame::with_payload(Kind::End, stream, Bytes::from(self.encode()))
    }
}

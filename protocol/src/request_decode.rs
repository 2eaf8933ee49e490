//! `REQUEST` decoded by hand in its common forms. The dispatcher and then the worker
//! decode every request; through serde that cost ~2.3k instructions a point select in the
//! dispatcher, a tenth of all it spends on one (callgrind, `scripts/instructions.sh
//! dispatcher`): checking the UTF-8 of every field name and walking serde's visitors.
//!
//! The fast path takes a map of the fields a client or a front end usually sends, each at
//! most once, with `params` of plain values (nil, integers, floats, strings, binaries) and
//! no `batch` statements. Anything else — a tagged value, a batch, `vars`, `blob_params`,
//! an unknown field, any form serde would refuse — is left to serde, so the result and
//! the error are always serde's own (`tests/roundtrip.rs` compares the two on arbitrary
//! and mangled bodies; the `body_decoder` fuzz target too).

use crate::body::Request;
use crate::error::ProtocolError;
use crate::frame::Frame;
use crate::msgpack_read::Reader;
use crate::value::Value;

impl Request {
    /// The body of a `REQUEST` frame, as `frame.body::<Request>()` decodes it.
    pub fn from_frame(frame: &Frame) -> Result<Request, ProtocolError> {
        frame.body_fast(Request::decode_common)
    }

    /// The body when it is in a common form; `None` when it is not (serde decides then).
    pub fn decode_common(payload: &[u8]) -> Option<Request> {
        let mut q = Request::default();
        Reader::new(payload).fields(field, |f, r| {
            // The arms in field()'s order.
            match f {
                0 => q.sql = r.text()?,
                1 => {
                    let len = r.array_len()?;
                    // Each value takes a byte at least: a count beyond the body is refused
                    // by serde, not allocated here.
                    if len > r.remaining() {
                        return None;
                    }
                    q.params = (0..len).map(|_| value(r)).collect::<Option<_>>()?;
                }
                2 => {
                    if r.array_len()? != 0 {
                        return None;
                    }
                }
                3 => q.read_only = r.boolean()?,
                4 => q.idempotent = r.boolean()?,
                5 => q.force_primary = r.boolean()?,
                6 => q.timeout_ms = r.uint()?,
                7 => q.cluster = r.opt(Reader::text)?,
                8 => q.causal_gtid = r.opt(Reader::text)?,
                9 => q.open_session = r.boolean()?,
                10 => q.session = r.opt(|r| u32::try_from(r.uint()?).ok())?,
                11 => q.text_rows = r.boolean()?,
                12 => q.prepared = r.boolean()?,
                13 => q.prepare_only = r.boolean()?,
                14 => q.multi_results = r.boolean()?,
                15 => q.raw_rows = r.boolean()?,
                _ => q.schema = r.opt(Reader::text)?,
            }
            Some(())
        })?;
        Some(q)
    }
}

/// The bit of each field the fast path takes, in `seen`; `None` for the others.
fn field(name: &[u8]) -> Option<u32> {
    Some(match name {
        b"sql" => 0,
        b"params" => 1,
        b"batch" => 2,
        b"read_only" => 3,
        b"idempotent" => 4,
        b"force_primary" => 5,
        b"timeout_ms" => 6,
        b"cluster" => 7,
        b"causal_gtid" => 8,
        b"open_session" => 9,
        b"session" => 10,
        b"text_rows" => 11,
        b"prepared" => 12,
        b"prepare_only" => 13,
        b"multi_results" => 14,
        b"raw_rows" => 15,
        b"schema" => 16,
        _ => return None,
    })
}

/// A plain value, as `Value`'s serde visitor reads it: nil, an integer that fits `i64`, a
/// float, a str (valid UTF-8), a bin. A tagged value (an array) is left to serde.
fn value(r: &mut Reader) -> Option<Value> {
    let b = r.peek()?;
    Some(match b {
        0xC0 => {
            r.byte()?;
            Value::Null
        }
        0x00..=0x7F | 0xCC..=0xCF => Value::Int(i64::try_from(r.uint()?).ok()?),
        0xE0..=0xFF => {
            r.byte()?;
            Value::Int(i64::from(b as i8))
        }
        0xD0 => {
            r.byte()?;
            Value::Int(i64::from(i8::from_be_bytes(r.be()?)))
        }
        0xD1 => {
            r.byte()?;
            Value::Int(i64::from(i16::from_be_bytes(r.be()?)))
        }
        0xD2 => {
            r.byte()?;
            Value::Int(i64::from(i32::from_be_bytes(r.be()?)))
        }
        0xD3 => {
            r.byte()?;
            Value::Int(i64::from_be_bytes(r.be()?))
        }
        0xCA => {
            r.byte()?;
            Value::Float(f32::from_be_bytes(r.be()?))
        }
        0xCB => {
            r.byte()?;
            Value::Double(f64::from_be_bytes(r.be()?))
        }
        0xC4..=0xC6 => Value::Bytes(r.bin()?.to_vec()),
        0xA0..=0xBF | 0xD9..=0xDB => Value::Text(r.text()?),
        _ => return None,
    })
}

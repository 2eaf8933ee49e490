//! `ROWS` encoded by hand: a worker writes one per batch of rows it reads from the
//! database. Through serde (`Frame::new`) a batch of one short row cost ~1.1k
//! instructions, 7 % of a worker's point select, most of it growing the output from empty
//! (callgrind, `scripts/instructions.sh worker`). The bytes are exactly serde's;
//! `tests/roundtrip.rs` compares the two on arbitrary rows.

use bytes::Bytes;

use crate::body::Rows;
use crate::frame::{Frame, Kind};
use crate::msgpack_write::{value_size, Writer};
use crate::value::Value;

impl Rows {
    /// The body of a `ROWS` holding `rows`, as [`Frame::new`] encodes a [`Rows`].
    pub fn encode(rows: &[Vec<Value>]) -> Vec<u8> {
        let size: usize = rows.iter().map(|r| 5 + r.iter().map(value_size).sum::<usize>()).sum();
        let mut w = Writer::with_capacity(16 + size);
        w.map(1);
        w.key("rows");
        w.array(rows.len());
        for row in rows {
            w.values(row);
        }
        w.finish().unwrap_or_else(|| {
            rmp_serde::to_vec_named(&Rows { rows: rows.to_vec() }).expect("body types always serialise")
        })
    }

    /// A `ROWS` frame on `stream` holding `rows`.
    pub fn to_frame(rows: &[Vec<Value>], stream: u32) -> Frame {
        Frame::with_payload(Kind::Rows, stream, Bytes::from(Rows::encode(rows)))
    }
}

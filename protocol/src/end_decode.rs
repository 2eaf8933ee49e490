//! `END` decoded by hand, the counterpart of `end_encode`. The dispatcher decodes every
//! request's `END` (to fill in `queue_time_us` and to account the request); through serde
//! that cost ~1.4k instructions per request, most of them checking the UTF-8 of field
//! names and walking serde's visitors (callgrind, `scripts/instructions.sh dispatcher`).
//!
//! The fast path reads only what a worker writes (`End::encode`): a fixmap of known field
//! names, each at most once, unsigned integers, `nil`, booleans and strings. Anything
//! else — another encoding serde would also accept, or a body serde refuses — is left to
//! serde, so the result and the error are always serde's own; `tests/roundtrip.rs`
//! compares the two on arbitrary and on mangled bodies.

use crate::body::End;
use crate::error::ProtocolError;
use crate::frame::Frame;
use crate::msgpack_read::Reader;

impl End {
    /// The body of an `END` frame, as `frame.body::<End>()` decodes it.
    pub fn from_frame(frame: &Frame) -> Result<End, ProtocolError> {
        frame.body_fast(End::decode_common)
    }

    /// The body when it is in the form a worker writes; `None` when it is not (serde
    /// decides then).
    pub fn decode_common(payload: &[u8]) -> Option<End> {
        let mut end = End::default();
        let seen = Reader::new(payload).fields(field, |f, r| {
            // The arms in field()'s order.
            match f {
                0 => end.affected_rows = r.uint()?,
                1 => end.last_insert_id = r.opt(Reader::uint)?,
                2 => end.warnings = u32::try_from(r.uint()?).ok()?,
                3 => end.rows = r.uint()?,
                4 => end.server_time_us = r.uint()?,
                5 => end.queue_time_us = r.uint()?,
                6 => end.gtid = r.opt(Reader::text)?,
                7 => end.in_transaction = r.boolean()?,
                8 => end.info = r.opt(Reader::text)?,
                _ => end.autocommit = r.opt(Reader::boolean)?,
            }
            Some(())
        })?;
        // serde refuses a body without a required field.
        (seen & REQUIRED == REQUIRED).then_some(end)
    }
}

/// The bit of each field in `seen` (`End`'s order); `None` for another name.
fn field(name: &[u8]) -> Option<u32> {
    Some(match name {
        b"affected_rows" => 0,
        b"last_insert_id" => 1,
        b"warnings" => 2,
        b"rows" => 3,
        b"server_time_us" => 4,
        b"queue_time_us" => 5,
        b"gtid" => 6,
        b"in_transaction" => 7,
        b"info" => 8,
        b"autocommit" => 9,
        _ => return None,
    })
}

/// The fields without a serde default: affected_rows, warnings, rows, server_time_us,
/// queue_time_us.
const REQUIRED: u32 = 0b11_1101;

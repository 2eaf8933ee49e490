//! `COLUMNS` decoded by hand in the form a worker writes. The SDK decodes one per result
//! set, and so does the MySQL front end (to write its clients' column definitions);
//! through serde a point select's one column cost the SDK ~2.5k instructions, a tenth of
//! all it spends on the query (callgrind, `scripts/instructions.sh loadgen`): field names'
//! UTF-8 checked and serde's visitors walked for every column.
//!
//! The fast path takes maps of the known field names, each at most once, with unsigned
//! integers in range and valid UTF-8 strings. Anything else — another encoding serde
//! would also accept, or a body serde refuses — is left to serde, so the result and the
//! error are always serde's own; `tests/roundtrip.rs` compares the two on arbitrary and on
//! mangled bodies, and the `body_decoder` fuzz target too.

use crate::body::{Column, Columns};
use crate::error::ProtocolError;
use crate::frame::Frame;
use crate::msgpack_read::Reader;

impl Columns {
    /// The body of a `COLUMNS` frame, as `frame.body::<Columns>()` decodes it.
    pub fn from_frame(frame: &Frame) -> Result<Columns, ProtocolError> {
        frame.body_fast(Columns::decode_common)
    }

    /// The body when it is in the form a worker writes; `None` when it is not (serde
    /// decides then).
    pub fn decode_common(payload: &[u8]) -> Option<Columns> {
        let mut result_set = 0;
        let mut columns = Vec::new();
        let seen = Reader::new(payload).fields(columns_field, |f, r| {
            match f {
                0 => result_set = u32::try_from(r.uint()?).ok()?,
                _ => {
                    let len = r.array_len()?;
                    // Each column takes many bytes: a count beyond the body is refused by
                    // serde, not allocated here.
                    if len > r.remaining() {
                        return None;
                    }
                    columns = (0..len).map(|_| column(r)).collect::<Option<_>>()?;
                }
            }
            Some(())
        })?;
        // Both fields are required.
        (seen == 0b11).then_some(Columns { result_set, columns })
    }
}

fn columns_field(name: &[u8]) -> Option<u32> {
    match name {
        b"result_set" => Some(0),
        b"columns" => Some(1),
        _ => None,
    }
}

fn column(r: &mut Reader) -> Option<Column> {
    let mut c = Column {
        name: String::new(),
        table: String::new(),
        column_type: 0,
        flags: 0,
        charset: 0,
        length: 0,
        decimals: 0,
    };
    let seen = r.fields(column_field, |f, r| {
        // The arms in column_field()'s order.
        match f {
            0 => c.name = r.text()?,
            1 => c.table = r.text()?,
            2 => c.column_type = u8::try_from(r.uint()?).ok()?,
            3 => c.flags = u16::try_from(r.uint()?).ok()?,
            4 => c.charset = u16::try_from(r.uint()?).ok()?,
            5 => c.length = u32::try_from(r.uint()?).ok()?,
            _ => c.decimals = u8::try_from(r.uint()?).ok()?,
        }
        Some(())
    })?;
    // Every field but `table` is required.
    (seen & COLUMN_REQUIRED == COLUMN_REQUIRED).then_some(c)
}

fn column_field(name: &[u8]) -> Option<u32> {
    Some(match name {
        b"name" => 0,
        b"table" => 1,
        b"column_type" => 2,
        b"flags" => 3,
        b"charset" => 4,
        b"length" => 5,
        b"decimals" => 6,
        _ => return None,
    })
}

/// name, column_type, flags, charset, length, decimals.
const COLUMN_REQUIRED: u32 = 0b111_1101;

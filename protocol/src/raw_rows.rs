//! `RAW_ROWS` (1.8): a result set's rows as the database sent them, for a front end that
//! speaks the database's own protocol and hands the rows on without decoding them.
//!
//! The body is an ordinary named-field map, `{"rows": [bin, …]}`, each `bin` one row
//! packet's payload (no packet header). It is encoded here by hand rather than through
//! serde so that a worker writes it straight from the packets it read (one allocation per
//! frame), and decoded into slices of the frame's own payload (no copy per row).

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::error::ProtocolError;
use crate::frame::MAX_BODY_DEPTH;

/// The bytes the body adds around the rows: the map with one key, the array header.
pub const OVERHEAD: usize = 1 + 5 + 5;

/// The bytes one row of `len` bytes takes in the body: its `bin` header and itself.
pub fn row_size(len: usize) -> usize {
    let header = match len {
        0..=0xFF => 2,
        0x100..=0xFFFF => 3,
        _ => 5,
    };
    header + len
}

/// The body of a `RAW_ROWS` frame holding `rows`. Panics on a row of 4 GiB or more,
/// which no frame can carry (the caller bounds rows by the frame size first).
pub fn encode<R: AsRef<[u8]>>(rows: &[R]) -> Vec<u8> {
    let size = OVERHEAD + rows.iter().map(|r| row_size(r.as_ref().len())).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(0x81); // fixmap, 1 entry
    out.extend_from_slice(&[0xA4, b'r', b'o', b'w', b's']);
    let count = u32::try_from(rows.len()).expect("fewer than 2^32 rows in a frame");
    out.push(0xDD); // array 32
    out.extend_from_slice(&count.to_be_bytes());
    for row in rows {
        let row = row.as_ref();
        let len = row.len();
        if let Ok(n) = u8::try_from(len) {
            out.extend_from_slice(&[0xC4, n]);
        } else if let Ok(n) = u16::try_from(len) {
            out.push(0xC5);
            out.extend_from_slice(&n.to_be_bytes());
        } else {
            let n = u32::try_from(len).expect("a row under 4 GiB");
            out.push(0xC6);
            out.extend_from_slice(&n.to_be_bytes());
        }
        out.extend_from_slice(row);
    }
    out
}

/// The rows of a `RAW_ROWS` body, each a slice of `payload`. Unknown keys are skipped,
/// as in every body; anything but a map with a `rows` array of `bin` is `BadBody`.
pub fn decode(payload: &[u8]) -> Result<Vec<&[u8]>, ProtocolError> {
    let mut de = rmp_serde::Deserializer::from_read_ref(payload);
    de.set_max_depth(MAX_BODY_DEPTH + 1);
    de.deserialize_map(RowsVisitor).map_err(|e| ProtocolError::BadBody {
        kind: "RAW_ROWS",
        reason: e.to_string(),
    })
}

struct RowsVisitor;

impl<'de> Visitor<'de> for RowsVisitor {
    type Value = Vec<&'de [u8]>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map with `rows`, an array of bin")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut rows = None;
        while let Some(key) = map.next_key::<&'de str>()? {
            if key == "rows" {
                if rows.is_some() {
                    return Err(de::Error::duplicate_field("rows"));
                }
                let found: Vec<&'de serde_bytes::Bytes> = map.next_value()?;
                rows = Some(found.into_iter().map(|b| &b[..]).collect());
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        rows.ok_or_else(|| de::Error::missing_field("rows"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_every_header_size_come_back() {
        let rows: Vec<Vec<u8>> = vec![vec![], vec![7; 255], vec![8; 256], vec![9; 65_535], vec![1; 65_536]];
        let body = encode(&rows);
        assert_eq!(
            body.len(),
            OVERHEAD + rows.iter().map(|r| row_size(r.len())).sum::<usize>()
        );
        let back = decode(&body).unwrap();
        assert_eq!(back.len(), rows.len());
        for (a, b) in back.iter().zip(&rows) {
            assert_eq!(*a, &b[..]);
        }
    }

    #[test]
    fn the_body_is_an_ordinary_map() {
        // What a client in another language decodes with a generic MessagePack library.
        #[derive(serde::Deserialize)]
        struct Plain {
            rows: Vec<serde_bytes::ByteBuf>,
        }
        let body = encode(&[&b"\x01a"[..], &b"\xfb"[..]]);
        let plain: Plain = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(plain.rows[0].as_ref(), b"\x01a");
        assert_eq!(plain.rows[1].as_ref(), b"\xfb");
        // And the other way: a generic encoder's body (an unknown key, a small array).
        #[derive(serde::Serialize)]
        struct Other<'a> {
            later: u32,
            #[serde(with = "serde_bytes")]
            one: &'a [u8],
            rows: Vec<serde_bytes::ByteBuf>,
        }
        let body = rmp_serde::to_vec_named(&Other {
            later: 1,
            one: b"x",
            rows: vec![serde_bytes::ByteBuf::from(b"\x03abc".to_vec())],
        })
        .unwrap();
        assert_eq!(decode(&body).unwrap(), vec![&b"\x03abc"[..]]);
    }

    #[test]
    fn malformed_bodies_are_bad_bodies() {
        for bad in [
            &b""[..],
            &[0x90],                                                             // an array, not a map
            &[0x80],                                                             // no rows
            &[0x81, 0xA4, b'r', b'o', b'w', b's', 0x01],                         // rows not an array
            &[0x81, 0xA4, b'r', b'o', b'w', b's', 0x91, 0x01],                   // a row not bin
            &[0x81, 0xA4, b'r', b'o', b'w', b's', 0x91, 0xC4, 0x05, 1],          // a lying length
            &[0x81, 0xA4, b'r', b'o', b'w', b's', 0xDD, 0xFF, 0xFF, 0xFF, 0xFF], // a lying count
        ] {
            assert!(
                matches!(decode(bad), Err(ProtocolError::BadBody { kind: "RAW_ROWS", .. })),
                "{bad:?}"
            );
        }
    }
}

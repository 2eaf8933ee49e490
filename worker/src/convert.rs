//! Conversions between `mysql_common` (through osprey-wire) and the wire protocol: column metadata, result
//! values (text and binary protocol) and statement parameters.
//!
//! The rule that drives the value conversion: the SQL type of the column decides the
//! [`Value`] variant, never the protocol the row travelled in. The text protocol hands
//! every value over as bytes, the binary protocol as typed values for some types and
//! bytes for others; both go through the same per-type rules, so the same row gives the
//! same values either way. (One caveat that no client can remove: the text protocol
//! prints FLOAT with 6 significant digits, so a FLOAT that needs more digits arrives
//! rounded through the text protocol and exact through the binary one.)

use osprey_protocol::{Column, Value};

/// MySQL column type codes (`MYSQL_TYPE_*`) used by the conversion (and its tests).
#[allow(dead_code)]
pub mod types {
    pub const DECIMAL: u8 = 0;
    pub const TINY: u8 = 1;
    pub const SHORT: u8 = 2;
    pub const LONG: u8 = 3;
    pub const FLOAT: u8 = 4;
    pub const DOUBLE: u8 = 5;
    pub const NULL: u8 = 6;
    pub const TIMESTAMP: u8 = 7;
    pub const LONGLONG: u8 = 8;
    pub const INT24: u8 = 9;
    pub const DATE: u8 = 10;
    pub const TIME: u8 = 11;
    pub const DATETIME: u8 = 12;
    pub const YEAR: u8 = 13;
    pub const NEWDATE: u8 = 14;
    pub const VARCHAR: u8 = 15;
    pub const BIT: u8 = 16;
    pub const TIMESTAMP2: u8 = 17;
    pub const DATETIME2: u8 = 18;
    pub const TIME2: u8 = 19;
    pub const JSON: u8 = 245;
    pub const NEWDECIMAL: u8 = 246;
    pub const ENUM: u8 = 247;
    pub const SET: u8 = 248;
    pub const BLOB: u8 = 252;
    pub const VAR_STRING: u8 = 253;
    pub const STRING: u8 = 254;
}

/// Column flag: the integer column is UNSIGNED.
pub const UNSIGNED_FLAG: u16 = 32;
/// Character set id of binary strings.
pub const BINARY_CHARSET: u16 = 63;

/// What the value conversion needs to know about a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnKind {
    pub column_type: u8,
    pub flags: u16,
    pub charset: u16,
}

impl ColumnKind {
    pub fn of(column: &osprey_wire::Column) -> ColumnKind {
        ColumnKind {
            column_type: column.column_type() as u8,
            flags: column.flags().bits(),
            charset: column.character_set(),
        }
    }

    fn unsigned(self) -> bool {
        self.flags & UNSIGNED_FLAG != 0
    }

    fn is_integer(self) -> bool {
        use types::*;
        matches!(self.column_type, TINY | SHORT | LONG | LONGLONG | INT24)
    }
}

/// Column metadata for a `COLUMNS` frame.
pub fn column(c: &osprey_wire::Column) -> Column {
    Column {
        name: c.name_str().into_owned(),
        table: c.table_str().into_owned(),
        column_type: c.column_type() as u8,
        flags: c.flags().bits(),
        charset: c.character_set(),
        length: c.column_length(),
        decimals: c.decimals(),
    }
}

/// Which parameters are bound as BLOB (binary): the `Bytes` ones `REQUEST.blob_params` names.
pub fn binary_params(params: &[Value], blob: &[u16]) -> Vec<bool> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| matches!(p, Value::Bytes(_)) && blob.contains(&(i as u16)))
        .collect()
}

/// One result value, from either protocol, as a protocol [`Value`].
pub fn value(kind: ColumnKind, v: osprey_wire::Value) -> Value {
    use osprey_wire::Value as M;
    match v {
        M::NULL => Value::Null,
        M::Bytes(b) => from_text(kind, b),
        M::Int(i) => int(kind, i128::from(i)),
        M::UInt(u) => int(kind, i128::from(u)),
        M::Float(f) if kind.column_type == types::DOUBLE => Value::Double(f64::from(f)),
        M::Float(f) => Value::Float(f),
        M::Double(d) if kind.column_type == types::FLOAT => Value::Float(d as f32),
        M::Double(d) => Value::Double(d),
        M::Date(year, month, day, hour, minute, second, micro) => {
            Value::date(year, month, day, hour, minute, second, micro)
        }
        M::Time(negative, days, hours, minutes, seconds, micros) => Value::Time {
            negative,
            days,
            hours,
            minutes,
            seconds,
            micros,
        },
    }
}

/// An integer from the binary protocol: `UInt` for UNSIGNED integer columns, `Int` otherwise
/// (YEAR included), `UInt` only when the value does not fit an `i64`.
fn int(kind: ColumnKind, v: i128) -> Value {
    let want_unsigned = kind.is_integer() && kind.unsigned();
    if want_unsigned {
        if let Ok(u) = u64::try_from(v) {
            return Value::UInt(u);
        }
    }
    match i64::try_from(v) {
        Ok(i) => Value::Int(i),
        Err(_) => Value::UInt(v as u64),
    }
}

/// A value that arrived as bytes (every text-protocol value, and strings, DECIMAL, BIT,
/// JSON, ENUM/SET in the binary protocol), by the column's SQL type. Never fails: bytes
/// that do not parse as their type are passed on as text (or bytes).
pub fn from_text(kind: ColumnKind, b: Vec<u8>) -> Value {
    use types::*;
    let parsed = match kind.column_type {
        TINY | SHORT | LONG | LONGLONG | INT24 => {
            let s = ascii(&b);
            if kind.unsigned() {
                s.and_then(|s| s.parse::<u64>().ok()).map(Value::UInt)
            } else {
                s.and_then(|s| s.parse::<i64>().ok()).map(Value::Int)
            }
        }
        YEAR => ascii(&b).and_then(|s| s.parse::<i64>().ok()).map(Value::Int),
        FLOAT => ascii(&b).and_then(|s| s.parse::<f32>().ok()).map(Value::Float),
        DOUBLE => ascii(&b).and_then(|s| s.parse::<f64>().ok()).map(Value::Double),
        DECIMAL | NEWDECIMAL => ascii(&b).map(|s| Value::Decimal(s.to_owned())),
        DATE | NEWDATE | DATETIME | DATETIME2 | TIMESTAMP | TIMESTAMP2 => ascii(&b).and_then(parse_datetime),
        TIME | TIME2 => ascii(&b).and_then(parse_time),
        NULL => Some(Value::Null),
        BIT => return Value::Bit(b),
        JSON => return text_or_bytes(b, Value::Json),
        ENUM | SET => return text_or_bytes(b, Value::Text),
        _ if kind.charset == BINARY_CHARSET => return Value::Bytes(b),
        _ => return text_or_bytes(b, Value::Text),
    };
    parsed.unwrap_or_else(|| text_or_bytes(b, Value::Text))
}

fn text_or_bytes(b: Vec<u8>, text: fn(String) -> Value) -> Value {
    match String::from_utf8(b) {
        Ok(s) => text(s),
        Err(e) => Value::Bytes(e.into_bytes()),
    }
}

fn ascii(b: &[u8]) -> Option<&str> {
    if b.is_ascii() {
        std::str::from_utf8(b).ok()
    } else {
        None
    }
}

/// `YYYY-MM-DD[ HH:MM:SS[.ffffff]]`; `0000-00-00 ...` gives all zeros.
pub fn parse_datetime(s: &str) -> Option<Value> {
    let (date, time) = match s.split_once(' ') {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut d = date.split('-');
    let year = d.next()?.parse().ok()?;
    let month = d.next()?.parse().ok()?;
    let day = d.next()?.parse().ok()?;
    if d.next().is_some() {
        return None;
    }
    let (hour, minute, second, micro) = match time {
        None => (0, 0, 0, 0),
        Some(t) => {
            let (h, m, s, us) = parse_hms(t)?;
            (u8::try_from(h).ok().filter(|h| *h < 24)?, m, s, us)
        }
    };
    Some(Value::date(year, month, day, hour, minute, second, micro))
}

/// `[-]H...H:MM:SS[.ffffff]`, hours may exceed 24 (up to 838).
pub fn parse_time(s: &str) -> Option<Value> {
    let (negative, rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let (h, minutes, seconds, micros) = parse_hms(rest)?;
    Some(Value::Time {
        negative,
        days: h / 24,
        hours: (h % 24) as u8,
        minutes,
        seconds,
        micros,
    })
}

fn parse_hms(t: &str) -> Option<(u32, u8, u8, u32)> {
    let (hms, frac) = match t.split_once('.') {
        Some((a, f)) => (a, Some(f)),
        None => (t, None),
    };
    let mut p = hms.split(':');
    let h: u32 = p.next()?.parse().ok()?;
    let m: u8 = p.next()?.parse().ok()?;
    let s: u8 = p.next()?.parse().ok()?;
    if p.next().is_some() || m > 59 || s > 59 {
        return None;
    }
    let micros = match frac {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 6 && f.bytes().all(|c| c.is_ascii_digit()) => {
            let n: u32 = f.parse().ok()?;
            n * 10u32.pow(6 - f.len() as u32)
        }
        Some(_) => return None,
    };
    Some((h, m, s, micros))
}

/// A statement parameter, losslessly: DECIMAL and JSON go as their text, BIT as the
/// unsigned integer its big-endian bytes spell (so it compares and stores as bits).
pub fn param(v: &Value) -> osprey_wire::Value {
    use osprey_wire::Value as M;
    match v {
        Value::Null => M::NULL,
        Value::Int(i) => M::Int(*i),
        Value::UInt(u) => M::UInt(*u),
        Value::Float(f) => M::Float(*f),
        Value::Double(d) => M::Double(*d),
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) => M::Bytes(s.as_bytes().to_vec()),
        Value::Bytes(b) => M::Bytes(b.clone()),
        Value::Bit(b) => {
            // Leading zero bytes carry no bits (a BIT(16) value may come as 2 bytes);
            // `Request::validate` refuses more than 64 significant bits.
            let significant = &b[b.iter().take_while(|x| **x == 0).count()..];
            match significant.len() {
                0..=8 => M::UInt(significant.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x))),
                _ => M::Bytes(b.clone()),
            }
        }
        Value::Date {
            year,
            month,
            day,
            hour,
            minute,
            second,
            micro,
        } => M::Date(*year, *month, *day, *hour, *minute, *second, *micro),
        Value::Time {
            negative,
            days,
            hours,
            minutes,
            seconds,
            micros,
        } => M::Time(*negative, *days, *hours, *minutes, *seconds, *micros),
    }
}

/// The bytes [`param`]`(v)` takes in a `COM_STMT_EXECUTE` packet (mysql_common's
/// `Value::bin_len`), without copying a string.
pub fn param_bin_len(v: &Value) -> usize {
    let lenenc = |n: usize| {
        n + match n {
            0..=250 => 1,
            251..=0xffff => 3,
            0x1_0000..=0xff_ffff => 4,
            _ => 9,
        }
    };
    match v {
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) => lenenc(s.len()),
        Value::Bytes(b) => lenenc(b.len()),
        other => param(other).bin_len() as usize,
    }
}

/// Upper bound of the MessagePack size of a value (used to cut `ROWS` batches).
pub fn encoded_size_bound(v: &Value) -> usize {
    match v {
        Value::Null | Value::Int(_) | Value::Float(_) | Value::Double(_) => 9,
        Value::UInt(_) => 11,
        Value::Date { .. } | Value::Time { .. } => 24,
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) => s.len() + 8,
        Value::Bytes(b) | Value::Bit(b) => b.len() + 8,
    }
}

#[cfg(test)]
mod tests {
    use super::types::*;
    use super::*;
    use osprey_wire::Value as M;

    fn k(column_type: u8, flags: u16, charset: u16) -> ColumnKind {
        ColumnKind {
            column_type,
            flags,
            charset,
        }
    }
    fn t(kind: ColumnKind, s: &str) -> Value {
        from_text(kind, s.as_bytes().to_vec())
    }

    #[test]
    fn integers_by_signedness() {
        assert_eq!(t(k(LONG, 0, 63), "-42"), Value::Int(-42));
        assert_eq!(
            t(k(LONGLONG, UNSIGNED_FLAG, 63), "18446744073709551615"),
            Value::UInt(u64::MAX)
        );
        assert_eq!(t(k(TINY, UNSIGNED_FLAG, 63), "7"), Value::UInt(7));
        assert_eq!(t(k(INT24, 0, 63), "-8388608"), Value::Int(-8388608));
        assert_eq!(t(k(YEAR, UNSIGNED_FLAG, 63), "2024"), Value::Int(2024));
        // binary protocol gives typed integers; same result
        assert_eq!(value(k(LONG, 0, 63), M::Int(-42)), Value::Int(-42));
        assert_eq!(value(k(TINY, UNSIGNED_FLAG, 63), M::Int(7)), Value::UInt(7));
        assert_eq!(
            value(k(LONGLONG, UNSIGNED_FLAG, 63), M::UInt(u64::MAX)),
            Value::UInt(u64::MAX)
        );
        assert_eq!(value(k(YEAR, UNSIGNED_FLAG, 63), M::UInt(2024)), Value::Int(2024));
        assert_eq!(value(k(LONGLONG, 0, 63), M::UInt(5)), Value::Int(5));
    }

    #[test]
    fn floats_by_column_type() {
        assert_eq!(t(k(FLOAT, 0, 63), "1.5"), Value::Float(1.5));
        assert_eq!(t(k(DOUBLE, 0, 63), "-2.25e100"), Value::Double(-2.25e100));
        assert_eq!(value(k(FLOAT, 0, 63), M::Float(1.5)), Value::Float(1.5));
        assert_eq!(value(k(DOUBLE, 0, 63), M::Float(1.5)), Value::Double(1.5));
        assert_eq!(value(k(FLOAT, 0, 63), M::Double(1.5)), Value::Float(1.5));
    }

    #[test]
    fn decimals_stay_exact_text() {
        assert_eq!(t(k(NEWDECIMAL, 0, 63), "-12.340"), Value::Decimal("-12.340".into()));
        assert_eq!(
            value(k(NEWDECIMAL, 0, 63), M::Bytes(b"99999999999999999999.5".to_vec())),
            Value::Decimal("99999999999999999999.5".into())
        );
        assert_eq!(t(k(DECIMAL, 0, 63), "1"), Value::Decimal("1".into()));
    }

    #[test]
    fn dates_and_datetimes() {
        assert_eq!(t(k(DATE, 0, 63), "2024-02-29"), Value::date(2024, 2, 29, 0, 0, 0, 0));
        assert_eq!(
            t(k(DATETIME, 0, 63), "2024-02-29 23:59:58.123456"),
            Value::date(2024, 2, 29, 23, 59, 58, 123456)
        );
        assert_eq!(
            t(k(DATETIME, 0, 63), "2024-02-29 23:59:58.12"),
            Value::date(2024, 2, 29, 23, 59, 58, 120000)
        );
        assert_eq!(
            t(k(TIMESTAMP, 0, 63), "1999-12-31 00:00:01"),
            Value::date(1999, 12, 31, 0, 0, 1, 0)
        );
        assert_eq!(t(k(DATE, 0, 63), "0000-00-00"), Value::date(0, 0, 0, 0, 0, 0, 0));
        assert_eq!(
            t(k(DATETIME, 0, 63), "0000-00-00 00:00:00"),
            Value::date(0, 0, 0, 0, 0, 0, 0)
        );
        assert_eq!(
            value(k(DATETIME, 0, 63), M::Date(2024, 2, 29, 23, 59, 58, 5)),
            Value::date(2024, 2, 29, 23, 59, 58, 5)
        );
        // garbage never panics, it falls back to text
        assert_eq!(t(k(DATE, 0, 63), "not a date"), Value::Text("not a date".into()));
        assert_eq!(
            t(k(DATETIME, 0, 63), "2024-01-01 25:00:00"),
            Value::Text("2024-01-01 25:00:00".into())
        );
    }

    #[test]
    fn times_negative_and_long() {
        assert_eq!(t(k(TIME, 0, 63), "12:34:56"), Value::time(false, 0, 12, 34, 56, 0));
        assert_eq!(t(k(TIME, 0, 63), "-838:59:59"), Value::time(true, 34, 22, 59, 59, 0));
        assert_eq!(t(k(TIME, 0, 63), "-00:00:01.5"), Value::time(true, 0, 0, 0, 1, 500000));
        assert_eq!(t(k(TIME, 0, 63), "100:00:00.000001"), Value::time(false, 4, 4, 0, 0, 1));
        assert_eq!(
            value(k(TIME, 0, 63), M::Time(true, 34, 22, 59, 59, 0)),
            Value::time(true, 34, 22, 59, 59, 0)
        );
        assert_eq!(t(k(TIME, 0, 63), "1:2"), Value::Text("1:2".into()));
    }

    #[test]
    fn strings_by_charset() {
        assert_eq!(t(k(VAR_STRING, 0, 45), "héllo"), Value::Text("héllo".into()));
        assert_eq!(
            from_text(k(VAR_STRING, 128, 63), vec![0, 255]),
            Value::Bytes(vec![0, 255])
        );
        assert_eq!(
            from_text(k(BLOB, 0, 63), b"abc".to_vec()),
            Value::Bytes(b"abc".to_vec())
        );
        // text column holding bytes that are not UTF-8 (e.g. latin1 connection)
        assert_eq!(from_text(k(STRING, 0, 8), vec![0xe9]), Value::Bytes(vec![0xe9]));
        assert_eq!(t(k(ENUM, 0, 45), "b"), Value::Text("b".into()));
        assert_eq!(t(k(SET, 0, 45), "a,c"), Value::Text("a,c".into()));
        assert_eq!(t(k(JSON, 0, 45), "{\"a\": 1}"), Value::Json("{\"a\": 1}".into()));
        assert_eq!(
            value(k(VARCHAR, 0, 45), M::Bytes(b"x".to_vec())),
            Value::Text("x".into())
        );
    }

    #[test]
    fn bits_nulls() {
        assert_eq!(from_text(k(BIT, 32, 63), vec![0x01, 0x05]), Value::Bit(vec![1, 5]));
        assert_eq!(value(k(BIT, 32, 63), M::Bytes(vec![0x05])), Value::Bit(vec![5]));
        assert_eq!(value(k(LONG, 0, 63), M::NULL), Value::Null);
        assert_eq!(t(k(NULL, 0, 63), ""), Value::Null);
    }

    #[test]
    fn params_are_lossless() {
        assert_eq!(param(&Value::UInt(u64::MAX)), M::UInt(u64::MAX));
        assert_eq!(param(&Value::Decimal("1.50".into())), M::Bytes(b"1.50".to_vec()));
        assert_eq!(param(&Value::Json("[1]".into())), M::Bytes(b"[1]".to_vec()));
        assert_eq!(param(&Value::Bit(vec![1, 5])), M::UInt(261));
        assert_eq!(param(&Value::Bit(vec![0, 0, 0, 0, 0, 0, 0, 0, 0x80])), M::UInt(128));
        assert_eq!(param(&Value::Bit(vec![0xff; 8])), M::UInt(u64::MAX));
        assert_eq!(param(&Value::Bit(vec![])), M::UInt(0));
        for v in [
            Value::Text("x".repeat(300)),
            Value::Bytes(vec![0; 70_000]),
            Value::Decimal("1.5".into()),
            Value::Int(1),
            Value::Null,
            Value::date(2024, 1, 2, 3, 4, 5, 6),
            Value::time(true, 1, 2, 3, 4, 0),
            Value::Bit(vec![1, 2]),
        ] {
            assert_eq!(param_bin_len(&v), param(&v).bin_len() as usize, "{v:?}");
        }
        assert_eq!(
            param(&Value::date(2024, 1, 2, 3, 4, 5, 6)),
            M::Date(2024, 1, 2, 3, 4, 5, 6)
        );
        assert_eq!(param(&Value::time(true, 2, 3, 4, 5, 6)), M::Time(true, 2, 3, 4, 5, 6));
        assert_eq!(param(&Value::Null), M::NULL);
        assert_eq!(param(&Value::Float(1.5)), M::Float(1.5));
    }

    #[test]
    fn size_bound_is_an_upper_bound() {
        let vals = [
            Value::Null,
            Value::Int(i64::MIN),
            Value::UInt(u64::MAX),
            Value::Double(1.0),
            Value::Text("x".repeat(70000)),
            Value::Bytes(vec![1; 300]),
            Value::date(2024, 1, 2, 3, 4, 5, 999999),
            Value::time(true, 34, 22, 59, 59, 999999),
            Value::Bit(vec![1; 8]),
            Value::Decimal("1.5".into()),
        ];
        for v in vals {
            let n = rmp_serde::to_vec_named(&v).unwrap().len();
            assert!(n <= encoded_size_bound(&v), "{v:?}: {n}");
        }
    }
}

//! SQL values, lossless for every MySQL/MariaDB column type.
//!
//! Wire encoding (MessagePack), chosen so that the common values cost one marker:
//!
//! | value | MessagePack |
//! |---|---|
//! | `Null` | nil |
//! | `Int(i64)` | int (any int family marker) |
//! | `Float(f32)` | float 32 |
//! | `Double(f64)` | float 64 |
//! | `Bytes` | bin |
//! | `Text` | str |
//! | `UInt(u64)` | array `[2, uint]` |
//! | `Decimal` | array `[5, str]` (exact decimal text) |
//! | `Date` | array `[6, year, month, day, hour, minute, second, micro]` |
//! | `Time` | array `[7, negative(bool), days, hours, minutes, seconds, micros]` |
//! | `Bit` | array `[8, bin]` (big-endian bytes, as MySQL sends them) |
//! | `Json` | array `[9, str]` |

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub(crate) const TAG_UINT: u8 = 2;
pub(crate) const TAG_DECIMAL: u8 = 5;
pub(crate) const TAG_DATE: u8 = 6;
pub(crate) const TAG_TIME: u8 = 7;
pub(crate) const TAG_BIT: u8 = 8;
pub(crate) const TAG_JSON: u8 = 9;

/// One SQL value. `Date` covers DATE, DATETIME and TIMESTAMP (zero dates are all
/// zeros); `Time` covers TIME including negative values and values over 24 hours.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    UInt(u64),
    Float(f32),
    Double(f64),
    /// DECIMAL/NUMERIC as exact decimal text, e.g. `"-12.340"`.
    Decimal(String),
    /// Binary strings and BLOBs (and text that is not valid UTF-8).
    Bytes(Vec<u8>),
    /// Character strings, ENUM and SET.
    Text(String),
    Date {
        year: u16,
        month: u8,
        day: u8,
        hour: u8,
        minute: u8,
        second: u8,
        micro: u32,
    },
    Time {
        negative: bool,
        days: u32,
        hours: u8,
        minutes: u8,
        seconds: u8,
        micros: u32,
    },
    /// BIT(n) as big-endian bytes.
    Bit(Vec<u8>),
    /// JSON document text.
    Json(String),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// A DATE/DATETIME/TIMESTAMP value (all zeros is MySQL's zero date).
    pub fn date(year: u16, month: u8, day: u8, hour: u8, minute: u8, second: u8, micro: u32) -> Value {
        Value::Date {
            year,
            month,
            day,
            hour,
            minute,
            second,
            micro,
        }
    }

    /// A TIME value: `days` carries hours beyond 24, `negative` the sign.
    pub fn time(negative: bool, days: u32, hours: u8, minutes: u8, seconds: u8, micros: u32) -> Value {
        Value::Time {
            negative,
            days,
            hours,
            minutes,
            seconds,
            micros,
        }
    }
}

/// The largest TIME magnitude MySQL and MariaDB accept: 838:59:59.999999, in microseconds.
const TIME_MAX_MICROS: u64 = ((838 * 60 + 59) * 60 + 59) * 1_000_000 + 999_999;

impl Value {
    /// Checks a value sent as a statement parameter: a value no MySQL column type can
    /// hold is refused here rather than reaching the server, which would turn it into a
    /// zero date, a warning or a truncation. The message names the problem.
    ///
    /// - `Date`: year 0–9999, month 0–12, day 0–31 and within the month (a zero month or day,
    ///   as in MySQL's zero date `0000-00-00`, is allowed), hour 0–23, minute and second
    ///   0–59, micro 0–999999;
    /// - `Time`: hours 0–23, minutes and seconds 0–59, micros 0–999999, magnitude at most
    ///   838:59:59.999999;
    /// - `Decimal`: `[+-]digits[.digits][e[+-]digits]` (digits on at least one side of the
    ///   point), nothing else, no spaces;
    /// - `Bit`: at most 64 significant bits (leading zero bytes do not count): BIT(64) is
    ///   the widest column.
    pub fn check_param(&self) -> Result<(), String> {
        match self {
            Value::Date {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micro,
            } => {
                let bad = |what: &str| {
                    Err(format!(
                        "invalid Date parameter {year:04}-{month:02}-{day:02} \
                         {hour:02}:{minute:02}:{second:02}.{micro:06}: {what}"
                    ))
                };
                if *year > 9999 {
                    return bad("year over 9999");
                }
                if *month > 12 {
                    return bad("month over 12");
                }
                if *day > 31 || (*month > 0 && *day > days_in_month(*year, *month)) {
                    return bad("no such day in that month");
                }
                if *hour > 23 || *minute > 59 || *second > 59 {
                    return bad("time of day out of range");
                }
                if *micro > 999_999 {
                    return bad("micro over 999999");
                }
                Ok(())
            }
            Value::Time {
                negative,
                days,
                hours,
                minutes,
                seconds,
                micros,
            } => {
                let sign = if *negative { "-" } else { "" };
                let bad = |what: &str| {
                    Err(format!(
                        "invalid Time parameter {sign}{days}d {hours:02}:{minutes:02}:{seconds:02}.{micros:06}: {what}"
                    ))
                };
                if *hours > 23 || *minutes > 59 || *seconds > 59 || *micros > 999_999 {
                    return bad("hours 0-23, minutes and seconds 0-59, micros 0-999999");
                }
                let total =
                    ((u64::from(*days) * 24 + u64::from(*hours)) * 60 + u64::from(*minutes)) * 60 + u64::from(*seconds);
                if total.saturating_mul(1_000_000).saturating_add(u64::from(*micros)) > TIME_MAX_MICROS {
                    return bad("beyond 838:59:59.999999, the TIME range");
                }
                Ok(())
            }
            Value::Decimal(s) if !is_decimal_text(s) => Err(format!(
                "invalid Decimal parameter {s:?}: expected [+-]digits[.digits][e[+-]digits]"
            )),
            Value::Bit(b) if b.iter().skip_while(|x| **x == 0).count() > 8 => Err(format!(
                "invalid Bit parameter of {} bytes: at most 64 significant bits (BIT(64) is the widest)",
                b.len()
            )),
            _ => Ok(()),
        }
    }
}

fn days_in_month(year: u16, month: u8) -> u8 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `[+-]digits[.digits][e[+-]digits]`, with at least one digit before or after the point.
fn is_decimal_text(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let mut mantissa = digits(&mut i);
    if b.get(i) == Some(&b'.') {
        i += 1;
        mantissa += digits(&mut i);
    }
    if mantissa == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(v.into())
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::UInt(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Double(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Int(v) => s.serialize_i64(*v),
            Value::Float(v) => s.serialize_f32(*v),
            Value::Double(v) => s.serialize_f64(*v),
            Value::Bytes(v) => s.serialize_bytes(v),
            Value::Text(v) => s.serialize_str(v),
            Value::UInt(v) => {
                let mut seq = s.serialize_seq(Some(2))?;
                seq.serialize_element(&TAG_UINT)?;
                seq.serialize_element(v)?;
                seq.end()
            }
            Value::Decimal(v) => tagged_str(s, TAG_DECIMAL, v),
            Value::Json(v) => tagged_str(s, TAG_JSON, v),
            Value::Bit(v) => {
                let mut seq = s.serialize_seq(Some(2))?;
                seq.serialize_element(&TAG_BIT)?;
                seq.serialize_element(serde_bytes::Bytes::new(v))?;
                seq.end()
            }
            Value::Date {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micro,
            } => {
                let mut seq = s.serialize_seq(Some(8))?;
                seq.serialize_element(&TAG_DATE)?;
                seq.serialize_element(year)?;
                seq.serialize_element(month)?;
                seq.serialize_element(day)?;
                seq.serialize_element(hour)?;
                seq.serialize_element(minute)?;
                seq.serialize_element(second)?;
                seq.serialize_element(micro)?;
                seq.end()
            }
            Value::Time {
                negative,
                days,
                hours,
                minutes,
                seconds,
                micros,
            } => {
                let mut seq = s.serialize_seq(Some(7))?;
                seq.serialize_element(&TAG_TIME)?;
                seq.serialize_element(negative)?;
                seq.serialize_element(days)?;
                seq.serialize_element(hours)?;
                seq.serialize_element(minutes)?;
                seq.serialize_element(seconds)?;
                seq.serialize_element(micros)?;
                seq.end()
            }
        }
    }
}

fn tagged_str<S: Serializer>(s: S, tag: u8, v: &str) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(2))?;
    seq.serialize_element(&tag)?;
    seq.serialize_element(v)?;
    seq.end()
}

struct ValueVisitor;

fn next<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(seq: &mut A, what: &str) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::custom(format_args!("tagged value: missing {what}")))
}

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an Osprey SQL value (nil, int, float, bin, str or tagged array)")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        i64::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom("untagged integer over i64::MAX: unsigned values use the [2, uint] form"))
    }
    fn visit_f32<E: de::Error>(self, v: f32) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Double(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Bytes(v.to_vec()))
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Value, E> {
        Ok(Value::Bytes(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Text(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Text(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let tag: u8 = next(&mut seq, "tag")?;
        let v = match tag {
            TAG_UINT => Value::UInt(next(&mut seq, "uint")?),
            TAG_DECIMAL => Value::Decimal(next(&mut seq, "decimal text")?),
            TAG_JSON => Value::Json(next(&mut seq, "json text")?),
            TAG_BIT => Value::Bit(next::<_, serde_bytes::ByteBuf>(&mut seq, "bit bytes")?.into_vec()),
            TAG_DATE => Value::Date {
                year: next(&mut seq, "year")?,
                month: next(&mut seq, "month")?,
                day: next(&mut seq, "day")?,
                hour: next(&mut seq, "hour")?,
                minute: next(&mut seq, "minute")?,
                second: next(&mut seq, "second")?,
                micro: next(&mut seq, "micro")?,
            },
            TAG_TIME => Value::Time {
                negative: next(&mut seq, "negative")?,
                days: next(&mut seq, "days")?,
                hours: next(&mut seq, "hours")?,
                minutes: next(&mut seq, "minutes")?,
                seconds: next(&mut seq, "seconds")?,
                micros: next(&mut seq, "micros")?,
            },
            other => return Err(de::Error::custom(format_args!("unknown value tag {other}"))),
        };
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(format_args!("tagged value {tag}: too many elements")));
        }
        Ok(v)
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

#[cfg(test)]
mod param_checks {
    use super::Value;

    #[test]
    fn dates() {
        for ok in [
            Value::date(2024, 2, 29, 23, 59, 59, 999_999),
            Value::date(0, 0, 0, 0, 0, 0, 0),
            Value::date(2024, 0, 0, 0, 0, 0, 0),
            Value::date(9999, 12, 31, 0, 0, 0, 0),
            Value::date(2000, 2, 29, 0, 0, 0, 0),
        ] {
            assert_eq!(ok.check_param(), Ok(()), "{ok:?}");
        }
        for bad in [
            Value::date(2024, 13, 1, 0, 0, 0, 0),
            Value::date(2024, 1, 32, 0, 0, 0, 0),
            Value::date(2023, 2, 29, 0, 0, 0, 0),
            Value::date(1900, 2, 29, 0, 0, 0, 0),
            Value::date(2024, 4, 31, 0, 0, 0, 0),
            Value::date(10000, 1, 1, 0, 0, 0, 0),
            Value::date(2024, 1, 1, 24, 0, 0, 0),
            Value::date(2024, 1, 1, 0, 60, 0, 0),
            Value::date(2024, 1, 1, 0, 0, 60, 0),
            Value::date(2024, 1, 1, 0, 0, 0, 1_000_000),
        ] {
            assert!(bad.check_param().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn times() {
        for ok in [
            Value::time(true, 34, 22, 59, 59, 999_999),
            Value::time(false, 0, 0, 0, 0, 0),
            Value::time(false, 1, 23, 0, 0, 0),
        ] {
            assert_eq!(ok.check_param(), Ok(()), "{ok:?}");
        }
        for bad in [
            Value::time(false, 34, 23, 0, 0, 0),
            Value::time(true, 35, 0, 0, 0, 0),
            Value::time(false, u32::MAX, 0, 0, 0, 0),
            Value::time(false, 0, 24, 0, 0, 0),
            Value::time(false, 0, 0, 60, 0, 0),
            Value::time(false, 0, 0, 0, 60, 0),
            Value::time(false, 0, 0, 0, 0, 1_000_000),
        ] {
            assert!(bad.check_param().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decimals() {
        for ok in [
            "0",
            "-12.340",
            "+1",
            ".5",
            "5.",
            "1e3",
            "-1.5E-7",
            "99999999999999999999999999999.5",
        ] {
            assert_eq!(Value::Decimal(ok.into()).check_param(), Ok(()), "{ok}");
        }
        for bad in [
            "", "abc", "-", ".", "1.2.3", " 1", "1 ", "1e", "1e+", "0x10", "1,5", "NaN", "e5",
        ] {
            assert!(Value::Decimal(bad.into()).check_param().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bits() {
        assert_eq!(Value::Bit(vec![0xff; 8]).check_param(), Ok(()));
        assert_eq!(Value::Bit(vec![0, 0, 0x80, 0, 0, 0, 0, 0, 0, 1]).check_param(), Ok(()));
        assert_eq!(Value::Bit(vec![]).check_param(), Ok(()));
        assert!(Value::Bit(vec![1; 9]).check_param().is_err());
    }
}

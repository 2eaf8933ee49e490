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

const TAG_UINT: u8 = 2;
const TAG_DECIMAL: u8 = 5;
const TAG_DATE: u8 = 6;
const TAG_TIME: u8 = 7;
const TAG_BIT: u8 = 8;
const TAG_JSON: u8 = 9;

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

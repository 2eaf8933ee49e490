//! Rows and conversions: [`FromValue`] (one SQL value to a Rust value), [`FromRow`]
//! (a row to a tuple or your own type), [`IntoParam`] (Rust values to parameters),
//! and JSON / serde support.

use std::fmt::Write as _;
use std::sync::Arc;

use osprey_protocol::{Column, Value};
use serde::de::DeserializeOwned;

use crate::error::Error;

/// Metadata of one result set: its index within the stream and its columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultSetMeta {
    /// 0-based index of the result set within the request.
    pub index: u32,
    pub columns: Vec<Column>,
}

impl ResultSetMeta {
    /// Position of the first column called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

/// One row: values in column order plus the result set's metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    meta: Arc<ResultSetMeta>,
    values: Vec<Value>,
}

impl Row {
    /// A row of `values` belonging to the result set `meta`.
    pub fn new(meta: Arc<ResultSetMeta>, values: Vec<Value>) -> Row {
        Row { meta, values }
    }

    /// Column metadata.
    pub fn columns(&self) -> &[Column] {
        &self.meta.columns
    }

    /// The result set this row belongs to.
    pub fn meta(&self) -> &Arc<ResultSetMeta> {
        &self.meta
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The raw values.
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    pub fn into_values(self) -> Vec<Value> {
        self.values
    }

    /// The raw value at `index`.
    pub fn value(&self, index: usize) -> Option<&Value> {
        self.values.get(index)
    }

    /// The value at `index`, converted.
    pub fn get<T: FromValue>(&self, index: usize) -> Result<T, Error> {
        let v = self
            .values
            .get(index)
            .ok_or_else(|| Error::conversion(format!("no column {index} (row has {})", self.values.len())))?;
        T::from_value(v.clone()).map_err(|e| column_context(e, index, self.meta.columns.get(index)))
    }

    /// The value of the column called `name`, converted.
    pub fn get_by_name<T: FromValue>(&self, name: &str) -> Result<T, Error> {
        let i = self
            .meta
            .position(name)
            .ok_or_else(|| Error::conversion(format!("no column named {name:?}")))?;
        self.get(i)
    }

    /// The row as a JSON object keyed by column name (see [`value_to_json`]).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let col = self.meta.columns.get(i);
                let name = col.map_or_else(|| format!("col{i}"), |c| c.name.clone());
                (name, value_to_json(v, col))
            })
            .collect()
    }

    /// Deserializes the row (as the JSON object of [`Row::to_json`]) into `T`.
    ///
    /// ```
    /// # use osprey_client::Row;
    /// #[derive(serde::Deserialize)]
    /// struct User { id: i64, name: String }
    /// # fn f(row: Row) -> Result<(), osprey_client::Error> {
    /// let user: User = row.deserialize()?;
    /// # Ok(()) }
    /// ```
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_value(serde_json::Value::Object(self.to_json()))
            .map_err(|e| Error::conversion(format!("cannot deserialize row: {e}")))
    }
}

fn column_context(e: Error, index: usize, col: Option<&Column>) -> Error {
    match col {
        Some(c) => Error::conversion(format!("column {index} ({}): {}", c.name, e.message())),
        None => Error::conversion(format!("column {index}: {}", e.message())),
    }
}

// ---------------------------------------------------------------------------
// FromValue

/// Conversion of one SQL value into a Rust value.
///
/// Conversions are lenient where MySQL's text protocol requires it: numbers
/// arriving as text or bytes are parsed, and strings accept any scalar. `NULL`
/// converts only into `Option<T>` (and [`Value`]).
pub trait FromValue: Sized {
    fn from_value(v: Value) -> Result<Self, Error>;
}

fn mismatch<T>(v: &Value, want: &str) -> Result<T, Error> {
    Err(Error::conversion(format!("cannot convert {} to {want}", describe(v))))
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Int(i) => format!("integer {i}"),
        Value::UInt(u) => format!("unsigned integer {u}"),
        Value::Float(f) => format!("float {f}"),
        Value::Double(f) => format!("double {f}"),
        Value::Decimal(d) => format!("decimal {d}"),
        Value::Bytes(b) => format!("{} bytes", b.len()),
        Value::Text(t) => format!("text {:?}", truncate(t, 40)),
        Value::Date { .. } => "a date".into(),
        Value::Time { .. } => "a time".into(),
        Value::Bit(_) => "a bit value".into(),
        Value::Json(_) => "a JSON document".into(),
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn text_of(v: &Value) -> Option<&str> {
    match v {
        Value::Text(t) | Value::Decimal(t) => Some(t),
        Value::Bytes(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn bits_u64(b: &[u8]) -> Option<u64> {
    if b.len() > 8 {
        return None;
    }
    Some(b.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)))
}

impl FromValue for Value {
    fn from_value(v: Value) -> Result<Self, Error> {
        Ok(v)
    }
}

impl FromValue for i64 {
    fn from_value(v: Value) -> Result<Self, Error> {
        match &v {
            Value::Int(i) => Ok(*i),
            Value::UInt(u) => i64::try_from(*u).or_else(|_| mismatch(&v, "i64")),
            Value::Bit(b) => bits_u64(b)
                .and_then(|u| i64::try_from(u).ok())
                .map_or_else(|| mismatch(&v, "i64"), Ok),
            _ => match text_of(&v).and_then(|t| t.trim().parse::<i64>().ok()) {
                Some(i) => Ok(i),
                None => mismatch(&v, "i64"),
            },
        }
    }
}

impl FromValue for u64 {
    fn from_value(v: Value) -> Result<Self, Error> {
        match &v {
            Value::UInt(u) => Ok(*u),
            Value::Int(i) => u64::try_from(*i).or_else(|_| mismatch(&v, "u64")),
            Value::Bit(b) => bits_u64(b).map_or_else(|| mismatch(&v, "u64"), Ok),
            _ => match text_of(&v).and_then(|t| t.trim().parse::<u64>().ok()) {
                Some(u) => Ok(u),
                None => mismatch(&v, "u64"),
            },
        }
    }
}

macro_rules! narrow_int {
    ($($t:ty => $via:ty),*) => {$(
        impl FromValue for $t {
            fn from_value(v: Value) -> Result<Self, Error> {
                let desc = describe(&v);
                let wide = <$via>::from_value(v)?;
                <$t>::try_from(wide).map_err(|_| {
                    Error::conversion(format!("cannot convert {desc} to {}: out of range", stringify!($t)))
                })
            }
        }
    )*};
}
narrow_int!(i32 => i64, i16 => i64, i8 => i64, u32 => u64, u16 => u64, u8 => u64, usize => u64, isize => i64);

impl FromValue for f64 {
    fn from_value(v: Value) -> Result<Self, Error> {
        match &v {
            Value::Double(f) => Ok(*f),
            Value::Float(f) => Ok(f64::from(*f)),
            Value::Int(i) => Ok(*i as f64),
            Value::UInt(u) => Ok(*u as f64),
            _ => match text_of(&v).and_then(|t| t.trim().parse::<f64>().ok()) {
                Some(f) => Ok(f),
                None => mismatch(&v, "f64"),
            },
        }
    }
}

impl FromValue for f32 {
    fn from_value(v: Value) -> Result<Self, Error> {
        match v {
            Value::Float(f) => Ok(f),
            other => f64::from_value(other).map(|f| f as f32),
        }
    }
}

impl FromValue for bool {
    fn from_value(v: Value) -> Result<Self, Error> {
        match &v {
            Value::Int(i) => Ok(*i != 0),
            Value::UInt(u) => Ok(*u != 0),
            Value::Bit(b) => Ok(b.iter().any(|x| *x != 0)),
            _ => match text_of(&v).map(str::trim) {
                Some("1") | Some("true") | Some("TRUE") => Ok(true),
                Some("0") | Some("false") | Some("FALSE") => Ok(false),
                _ => mismatch(&v, "bool"),
            },
        }
    }
}

impl FromValue for String {
    fn from_value(v: Value) -> Result<Self, Error> {
        match v {
            Value::Text(t) | Value::Decimal(t) | Value::Json(t) => Ok(t),
            Value::Bytes(b) => String::from_utf8(b).map_err(|_| Error::conversion("bytes are not valid UTF-8")),
            Value::Null => mismatch(&Value::Null, "String"),
            other => Ok(display_value(&other)),
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(v: Value) -> Result<Self, Error> {
        match v {
            Value::Bytes(b) | Value::Bit(b) => Ok(b),
            Value::Text(t) | Value::Decimal(t) | Value::Json(t) => Ok(t.into_bytes()),
            other => mismatch(&other, "Vec<u8>"),
        }
    }
}

impl FromValue for serde_json::Value {
    fn from_value(v: Value) -> Result<Self, Error> {
        Ok(value_to_json(&v, None))
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: Value) -> Result<Self, Error> {
        match v {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

// ---------------------------------------------------------------------------
// FromRow

/// Conversion of a whole row. Implemented for [`Row`], `Vec<Value>` and tuples of
/// up to 8 [`FromValue`] types (the row must have exactly as many columns).
///
/// Implement it for your own types, or use [`Row::deserialize`] with serde.
pub trait FromRow: Sized {
    fn from_row(row: Row) -> Result<Self, Error>;
}

impl FromRow for Row {
    fn from_row(row: Row) -> Result<Self, Error> {
        Ok(row)
    }
}

impl FromRow for Vec<Value> {
    fn from_row(row: Row) -> Result<Self, Error> {
        Ok(row.values)
    }
}

macro_rules! tuple_from_row {
    ($n:literal; $($t:ident),+) => {
        impl<$($t: FromValue),+> FromRow for ($($t,)+) {
            fn from_row(row: Row) -> Result<Self, Error> {
                if row.values.len() != $n {
                    return Err(Error::conversion(format!(
                        "row has {} columns, the tuple {}", row.values.len(), $n
                    )));
                }
                let meta = row.meta;
                let mut it = row.values.into_iter().enumerate();
                Ok(($({
                    let (i, v) = it.next().expect("length checked");
                    $t::from_value(v).map_err(|e| column_context(e, i, meta.columns.get(i)))?
                },)+))
            }
        }
    };
}
tuple_from_row!(1; A);
tuple_from_row!(2; A, B);
tuple_from_row!(3; A, B, C);
tuple_from_row!(4; A, B, C, D);
tuple_from_row!(5; A, B, C, D, E);
tuple_from_row!(6; A, B, C, D, E, F);
tuple_from_row!(7; A, B, C, D, E, F, G);
tuple_from_row!(8; A, B, C, D, E, F, G, H);

// ---------------------------------------------------------------------------
// Parameters

/// Conversion of a Rust value into a statement parameter. Used by [`params!`](crate::params).
/// `bool` becomes `0`/`1`, byte slices become `Bytes`, `None` becomes `NULL`.
pub trait IntoParam {
    fn into_param(self) -> Value;
}

macro_rules! param_via {
    ($($t:ty => |$x:ident| $e:expr),* $(,)?) => {$(
        impl IntoParam for $t {
            fn into_param(self) -> Value {
                let $x = self;
                $e
            }
        }
    )*};
}
param_via! {
    Value => |v| v,
    &Value => |v| v.clone(),
    i8 => |v| Value::Int(v.into()),
    i16 => |v| Value::Int(v.into()),
    i32 => |v| Value::Int(v.into()),
    i64 => |v| Value::Int(v),
    isize => |v| Value::Int(v as i64),
    u8 => |v| Value::Int(v.into()),
    u16 => |v| Value::Int(v.into()),
    u32 => |v| Value::Int(v.into()),
    u64 => |v| Value::UInt(v),
    usize => |v| Value::UInt(v as u64),
    f32 => |v| Value::Float(v),
    f64 => |v| Value::Double(v),
    bool => |v| Value::Int(v.into()),
    &str => |v| Value::Text(v.to_owned()),
    String => |v| Value::Text(v),
    &String => |v| Value::Text(v.clone()),
    Vec<u8> => |v| Value::Bytes(v),
    &[u8] => |v| Value::Bytes(v.to_vec()),
}

impl<T: IntoParam> IntoParam for Option<T> {
    fn into_param(self) -> Value {
        self.map_or(Value::Null, IntoParam::into_param)
    }
}

/// Builds a `Vec<Value>` of statement parameters from Rust values ([`IntoParam`]).
///
/// ```
/// use osprey_client::{params, Value};
/// let p = params![42, "x", true, None::<i64>];
/// assert_eq!(p, vec![Value::Int(42), Value::Text("x".into()), Value::Int(1), Value::Null]);
/// ```
#[macro_export]
macro_rules! params {
    () => { ::std::vec::Vec::<$crate::Value>::new() };
    ($($v:expr),+ $(,)?) => { ::std::vec![$($crate::IntoParam::into_param($v)),+] };
}

// ---------------------------------------------------------------------------
// Text and JSON renderings

/// MySQL type codes that hold integers (TINY, SHORT, LONG, LONGLONG, INT24, YEAR).
fn is_int_type(t: u8) -> bool {
    matches!(t, 1 | 2 | 3 | 8 | 9 | 13)
}

/// FLOAT and DOUBLE.
fn is_float_type(t: u8) -> bool {
    matches!(t, 4 | 5)
}

/// Hex rendering `0x...` of bytes.
pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + b.len() * 2);
    s.push_str("0x");
    for x in b {
        let _ = write!(s, "{x:02X}");
    }
    s
}

/// Text rendering of a value, as the `mysql` client would print it: `NULL`, numbers,
/// text, dates as `YYYY-MM-DD HH:MM:SS[.ffffff]`, times as `[-]HH:MM:SS[.ffffff]`,
/// bytes as text when they are UTF-8 and as `0x..` hex otherwise, BIT as hex.
pub fn display_value(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Double(f) => f.to_string(),
        Value::Decimal(t) | Value::Text(t) | Value::Json(t) => t.clone(),
        Value::Bytes(b) => match std::str::from_utf8(b) {
            Ok(s) if !s.chars().any(|c| c.is_control() && c != '\t' && c != '\n') => s.to_owned(),
            _ => hex(b),
        },
        Value::Bit(b) => hex(b),
        Value::Date {
            year,
            month,
            day,
            hour,
            minute,
            second,
            micro,
        } => {
            let mut s = format!("{year:04}-{month:02}-{day:02}");
            if (*hour, *minute, *second, *micro) != (0, 0, 0, 0) {
                let _ = write!(s, " {hour:02}:{minute:02}:{second:02}");
                if *micro != 0 {
                    let _ = write!(s, ".{micro:06}");
                }
            }
            s
        }
        Value::Time {
            negative,
            days,
            hours,
            minutes,
            seconds,
            micros,
        } => {
            let h = u64::from(*days) * 24 + u64::from(*hours);
            let mut s = format!("{}{h:02}:{minutes:02}:{seconds:02}", if *negative { "-" } else { "" });
            if *micros != 0 {
                let _ = write!(s, ".{micros:06}");
            }
            s
        }
    }
}

/// JSON rendering of a value. With the column's metadata, integers and floats that
/// arrive as text (MySQL's text protocol) become JSON numbers.
///
/// | value | JSON |
/// |---|---|
/// | NULL | `null` |
/// | Int, UInt, Float, Double | number (non-finite floats: `null`) |
/// | Decimal | string (exact) |
/// | Text, UTF-8 Bytes | string |
/// | other Bytes | array of byte numbers |
/// | Date, Time | string, as [`display_value`] |
/// | Bit | number (up to 64 bits), else array of bytes |
/// | Json | the parsed document (string if it does not parse) |
pub fn value_to_json(v: &Value, column: Option<&Column>) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Null => J::Null,
        Value::Int(i) => J::from(*i),
        Value::UInt(u) => J::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(f64::from(*f)).map_or(J::Null, J::Number),
        Value::Double(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::Decimal(t) => J::String(t.clone()),
        Value::Text(t) => text_json(t, column),
        Value::Bytes(b) => match std::str::from_utf8(b) {
            Ok(t) => text_json(t, column),
            Err(_) => J::Array(b.iter().map(|x| J::from(*x)).collect()),
        },
        Value::Bit(b) => match bits_u64(b) {
            Some(u) => J::from(u),
            None => J::Array(b.iter().map(|x| J::from(*x)).collect()),
        },
        Value::Json(t) => serde_json::from_str(t).unwrap_or_else(|_| J::String(t.clone())),
        Value::Date { .. } | Value::Time { .. } => J::String(display_value(v)),
    }
}

fn text_json(t: &str, column: Option<&Column>) -> serde_json::Value {
    use serde_json::Value as J;
    if let Some(c) = column {
        if is_int_type(c.column_type) {
            if let Ok(i) = t.parse::<i64>() {
                return J::from(i);
            }
            if let Ok(u) = t.parse::<u64>() {
                return J::from(u);
            }
        } else if is_float_type(c.column_type) {
            if let Some(n) = t.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                return J::Number(n);
            }
        } else if c.column_type == 245 {
            if let Ok(j) = serde_json::from_str(t) {
                return j;
            }
        }
    }
    J::String(t.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, t: u8) -> Column {
        Column {
            name: name.into(),
            table: String::new(),
            column_type: t,
            flags: 0,
            charset: 33,
            length: 0,
            decimals: 0,
        }
    }

    fn row(values: Vec<Value>) -> Row {
        let columns = (0..values.len()).map(|i| col(&format!("c{i}"), 3)).collect();
        Row::new(Arc::new(ResultSetMeta { index: 0, columns }), values)
    }

    #[test]
    fn from_value_lenient_numbers() {
        assert_eq!(i64::from_value(Value::Bytes(b"42".to_vec())).unwrap(), 42);
        assert_eq!(i64::from_value(Value::UInt(7)).unwrap(), 7);
        assert!(i64::from_value(Value::UInt(u64::MAX)).is_err());
        assert_eq!(
            u64::from_value(Value::Text("18446744073709551615".into())).unwrap(),
            u64::MAX
        );
        assert!(u64::from_value(Value::Int(-1)).is_err());
        assert_eq!(i32::from_value(Value::Int(-5)).unwrap(), -5);
        assert!(i32::from_value(Value::Int(1 << 40)).is_err());
        assert_eq!(f64::from_value(Value::Decimal("1.25".into())).unwrap(), 1.25);
        assert!(bool::from_value(Value::Int(1)).unwrap());
        assert!(!bool::from_value(Value::Bytes(b"0".to_vec())).unwrap());
        assert_eq!(u64::from_value(Value::Bit(vec![1, 0])).unwrap(), 256);
    }

    #[test]
    fn from_value_strings_bytes_options() {
        assert_eq!(String::from_value(Value::Bytes(b"hi".to_vec())).unwrap(), "hi");
        assert!(String::from_value(Value::Bytes(vec![0xff])).is_err());
        assert_eq!(String::from_value(Value::Int(3)).unwrap(), "3");
        assert!(String::from_value(Value::Null).is_err());
        assert_eq!(Option::<String>::from_value(Value::Null).unwrap(), None);
        assert_eq!(Option::<i64>::from_value(Value::Int(1)).unwrap(), Some(1));
        assert_eq!(Vec::<u8>::from_value(Value::Bytes(vec![0, 1])).unwrap(), vec![0, 1]);
    }

    #[test]
    fn tuples_check_arity_and_name_the_column() {
        let r = row(vec![Value::Int(1), Value::Text("a".into()), Value::Null]);
        let (a, b, c): (i64, String, Option<f64>) = FromRow::from_row(r.clone()).unwrap();
        assert_eq!((a, b.as_str(), c), (1, "a", None));
        assert!(<(i64, String)>::from_row(r.clone()).is_err());
        let e = <(i64, i64, i64)>::from_row(r).unwrap_err();
        assert_eq!(e.code(), osprey_protocol::ErrorCode::BadBody);
        assert!(e.message().contains("column 1 (c1)"), "{}", e.message());
    }

    #[test]
    fn json_uses_column_types() {
        let meta = Arc::new(ResultSetMeta {
            index: 0,
            columns: vec![
                col("id", 8),
                col("name", 253),
                col("price", 246),
                col("raw", 252),
                col("doc", 245),
            ],
        });
        let r = Row::new(
            meta,
            vec![
                Value::Bytes(b"12".to_vec()),
                Value::Bytes(b"bob".to_vec()),
                Value::Bytes(b"9.50".to_vec()),
                Value::Bytes(vec![0xff, 0]),
                Value::Bytes(br#"{"a":1}"#.to_vec()),
            ],
        );
        let j = serde_json::Value::Object(r.to_json());
        assert_eq!(
            j,
            serde_json::json!({"id": 12, "name": "bob", "price": "9.50", "raw": [255, 0], "doc": {"a": 1}})
        );

        #[derive(serde::Deserialize)]
        struct Item {
            id: i64,
            name: String,
        }
        let item: Item = r.deserialize().unwrap();
        assert_eq!((item.id, item.name.as_str()), (12, "bob"));
    }

    #[test]
    fn display_dates_times_bytes() {
        let d = Value::Date {
            year: 2024,
            month: 2,
            day: 29,
            hour: 13,
            minute: 5,
            second: 9,
            micro: 120,
        };
        assert_eq!(display_value(&d), "2024-02-29 13:05:09.000120");
        let t = Value::Time {
            negative: true,
            days: 1,
            hours: 2,
            minutes: 3,
            seconds: 4,
            micros: 0,
        };
        assert_eq!(display_value(&t), "-26:03:04");
        assert_eq!(display_value(&Value::Bytes(vec![0xff, 0xad])), "0xFFAD");
        assert_eq!(display_value(&Value::Null), "NULL");
    }
}

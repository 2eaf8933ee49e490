//! Prepared statements across shared workers: the dispatcher gives out the statement ids
//! and keeps, per connection, each statement's text, definitions and the parameter types
//! its client last bound; a worker prepares a text lazily when it first runs it (its own
//! bounded statement cache). An `EXECUTE` without types (the client bound them before)
//! therefore binds correctly whichever worker runs it (MaxScale's MXS-2521).

use std::collections::HashMap;

use osprey_protocol::{Column, Value};

use crate::codec::{put_lenenc_bytes, Cursor};

/// Bounds per connection: statements, and the bytes of their texts and definitions
/// (parameters' and columns'), and of their long data.
pub const MAX_STATEMENTS: usize = 1024;
pub const MAX_TEXT_BYTES: usize = 16 << 20;

/// What a statement costs in memory: its text and its definitions (a join of wide
/// tables has a thousand columns for a few hundred bytes of text).
pub fn cost(sql: &str, params: &[Column], columns: &[Column]) -> usize {
    let defs = |d: &[Column]| -> usize {
        d.iter()
            .map(|c| std::mem::size_of::<Column>() + c.name.len() + c.table.len())
            .sum()
    };
    std::mem::size_of::<Prepared>() + sql.len() + defs(params) + defs(columns)
}

/// One statement a client prepared.
#[derive(Debug)]
pub struct Prepared {
    pub sql: String,
    /// What each execution would otherwise read from `sql` again.
    pub facts: crate::state::Facts,
    pub params: Vec<Column>,
    pub columns: Vec<Column>,
    /// The parameter types of the last `EXECUTE` that sent them: (type, unsigned).
    types: Option<Vec<(u8, bool)>>,
    /// `COM_STMT_SEND_LONG_DATA` chunks by parameter, until the next `EXECUTE` or `RESET`.
    long_data: HashMap<u16, Vec<u8>>,
    /// Its [`cost`].
    cost: usize,
}

/// A connection's prepared statements.
#[derive(Debug, Default)]
pub struct Statements {
    map: HashMap<u32, Prepared>,
    next_id: u32,
    text_bytes: usize,
    long_bytes: usize,
}

/// Why a statement cannot be kept or run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StmtError {
    #[error("Can't create more than max_prepared_stmt_count statements (current value: {MAX_STATEMENTS})")]
    TooMany,
    #[error("Unknown prepared statement handler ({0}) given to mysqld_stmt_execute")]
    Unknown(u32),
    #[error("Incorrect arguments to mysqld_stmt_execute: {0}")]
    Malformed(&'static str),
    #[error("Parameter of prepared statement which is set through mysql_send_long_data() is longer than 'max_long_data_size' bytes")]
    LongDataTooLarge,
}

impl StmtError {
    /// The ERR packet a client gets.
    pub fn reply(&self) -> Vec<u8> {
        let (errno, state) = self.errno();
        crate::reply::err(errno, state, &self.to_string())
    }

    pub fn errno(&self) -> (u16, &'static str) {
        match self {
            StmtError::TooMany => (1461, "42000"),
            StmtError::Unknown(_) => (1243, "HY000"),
            StmtError::Malformed(_) => (1210, "HY000"),
            StmtError::LongDataTooLarge => (1153, "08S01"),
        }
    }
}

impl Statements {
    /// Keeps a statement; its id.
    pub fn add(&mut self, sql: String, params: Vec<Column>, columns: Vec<Column>) -> Result<u32, StmtError> {
        let cost = cost(&sql, &params, &columns);
        if self.map.len() >= MAX_STATEMENTS || self.text_bytes + cost > MAX_TEXT_BYTES {
            return Err(StmtError::TooMany);
        }
        self.next_id = self.next_id.wrapping_add(1).max(1);
        while self.map.contains_key(&self.next_id) {
            self.next_id = self.next_id.wrapping_add(1).max(1);
        }
        self.text_bytes += cost;
        self.map.insert(
            self.next_id,
            Prepared {
                facts: crate::state::Facts::of(&osprey_sql::Code::of(&sql)),
                sql,
                params,
                columns,
                types: None,
                long_data: HashMap::new(),
                cost,
            },
        );
        Ok(self.next_id)
    }

    pub fn get(&self, id: u32) -> Option<&Prepared> {
        self.map.get(&id)
    }

    /// The memory its statements and their long data hold (what the dispatcher charges
    /// to its global request-byte budget).
    pub fn bytes(&self) -> usize {
        self.text_bytes + self.long_bytes
    }

    pub fn close(&mut self, id: u32) {
        if let Some(p) = self.map.remove(&id) {
            self.text_bytes -= p.cost;
            self.long_bytes -= p.long_data.values().map(Vec::len).sum::<usize>();
        }
    }

    /// `COM_STMT_RESET`: its long data dropped.
    pub fn reset(&mut self, id: u32) -> Result<(), StmtError> {
        let p = self.map.get_mut(&id).ok_or(StmtError::Unknown(id))?;
        self.long_bytes -= p.long_data.values().map(Vec::len).sum::<usize>();
        p.long_data.clear();
        Ok(())
    }

    /// `COM_STMT_SEND_LONG_DATA` (no answer; an error is kept for the `EXECUTE`).
    pub fn long_data(&mut self, body: &[u8], limit: usize) -> Result<(), StmtError> {
        let mut c = Cursor(body);
        let (Some(id), Some(param)) = (c.u32(), c.u16()) else {
            return Err(StmtError::Malformed("long data header"));
        };
        let data = c.rest();
        let p = self.map.get_mut(&id).ok_or(StmtError::Unknown(id))?;
        if usize::from(param) >= p.params.len() {
            return Err(StmtError::Malformed(
                "long data for a parameter the statement does not have",
            ));
        }
        if self.long_bytes + data.len() > limit {
            return Err(StmtError::LongDataTooLarge);
        }
        self.long_bytes += data.len();
        p.long_data.entry(param).or_default().extend_from_slice(data);
        Ok(())
    }

    /// Reads a `COM_STMT_EXECUTE` body: the statement's id and its parameters' values
    /// (long data taken in; the types remembered when this execute sends none).
    pub fn execute(&mut self, body: &[u8]) -> Result<Execute, StmtError> {
        let bad = StmtError::Malformed;
        let mut c = Cursor(body);
        let id = c.u32().ok_or(bad("no statement id"))?;
        let p = self.map.get_mut(&id).ok_or(StmtError::Unknown(id))?;
        let _flags = c.u8().ok_or(bad("no flags"))?;
        let _iterations = c.u32().ok_or(bad("no iteration count"))?;
        let n = p.params.len();
        let long = std::mem::take(&mut p.long_data);
        self.long_bytes -= long.values().map(Vec::len).sum::<usize>();
        if n == 0 {
            return Ok(Execute {
                id,
                values: Vec::new(),
                blob: Vec::new(),
            });
        }
        let nulls = c.take(n.div_ceil(8)).ok_or(bad("no null bitmap"))?;
        let bound = c.u8().ok_or(bad("no new-params-bound flag"))?;
        if bound == 1 {
            let mut types = Vec::with_capacity(n);
            for _ in 0..n {
                let (Some(t), Some(f)) = (c.u8(), c.u8()) else {
                    return Err(bad("parameter types"));
                };
                types.push((t, f & 0x80 != 0));
            }
            p.types = Some(types);
        }
        let types = p.types.as_ref().ok_or(bad("no parameter types were ever sent"))?;
        let mut values = Vec::with_capacity(n);
        let mut blob = Vec::new();
        for (i, &(t, unsigned)) in types.iter().enumerate() {
            if is_blob(t) {
                blob.push(i as u16);
            }
            if nulls[i / 8] & (1 << (i % 8)) != 0 {
                values.push(Value::Null);
            } else if let Some(data) = long.get(&(i as u16)) {
                values.push(Value::Bytes(data.clone()));
            } else {
                values.push(read_value(&mut c, t, unsigned).ok_or(bad("a parameter's value"))?);
            }
        }
        Ok(Execute { id, values, blob })
    }
}

/// A `COM_STMT_EXECUTE` read: the statement, its values, and which of them the client
/// bound as a BLOB (binary; `REQUEST.blob_params`).
#[derive(Debug, PartialEq)]
pub struct Execute {
    pub id: u32,
    pub values: Vec<Value>,
    pub blob: Vec<u16>,
}

/// The BLOB types (and BIT, GEOMETRY): binary values.
fn is_blob(t: u8) -> bool {
    matches!(t, 0xF9..=0xFC | 0x10 | 0xFF)
}

/// One binary-protocol value of MySQL type `t`.
fn read_value(c: &mut Cursor<'_>, t: u8, unsigned: bool) -> Option<Value> {
    let int = |v: i64, u: u64| if unsigned { Value::UInt(u) } else { Value::Int(v) };
    Some(match t {
        0x06 => Value::Null,
        0x01 => {
            let b = c.u8()?;
            int(i64::from(b as i8), u64::from(b))
        }
        0x02 | 0x0D => {
            let v = c.u16()?;
            int(i64::from(v as i16), u64::from(v))
        }
        0x03 | 0x09 => {
            let v = c.u32()?;
            int(i64::from(v as i32), u64::from(v))
        }
        0x08 => {
            let b: [u8; 8] = c.take(8)?.try_into().ok()?;
            int(i64::from_le_bytes(b), u64::from_le_bytes(b))
        }
        0x04 => Value::Float(f32::from_le_bytes(c.take(4)?.try_into().ok()?)),
        0x05 => Value::Double(f64::from_le_bytes(c.take(8)?.try_into().ok()?)),
        0x07 | 0x0A | 0x0C | 0x11 | 0x12 => {
            let len = c.u8()?;
            let mut b = Cursor(c.take(usize::from(len))?);
            let (mut year, mut month, mut day, mut hour, mut minute, mut second, mut micro) = (0, 0, 0, 0, 0, 0, 0);
            if len >= 4 {
                year = b.u16()?;
                month = b.u8()?;
                day = b.u8()?;
            }
            if len >= 7 {
                hour = b.u8()?;
                minute = b.u8()?;
                second = b.u8()?;
            }
            if len >= 11 {
                micro = b.u32()?;
            }
            Value::date(year, month, day, hour, minute, second, micro)
        }
        0x0B | 0x13 => {
            let len = c.u8()?;
            let mut b = Cursor(c.take(usize::from(len))?);
            let (mut negative, mut days, mut hours, mut minutes, mut seconds, mut micros) = (false, 0, 0, 0, 0, 0);
            if len >= 8 {
                negative = b.u8()? == 1;
                days = b.u32()?;
                hours = b.u8()?;
                minutes = b.u8()?;
                seconds = b.u8()?;
            }
            if len >= 12 {
                micros = b.u32()?;
            }
            Value::time(negative, days, hours, minutes, seconds, micros)
        }
        // BLOBs, BIT, GEOMETRY: binary, bound again as a BLOB by the worker.
        t if is_blob(t) => Value::Bytes(c.lenenc_bytes()?.to_vec()),
        // Strings, DECIMAL, JSON, ENUM, SET: text in the connection's character set (bytes
        // that are not UTF-8 still go as a string, as the client sent them).
        _ => {
            let b = c.lenenc_bytes()?.to_vec();
            match String::from_utf8(b) {
                Ok(s) => Value::Text(s),
                Err(e) => Value::Bytes(e.into_bytes()),
            }
        }
    })
}

/// `COM_STMT_PREPARE`'s OK: the id, the counts.
pub fn prepare_ok(id: u32, columns: usize, params: usize) -> Vec<u8> {
    let mut p = vec![0x00];
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(&(columns.min(usize::from(u16::MAX)) as u16).to_le_bytes());
    p.extend_from_slice(&(params.min(usize::from(u16::MAX)) as u16).to_le_bytes());
    p.push(0);
    p.extend_from_slice(&0u16.to_le_bytes());
    p
}

/// A binary-protocol row of `columns` (the worker's typed values).
pub fn binary_row(out: &mut Vec<u8>, columns: &[Column], row: &[Value]) {
    out.push(0x00);
    let bitmap_at = out.len();
    out.resize(bitmap_at + (row.len() + 7 + 2) / 8, 0);
    for (i, v) in row.iter().enumerate() {
        let t = columns.get(i).map_or(0xFD, |c| c.column_type);
        match v {
            Value::Null => {
                let bit = i + 2;
                out[bitmap_at + bit / 8] |= 1 << (bit % 8);
            }
            Value::Int(n) => put_int(out, t, *n as u64),
            Value::UInt(n) => put_int(out, t, *n),
            Value::Float(f) if t == 0x05 => out.extend_from_slice(&f64::from(*f).to_le_bytes()),
            Value::Float(f) => out.extend_from_slice(&f.to_le_bytes()),
            Value::Double(d) if t == 0x04 => out.extend_from_slice(&(*d as f32).to_le_bytes()),
            Value::Double(d) => out.extend_from_slice(&d.to_le_bytes()),
            Value::Decimal(s) | Value::Text(s) | Value::Json(s) => put_lenenc_bytes(out, s.as_bytes()),
            Value::Bytes(b) | Value::Bit(b) => put_lenenc_bytes(out, b),
            Value::Date {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micro,
            } => {
                let len: u8 = if *micro != 0 {
                    11
                } else if *hour != 0 || *minute != 0 || *second != 0 {
                    7
                } else if *year != 0 || *month != 0 || *day != 0 {
                    4
                } else {
                    0
                };
                out.push(len);
                if len >= 4 {
                    out.extend_from_slice(&year.to_le_bytes());
                    out.extend_from_slice(&[*month, *day]);
                }
                if len >= 7 {
                    out.extend_from_slice(&[*hour, *minute, *second]);
                }
                if len >= 11 {
                    out.extend_from_slice(&micro.to_le_bytes());
                }
            }
            Value::Time {
                negative,
                days,
                hours,
                minutes,
                seconds,
                micros,
            } => {
                let zero = *days == 0 && *hours == 0 && *minutes == 0 && *seconds == 0 && *micros == 0;
                let len: u8 = if *micros != 0 {
                    12
                } else if zero {
                    0
                } else {
                    8
                };
                out.push(len);
                if len >= 8 {
                    out.push(u8::from(*negative));
                    out.extend_from_slice(&days.to_le_bytes());
                    out.extend_from_slice(&[*hours, *minutes, *seconds]);
                }
                if len >= 12 {
                    out.extend_from_slice(&micros.to_le_bytes());
                }
            }
        }
    }
}

/// An integer in the width its column type has.
fn put_int(out: &mut Vec<u8>, t: u8, v: u64) {
    match t {
        0x01 => out.push(v as u8),
        0x02 | 0x0D => out.extend_from_slice(&(v as u16).to_le_bytes()),
        0x03 | 0x09 => out.extend_from_slice(&(v as u32).to_le_bytes()),
        0x08 => out.extend_from_slice(&v.to_le_bytes()),
        // An integer for a column of another type (an expression): as text.
        _ => put_lenenc_bytes(out, v.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(t: u8) -> Column {
        Column {
            name: "c".into(),
            table: String::new(),
            column_type: t,
            flags: 0,
            charset: 63,
            length: 0,
            decimals: 0,
        }
    }

    #[test]
    fn a_prepared_statement_keeps_what_its_text_says() {
        let mut s = Statements::default();
        let end = s.add("COMMIT".into(), vec![], vec![]).unwrap();
        let var = s
            .add("SELECT @a := ?".into(), vec![col(0xFD)], vec![col(0xFD)])
            .unwrap();
        let plain = s
            .add("SELECT c FROM t WHERE id = ?".into(), vec![col(0xFD)], vec![col(0xFD)])
            .unwrap();
        assert!(s.get(end).unwrap().facts.plain_end);
        assert_eq!(s.get(var).unwrap().facts.sticky, Some("user_variable"));
        let f = s.get(plain).unwrap().facts;
        assert_eq!(
            (f.plain_end, f.counter, f.sticky, f.controls_session),
            (false, None, None, false)
        );
    }

    #[test]
    fn an_execute_without_types_binds_with_the_ones_sent_before() {
        let mut s = Statements::default();
        let id = s.add("SELECT ?, ?".into(), vec![col(0xFD), col(0xFD)], vec![]).unwrap();
        // id, flags, iterations, null bitmap (second NULL), bound, types LONGLONG + STRING, values
        let mut body = id.to_le_bytes().to_vec();
        body.extend_from_slice(&[0, 1, 0, 0, 0, 0b10, 1, 0x08, 0, 0xFE, 0]);
        body.extend_from_slice(&42i64.to_le_bytes());
        let e = s.execute(&body).unwrap();
        assert_eq!((e.id, e.values), (id, vec![Value::Int(42), Value::Null]));
        let mut again = id.to_le_bytes().to_vec();
        again.extend_from_slice(&[0, 1, 0, 0, 0, 0b00, 0]);
        again.extend_from_slice(&7i64.to_le_bytes());
        again.extend_from_slice(&[2, b'h', b'i']);
        let e = s.execute(&again).unwrap();
        assert_eq!(
            (e.values, e.blob),
            (vec![Value::Int(7), Value::Text("hi".into())], vec![])
        );
    }

    #[test]
    fn bad_executes_are_errors_not_panics() {
        let mut s = Statements::default();
        let id = s.add("SELECT ?".into(), vec![col(0xFD)], vec![]).unwrap();
        for n in 0..16 {
            let mut body = id.to_le_bytes().to_vec();
            body.extend_from_slice(&[0, 1, 0, 0, 0, 0, 1, 0x0C, 0, 11, 1, 2, 3][..n.min(13)]);
            let _ = s.execute(&body);
        }
        assert_eq!(s.execute(&[9, 9, 9, 9]), Err(StmtError::Unknown(0x0909_0909)));
        assert!(s.long_data(&[1, 0, 0, 0, 5, 0, 1], 100).is_err(), "no parameter 5");
        assert_eq!(
            s.long_data(
                &id.to_le_bytes()
                    .iter()
                    .chain(&[0, 0])
                    .chain(&[7; 200])
                    .copied()
                    .collect::<Vec<_>>(),
                100
            ),
            Err(StmtError::LongDataTooLarge)
        );
    }

    #[test]
    fn statements_are_bounded() {
        let mut s = Statements::default();
        for i in 0..MAX_STATEMENTS {
            s.add(format!("SELECT {i}"), vec![], vec![]).unwrap();
        }
        assert_eq!(s.add("SELECT x".into(), vec![], vec![]), Err(StmtError::TooMany));
        s.close(1);
        assert!(s.add("SELECT x".into(), vec![], vec![]).is_ok());
    }

    #[test]
    fn definitions_count_against_the_bytes_too() {
        // A short text with a thousand wide columns: its definitions are what costs.
        let wide: Vec<Column> = (0..1000)
            .map(|i| Column {
                name: format!("a_rather_long_column_name_{i}"),
                table: "a_table_with_a_long_name".into(),
                ..col(0xFD)
            })
            .collect();
        let mut s = Statements::default();
        let mut kept = 0;
        while s.add(format!("SELECT * FROM w{kept}"), vec![], wide.clone()).is_ok() {
            kept += 1;
        }
        assert!(kept < 200, "bounded by bytes, not only by count: {kept}");
        assert!(s.bytes() <= MAX_TEXT_BYTES, "{}", s.bytes());
        let before = s.bytes();
        s.close(1);
        assert!(s.bytes() < before, "a close gives its bytes back");
        assert!(s.add("SELECT 1".into(), vec![], wide).is_ok());
    }

    #[test]
    fn binary_rows_put_nulls_in_the_bitmap_and_ints_in_their_width() {
        let mut out = Vec::new();
        binary_row(
            &mut out,
            &[col(0x01), col(0x03), col(0xFD)],
            &[Value::Int(-1), Value::Null, Value::Bytes(b"ab".to_vec())],
        );
        assert_eq!(out, vec![0x00, 0b1000, 0xFF, 2, b'a', b'b']);
    }
}

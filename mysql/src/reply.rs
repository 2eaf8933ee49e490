//! What the MySQL front end writes: OK, ERR, EOF, column definitions and text rows, and
//! the table from Osprey's own error codes to MySQL error numbers (docs/MYSQL.md).

use osprey_protocol::{Column, ErrorBody, ErrorCode, Origin, Value};

use crate::codec::{put_lenenc_bytes, put_lenenc_int};

pub const SERVER_STATUS_IN_TRANS: u16 = 0x0001;
pub const SERVER_STATUS_AUTOCOMMIT: u16 = 0x0002;

/// OK: affected rows, last insert id, status, warnings (`header` 0x00, or 0xFE where it
/// ends a result set under DEPRECATE_EOF).
pub fn ok(header: u8, affected: u64, last_insert_id: u64, status: u16, warnings: u16) -> Vec<u8> {
    let mut p = vec![header];
    put_lenenc_int(&mut p, affected);
    put_lenenc_int(&mut p, last_insert_id);
    p.extend_from_slice(&status.to_le_bytes());
    p.extend_from_slice(&warnings.to_le_bytes());
    p
}

/// [`ok`] with the server's message after it (e.g. `Rows matched: 1  Changed: 1`).
pub fn ok_info(affected: u64, last_insert_id: u64, status: u16, warnings: u16, info: &str) -> Vec<u8> {
    let mut p = ok(0x00, affected, last_insert_id, status, warnings);
    if !info.is_empty() {
        // Length-encoded, as servers write it (and as libmysql and Connector/C read it).
        put_lenenc_bytes(&mut p, info.as_bytes());
    }
    p
}

/// `Rows matched: N` of an UPDATE's message: the affected rows a client that asked for
/// `CLIENT_FOUND_ROWS` gets.
pub fn rows_matched(info: &str) -> Option<u64> {
    let rest = info.strip_prefix("Rows matched: ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// What ends a result set's rows: an OK with the 0xFE header when the client negotiated
/// `CLIENT_DEPRECATE_EOF`, else the classic EOF.
pub fn terminator(deprecate_eof: bool, status: u16, warnings: u16) -> Vec<u8> {
    if deprecate_eof {
        ok(0xFE, 0, 0, status, warnings)
    } else {
        eof(status, warnings)
    }
}

/// The classic EOF packet.
pub fn eof(status: u16, warnings: u16) -> Vec<u8> {
    let mut p = vec![0xFE];
    p.extend_from_slice(&warnings.to_le_bytes());
    p.extend_from_slice(&status.to_le_bytes());
    p
}

/// ERR with its number, SQLSTATE (5 characters) and message.
pub fn err(errno: u16, sqlstate: &str, message: &str) -> Vec<u8> {
    let mut p = vec![0xFF];
    p.extend_from_slice(&errno.to_le_bytes());
    p.push(b'#');
    let state = sqlstate.as_bytes();
    p.extend((0..5).map(|i| state.get(i).copied().unwrap_or(b'0')));
    // Bounded: a message is for people, and a packet must stay small.
    let msg = message.as_bytes();
    p.extend_from_slice(&msg[..msg.len().min(4000)]);
    p
}

/// An ERR sent instead of the greeting (too many connections): the client has not said
/// yet that it speaks protocol 4.1, so, as a server does, no SQLSTATE (a 4.1 client would
/// otherwise show `#08004` as part of the message).
pub fn err_before_greeting(errno: u16, message: &str) -> Vec<u8> {
    let mut p = vec![0xFF];
    p.extend_from_slice(&errno.to_le_bytes());
    let msg = message.as_bytes();
    p.extend_from_slice(&msg[..msg.len().min(4000)]);
    p
}

/// A column definition (protocol 4.1).
pub fn column(c: &Column) -> Vec<u8> {
    let mut p = Vec::with_capacity(48 + 2 * (c.name.len() + c.table.len()));
    put_lenenc_bytes(&mut p, b"def");
    put_lenenc_bytes(&mut p, b"");
    put_lenenc_bytes(&mut p, c.table.as_bytes());
    put_lenenc_bytes(&mut p, c.table.as_bytes());
    put_lenenc_bytes(&mut p, c.name.as_bytes());
    put_lenenc_bytes(&mut p, c.name.as_bytes());
    p.push(0x0C);
    p.extend_from_slice(&c.charset.to_le_bytes());
    p.extend_from_slice(&c.length.to_le_bytes());
    p.push(c.column_type);
    p.extend_from_slice(&c.flags.to_le_bytes());
    p.push(c.decimals);
    p.extend_from_slice(&[0, 0]);
    p
}

/// A text-protocol row. The workers send each value as the server's own text
/// (`REQUEST.text_rows`), so it goes out byte for byte; a typed value (from an older
/// worker) is written as MySQL writes it.
pub fn text_row(out: &mut Vec<u8>, row: &[Value]) {
    for v in row {
        match v {
            Value::Null => out.push(0xFB),
            Value::Bytes(b) | Value::Bit(b) => put_lenenc_bytes(out, b),
            Value::Text(s) | Value::Decimal(s) | Value::Json(s) => put_lenenc_bytes(out, s.as_bytes()),
            Value::Int(i) => put_lenenc_bytes(out, i.to_string().as_bytes()),
            Value::UInt(u) => put_lenenc_bytes(out, u.to_string().as_bytes()),
            Value::Float(f) => put_lenenc_bytes(out, f.to_string().as_bytes()),
            Value::Double(d) => put_lenenc_bytes(out, d.to_string().as_bytes()),
            Value::Date {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micro,
            } => {
                let mut s = format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}");
                if *micro > 0 {
                    s.push_str(&format!(".{micro:06}"));
                }
                put_lenenc_bytes(out, s.as_bytes())
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
                if *micros > 0 {
                    s.push_str(&format!(".{micros:06}"));
                }
                put_lenenc_bytes(out, s.as_bytes())
            }
        }
    }
}

/// Errors of Osprey's own, by what a MySQL client should make of them.
pub const ER_CON_COUNT: u16 = 1040;
pub const ER_QUERY_INTERRUPTED: u16 = 1317;
pub const ER_NOT_SUPPORTED_YET: u16 = 1235;
pub const ER_UNKNOWN_ERROR: u16 = 1105;
pub const ER_UNKNOWN_COM: u16 = 1047;
pub const ER_SERVER_SHUTDOWN: u16 = 1053;
pub const ER_CONNECTION_KILLED: u16 = 1927;
pub const ER_STATEMENT_TIMEOUT: u16 = 3024;
pub const ER_NET_PACKET_TOO_LARGE: u16 = 1153;
/// A statement whose digest is blocked (Osprey's reserved number).
pub const ER_OSPREY_BLOCKED: u16 = 9001;
/// Too many sessions (pinned clients) on the cluster's primary.
pub const ER_OSPREY_SESSION_LIMIT: u16 = 9002;

/// The MySQL error for an Osprey `ERROR`: a database's own error verbatim, Osprey's by the
/// table in docs/MYSQL.md.
pub fn error_of(e: &ErrorBody) -> (u16, String, String) {
    if let (Origin::Database, Some(errno)) = (e.origin, e.errno) {
        let state = e.sqlstate.clone().unwrap_or_else(|| "HY000".into());
        return (errno, state, e.message.clone());
    }
    if let Some(errno) = e.errno {
        // A worker's error that carries the server's number (a database error seen
        // through a refusal, e.g. a fatal one): keep it.
        return (
            errno,
            e.sqlstate.clone().unwrap_or_else(|| "HY000".into()),
            e.message.clone(),
        );
    }
    let msg = format!("osprey: {}", e.message);
    let (errno, state) = match e.code {
        ErrorCode::Throttled | ErrorCode::QueueFull | ErrorCode::QueueTimeout => (ER_CON_COUNT, "08004"),
        ErrorCode::SessionLimit => (ER_OSPREY_SESSION_LIMIT, "08004"),
        ErrorCode::SqlBlocked => (ER_OSPREY_BLOCKED, "HY000"),
        ErrorCode::RequestTimeout => (ER_STATEMENT_TIMEOUT, "HY000"),
        ErrorCode::Cancelled => (ER_QUERY_INTERRUPTED, "70100"),
        ErrorCode::ShuttingDown => (ER_SERVER_SHUTDOWN, "08S01"),
        ErrorCode::InvalidRequest | ErrorCode::BadUtf8 => (ER_NOT_SUPPORTED_YET, "42000"),
        ErrorCode::SessionAborted => (ER_CONNECTION_KILLED, "08S01"),
        ErrorCode::FrameTooLarge => (ER_NET_PACKET_TOO_LARGE, "08S01"),
        _ => (ER_UNKNOWN_ERROR, "HY000"),
    };
    (errno, state.to_string(), msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_errors_pass_verbatim_and_osprey_errors_map() {
        let mut db = ErrorBody::undispatched(Origin::Database, ErrorCode::Database, "Duplicate entry '1'");
        db.errno = Some(1062);
        db.sqlstate = Some("23000".into());
        assert_eq!(error_of(&db), (1062, "23000".into(), "Duplicate entry '1'".into()));
        let t = ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::Throttled, "slow down");
        assert_eq!(error_of(&t).0, 1040);
        let b = ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::SqlBlocked, "digest 1a2b");
        assert_eq!(error_of(&b).0, ER_OSPREY_BLOCKED);
        let p = err(1045, "28000", "Access denied");
        assert_eq!(err_before_greeting(1040, "Too many connections")[3], b'T');
        assert_eq!(&p[..4], &[0xFF, 0x15, 0x04, b'#']);
    }
}

//! The database side: connection options, the one session a worker holds, the short-lived
//! side connection that sends `KILL QUERY`, and which errors end the session.

use std::time::Duration;

use osprey_protocol::{Backend, BackendTls, SslMode};
use osprey_wire::{Error, Opts, Session, TlsOpts, Value};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot connect to {backend} within {timeout:?}")]
    ConnectTimeout { backend: String, timeout: Duration },
    #[error("cannot connect to {backend}: {source}")]
    Connect { backend: String, source: Error },
}

/// Options for the worker's session and for its side connections. `tls` absent or
/// `disabled`: plain TCP; `preferred` falls back to plain TCP on the same connection
/// when the server offers no TLS (osprey-wire does it, and logs it).
pub fn opts(b: &Backend, tls: Option<&BackendTls>, timeout: Duration) -> Opts {
    let mut opts = Opts::new(b.host.clone(), b.port, b.user.clone(), b.password.clone());
    opts.database = b.database.clone().filter(|d| !d.is_empty());
    opts.connect_timeout = timeout;
    opts.tls = tls.and_then(|t| {
        let mode = match t.mode {
            SslMode::Disabled => return None,
            SslMode::Preferred => osprey_wire::SslMode::Preferred,
            SslMode::Required => osprey_wire::SslMode::Required,
            SslMode::VerifyCa => osprey_wire::SslMode::VerifyCa,
            SslMode::VerifyIdentity => osprey_wire::SslMode::VerifyIdentity,
        };
        Some(TlsOpts {
            mode,
            ca_file: t.ca_file.as_ref().map(Into::into),
            server_name: t.server_name.clone(),
        })
    });
    opts
}

fn describe(b: &Backend) -> String {
    format!("{} ({}:{})", b.name, b.host, b.port)
}

/// Opens the worker's session; returns the options, for side connections.
pub async fn open(b: &Backend, tls: Option<&BackendTls>, timeout: Duration) -> Result<(Session, Opts), SessionError> {
    let opts = opts(b, tls, timeout);
    match Session::connect(&opts).await {
        Ok(s) => Ok((s, opts)),
        Err(Error::ConnectTimeout(_)) => Err(SessionError::ConnectTimeout {
            backend: describe(b),
            timeout,
        }),
        Err(source) => Err(SessionError::Connect {
            backend: describe(b),
            source,
        }),
    }
}

/// The rows of `sql` (text protocol), for the worker's own small queries.
pub async fn query_rows(session: &mut Session, sql: &str) -> Result<Vec<Vec<Value>>, Error> {
    session.send_query(sql)?;
    collect_rows(session).await
}

/// The rows of the oldest pending response (every result set's, in order).
async fn collect_rows(session: &mut Session) -> Result<Vec<Vec<Value>>, Error> {
    let mut rows = Vec::new();
    loop {
        match session.next_event().await? {
            osprey_wire::Event::Row(row) => {
                rows.push(row.unwrap_raw().into_iter().map(|v| v.unwrap_or(Value::NULL)).collect())
            }
            osprey_wire::Event::End {
                more_results: false, ..
            } => return Ok(rows),
            _ => {}
        }
    }
}

/// A text value as a string (`None` for NULL).
pub fn text(v: &Value) -> Option<String> {
    match v {
        Value::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::NULL => None,
        other => Some(other.as_sql(true)),
    }
}

/// Sends `KILL QUERY` for the worker's session from a short-lived connection.
#[derive(Debug)]
pub struct Killer {
    pub opts: Opts,
    pub conn_id: u32,
    pub timeout: Duration,
}

fn timed_out(what: &str) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

impl Killer {
    /// Sends one `KILL QUERY` on `side` (opened first if `None`; dropped again on an
    /// error, so the next call opens a fresh one), within `timeout`. With `query_id`,
    /// MariaDB's `KILL QUERY ID`: only that statement is stopped, never one pipelined
    /// behind it that starts meanwhile.
    pub async fn kill_query(&self, side: &mut Option<Session>, query_id: Option<u64>) -> Result<(), Error> {
        let sql = match query_id {
            Some(id) => format!("KILL QUERY ID {id}"),
            None => format!("KILL QUERY {}", self.conn_id),
        };
        let work = async {
            if side.is_none() {
                *side = Some(Session::connect(&self.opts).await?);
            }
            match side.as_mut() {
                Some(conn) => conn.query_drop(&sql).await.map(|_| ()),
                None => Ok(()),
            }
        };
        let r = match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(timed_out("KILL QUERY")),
        };
        if r.is_err() {
            *side = None;
        }
        r
    }

    /// The session's `COMMAND` in the processlist (`Query`, `Execute`, `Sleep`, or `Killed`
    /// once a kill is pending), with its state and statement, for the log; `None` if the
    /// side connection cannot tell.
    pub async fn command(&self, side: &mut Option<Session>) -> Option<(String, String)> {
        let conn = side.as_mut()?;
        let sql = format!(
            "SELECT COMMAND, CONCAT_WS(' / ', STATE, TIME_MS, LEFT(INFO, 60)) \
             FROM information_schema.PROCESSLIST WHERE ID = {}",
            self.conn_id
        );
        match tokio::time::timeout(self.timeout, query_rows(conn, &sql)).await {
            Ok(Ok(rows)) => match rows.first() {
                Some(row) => Some((
                    row.first().and_then(text).unwrap_or_default(),
                    row.get(1).and_then(text).unwrap_or_default(),
                )),
                None => Some(("gone".into(), String::new())),
            },
            Ok(Err(e)) => {
                if e.is_fatal() {
                    *side = None;
                }
                None
            }
            Err(_) => {
                *side = None;
                None
            }
        }
    }

    /// MariaDB's `QUERY_ID` of the session's statement whose text is exactly `sql`, as the
    /// processlist shows it now; `Ok(None)` when the session runs another statement (or
    /// none). Needs a side connection (opened if `None`).
    pub async fn query_id(&self, side: &mut Option<Session>, sql: &str) -> Result<Option<u64>, Error> {
        let work = async {
            if side.is_none() {
                *side = Some(Session::connect(&self.opts).await?);
            }
            let Some(conn) = side.as_mut() else {
                return Ok(None);
            };
            let stmt = conn
                .prepare("SELECT QUERY_ID FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO = ?")
                .await?;
            conn.send_execute(
                &stmt,
                &[
                    Value::UInt(u64::from(self.conn_id)),
                    Value::Bytes(sql.as_bytes().to_vec()),
                ],
            )?;
            let rows = collect_rows(conn).await?;
            Ok(rows.first().and_then(|r| r.first()).and_then(|v| match v {
                Value::Int(i) => u64::try_from(*i).ok(),
                Value::UInt(u) => Some(*u),
                Value::Bytes(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
                _ => None,
            }))
        };
        let r = match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(timed_out("the processlist query")),
        };
        if r.as_ref().is_err_and(|e| e.is_fatal()) {
            *side = None;
        }
        r
    }
}

/// Closes a side connection without waiting long for it.
pub async fn close_side(side: Option<Session>) {
    if let Some(conn) = side {
        let _ = tokio::time::timeout(Duration::from_secs(1), conn.quit()).await;
    }
}

/// `ER_QUERY_INTERRUPTED`: the statement was stopped by `KILL QUERY`.
pub const ER_QUERY_INTERRUPTED: u16 = 1317;
/// `ER_STATEMENT_TIMEOUT` (MariaDB): `max_statement_time` exceeded.
pub const ER_STATEMENT_TIMEOUT: u16 = 1969;

/// Server error numbers after which the session is gone or cannot be trusted.
const FATAL_SERVER_ERRORS: &[u16] = &[
    1040, // ER_CON_COUNT_ERROR
    1043, // ER_HANDSHAKE_ERROR
    1047, // ER_UNKNOWN_COM_ERROR (session out of step)
    1053, // ER_SERVER_SHUTDOWN
    1077, // ER_NORMAL_SHUTDOWN
    1079, // ER_SHUTDOWN_COMPLETE
    1080, // ER_FORCING_CLOSE
    1152, // ER_ABORTING_CONNECTION
    1153, // ER_NET_PACKET_TOO_LARGE (server closes the session)
    1154, // ER_NET_READ_ERROR_FROM_PIPE
    1155, // ER_NET_FCNTL_ERROR
    1156, // ER_NET_PACKETS_OUT_OF_ORDER
    1157, // ER_NET_UNCOMPRESS_ERROR
    1158, // ER_NET_READ_ERROR
    1159, // ER_NET_READ_INTERRUPTED
    1160, // ER_NET_ERROR_ON_WRITE
    1161, // ER_NET_WRITE_INTERRUPTED
    1184, // ER_NEW_ABORTING_CONNECTION
    1927, // ER_CONNECTION_KILLED
    2006, // CR_SERVER_GONE_ERROR
    2013, // CR_SERVER_LOST
    4031, // ER_CLIENT_INTERACTION_TIMEOUT
];

/// How an error from the session must be handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The server rejected the statement; the session is fine.
    Database,
    /// The session refused the command before sending anything (osprey-wire's
    /// `Error::Refused`): the session is fine and nothing ran.
    Rejected,
    /// The session is lost or unusable: answer, then exit.
    Fatal,
}

pub fn classify(e: &Error) -> ErrorClass {
    match e {
        Error::Server(s) if FATAL_SERVER_ERRORS.contains(&s.code) => ErrorClass::Fatal,
        Error::Server(_) => ErrorClass::Database,
        Error::Refused(_) => ErrorClass::Rejected,
        // I/O, protocol, TLS, authentication: osprey-wire has broken the session.
        _ => ErrorClass::Fatal,
    }
}

/// Adds `last_gtid` to the variables the server reports in OK packets when they change
/// (MariaDB 10.3+), keeping whatever the session tracked already (`*` tracks all). The
/// OK packet of a statement that committed then carries its GTID: read-your-writes at no
/// extra round trip. Session variables go back to the server's defaults on every session
/// reset, so this is sent again after each (`execute::reset_connection`).
pub const TRACK_LAST_GTID: &str = "SET SESSION session_track_system_variables = \
     IF(@@session.session_track_system_variables = '*' \
        OR FIND_IN_SET('last_gtid', @@session.session_track_system_variables), \
        @@session.session_track_system_variables, \
        CONCAT_WS(',', NULLIF(@@session.session_track_system_variables, ''), 'last_gtid'))";

/// Asks a MariaDB session to report `last_gtid` ([`TRACK_LAST_GTID`]). `false` (logged)
/// when the server refuses: the worker then serves without GTIDs in `END`.
pub async fn track_last_gtid(conn: &mut Session) -> Result<bool, Error> {
    match conn.query_drop(TRACK_LAST_GTID).await {
        Ok(_) => Ok(true),
        Err(Error::Server(e)) if !FATAL_SERVER_ERRORS.contains(&e.code) => {
            tracing::warn!(code = e.code, message = %e.message, "the server does not track last_gtid: no GTID in END");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use osprey_wire::ServerError;

    fn server(code: u16) -> Error {
        Error::Server(ServerError {
            code,
            message: String::new(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn classification() {
        assert_eq!(classify(&server(1064)), ErrorClass::Database);
        assert_eq!(classify(&server(1317)), ErrorClass::Database);
        assert_eq!(classify(&server(1927)), ErrorClass::Fatal);
        assert_eq!(classify(&server(4031)), ErrorClass::Fatal);
        assert_eq!(classify(&Error::Broken), ErrorClass::Fatal);
        assert_eq!(classify(&Error::Protocol("x".into())), ErrorClass::Fatal);
        assert_eq!(
            classify(&Error::Io(std::io::ErrorKind::UnexpectedEof.into())),
            ErrorClass::Fatal
        );
        assert_eq!(classify(&Error::Refused("x".into())), ErrorClass::Rejected);
    }
}

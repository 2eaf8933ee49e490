//! The database side: connection options, the one session a worker holds, the short-lived
//! side connection that sends `KILL QUERY`, and which errors end the session.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, DriverError, Opts, OptsBuilder, SslOpts};
use osprey_protocol::{Backend, BackendTls, SslMode};

/// The driver's own packet limit, in both directions: the protocol's maximum (1 GiB), so
/// that it never refuses a row the server sends (the driver closes its connection on any
/// error of its own). What the server accepts is the server's `max_allowed_packet`,
/// read at connect and checked before sending (`execute::preflight`). Given here so that
/// connecting costs no extra query.
const MAX_ALLOWED_PACKET: usize = 1024 * 1024 * 1024;
/// `wait_timeout` the client assumes (server default; only informs the driver).
const WAIT_TIMEOUT: usize = 28_800;
const STMT_CACHE_SIZE: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot connect to {backend} within {timeout:?}")]
    ConnectTimeout { backend: String, timeout: Duration },
    #[error("cannot connect to {backend}: {source}")]
    Connect {
        backend: String,
        source: mysql_async::Error,
    },
}

/// Options for the worker's session and for its side connections. `tls` absent or
/// `disabled`: plain TCP; `preferred` asks for TLS here, and [`open`] falls back.
pub fn opts(b: &Backend, tls: Option<&BackendTls>) -> Opts {
    let builder = OptsBuilder::default()
        .ip_or_hostname(b.host.clone())
        .tcp_port(b.port)
        .user(Some(b.user.clone()))
        .pass(Some(b.password.clone()))
        .db_name(b.database.clone())
        .prefer_socket(false)
        .max_allowed_packet(Some(MAX_ALLOWED_PACKET))
        .wait_timeout(Some(WAIT_TIMEOUT))
        .stmt_cache_size(STMT_CACHE_SIZE)
        .local_infile_handler(Some(NoFiles));
    builder.ssl_opts(tls.and_then(ssl_opts)).into()
}

fn ssl_opts(tls: &BackendTls) -> Option<SslOpts> {
    let verified = |ssl: SslOpts| match &tls.ca_file {
        // A CA given is the only one trusted; else the built-in public roots.
        Some(ca) => ssl
            .with_root_certs(vec![std::path::PathBuf::from(ca).into()])
            .with_disable_built_in_roots(true),
        None => ssl,
    };
    match tls.mode {
        SslMode::Disabled => None,
        // Encryption against a passive listener only, as MySQL's PREFERRED and REQUIRED.
        SslMode::Preferred | SslMode::Required => Some(SslOpts::default().with_danger_accept_invalid_certs(true)),
        SslMode::VerifyCa => Some(verified(SslOpts::default()).with_danger_skip_domain_validation(true)),
        SslMode::VerifyIdentity => {
            Some(verified(SslOpts::default()).with_danger_tls_hostname_override(tls.server_name.clone()))
        }
    }
}

/// Opens the worker's session; returns the options that worked, for side connections.
/// Under `preferred`, a server that offers no TLS gets a second, plain connection.
pub async fn open(b: &Backend, tls: Option<&BackendTls>, timeout: Duration) -> Result<(Conn, Opts), SessionError> {
    let opts = opts(b, tls);
    match connect(b, &opts, timeout).await {
        Err(SessionError::Connect {
            source: mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer),
            ..
        }) if tls.is_some_and(|t| t.mode == SslMode::Preferred) => {
            tracing::warn!(backend = %describe(b), "ssl_mode preferred: the database offers no TLS; connecting in clear");
            let plain = self::opts(b, None);
            let conn = connect(b, &plain, timeout).await?;
            Ok((conn, plain))
        }
        r => r.map(|conn| (conn, opts)),
    }
}

/// Answers a server's LOCAL INFILE request with an empty file. Such statements are
/// refused before they are sent (`osprey_sql::loads_local_file`); this is the net for one
/// the scan could miss: without a handler the driver fails the request and closes the
/// session, with this one the server loads nothing and the session stays.
struct NoFiles;

impl mysql_async::prelude::GlobalHandler for NoFiles {
    fn handle(
        &self,
        _file_name: &[u8],
    ) -> futures::future::BoxFuture<'static, Result<mysql_async::InfileData, mysql_async::LocalInfileError>> {
        Box::pin(async {
            let empty: mysql_async::InfileData = Box::pin(futures::stream::empty());
            Ok(empty)
        })
    }
}

fn describe(b: &Backend) -> String {
    format!("{} ({}:{})", b.name, b.host, b.port)
}

/// Opens a connection within `timeout`.
pub async fn connect(b: &Backend, opts: &Opts, timeout: Duration) -> Result<Conn, SessionError> {
    match tokio::time::timeout(timeout, Conn::new(opts.clone())).await {
        Err(_) => Err(SessionError::ConnectTimeout {
            backend: describe(b),
            timeout,
        }),
        Ok(Err(source)) => Err(SessionError::Connect {
            backend: describe(b),
            source,
        }),
        Ok(Ok(conn)) => Ok(conn),
    }
}

/// Sends `KILL QUERY <id>` for the worker's session from a short-lived connection.
#[derive(Debug)]
pub struct Killer {
    pub opts: Opts,
    pub conn_id: u32,
    pub timeout: Duration,
}

impl Killer {
    /// Sends one `KILL QUERY` on `side` (opened first if `None`; dropped again on an
    /// error, so the next call opens a fresh one), within `timeout`.
    pub async fn kill_query(&self, side: &mut Option<Conn>) -> Result<(), mysql_async::Error> {
        let work = async {
            if side.is_none() {
                *side = Some(Conn::new(self.opts.clone()).await?);
            }
            match side.as_mut() {
                Some(conn) => conn.query_drop(format!("KILL QUERY {}", self.conn_id)).await,
                None => Ok(()),
            }
        };
        let r = match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(mysql_async::Error::Other("KILL QUERY timed out".into())),
        };
        if r.is_err() {
            *side = None;
        }
        r
    }
}

impl Killer {
    /// The session's `COMMAND` in the processlist (`Query`, `Execute`, `Sleep`, or `Killed`
    /// once a kill is pending), with its state and statement, for the log; `None` if the
    /// side connection cannot tell.
    pub async fn command(&self, side: &mut Option<Conn>) -> Option<(String, String)> {
        let conn = side.as_mut()?;
        let sql = "SELECT COMMAND, CONCAT_WS(' / ', STATE, TIME_MS, LEFT(INFO, 60)) \
                   FROM information_schema.PROCESSLIST WHERE ID = ?";
        let work = conn.exec_first::<(String, Option<String>), _, _>(sql, (self.conn_id,));
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(Some((command, detail)))) => Some((command, detail.unwrap_or_default())),
            Ok(Ok(None)) => Some(("gone".into(), String::new())),
            _ => None,
        }
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
    /// The driver refused the request before executing it (named and positional
    /// parameters mixed: found before any command, so the session is fine and nothing ran).
    Rejected,
    /// The session is lost or unusable: answer, then exit.
    Fatal,
}

pub fn classify(e: &mysql_async::Error) -> ErrorClass {
    use mysql_async::{DriverError as D, Error as E};
    match e {
        E::Server(s) if FATAL_SERVER_ERRORS.contains(&s.code) => ErrorClass::Fatal,
        E::Server(_) => ErrorClass::Database,
        // Every other driver error comes from inside a command, after which the driver
        // has closed the connection (`Conn::routine`): a wrong parameter count included,
        // which is why `execute::preflight` and the prepared count keep it from happening.
        E::Driver(D::MixedParams) => ErrorClass::Rejected,
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
pub async fn track_last_gtid(conn: &mut Conn) -> Result<bool, mysql_async::Error> {
    match conn.query_drop(TRACK_LAST_GTID).await {
        Ok(()) => Ok(true),
        Err(mysql_async::Error::Server(e)) => {
            tracing::warn!(code = e.code, message = %e.message, "the server does not track last_gtid: no GTID in END");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::{DriverError, Error, ServerError};

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
        assert_eq!(
            classify(&Error::Driver(DriverError::ConnectionClosed)),
            ErrorClass::Fatal
        );
        assert_eq!(
            classify(&Error::Driver(DriverError::StmtParamsMismatch {
                required: 1,
                supplied: 2
            })),
            ErrorClass::Fatal,
            "the driver closed its connection"
        );
        assert_eq!(classify(&Error::Driver(DriverError::MixedParams)), ErrorClass::Rejected);
    }
}

//! Typed frame bodies. Each is a MessagePack map with the field names shown
//! (encoded with `rmp_serde::to_vec_named`). Unknown fields are ignored, so a
//! minor version may add fields; `Option` fields may be absent or nil.

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{ErrorCode, Origin, ProtocolError};
use crate::value::Value;

/// Role announced in `HELLO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Client,
    Worker,
    /// A role string this peer does not know: the dispatcher refuses it with
    /// `AUTH_FAILED` (as any wrong role), not as a malformed body. Never sent deliberately.
    Unknown,
}

/// A `str` only (section 4): serde's derive would also take a `bin` holding the name.
impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
        Ok(match text(d, "role")?.as_str() {
            "client" => Role::Client,
            "worker" => Role::Worker,
            _ => Role::Unknown,
        })
    }
}

/// The `str` of the field `name` (section 4: text is `str`). serde's `String` would also
/// take a `bin` of UTF-8, so that a token or a role sent as bytes passed.
fn text<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<String, D::Error> {
    struct V(&'static str);
    impl<'de> de::Visitor<'de> for V {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "`{}` as a MessagePack str", self.0)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
    }
    d.deserialize_string(V(name))
}

/// [`text`] of an optional field: absent or nil is `None`.
fn optional_text<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<Option<String>, D::Error> {
    struct V(&'static str);
    impl<'de> de::Visitor<'de> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "`{}` as a MessagePack str or nil", self.0)
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            text(d, self.0).map(Some)
        }
    }
    d.deserialize_option(V(name))
}

/// Optional texts a client sends, each checked to be a `str` with its name in the error.
macro_rules! texts {
    ($($f:ident = $name:literal),* $(,)?) => {$(
        fn $f<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
            optional_text(d, $name)
        }
    )*};
}
texts!(
    token_text = "token",
    secret_text = "secret",
    name_text = "name",
    cluster_text = "cluster",
    causal_gtid_text = "causal_gtid",
    schema_text = "schema",
);

/// `HELLO` (stream 0), the first frame a connecting peer sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Hello {
    pub version_major: u16,
    pub version_minor: u16,
    pub role: Role,
    /// Client credential (role `client`).
    #[serde(default, deserialize_with = "token_text")]
    pub token: Option<String>,
    /// Per-boot worker secret (role `worker`).
    #[serde(default, deserialize_with = "secret_text")]
    pub secret: Option<String>,
    /// Slot the worker was spawned for (role `worker`).
    #[serde(default)]
    pub slot: Option<u32>,
    /// Process id of the peer.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Free-form name for logs and the admin view.
    #[serde(default, deserialize_with = "name_text")]
    pub name: Option<String>,
    /// Role `client`: asks for per-stream flow control with this initial window, in data
    /// frames (`COLUMNS`/`ROWS`) per stream. Absent or 0: no flow control.
    #[serde(default)]
    pub stream_window: Option<u32>,
}

/// Refuses a major version other than [`crate::PROTOCOL_MAJOR`]; any minor version is fine.
fn check_major(major: u16, minor: u16) -> Result<(), ProtocolError> {
    if major == crate::PROTOCOL_MAJOR {
        Ok(())
    } else {
        Err(ProtocolError::UnsupportedVersion { major, minor })
    }
}

impl Hello {
    /// The receiver's version check: a `HELLO` with any major version decodes, and the
    /// dispatcher refuses one it does not speak with `ERROR UNSUPPORTED_VERSION` on stream 0.
    pub fn check_version(&self) -> Result<(), ProtocolError> {
        check_major(self.version_major, self.version_minor)
    }
}

/// Database endpoint a worker must connect to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Backend {
    /// Name of the backend in the dispatcher's config (e.g. `primary`).
    pub name: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    #[serde(default)]
    pub database: Option<String>,
}

/// TLS from a worker to the database, named after MySQL's `--ssl-mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SslMode {
    /// Plain TCP.
    #[default]
    Disabled,
    /// TLS when the server offers it (certificate not checked), else plain TCP.
    Preferred,
    /// TLS or no connection; the certificate is not checked.
    Required,
    /// TLS, and the certificate must chain to the CA; its name is not checked.
    VerifyCa,
    /// As `verify_ca`, and the certificate must be valid for the server name.
    VerifyIdentity,
}

/// `WorkerSettings.backend_tls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendTls {
    pub mode: SslMode,
    /// PEM CA file the worker reads (verify modes). Absent: built-in public roots.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// Name checked under `verify_identity`. Absent: the backend's `host`.
    #[serde(default)]
    pub server_name: Option<String>,
}

/// When a worker resets its database session between requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionReset {
    /// After a request whose text may leave session state behind (`SET`, `@var`, `USE`,
    /// temporary tables, ...); plain requests keep the session and its statement cache.
    #[default]
    Auto,
    /// After every request that ran on the database, whatever its text: what the text
    /// scan cannot see (a stored function or trigger setting variables, quoting under
    /// `NO_BACKSLASH_ESCAPES`/`ANSI_QUOTES`) cannot leak either. Costs the reset's round
    /// trips and the statement cache on every request.
    Always,
}

/// Settings the dispatcher hands to a worker in its `HELLO_ACK`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct WorkerSettings {
    pub backend: Backend,
    /// Ask to retire after this many requests (0 = never).
    pub max_requests: u64,
    /// Ask to retire after this age in milliseconds (0 = never).
    pub max_age_ms: u64,
    /// Flush a `ROWS` frame when it holds this many rows ...
    pub batch_rows: u32,
    /// ... or this many bytes of values, whichever comes first.
    pub batch_bytes: u32,
    /// Timeout for connecting to the database, milliseconds.
    pub connect_timeout_ms: u64,
    /// When to reset the database session between requests (absent: `auto`).
    #[serde(default)]
    pub session_reset: SessionReset,
    /// TLS to the database (absent: plain TCP). Not sent when disabled, so a worker that
    /// predates it decodes the settings unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_tls: Option<BackendTls>,
}

/// `HELLO_ACK` (stream 0): the dispatcher accepts the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct HelloAck {
    pub version_major: u16,
    pub version_minor: u16,
    /// Server software name and version.
    pub server: String,
    /// Connection id, for logs and the admin view.
    pub connection_id: u64,
    /// Largest payload the dispatcher accepts.
    pub max_payload: u32,
    /// Largest number of concurrently open streams (clients).
    pub max_streams: u32,
    /// The peer should send something at least this often (milliseconds).
    pub keepalive_interval_ms: u64,
    /// Worker settings (role `worker` only).
    #[serde(default)]
    pub worker: Option<WorkerSettings>,
    /// The per-stream window the dispatcher applies (at most the one asked for in `HELLO`);
    /// 0 (or absent, from a dispatcher without flow control): none, send no `WINDOW`.
    #[serde(default)]
    pub stream_window: u32,
}

impl HelloAck {
    /// The connecting peer's check of the dispatcher's answer (same rule as [`Hello::check_version`]).
    pub fn check_version(&self) -> Result<(), ProtocolError> {
        check_major(self.version_major, self.version_minor)
    }
}

/// `PING` / `PONG` (stream 0). A `PONG` echoes the nonce of the `PING` it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Ping {
    pub nonce: u64,
}

/// `GOAWAY` (stream 0): no new streams on this connection; open ones finish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct GoAway {
    pub code: ErrorCode,
    pub message: String,
}

/// `QUIT_REQUEST` (stream 0): a worker asks to retire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct QuitRequest {
    /// `max_requests`, `max_age` or `shutdown`.
    pub reason: String,
    pub requests_served: u64,
    pub age_ms: u64,
}

/// `QUIT_NOW` (stream 0): the dispatcher lets the worker exit. Empty map.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct QuitNow {}

/// `STARTED` (a stream, worker to dispatcher, 1.4): the worker is about to send the
/// stream's statement to its database while the `END` of an earlier stream is still to
/// come (pipelining). Empty map.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Started {}

impl Started {
    /// Its body as serde writes it (an empty map, `0x80`), not encoded again for every
    /// request a worker starts.
    pub const BODY: &'static [u8] = &[0x80];
}

/// `READY` (stream 0, worker to dispatcher): the worker's database session is open.
/// Only a ready worker is given requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Ready {
    /// The database session's connection id (`CONNECTION_ID()`), used for `KILL QUERY`.
    pub db_connection_id: u32,
    /// The database server's version string.
    pub server_version: String,
}

/// `CANCEL` (on the stream to abort).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Cancel {
    #[serde(default)]
    pub reason: String,
}

/// `WINDOW` (client → dispatcher, on an open stream): the dispatcher may send `increment`
/// more data frames (`COLUMNS`, `ROWS`, `RESULT_END`, `RAW_ROWS`) on this stream. `ERROR` and `END` never need
/// credit. A `WINDOW` for a stream that is no longer open is ignored (it crossed `END`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Window {
    pub increment: u32,
}

/// One statement of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Statement {
    #[serde(deserialize_with = "utf8_text")]
    pub sql: String,
    #[serde(default)]
    pub params: Vec<Value>,
}

/// `REQUEST`: opens a stream. Either `sql` (one statement, with `params` bound
/// positionally to `?` placeholders) or a non-empty `batch` (run in one
/// transaction, all or nothing), not both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Request {
    #[serde(default, deserialize_with = "utf8_text")]
    pub sql: String,
    #[serde(default)]
    pub params: Vec<Value>,
    #[serde(default)]
    pub batch: Vec<Statement>,
    /// The caller says this is a read; it may go to a replica outside a transaction.
    #[serde(default)]
    pub read_only: bool,
    /// Safe to run twice: the SDK may resend it after an unknown outcome.
    #[serde(default)]
    pub idempotent: bool,
    /// Route to the primary whatever the read/write split says.
    #[serde(default)]
    pub force_primary: bool,
    /// Per-request timeout in milliseconds (0 = the dispatcher's `request_timeout`).
    #[serde(default)]
    pub timeout_ms: u64,
    /// The cluster to run on (absent: the dispatcher's first cluster). Protocol 1.2.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "cluster_text")]
    pub cluster: Option<String>,
    /// Read-your-writes (protocol 1.3): the request must see at least this MariaDB GTID
    /// position (`domain-server-seq`, comma-separated per domain; see [`crate::GtidPos`]),
    /// typically the newest `END.gtid` the client received for this cluster. The
    /// dispatcher routes such a read only to a replica known to have applied it, or to
    /// the primary; it never reaches the database. A dispatcher before 1.3 ignores it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "causal_gtid_text"
    )]
    pub causal_gtid: Option<String>,
    /// Opens a session on this stream (protocol 1.5): no `sql` or `batch`; `cluster`,
    /// `read_only` (a read-only session may pin a replica's worker) and `causal_gtid` (that
    /// replica must have applied it) apply. The stream stays open for the session's life:
    /// `SESSION` when a worker is pinned, then `END` after the client's `CANCEL` closes it,
    /// or `ERROR SESSION_ABORTED` + `END`. `timeout_ms`: the longest wait for a worker
    /// (0: `sessions.open_timeout_ms`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub open_session: bool,
    /// Runs this request in the session opened on that stream id of this connection
    /// (protocol 1.5), on its pinned worker: transaction control, table locks and session
    /// state are allowed there. `cluster`, `read_only`, `force_primary` and `causal_gtid`
    /// are ignored (the session's worker decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u32>,
    /// Rows as the server's text protocol carries them (protocol 1.6): a request without
    /// `params` answers every value as `Bytes` (or nil), the server's own text, unparsed.
    /// For front ends that hand the text on (the MySQL front end).
    #[serde(default, skip_serializing_if = "is_false")]
    pub text_rows: bool,
    /// Run as a prepared statement (protocol 1.6): the binary protocol and typed values
    /// even without `params` (a front end whose client prepared the statement).
    #[serde(default, skip_serializing_if = "is_false")]
    pub prepared: bool,
    /// Parameters (by index) bound as `MYSQL_TYPE_BLOB`, binary, instead of a string
    /// (protocol 1.6): `Bytes` parameters a MySQL client bound as a BLOB.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blob_params: Vec<u16>,
    /// Describe, do not run (protocol 1.6): the worker prepares `sql` and answers its
    /// parameters' definitions (`COLUMNS` result set 0) and its result's columns (`COLUMNS`
    /// result set 1, none for a statement without rows), then `END`. No `params`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub prepare_only: bool,
    /// Each result apart (protocol 1.7): when the statement(s) give several results
    /// (several statements in `sql`, a `CALL`), each but the last ends with a
    /// `RESULT_END` carrying its own counters, and `END` carries the last one's instead of
    /// sums. Not with `batch`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub multi_results: bool,
    /// Rows as the database sent them (protocol 1.8): each result set's rows come in
    /// `RAW_ROWS` frames holding the row packets' payloads, undecoded, instead of `ROWS`:
    /// the text protocol's rows for a statement run without parameters that is not
    /// `prepared`, the binary protocol's otherwise. For a front end that speaks that
    /// protocol to its own clients and hands the rows on (the MySQL front end). A peer
    /// before 1.8 answers `ROWS`: the asker takes those too.
    #[serde(default, skip_serializing_if = "is_false")]
    pub raw_rows: bool,
    /// The default database the request runs in (protocol 1.6; absent: the backend's
    /// configured one). The worker changes its session's database first if it differs.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "schema_text")]
    pub schema: Option<String>,
    /// Session variables the request runs under (protocol 1.6), `[name, value]` pairs in
    /// order: each name one of the tracked variables (docs/PROTOCOL.md), each value a plain
    /// literal; `names` is `SET NAMES`. The worker applies what its session lacks first
    /// (a session that has others is reset); anything else is `INVALID_REQUEST`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vars: Vec<(String, String)>,
    /// Not on the wire: the SDK's per-request choice of read-your-writes (`None`: its
    /// `ClientConfig::read_your_writes`). It decides whether the SDK fills `causal_gtid`.
    #[serde(skip)]
    pub read_your_writes: Option<bool>,
}

/// The most parameters one statement may have: MySQL's prepared statements count them
/// in 16 bits.
pub const MAX_PARAMS: usize = 65_535;

impl Request {
    /// A single statement without parameters.
    pub fn sql(sql: impl Into<String>) -> Request {
        Request {
            sql: sql.into(),
            ..Default::default()
        }
    }

    /// Checks the shape rules, `causal_gtid` ([`crate::GtidPos::parse`]) and every
    /// parameter ([`Value::check_param`], at most [`MAX_PARAMS`] per statement); the
    /// message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(gtid) = &self.causal_gtid {
            crate::GtidPos::parse(gtid).map_err(|e| format!("causal_gtid: {e}"))?;
        }
        if self.open_session {
            return match (
                self.sql.is_empty() && self.batch.is_empty() && self.params.is_empty(),
                self.session,
            ) {
                (_, Some(_)) => Err("open_session and session together: a session is opened on its own stream".into()),
                (false, None) => Err("open_session takes no sql, batch or params: send them in the session".into()),
                (true, None) => Ok(()),
            };
        }
        if self.session.is_some() && !self.batch.is_empty() {
            return Err(
                "a batch cannot run in a session (it is a transaction of its own): send its statements one by one"
                    .into(),
            );
        }
        if self.multi_results && !self.batch.is_empty() {
            return Err("multi_results is for sql, not a batch (whose statements are one transaction)".into());
        }
        if self.session == Some(0) {
            return Err("session 0: a session is named by the id of the stream that opened it".into());
        }
        match (self.sql.is_empty(), self.batch.is_empty()) {
            (true, true) => Err("request has neither sql nor batch".into()),
            (false, false) => Err("request has both sql and batch".into()),
            (true, false) if self.batch.iter().any(|s| s.sql.trim().is_empty()) => {
                Err("a batch statement has empty sql".into())
            }
            (false, true) if self.sql.trim().is_empty() => Err("sql is blank".into()),
            _ if !self.batch.is_empty() && !self.params.is_empty() => Err("params go inside batch statements".into()),
            _ => {
                let statements = std::iter::once(self.params.as_slice())
                    .chain(self.batch.iter().map(|s| s.params.as_slice()))
                    .enumerate();
                for (i, params) in statements {
                    let which = || match i {
                        0 => String::new(),
                        n => format!("batch statement {}: ", n - 1),
                    };
                    if params.len() > MAX_PARAMS {
                        return Err(format!(
                            "{}{} parameters; a statement takes at most {MAX_PARAMS}",
                            which(),
                            params.len()
                        ));
                    }
                    for (j, p) in params.iter().enumerate() {
                        p.check_param().map_err(|e| format!("{}parameter {j}: {e}", which()))?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Metadata of one column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Column {
    pub name: String,
    #[serde(default)]
    pub table: String,
    /// MySQL column type code (`MYSQL_TYPE_*`, e.g. 3 = LONG, 246 = NEWDECIMAL, 252 = BLOB).
    pub column_type: u8,
    /// MySQL column flags (e.g. 32 = UNSIGNED, 128 = BINARY, 1 = NOT NULL).
    pub flags: u16,
    /// Character set id (63 = binary).
    pub charset: u16,
    /// Declared display length.
    pub length: u32,
    pub decimals: u8,
}

/// `COLUMNS`: starts a result set. A stream may carry several result sets
/// (a batch), each a `COLUMNS` followed by zero or more `ROWS`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Columns {
    /// 0-based index of the result set within the stream.
    pub result_set: u32,
    pub columns: Vec<Column>,
}

/// `ROWS`: a batch of rows of the current result set, each as many values as columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Rows {
    pub rows: Vec<Vec<Value>>,
}

/// `END`: terminal frame. After a success it carries the summary; after an `ERROR`
/// it carries zeros and closes the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct End {
    /// Sum of affected rows over the statements.
    pub affected_rows: u64,
    /// Last insert id of the last statement that produced one.
    #[serde(default)]
    pub last_insert_id: Option<u64>,
    pub warnings: u32,
    /// Rows sent in `ROWS` frames.
    pub rows: u64,
    /// Time the statement(s) took on the worker, microseconds.
    pub server_time_us: u64,
    /// Time the request waited for a worker in the dispatcher, microseconds.
    pub queue_time_us: u64,
    /// The MariaDB GTID position of the request's last write (`domain-server-seq`, or a
    /// comma-separated list when it wrote in several domains): what a later read must
    /// see to see this request's writes. Absent when the request committed nothing (a
    /// read, a write that changed no row, an error) or the server does not report it.
    /// Protocol 1.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
    /// In a session (protocol 1.5): a transaction is open on the session after this
    /// request (the server's `SERVER_STATUS_IN_TRANS`). Absent: false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_transaction: bool,
    /// The server's message in the OK packet of the request's last statement (protocol
    /// 1.6), e.g. `Rows matched: 2  Changed: 1  Warnings: 0`. Absent when it gave none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<String>,
    /// Whether autocommit was on after the request's last statement (protocol 1.8: the
    /// server's `SERVER_STATUS_AUTOCOMMIT`). In a session it follows what the statements
    /// did (`SET autocommit = 0` among several statements); outside one it is always on.
    /// Absent: not known (an older worker, or no statement ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autocommit: Option<bool>,
}

/// `RESULT_END` (worker → dispatcher → client, protocol 1.7): on a stream whose `REQUEST`
/// asked for `multi_results`, the end of one result (a result set, or a statement's OK)
/// when another result follows: several statements in one `sql`, or a `CALL`. The last
/// result's counters are in `END`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct ResultEnd {
    /// This result's affected rows (0 for a result set).
    pub affected_rows: u64,
    /// The insert id this result's OK reported, when not 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_insert_id: Option<u64>,
    /// The warnings this result's OK or EOF reported.
    pub warnings: u32,
    /// The server's message in this result's OK packet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<String>,
    /// In a session: a transaction is open after this result (`SERVER_STATUS_IN_TRANS`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_transaction: bool,
    /// Whether autocommit was on after this result (protocol 1.8, as `END.autocommit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autocommit: Option<bool>,
}

/// What became of a session's transaction when the session ended without the client
/// (`ErrorBody.transaction`, protocol 1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransactionOutcome {
    /// A transaction was open and no commit was in flight: the database rolled it back.
    RolledBack,
    /// A statement that may commit (`COMMIT`, or one that commits implicitly) was in
    /// flight: it may or may not have committed. Check the data before retrying.
    Unknown,
    /// A value this peer does not know (sent by a newer peer). Never sent deliberately.
    #[serde(other)]
    Other,
}

/// `SESSION` (dispatcher → client, on the stream that opened a session; protocol 1.5): a
/// worker is pinned to the session from now on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct SessionOpened {
    /// The member whose worker is pinned (a replica for a read-only session, or the primary).
    pub member: String,
    /// The pinned worker's slot, for logs and `osprey sessions`.
    pub slot: u32,
    /// Whether the session runs on a replica (read-only).
    pub read_only: bool,
}

/// `RESET` (dispatcher → worker, protocol 1.5): end the session the worker served.
/// Empty map; answered with `END`, or `ERROR` + `END` (then the worker exits).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Reset {}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `ERROR`: on a stream, always followed by `END`; on stream 0, the connection closes after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct ErrorBody {
    pub origin: Origin,
    pub code: ErrorCode,
    /// MySQL error number, when the database produced the error.
    #[serde(default)]
    pub errno: Option<u16>,
    /// SQLSTATE, when the database produced the error.
    #[serde(default)]
    pub sqlstate: Option<String>,
    pub message: String,
    /// Whether the request may have reached a database. `false` means it provably did not.
    pub dispatched: bool,
    /// Whether sending the same request again may succeed.
    pub retryable: bool,
    /// `SESSION_ABORTED` (protocol 1.5): what became of the session's transaction. Absent:
    /// no transaction was open (nothing was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction: Option<TransactionOutcome>,
}

impl ErrorBody {
    /// An error that did not reach any database.
    pub fn undispatched(origin: Origin, code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            origin,
            code,
            errno: None,
            sqlstate: None,
            message: message.into(),
            dispatched: false,
            transaction: None,
            retryable: matches!(
                code,
                ErrorCode::QueueFull
                    | ErrorCode::QueueTimeout
                    | ErrorCode::ShuttingDown
                    | ErrorCode::BackendUnavailable
                    | ErrorCode::WorkerLost
                    | ErrorCode::KeepaliveTimeout
                    | ErrorCode::Throttled
                    | ErrorCode::SessionLimit
            ),
        }
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} error {}", format!("{:?}", self.origin).to_lowercase(), self.code)?;
        if let Some(errno) = self.errno {
            write!(f, " ({errno}")?;
            if let Some(state) = &self.sqlstate {
                write!(f, "/{state}")?;
            }
            write!(f, ")")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The whole message of the serde error produced for SQL text that is not UTF-8, so
/// that [`crate::Frame::body`] can report [`crate::ProtocolError::BadUtf8`]. It must be
/// compared whole: other errors may quote input text, which may hold this string.
pub(crate) const BAD_UTF8_MARKER: &str = "osprey:bad-utf8";

/// Accepts str (and, from lenient encoders, bin) but insists on valid UTF-8.
fn utf8_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl<'de> de::Visitor<'de> for V {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("UTF-8 SQL text")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<String, E> {
            String::from_utf8(v.to_vec()).map_err(|_| E::custom(BAD_UTF8_MARKER))
        }
    }
    d.deserialize_string(V)
}

#[cfg(test)]
mod validate_tests {
    use super::*;

    fn with(params: Vec<Value>) -> Request {
        Request {
            sql: "SELECT ?".into(),
            params,
            ..Default::default()
        }
    }

    #[test]
    fn parameters_are_checked() {
        assert_eq!(with(vec![Value::Int(1)]).validate(), Ok(()));
        let e = with(vec![Value::Int(1), Value::date(2024, 13, 1, 0, 0, 0, 0)])
            .validate()
            .unwrap_err();
        assert!(e.contains("parameter 1") && e.contains("month"), "{e}");
        assert!(with(vec![Value::Decimal("abc".into())]).validate().is_err());
        assert!(with(vec![Value::Null; MAX_PARAMS + 1]).validate().is_err());
        assert_eq!(with(vec![Value::Null; MAX_PARAMS]).validate(), Ok(()));
        let batch = Request {
            batch: vec![
                Statement {
                    sql: "SELECT 1".into(),
                    params: vec![],
                },
                Statement {
                    sql: "SELECT ?".into(),
                    params: vec![Value::time(false, 40, 0, 0, 0, 0)],
                },
            ],
            ..Default::default()
        };
        let e = batch.validate().unwrap_err();
        assert!(e.starts_with("batch statement 1: parameter 0"), "{e}");
    }
}

/// A named-field body decodes from a MessagePack map only (section 4): `rmp_serde` would
/// also take an array and fill the fields by position, so a body that merely has the
/// right number of elements would pass. Each body type derives its serde code as
/// inherent functions (`remote = "Self"`) and the trait impls below put this check in
/// front, at every nesting level (a batch's statements, a COLUMNS' columns, ...).
trait FromMap: Sized {
    fn from_map<'de, A: de::MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

fn map_only<'de, D: Deserializer<'de>, T: FromMap>(d: D) -> Result<T, D::Error> {
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: FromMap> de::Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of named fields")
        }
        fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::from_map(map)
        }
    }
    d.deserialize_map(V(std::marker::PhantomData))
}

macro_rules! named_bodies {
    ($($t:ident),* $(,)?) => {$(
        impl FromMap for $t {
            fn from_map<'de, A: de::MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
                $t::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                map_only(d)
            }
        }
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                $t::serialize(self, s)
            }
        }
    )*};
}

named_bodies!(
    Hello,
    Backend,
    WorkerSettings,
    HelloAck,
    Ping,
    GoAway,
    QuitRequest,
    QuitNow,
    Started,
    SessionOpened,
    Reset,
    Ready,
    Cancel,
    Window,
    Statement,
    Request,
    Column,
    Columns,
    Rows,
    End,
    ResultEnd,
    ErrorBody
);

//! Osprey client SDK.
//!
//! A [`Client`] keeps one multiplexed TCP connection to an Osprey dispatcher and runs
//! every request as a stream on it. It reconnects by itself (next address in the
//! list, exponential back-off with jitter), moves to a new connection after
//! `GOAWAY`, resends what provably never reached a database, and never leaves a
//! request hanging: every call ends with a result or an [`Error`].
//!
//! ```no_run
//! use osprey_client::{params, Client, ClientConfig};
//! # async fn f() -> Result<(), osprey_client::Error> {
//! let client = Client::connect(ClientConfig::new("127.0.0.1:7400", "token")).await?;
//! let id = client.execute("INSERT INTO t (v) VALUES (?)", &params!["x"]).await?.last_insert_id;
//! let rows: Vec<(i64, String)> = client.query_as("SELECT id, v FROM t", &[]).await?;
//! # Ok(()) }
//! ```
//!
//! # Retries
//!
//! * A request not yet written to a connection that dies (or that received `GOAWAY`)
//!   is sent on the next connection.
//! * A request written to a connection that then dies is resent if it is marked
//!   `idempotent` (up to `max_retries`); otherwise it fails with `OUTCOME_UNKNOWN`
//!   (origin `client`, `dispatched() == true`).
//! * A dispatcher `ERROR` with `dispatched == false` and code `SHUTTING_DOWN`,
//!   `WORKER_LOST` or `BACKEND_UNAVAILABLE` is retried after a back-off (up to
//!   `max_retries`). `QUEUE_FULL` and `QUEUE_TIMEOUT` are returned to the caller.
//! * A [`RowStream`] is resent only until it has yielded its first item.
//!
//! # Cancellation
//!
//! Dropping a request future or a [`RowStream`] before the request ended sends
//! `CANCEL` on its stream; the `ERROR`+`END` that follows is swallowed. The stream id
//! and its place under `max_streams` are released when `END` arrives (or the
//! connection dies), not before.
//!
//! # Backpressure
//!
//! Per-stream flow control (protocol 1.1): the SDK asks for a window of
//! [`ClientConfig::stream_buffer`] data frames per stream (default 16; a `ROWS` frame
//! holds at most the dispatcher's batch size). The dispatcher sends a stream no more
//! data frames than its reader has room for, and the SDK gives credit back (`WINDOW`)
//! as the reader takes them (half a window at a time, and at least once a second). So
//! a slow reader slows only its own stream: the other streams of the connection go on.
//! A stream left unread for the dispatcher's `client_write_timeout` (30 s by default)
//! ends with `SLOW_CONSUMER` and its statement is killed, so it cannot pin a worker.
//!
//! Against a dispatcher without flow control (protocol 1.0) the bound is this: each
//! stream buffers at most `stream_buffer` frames; when a reader leaves that full, the
//! connection stops reading the socket until it makes room, which (through TCP) pauses
//! the whole connection. Keepalive-timeout detection is suspended while the connection
//! is paused that way.
//!
//! # Read-your-writes
//!
//! Against MariaDB, the `END` of a request that committed carries its GTID
//! ([`ExecResult::gtid`]); the [`Client`] keeps the newest position per cluster
//! ([`Client::last_gtid`]). With [`ClientConfig::read_your_writes`] on (or per request,
//! [`RequestExt::with_read_your_writes`]), requests carry that position as
//! `causal_gtid`, and the dispatcher routes such a read only to a replica that has
//! applied it, or to the primary: a read after a write through the same `Client` sees
//! the write, wherever it runs. Clones of a `Client` share the position; separate
//! `Client`s (other processes) do not, so pass [`Client::last_gtid`] along
//! ([`RequestExt::with_causal_gtid`]) where a write in one must be seen by a read in
//! another. Positions are per cluster name as sent (`REQUEST.cluster`, after
//! [`ClientConfig::cluster`]); name a cluster the same way throughout (a request without
//! a cluster and one naming the dispatcher's first cluster keep separate positions).
//! Requires a dispatcher of protocol 1.3 or later (an older one ignores the field and a
//! read may be stale).
//!
//! ```no_run
//! use osprey_client::{params, Client, ClientConfig, Request, RequestExt};
//! # async fn f() -> Result<(), osprey_client::Error> {
//! let mut config = ClientConfig::new("127.0.0.1:7400", "token");
//! config.read_your_writes = true;
//! let client = Client::connect(config).await?;
//! client.execute("UPDATE users SET name = ? WHERE id = ?", &params!["ann", 7]).await?;
//! // Sees the update, even when served by a replica.
//! let r = client.query("SELECT name FROM users WHERE id = ?", &params![7]).await?;
//! // This one does not wait for it (any eligible replica).
//! let r = client.send(Request::sql("SELECT COUNT(*) FROM users").with_read_your_writes(false)).await?;
//! # Ok(()) }
//! ```
//!
//! # Keepalive
//!
//! The client sends `PING` every `keepalive_interval` (or the dispatcher's
//! `keepalive_interval_ms` if shorter) and answers the dispatcher's `PING`. When no
//! frame at all arrives for `keepalive_timeout`, the connection is declared dead.

mod client;
pub mod config;
mod connection;
pub mod error;
/// The runtime directory and credentials file, shared with the dispatcher (they live in the
/// protocol crate so that neither binary links the other).
pub use osprey_protocol::local;
/// MySQL password hashes (`osprey mysql-password`, the dispatcher's `[[mysql.users]]`).
pub use osprey_protocol::mysql_auth;
pub mod retry;
pub mod rows;
pub mod session;
mod stream;
mod stream_queue;
pub mod tls;

use std::time::Duration;

pub use client::{Client, ClientStats};
pub use config::{ClientConfig, DEFAULT_ADDR, DEFAULT_ADMIN_ADDR};
pub use error::Error;
pub use osprey_protocol::TransactionOutcome;
pub use osprey_protocol::{Column, ErrorCode, Gtid, GtidError, GtidPos, Origin, Request, Statement, Value};
pub use rows::{display_value, value_to_json, FromRow, FromValue, IntoParam, ResultSetMeta, Row};
pub use session::{IsolationLevel, Session, SessionOptions, Transaction, TransactionOptions, TxFuture};
pub use stream::{BatchResult, ExecResult, QueryResult, ResultSet, RowStream, StreamItem};
pub use tls::TlsConfig;

/// One statement of a [`Client::batch`].
pub fn statement(sql: impl Into<String>, params: Vec<Value>) -> Statement {
    Statement {
        sql: sql.into(),
        params,
    }
}

/// Builder-style setters for [`Request`].
///
/// ```
/// use osprey_client::{params, Request, RequestExt};
/// let r = Request::sql("SELECT ?").with_params(params![1]).with_idempotent(true);
/// assert!(r.idempotent);
/// ```
pub trait RequestExt: Sized {
    /// Positional parameters for the `?` placeholders.
    fn with_params(self, params: Vec<Value>) -> Self;
    /// A read: may go to a replica outside a transaction.
    fn with_read_only(self, yes: bool) -> Self;
    /// Safe to run twice: may be resent after a lost connection.
    fn with_idempotent(self, yes: bool) -> Self;
    /// Route to the primary whatever the read/write split says.
    fn with_force_primary(self, yes: bool) -> Self;
    /// Per-request timeout (sent as `timeout_ms`, enforced locally too).
    fn with_timeout(self, timeout: Duration) -> Self;
    /// The cluster to run on (default: [`ClientConfig::cluster`], else the dispatcher's first).
    fn with_cluster(self, cluster: impl Into<String>) -> Self;
    /// Read-your-writes for this request, whatever [`ClientConfig::read_your_writes`]
    /// says: `true` sends the client's newest GTID position for the request's cluster as
    /// `causal_gtid`, `false` sends none (beyond one set with [`with_causal_gtid`](Self::with_causal_gtid)).
    fn with_read_your_writes(self, yes: bool) -> Self;
    /// A GTID position this request must see (e.g. [`Client::last_gtid`] of another
    /// client). With read-your-writes on, the client's own position is merged in.
    fn with_causal_gtid(self, pos: &GtidPos) -> Self;
}

impl RequestExt for Request {
    fn with_params(mut self, params: Vec<Value>) -> Self {
        self.params = params;
        self
    }
    fn with_read_only(mut self, yes: bool) -> Self {
        self.read_only = yes;
        self
    }
    fn with_idempotent(mut self, yes: bool) -> Self {
        self.idempotent = yes;
        self
    }
    fn with_force_primary(mut self, yes: bool) -> Self {
        self.force_primary = yes;
        self
    }
    fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = (timeout.as_millis() as u64).max(1);
        self
    }
    fn with_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }
    fn with_read_your_writes(mut self, yes: bool) -> Self {
        self.read_your_writes = Some(yes);
        self
    }
    fn with_causal_gtid(mut self, pos: &GtidPos) -> Self {
        self.causal_gtid = (!pos.is_empty()).then(|| pos.to_string());
        self
    }
}

//! Sessions and transactions (protocol 1.5): one worker of the dispatcher pinned to this
//! client until the session ends, so that `BEGIN` … application logic … `COMMIT`,
//! temporary tables, user variables and locks work.
//!
//! A session lives on one connection and is never moved to another: if that connection
//! or the pinned worker is lost, the session ends and the application gets the error
//! (`SESSION_ABORTED`, with `transaction` saying whether an open transaction is known
//! rolled back or its outcome is unknown). Nothing in a session is retried by the SDK.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use osprey_protocol::{End, ErrorBody, ErrorCode, Kind, Request, SessionOpened, TransactionOutcome, Value};

use crate::client::Inner;
use crate::connection::{ConnHandle, StreamGuard};
use crate::error::Error;
use crate::rows::FromRow;
use crate::stream::{collect, Call, ExecResult, QueryResult};

/// How a session is opened.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The session only reads: the dispatcher may pin a replica's worker (fresh enough
    /// for this client's earlier writes when read-your-writes is on).
    pub read_only: bool,
    /// The cluster (default: the client's, else the dispatcher's first).
    pub cluster: Option<String>,
    /// The longest wait for a worker (default: the client's `request_timeout`, else the
    /// dispatcher's `sessions.open_timeout_ms`).
    pub open_timeout: Option<Duration>,
}

/// `SET TRANSACTION ISOLATION LEVEL …`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationLevel {
    ReadUncommitted,
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

impl IsolationLevel {
    fn sql(self) -> &'static str {
        match self {
            IsolationLevel::ReadUncommitted => "READ UNCOMMITTED",
            IsolationLevel::ReadCommitted => "READ COMMITTED",
            IsolationLevel::RepeatableRead => "REPEATABLE READ",
            IsolationLevel::Serializable => "SERIALIZABLE",
        }
    }
}

/// How a transaction starts.
#[derive(Debug, Clone, Default)]
pub struct TransactionOptions {
    /// Absent: the server's default (REPEATABLE READ on InnoDB).
    pub isolation: Option<IsolationLevel>,
    /// `START TRANSACTION READ ONLY`; the session may then run on a replica.
    pub read_only: bool,
    /// `WITH CONSISTENT SNAPSHOT`.
    pub consistent_snapshot: bool,
    pub cluster: Option<String>,
}

impl TransactionOptions {
    /// The statement that starts the transaction.
    fn start_sql(&self) -> String {
        let mut parts = Vec::new();
        if self.consistent_snapshot {
            parts.push("WITH CONSISTENT SNAPSHOT");
        }
        if self.read_only {
            parts.push("READ ONLY");
        }
        match parts.is_empty() {
            true => "START TRANSACTION".into(),
            false => format!("START TRANSACTION {}", parts.join(", ")),
        }
    }
}

/// An open session. Statements run one after another on its pinned worker. Dropping it
/// ends the session without waiting (the dispatcher rolls back an open transaction and
/// resets the worker); [`Session::close`] waits for that and reports how it ended.
pub struct Session {
    inner: Arc<Inner>,
    conn: ConnHandle,
    id: u32,
    opened: SessionOpened,
    /// The session's cluster: its writes' GTIDs count for read-your-writes there.
    cluster: Option<String>,
    /// The session's own stream: its terminal frame ends the session.
    stream: Mutex<Option<StreamGuard>>,
    /// How the session ended, once known.
    ended: Mutex<Option<Error>>,
    /// An `ERROR` read on the session's stream whose `END` has not come yet.
    pending: Mutex<Option<Error>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("member", &self.opened.member)
            .field("slot", &self.opened.slot)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens a session (see [`Client::session`](crate::Client::session)).
    pub(crate) async fn open(inner: Arc<Inner>, opts: SessionOptions) -> Result<Session, Error> {
        let conn = inner.wait_conn().await?;
        let wait = opts.open_timeout.or(inner.cfg.request_timeout);
        let request = Request {
            open_session: true,
            read_only: opts.read_only,
            cluster: opts.cluster.or_else(|| inner.cfg.cluster.clone()),
            causal_gtid: None,
            timeout_ms: wait.map_or(0, |w| (w.as_millis() as u64).max(1)),
            ..Default::default()
        };
        let request = Request {
            causal_gtid: (opts.read_only && inner.cfg.read_your_writes)
                .then(|| inner.position(&request.cluster))
                .flatten()
                .map(|p| p.to_string()),
            ..request
        };
        let cluster = request.cluster.clone();
        let mut stream = conn.open(2, |id| request.to_frame(id)).await.map_err(|_| {
            Error::client(
                ErrorCode::ConnectFailed,
                false,
                "the connection closed before the session opened",
            )
        })?;
        let id = stream.id;
        let answer = async {
            let mut error = None;
            loop {
                match stream.recv().await {
                    Some(f) if f.kind == Kind::Session => {
                        return f.body::<SessionOpened>().map_err(|e| Error::protocol(&e));
                    }
                    Some(f) if f.kind == Kind::Error => {
                        error = Some(f.body::<ErrorBody>().map_err(|e| Error::protocol(&e))?);
                    }
                    Some(f) if f.kind == Kind::End => {
                        stream.finished = true;
                        return Err(match error {
                            Some(body) => Error::from_body(body),
                            None => Error::client(ErrorCode::ProtocolViolation, false, "END before SESSION"),
                        });
                    }
                    Some(f) => {
                        return Err(Error::client(
                            ErrorCode::ProtocolViolation,
                            false,
                            format!("unexpected {} frame while opening a session", f.kind.name()),
                        ))
                    }
                    None => {
                        stream.finished = true;
                        return Err(Error::client(
                            ErrorCode::ConnectFailed,
                            false,
                            "the connection to the dispatcher was lost while the session opened",
                        ));
                    }
                }
            }
        };
        // The dispatcher bounds the wait itself; this is the client's own bound on top.
        let opened = match wait {
            Some(w) => tokio::time::timeout(w + Duration::from_secs(1), answer)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::client(
                        ErrorCode::QueueTimeout,
                        false,
                        "no session opened in time (client side)",
                    ))
                })?,
            None => answer.await?,
        };
        Ok(Session {
            inner,
            conn,
            id,
            opened,
            cluster,
            stream: Mutex::new(Some(stream)),
            ended: Mutex::new(None),
            pending: Mutex::new(None),
        })
    }

    /// The member whose worker is pinned.
    pub fn member(&self) -> &str {
        &self.opened.member
    }

    /// The pinned worker's slot (as `osprey status` shows it).
    pub fn slot(&self) -> u32 {
        self.opened.slot
    }

    /// Whether the session runs on a replica.
    pub fn on_replica(&self) -> bool {
        self.opened.read_only
    }

    /// How the session ended without the client, if it did (`SESSION_ABORTED`).
    pub fn aborted(&self) -> Option<Error> {
        self.poll_end();
        self.ended.lock().unwrap().clone()
    }

    /// Takes in the session stream's terminal frames that already arrived.
    fn poll_end(&self) {
        let mut guard = self.stream.lock().unwrap();
        let Some(stream) = guard.as_mut() else { return };
        let mut pending = self.pending.lock().unwrap();
        while let Some(Some(frame)) = stream.recv().now_or_never() {
            match frame.kind {
                // Kept until its END comes, which may be in a later poll.
                Kind::Error => *pending = frame.body::<ErrorBody>().ok().map(Error::from_body),
                Kind::End => {
                    stream.finished = true;
                    let e = pending
                        .take()
                        .unwrap_or_else(|| Error::client(ErrorCode::SessionAborted, false, "the session ended"));
                    *self.ended.lock().unwrap() = Some(e);
                    *guard = None;
                    return;
                }
                _ => {}
            }
        }
    }

    /// Runs one statement in the session and returns all its result sets.
    pub async fn query(&self, sql: impl Into<String>, params: &[Value]) -> Result<QueryResult, Error> {
        self.send(Request {
            sql: sql.into(),
            params: params.to_vec(),
            ..Default::default()
        })
        .await
    }

    /// Runs one request in the session (`session` is filled in; `cluster`, routing
    /// flags and `causal_gtid` do not apply).
    pub async fn send(&self, mut request: Request) -> Result<QueryResult, Error> {
        if let Some(e) = self.aborted() {
            return Err(e);
        }
        request.session = Some(self.id);
        // Ignored by the dispatcher (the session's worker decides); the SDK files the
        // statement's GTID under it.
        request.cluster.clone_from(&self.cluster);
        let result = collect(Call::in_session(self.inner.clone(), request, self.conn.clone())).await;
        if let Err(e) = &result {
            if e.code() == ErrorCode::SessionAborted {
                *self.ended.lock().unwrap() = Some(e.clone());
            }
        }
        result
    }

    /// Runs one statement and converts the rows of its first result set.
    pub async fn query_as<T: FromRow>(&self, sql: impl Into<String>, params: &[Value]) -> Result<Vec<T>, Error> {
        self.query(sql, params).await?.rows_as()
    }

    /// The first row of the first result set, converted.
    pub async fn query_first<T: FromRow>(&self, sql: impl Into<String>, params: &[Value]) -> Result<Option<T>, Error> {
        self.query(sql, params).await?.first_as()
    }

    /// Runs a statement and returns its summary.
    pub async fn execute(&self, sql: impl Into<String>, params: &[Value]) -> Result<ExecResult, Error> {
        Ok(self.query(sql, params).await?.summary)
    }

    /// Ends the session and waits for the dispatcher's answer: `Ok` when it closed
    /// cleanly (an open transaction is rolled back), the abort otherwise.
    pub async fn close(self) -> Result<(), Error> {
        let stream = self.stream.lock().unwrap().take();
        let Some(mut stream) = stream else {
            return match self.ended.lock().unwrap().take() {
                Some(e) if e.code() == ErrorCode::SessionAborted => Err(e),
                _ => Ok(()),
            };
        };
        stream.cancel_and_keep();
        let mut error = self.pending.lock().unwrap().take();
        let wait = self.inner.cfg.request_timeout.unwrap_or(Duration::from_secs(60));
        let ended = tokio::time::timeout(wait, async {
            while let Some(frame) = stream.recv().await {
                match frame.kind {
                    Kind::Error => error = frame.body::<ErrorBody>().ok().map(Error::from_body),
                    Kind::End => {
                        stream.finished = true;
                        let _ = frame.body::<End>();
                        return true;
                    }
                    _ => {}
                }
            }
            stream.finished = true;
            false
        })
        .await;
        match (ended, error) {
            (Ok(true), None) => Ok(()),
            (_, Some(e)) => Err(e),
            // The connection went: the dispatcher ends the session on its own.
            (Ok(false), None) => Ok(()),
            (Err(_), None) => Err(Error::client(
                ErrorCode::RequestTimeout,
                false,
                "the session's close was not answered in time (client side)",
            )),
        }
    }
}

/// A transaction on its own session. [`Transaction::commit`] or
/// [`Transaction::rollback`] ends it; dropped without either, it is rolled back (the
/// session's end rolls it back on the dispatcher's side; nothing blocks in `Drop`).
#[derive(Debug)]
pub struct Transaction {
    session: Session,
}

impl Transaction {
    pub(crate) async fn begin(inner: Arc<Inner>, opts: TransactionOptions) -> Result<Transaction, Error> {
        let session = Session::open(
            inner,
            SessionOptions {
                read_only: opts.read_only,
                cluster: opts.cluster.clone(),
                open_timeout: None,
            },
        )
        .await?;
        if let Some(level) = opts.isolation {
            session
                .execute(format!("SET TRANSACTION ISOLATION LEVEL {}", level.sql()), &[])
                .await?;
        }
        session.execute(opts.start_sql(), &[]).await?;
        Ok(Transaction { session })
    }

    /// The session the transaction runs on.
    pub fn session(&self) -> &Session {
        &self.session
    }

    pub async fn query(&self, sql: impl Into<String>, params: &[Value]) -> Result<QueryResult, Error> {
        self.session.query(sql, params).await
    }

    pub async fn query_as<T: FromRow>(&self, sql: impl Into<String>, params: &[Value]) -> Result<Vec<T>, Error> {
        self.session.query_as(sql, params).await
    }

    pub async fn query_first<T: FromRow>(&self, sql: impl Into<String>, params: &[Value]) -> Result<Option<T>, Error> {
        self.session.query_first(sql, params).await
    }

    pub async fn execute(&self, sql: impl Into<String>, params: &[Value]) -> Result<ExecResult, Error> {
        self.session.execute(sql, params).await
    }

    /// Commits, then ends the session. An error here may leave the outcome unknown:
    /// see [`Error::transaction_outcome`] (never retried by the SDK).
    pub async fn commit(self) -> Result<ExecResult, Error> {
        let end = self.session.execute("COMMIT", &[]).await.map_err(|e| {
            // A COMMIT that may have reached the database and was not answered by it (a
            // timeout, a lost connection or worker): whether it committed is not known.
            if e.dispatched() && e.origin() != osprey_protocol::Origin::Database && e.transaction_outcome().is_none() {
                let mut body = e.body().clone();
                body.transaction = Some(TransactionOutcome::Unknown);
                Error::from_body(body)
            } else {
                e
            }
        })?;
        // The commit is done; how the session's close goes does not change it.
        let _ = self.session.close().await;
        Ok(end)
    }

    /// Rolls back, then ends the session.
    pub async fn rollback(self) -> Result<(), Error> {
        let r = self.session.execute("ROLLBACK", &[]).await;
        let closed = self.session.close().await;
        r.map(drop).and(closed)
    }
}

/// Whether an error inside a transaction is worth running the whole transaction again:
/// a deadlock (1213) or a lock wait timeout (1205), where the database rolled back (or
/// the statement) and nothing was committed.
pub fn is_transient(e: &Error) -> bool {
    e.code() == ErrorCode::Database && matches!(e.errno(), Some(1213) | Some(1205))
}

/// The boxed future a [`crate::Client::run_transaction`] closure returns.
pub type TxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// What [`crate::Client::run_transaction`] does, attempt after attempt.
pub(crate) async fn run<T, F>(
    inner: Arc<Inner>,
    opts: TransactionOptions,
    attempts: u32,
    mut body: F,
) -> Result<T, Error>
where
    F: for<'a> FnMut(&'a Transaction) -> TxFuture<'a, T>,
{
    let attempts = attempts.max(1);
    let mut tried = 0;
    loop {
        tried += 1;
        let tx = Transaction::begin(inner.clone(), opts.clone()).await?;
        let result = body(&tx).await;
        let e = match result {
            Ok(value) => match tx.commit().await {
                Ok(_) => return Ok(value),
                // A commit whose outcome is unknown is never run again.
                Err(e) => e,
            },
            Err(e) => {
                // Rolled back when the session ends (a deadlock rolled it back already).
                drop(tx);
                e
            }
        };
        if tried >= attempts || !is_transient(&e) {
            return Err(e);
        }
        tracing::debug!(attempt = tried, error = %e, "transaction failed transiently; running it again");
        let wait = crate::retry::backoff(tried - 1, inner.cfg.backoff_min, inner.cfg.backoff_max);
        tokio::time::sleep(wait).await;
    }
}

impl Error {
    /// For `SESSION_ABORTED`: what became of the session's open transaction (`None`:
    /// none was open). After a lost connection (`OUTCOME_UNKNOWN`) in a transaction,
    /// [`TransactionOutcome::Unknown`].
    pub fn transaction_outcome(&self) -> Option<TransactionOutcome> {
        match self.code() {
            ErrorCode::OutcomeUnknown => Some(TransactionOutcome::Unknown),
            _ => self.body().transaction,
        }
    }
}

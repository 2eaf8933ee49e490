//! The [`Client`]: a cheap, cloneable handle; and the background task that keeps
//! one usable connection (reconnecting with back-off, moving on after `GOAWAY`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use osprey_protocol::{ErrorCode, GtidPos, Request, Statement, Value};
use serde::de::DeserializeOwned;
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use crate::config::ClientConfig;
use crate::connection::{self, ConnHandle, Stats, Status};
use crate::error::Error;
use crate::retry;
use crate::rows::{FromRow, Row};
use crate::stream::{collect, BatchResult, Call, ExecResult, QueryResult, RowStream};

/// Counters for tests and monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Streams opened (`REQUEST` frames written).
    pub streams_opened: u64,
    /// Streams closed (`END` received, or their connection died).
    pub streams_closed: u64,
    /// Streams open right now (`streams_opened - streams_closed`).
    pub in_flight: u64,
    /// Connections established after the first one.
    pub reconnects: u64,
    /// Requests sent again (after a retryable error or, when idempotent, a lost connection).
    pub retries: u64,
}

#[derive(Clone)]
pub(crate) enum ConnState {
    Up(ConnHandle),
    Down { last_error: Option<Error> },
    Closed,
}

pub(crate) struct Inner {
    pub cfg: ClientConfig,
    pub stats: Arc<Stats>,
    state: watch::Receiver<ConnState>,
    waiting: AtomicUsize,
    /// Read-your-writes: the newest GTID position seen in an `END`, per cluster as the
    /// requests named it (`None`: the dispatcher's first). Positions of different
    /// clusters are unrelated. Locked only to merge a write's GTID or copy a position out.
    positions: Mutex<HashMap<Option<String>, GtidPos>>,
    /// Dropped with the last handle: stops the connection manager.
    _shutdown: oneshot::Sender<()>,
}

pub(crate) struct WaitingGuard<'a>(&'a AtomicUsize);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Inner {
    /// Takes in the GTID of a request's `END` (`cluster` as the request named it).
    pub fn saw_gtid(&self, cluster: &Option<String>, gtid: &str) {
        let pos = match GtidPos::parse(gtid) {
            Ok(p) if !p.is_empty() => p,
            Ok(_) => return,
            Err(e) => {
                warn!(gtid, error = %e, "END carried a GTID that is not one; ignored");
                return;
            }
        };
        let mut positions = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        match positions.get_mut(cluster) {
            Some(mine) => mine.merge(&pos),
            None => {
                positions.insert(cluster.clone(), pos);
            }
        }
    }

    /// The newest position seen for `cluster` (as the requests named it).
    pub fn position(&self, cluster: &Option<String>) -> Option<GtidPos> {
        let positions = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        positions.get(cluster).cloned()
    }

    /// A connection that accepts new streams, waiting up to `connection_wait` while
    /// the manager reconnects.
    pub async fn wait_conn(&self) -> Result<ConnHandle, Error> {
        let mut rx = self.state.clone();
        let wait = async {
            loop {
                {
                    let state = rx.borrow_and_update();
                    match &*state {
                        ConnState::Up(h) if h.usable() => return Ok(h.clone()),
                        ConnState::Closed => {
                            return Err(Error::client(
                                ErrorCode::ConnectFailed,
                                false,
                                "the client is shut down",
                            ))
                        }
                        _ => {}
                    }
                }
                if rx.changed().await.is_err() {
                    return Err(Error::client(
                        ErrorCode::ConnectFailed,
                        false,
                        "the client is shut down",
                    ));
                }
            }
        };
        match tokio::time::timeout(self.cfg.connection_wait, wait).await {
            Ok(r) => r,
            Err(_) => {
                let last = match &*self.state.borrow() {
                    ConnState::Down { last_error: Some(e) } => format!(": {e}"),
                    _ => String::new(),
                };
                Err(Error::client(
                    ErrorCode::ConnectFailed,
                    false,
                    format!(
                        "no connection to a dispatcher within {:?}{last}",
                        self.cfg.connection_wait
                    ),
                ))
            }
        }
    }

    /// Counts a request waiting for a stream; fails with `QUEUE_FULL` past `max_waiting`.
    pub fn enter_waiting(&self) -> Result<WaitingGuard<'_>, Error> {
        let n = self.waiting.fetch_add(1, Ordering::SeqCst);
        let guard = WaitingGuard(&self.waiting);
        if n >= self.cfg.max_waiting {
            return Err(Error::client(
                ErrorCode::QueueFull,
                false,
                format!("{n} requests already wait for a free stream (max_waiting)"),
            ));
        }
        Ok(guard)
    }
}

/// A handle on the dispatcher: one multiplexed connection that reconnects by itself.
///
/// `Client` is cheap to clone (an `Arc` inside) and is meant to be shared by every
/// task of the application; concurrent requests run as concurrent streams on one
/// connection, up to the dispatcher's `max_streams` (further requests wait locally).
///
/// ```no_run
/// use osprey_client::{params, Client, ClientConfig};
/// # async fn f() -> Result<(), osprey_client::Error> {
/// let client = Client::connect(ClientConfig::new("127.0.0.1:7400", "secret-token")).await?;
/// let names: Vec<(i64, String)> = client.query_as("SELECT id, name FROM users WHERE id > ?", &params![10]).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addrs", &self.inner.cfg.addrs)
            .finish_non_exhaustive()
    }
}

fn sql_request(sql: impl Into<String>, params: &[Value]) -> Request {
    Request {
        sql: sql.into(),
        params: params.to_vec(),
        ..Default::default()
    }
}

impl Client {
    /// Connects to the first address of `config.addrs` that accepts (each tried once,
    /// in order) and starts the background connection manager. Fails with the last
    /// error (for example `AUTH_FAILED` from the dispatcher, or `CONNECT_FAILED`).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), osprey_client::Error> {
    /// let mut config = osprey_client::ClientConfig::new("10.0.0.1:7400", "token")
    ///     .with_addrs(["10.0.0.1:7400", "10.0.0.2:7400"]);
    /// config.request_timeout = Some(std::time::Duration::from_secs(5));
    /// let client = osprey_client::Client::connect(config).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: ClientConfig) -> Result<Client, Error> {
        if config.addrs.is_empty() {
            return Err(Error::client(
                ErrorCode::ConnectFailed,
                false,
                "no dispatcher address configured",
            ));
        }
        let stats = Arc::new(Stats::default());
        let mut best: Option<Error> = None;
        let mut first = None;
        for (i, addr) in config.addrs.iter().enumerate() {
            match connection::connect(addr, &config, stats.clone()).await {
                Ok(h) => {
                    first = Some((i, h));
                    break;
                }
                Err(e) => {
                    warn!(addr, error = %e, "connect failed");
                    // Prefer the dispatcher's own refusal (e.g. AUTH_FAILED) over a plain connect failure.
                    if best.as_ref().is_none_or(|b| b.code() == ErrorCode::ConnectFailed) {
                        best = Some(e);
                    }
                }
            }
        }
        let Some((idx, handle)) = first else {
            return Err(best.expect("at least one address was tried"));
        };
        let (state_tx, state_rx) = watch::channel(ConnState::Up(handle.clone()));
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        tokio::spawn(manage(
            config.clone(),
            stats.clone(),
            idx,
            handle,
            state_tx,
            shutdown_rx,
        ));
        Ok(Client {
            inner: Arc::new(Inner {
                cfg: config,
                stats,
                state: state_rx,
                waiting: AtomicUsize::new(0),
                positions: Mutex::new(HashMap::new()),
                _shutdown: shutdown_tx,
            }),
        })
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// Read-your-writes: the newest GTID position this client (and its clones) received
    /// in an `END` for `cluster` (`None`: [`ClientConfig::cluster`], the default cluster
    /// of this client's requests), merged per replication domain; `None` before any
    /// write there reported one. This is what requests send as `causal_gtid` when
    /// read-your-writes is on.
    ///
    /// ```no_run
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// client.execute("INSERT INTO t VALUES (1)", &[]).await?;
    /// println!("wrote up to {:?}", client.last_gtid(None).map(|p| p.to_string()));
    /// # Ok(()) }
    /// ```
    pub fn last_gtid(&self, cluster: Option<&str>) -> Option<GtidPos> {
        let key = cluster.map(str::to_owned).or_else(|| self.inner.cfg.cluster.clone());
        self.inner.position(&key)
    }

    /// Counters: streams opened and closed, in flight, reconnects, retries.
    ///
    /// ```no_run
    /// # fn f(client: osprey_client::Client) {
    /// let s = client.stats();
    /// assert_eq!(s.streams_opened, s.streams_closed + s.in_flight);
    /// # }
    /// ```
    pub fn stats(&self) -> ClientStats {
        let s = &self.inner.stats;
        let opened = s.opened.load(Ordering::SeqCst);
        let closed = s.closed.load(Ordering::SeqCst);
        ClientStats {
            streams_opened: opened,
            streams_closed: closed,
            in_flight: opened.saturating_sub(closed),
            reconnects: s.reconnects.load(Ordering::SeqCst),
            retries: s.retries.load(Ordering::SeqCst),
        }
    }

    /// Sends a request with full control over its flags and returns everything it
    /// produced. The request is retried automatically when it provably did not reach a
    /// database; after a lost connection it is resent only if `idempotent` is set
    /// (otherwise the error is `OUTCOME_UNKNOWN`).
    ///
    /// ```no_run
    /// use osprey_client::{params, Request, RequestExt};
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let req = Request::sql("SELECT * FROM orders WHERE customer = ?")
    ///     .with_params(params![42])
    ///     .with_read_only(true)
    ///     .with_idempotent(true)
    ///     .with_timeout(std::time::Duration::from_secs(2));
    /// let result = client.send(req).await?;
    /// println!("{} rows", result.rows().len());
    /// # Ok(()) }
    /// ```
    pub async fn send(&self, request: Request) -> Result<QueryResult, Error> {
        collect(Call::new(self.inner.clone(), request, true)).await
    }

    /// Runs one statement and returns all its result sets.
    ///
    /// ```no_run
    /// use osprey_client::params;
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let r = client.query("SELECT id, name FROM users WHERE id = ?", &params![7]).await?;
    /// for row in r.rows() {
    ///     let name: String = row.get_by_name("name")?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn query(&self, sql: impl Into<String>, params: &[Value]) -> Result<QueryResult, Error> {
        self.send(sql_request(sql, params)).await
    }

    /// Runs one statement and converts the rows of its first result set.
    ///
    /// ```no_run
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let rows: Vec<(i64, Option<String>)> = client.query_as("SELECT id, email FROM users", &[]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn query_as<T: FromRow>(&self, sql: impl Into<String>, params: &[Value]) -> Result<Vec<T>, Error> {
        self.query(sql, params).await?.rows_as()
    }

    /// The first row of the first result set, converted; `None` when there is none.
    ///
    /// ```no_run
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let n: Option<(i64,)> = client.query_first("SELECT COUNT(*) FROM users", &[]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn query_first<T: FromRow>(&self, sql: impl Into<String>, params: &[Value]) -> Result<Option<T>, Error> {
        self.query(sql, params).await?.first_as()
    }

    /// Rows of the first result set as JSON objects keyed by column name
    /// (see [`value_to_json`](crate::rows::value_to_json) for the mapping).
    ///
    /// ```no_run
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// for obj in client.query_json("SELECT id, name FROM users", &[]).await? {
    ///     println!("{}", serde_json::Value::Object(obj));
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn query_json(
        &self,
        sql: impl Into<String>,
        params: &[Value],
    ) -> Result<Vec<serde_json::Map<String, serde_json::Value>>, Error> {
        Ok(self.query(sql, params).await?.rows().iter().map(Row::to_json).collect())
    }

    /// Rows of the first result set deserialized with serde (through their JSON form).
    ///
    /// ```no_run
    /// #[derive(serde::Deserialize)]
    /// struct User { id: i64, name: String }
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let users: Vec<User> = client.query_de("SELECT id, name FROM users", &[]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn query_de<T: DeserializeOwned>(
        &self,
        sql: impl Into<String>,
        params: &[Value],
    ) -> Result<Vec<T>, Error> {
        self.query(sql, params)
            .await?
            .rows()
            .iter()
            .map(Row::deserialize)
            .collect()
    }

    /// Runs a statement that returns no rows (or ignores them) and returns the summary.
    ///
    /// ```no_run
    /// use osprey_client::params;
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let r = client.execute("INSERT INTO users (name) VALUES (?)", &params!["ann"]).await?;
    /// println!("id {:?}, {} row(s)", r.last_insert_id, r.affected_rows);
    /// # Ok(()) }
    /// ```
    pub async fn execute(&self, sql: impl Into<String>, params: &[Value]) -> Result<ExecResult, Error> {
        Ok(self.send(sql_request(sql, params)).await?.summary)
    }

    /// Runs several statements in one transaction on the dispatcher: all or nothing.
    ///
    /// ```no_run
    /// use osprey_client::{params, statement};
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let r = client
    ///     .batch(vec![
    ///         statement("UPDATE accounts SET balance = balance - ? WHERE id = ?", params![10, 1]),
    ///         statement("UPDATE accounts SET balance = balance + ? WHERE id = ?", params![10, 2]),
    ///     ])
    ///     .await?;
    /// assert_eq!(r.summary.affected_rows, 2);
    /// # Ok(()) }
    /// ```
    pub async fn batch(&self, statements: Vec<Statement>) -> Result<BatchResult, Error> {
        self.send(Request {
            batch: statements,
            ..Default::default()
        })
        .await
    }

    /// Streams a request's rows as they arrive, without holding the whole result in
    /// memory. Nothing is sent until the stream is first polled. Dropping the stream
    /// early cancels the request.
    ///
    /// ```no_run
    /// use futures::StreamExt;
    /// use osprey_client::{Request, StreamItem};
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let mut s = client.stream(Request::sql("SELECT id, payload FROM events"));
    /// while let Some(item) = s.next().await {
    ///     match item? {
    ///         StreamItem::ResultSet(meta) => println!("{} columns", meta.columns.len()),
    ///         StreamItem::Row(row) => { let _id: i64 = row.get(0)?; }
    ///     }
    /// }
    /// println!("{:?}", s.summary());
    /// # Ok(()) }
    /// ```
    pub fn stream(&self, request: Request) -> RowStream {
        RowStream::new(Call::new(self.inner.clone(), request, false))
    }

    /// Opens a session: one worker of the dispatcher pinned to it until it ends, so that
    /// session state (temporary tables, user variables, `GET_LOCK`, `SET SESSION`) and
    /// transaction control work. See [`Session`](crate::Session).
    ///
    /// ```no_run
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let s = client.session().await?;
    /// s.execute("CREATE TEMPORARY TABLE picks (id INT)", &[]).await?;
    /// s.execute("INSERT INTO picks SELECT id FROM items WHERE hot", &[]).await?;
    /// let n: Option<(i64,)> = s.query_first("SELECT COUNT(*) FROM picks", &[]).await?;
    /// s.close().await?;
    /// # Ok(()) }
    /// ```
    pub async fn session(&self) -> Result<crate::Session, Error> {
        self.session_with(crate::SessionOptions::default()).await
    }

    /// [`Client::session`] with options (read-only on a replica, cluster, open timeout).
    pub async fn session_with(&self, opts: crate::SessionOptions) -> Result<crate::Session, Error> {
        crate::Session::open(self.inner.clone(), opts).await
    }

    /// Starts a transaction on a session of its own (`START TRANSACTION`).
    ///
    /// ```no_run
    /// use osprey_client::params;
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let tx = client.transaction().await?;
    /// let (balance,): (i64,) = tx
    ///     .query_first("SELECT balance FROM accounts WHERE id = ? FOR UPDATE", &params![1])
    ///     .await?
    ///     .expect("account 1");
    /// if balance >= 10 {
    ///     tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = ?", &params![1]).await?;
    ///     tx.commit().await?;
    /// } // dropped without commit: rolled back
    /// # Ok(()) }
    /// ```
    pub async fn transaction(&self) -> Result<crate::Transaction, Error> {
        self.transaction_with(crate::TransactionOptions::default()).await
    }

    /// [`Client::transaction`] with options (isolation level, read only, consistent snapshot).
    pub async fn transaction_with(&self, opts: crate::TransactionOptions) -> Result<crate::Transaction, Error> {
        crate::Transaction::begin(self.inner.clone(), opts).await
    }

    /// Runs `body` in a transaction and commits it; a deadlock (1213) or lock wait timeout
    /// (1205) runs the whole transaction again, at most `attempts` times in all. A commit
    /// whose outcome is unknown is never run again: its error is returned.
    ///
    /// ```no_run
    /// use osprey_client::{params, TransactionOptions};
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// client
    ///     .run_transaction(TransactionOptions::default(), 5, |tx| {
    ///         Box::pin(async move {
    ///             tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = ?", &params![1]).await?;
    ///             tx.execute("UPDATE accounts SET balance = balance + 10 WHERE id = ?", &params![2]).await?;
    ///             Ok(())
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_transaction<T, F>(
        &self,
        opts: crate::TransactionOptions,
        attempts: u32,
        body: F,
    ) -> Result<T, Error>
    where
        F: for<'a> FnMut(&'a crate::Transaction) -> crate::TxFuture<'a, T>,
    {
        crate::session::run(self.inner.clone(), opts, attempts, body).await
    }
}

/// Keeps a usable connection published in `state`: after the current one dies or
/// receives `GOAWAY`, connects to the next address (first attempt at once, then
/// exponential back-off with jitter between failures). A `GOAWAY` connection is left
/// to finish its streams on its own.
async fn manage(
    cfg: ClientConfig,
    stats: Arc<Stats>,
    mut idx: usize,
    mut current: ConnHandle,
    state: watch::Sender<ConnState>,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        state.send_replace(ConnState::Up(current.clone()));
        let mut status = current.shared.subscribe();
        tokio::select! {
            _ = &mut shutdown => {
                state.send_replace(ConnState::Closed);
                return;
            }
            _ = status.wait_for(|s| *s != Status::Up) => {}
        }
        state.send_replace(ConnState::Down { last_error: None });
        let mut failures = 0u32;
        current = loop {
            idx = (idx + 1) % cfg.addrs.len();
            let addr = &cfg.addrs[idx];
            let result = tokio::select! {
                _ = &mut shutdown => {
                    state.send_replace(ConnState::Closed);
                    return;
                }
                r = connection::connect(addr, &cfg, stats.clone()) => r,
            };
            match result {
                Ok(h) => {
                    stats.reconnects.fetch_add(1, Ordering::SeqCst);
                    info!(addr, "reconnected");
                    break h;
                }
                Err(e) => {
                    let wait = retry::backoff(failures, cfg.backoff_min, cfg.backoff_max);
                    failures = failures.saturating_add(1);
                    warn!(addr, error = %e, ?wait, "reconnect failed");
                    state.send_replace(ConnState::Down { last_error: Some(e) });
                    tokio::select! {
                        _ = &mut shutdown => {
                            state.send_replace(ConnState::Closed);
                            return;
                        }
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        };
    }
}

//! One request's life: picking a connection, opening a stream, reading its frames,
//! retrying when that is safe ([`Call`]), and the public views of the results
//! ([`RowStream`], [`QueryResult`], [`ExecResult`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::Stream;
use osprey_protocol::{Column, Columns, End, ErrorBody, ErrorCode, Frame, GtidPos, Kind, Request, Rows, Value};
use tokio::time::Instant;
use tracing::{debug, Instrument};

use crate::client::Inner;
use crate::connection::{ConnHandle, StreamGuard};
use crate::error::Error;
use crate::retry;
use crate::rows::{FromRow, ResultSetMeta, Row};

/// Summary of a finished request (the `END` frame).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecResult {
    /// Sum of affected rows over the statements.
    pub affected_rows: u64,
    /// Last insert id of the last statement that produced one.
    pub last_insert_id: Option<u64>,
    pub warnings: u32,
    /// Rows received.
    pub rows: u64,
    /// Time the statement(s) took on the worker.
    pub server_time: Duration,
    /// Time the request waited for a worker in the dispatcher.
    pub queue_time: Duration,
    /// The GTID position of the request's last commit (MariaDB `domain-server-seq`, a
    /// comma-separated list for several domains); `None` when it committed nothing.
    /// See [`Client::last_gtid`](crate::Client::last_gtid).
    pub gtid: Option<String>,
}

impl From<End> for ExecResult {
    fn from(e: End) -> ExecResult {
        ExecResult {
            affected_rows: e.affected_rows,
            last_insert_id: e.last_insert_id,
            warnings: e.warnings,
            rows: e.rows,
            server_time: Duration::from_micros(e.server_time_us),
            queue_time: Duration::from_micros(e.queue_time_us),
            gtid: e.gtid,
        }
    }
}

/// One result set with all its rows.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultSet {
    pub meta: Arc<ResultSetMeta>,
    pub rows: Vec<Row>,
}

impl ResultSet {
    pub fn columns(&self) -> &[Column] {
        &self.meta.columns
    }
}

/// Everything a request returned: every result set (a batch may have several, a
/// pure write none) and the summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueryResult {
    pub sets: Vec<ResultSet>,
    pub summary: ExecResult,
}

/// The result of [`Client::batch`](crate::Client::batch): one result set per statement
/// that returned rows, and the summed summary.
pub type BatchResult = QueryResult;

impl QueryResult {
    /// Columns of the first result set (empty when there is none).
    pub fn columns(&self) -> &[Column] {
        self.sets.first().map_or(&[], |s| &s.meta.columns)
    }

    /// Rows of the first result set.
    pub fn rows(&self) -> &[Row] {
        self.sets.first().map_or(&[], |s| &s.rows)
    }

    /// Rows of the first result set, by value.
    pub fn into_rows(self) -> Vec<Row> {
        self.sets.into_iter().next().map(|s| s.rows).unwrap_or_default()
    }

    /// The rows of the first result set, each converted.
    pub(crate) fn rows_as<T: FromRow>(self) -> Result<Vec<T>, Error> {
        self.into_rows().into_iter().map(T::from_row).collect()
    }

    /// The first row of the first result set, converted; `None` when there is none.
    pub(crate) fn first_as<T: FromRow>(self) -> Result<Option<T>, Error> {
        self.into_rows().into_iter().next().map(T::from_row).transpose()
    }

    pub fn affected_rows(&self) -> u64 {
        self.summary.affected_rows
    }

    pub fn last_insert_id(&self) -> Option<u64> {
        self.summary.last_insert_id
    }
}

/// What a [`Call`] produces.
pub(crate) enum Event {
    ResultSet(Arc<ResultSetMeta>),
    Rows(Vec<Vec<Value>>),
    End(ExecResult),
    /// The request is being sent again: forget what was received so far.
    Restart,
}

/// The retrying state machine behind every request.
pub(crate) struct Call {
    inner: Arc<Inner>,
    req: Request,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    stream: Option<StreamGuard>,
    error: Option<Error>,
    retries: u32,
    /// Something was handed to the consumer since the last (re)start.
    yielded: bool,
    /// The consumer can handle [`Event::Restart`] (buffered calls); a [`RowStream`] cannot.
    restartable: bool,
    /// An earlier attempt may have reached a database.
    maybe_dispatched: bool,
    /// Send the client's GTID position for the cluster as `causal_gtid`.
    read_your_writes: bool,
    /// The `causal_gtid` the caller set, merged with the client's position at each attempt.
    causal_gtid: Option<String>,
    has_result_set: bool,
    started: bool,
    done: bool,
    span: tracing::Span,
    /// A session's statement: only on this connection, never resent.
    session: Option<ConnHandle>,
}

impl Call {
    pub fn new(inner: Arc<Inner>, mut req: Request, restartable: bool) -> Call {
        if req.cluster.is_none() {
            req.cluster.clone_from(&inner.cfg.cluster);
        }
        let read_your_writes = req.read_your_writes.unwrap_or(inner.cfg.read_your_writes);
        let causal_gtid = req.causal_gtid.clone();
        let timeout = match req.timeout_ms {
            0 => inner.cfg.request_timeout,
            ms => Some(Duration::from_millis(ms)),
        };
        let span = tracing::debug_span!(
            "osprey_request",
            stream = tracing::field::Empty,
            conn = tracing::field::Empty
        );
        Call {
            inner,
            req,
            timeout,
            deadline: None,
            stream: None,
            error: None,
            retries: 0,
            yielded: false,
            restartable,
            maybe_dispatched: false,
            read_your_writes,
            causal_gtid,
            has_result_set: false,
            started: false,
            done: false,
            span,
            session: None,
        }
    }

    /// A statement of the session on `conn`: sent on that connection only, and never
    /// again (the session's state would not be there on another).
    pub fn in_session(inner: Arc<Inner>, req: Request, conn: ConnHandle) -> Call {
        let mut call = Call::new(inner, req, true);
        call.read_your_writes = false;
        call.session = Some(conn);
        call
    }

    pub async fn next(&mut self) -> Option<Result<Event, Error>> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            if let Err(msg) = self.req.validate() {
                self.done = true;
                return Some(Err(Error::client(ErrorCode::InvalidRequest, false, msg)));
            }
            self.deadline = self.timeout.map(|t| Instant::now() + t);
        }
        let span = self.span.clone();
        let r = match self.deadline {
            Some(d) => match tokio::time::timeout_at(d, self.step().instrument(span)).await {
                Ok(r) => r,
                Err(_) => Err(self.timeout_error()),
            },
            None => self.step().instrument(span).await,
        };
        // An earlier attempt may have run (it was written and its connection died): a
        // later attempt's "did not reach a database" does not speak for that one.
        let r = r.map_err(|e| {
            if self.maybe_dispatched && !e.dispatched() {
                let mut body = e.body().clone();
                body.dispatched = true;
                body.retryable = false;
                Error::from_body(body)
            } else {
                e
            }
        });
        if matches!(r, Err(_) | Ok(Event::End(_))) {
            self.done = true;
            self.stream = None; // cancels the stream if it is still open
        }
        Some(r)
    }

    fn timeout_error(&self) -> Error {
        let written = self.stream.as_ref().is_some_and(StreamGuard::written);
        Error::client(
            ErrorCode::RequestTimeout,
            written || self.maybe_dispatched,
            format!(
                "request timed out after {:?} (client side)",
                self.timeout.unwrap_or_default()
            ),
        )
    }

    fn may_resend(&self) -> bool {
        self.session.is_none() && self.retries < self.inner.cfg.max_retries && (!self.yielded || self.restartable)
    }

    fn count_retry(&mut self) {
        self.retries += 1;
        self.inner.stats.retries.fetch_add(1, Ordering::SeqCst);
    }

    /// After a resend decision: tell a buffering consumer to start over.
    fn restart_event(&mut self) -> Option<Event> {
        self.has_result_set = false;
        if std::mem::take(&mut self.yielded) {
            Some(Event::Restart)
        } else {
            None
        }
    }

    async fn step(&mut self) -> Result<Event, Error> {
        loop {
            if self.stream.is_none() {
                // A new attempt: nothing the server said about an earlier one applies.
                self.error = None;
                let s = self.start().await?;
                self.span.record("stream", s.id);
                self.stream = Some(s);
            }
            let s = self.stream.as_mut().expect("stream is open");
            let Some(frame) = s.recv().await else {
                // The connection died, or refused the stream after GOAWAY.
                s.finished = true;
                let (id, written) = (s.id, s.written());
                self.stream = None;
                if let Some(err) = self.error.take() {
                    // The server's ERROR arrived, only its END was lost: that ERROR is
                    // the outcome, decided as after ERROR + END.
                    if retry::is_auto_retryable(&err) && self.may_resend() {
                        self.count_retry();
                        match self.restart_event() {
                            Some(ev) => return Ok(ev),
                            None => continue,
                        }
                    }
                    return Err(err);
                }
                if !written && self.session.is_none() {
                    debug!(stream = id, "stream was never written; sending on another connection");
                    continue;
                }
                if !written {
                    return Err(session_gone());
                }
                self.maybe_dispatched = true;
                if self.req.idempotent && self.may_resend() {
                    debug!(stream = id, "connection lost; resending idempotent request");
                    self.count_retry();
                    match self.restart_event() {
                        Some(ev) => return Ok(ev),
                        None => continue,
                    }
                }
                return Err(Error::client(
                    ErrorCode::OutcomeUnknown,
                    true,
                    "the connection to the dispatcher was lost after the request was sent; it may or may not have run",
                ));
            };
            match self.on_frame(frame)? {
                Some(ev) => return Ok(ev),
                None => {
                    if self.stream.is_none() {
                        // ERROR + END: decide about a retry.
                        let err = self.error.take().expect("error recorded");
                        if retry::is_auto_retryable(&err) && self.may_resend() {
                            let wait =
                                retry::backoff(self.retries, self.inner.cfg.backoff_min, self.inner.cfg.backoff_max);
                            debug!(code = %err.code(), ?wait, "undispatched error; retrying");
                            self.count_retry();
                            tokio::time::sleep(wait).await;
                            if let Some(ev) = self.restart_event() {
                                return Ok(ev);
                            }
                            continue;
                        }
                        return Err(err);
                    }
                }
            }
        }
    }

    /// Handles one frame of the open stream. `Ok(None)`: keep reading (or, when the
    /// stream was closed by `END` after `ERROR`, decide in the caller).
    fn on_frame(&mut self, frame: Frame) -> Result<Option<Event>, Error> {
        let s = self.stream.as_mut().expect("stream is open");
        let bad = |e: osprey_protocol::ProtocolError| Error::protocol(&e);
        match frame.kind {
            Kind::Columns => {
                let c = Columns::from_frame(&frame).map_err(bad)?;
                self.yielded = true;
                self.has_result_set = true;
                Ok(Some(Event::ResultSet(Arc::new(ResultSetMeta {
                    index: c.result_set,
                    columns: c.columns,
                }))))
            }
            Kind::Rows => {
                if !self.has_result_set {
                    return Err(Error::client(ErrorCode::ProtocolViolation, true, "ROWS before COLUMNS"));
                }
                let r: Rows = frame.body().map_err(bad)?;
                self.yielded = true;
                Ok(Some(Event::Rows(r.rows)))
            }
            Kind::Error => {
                let body: ErrorBody = frame.body().map_err(bad)?;
                s.finished = true; // the dispatcher is closing the stream: no CANCEL
                self.error = Some(Error::from_body(body));
                Ok(None)
            }
            Kind::End => {
                s.finished = true;
                self.stream = None;
                if self.error.is_some() {
                    return Ok(None);
                }
                let end = End::from_frame(&frame).map_err(bad)?;
                if let Some(gtid) = &end.gtid {
                    self.inner.saw_gtid(&self.req.cluster, gtid);
                }
                Ok(Some(Event::End(end.into())))
            }
            other => Err(Error::client(
                ErrorCode::ProtocolViolation,
                true,
                format!("unexpected {} frame on a stream", other.name()),
            )),
        }
    }

    /// The position a read-your-writes request must see: the client's for the cluster,
    /// with the caller's own `causal_gtid` (already validated) merged in.
    fn causal_position(&self, cluster: &Option<String>) -> Option<String> {
        let mut pos = self.inner.position(cluster).unwrap_or_default();
        if let Some(given) = self.causal_gtid.as_deref().and_then(|g| GtidPos::parse(g).ok()) {
            pos.merge(&given);
        }
        (!pos.is_empty()).then(|| pos.to_string())
    }

    /// Waits for a usable connection and opens a stream on it.
    async fn start(&mut self) -> Result<StreamGuard, Error> {
        if let Some(conn) = self.session.clone() {
            let frame = self.req.to_frame(0);
            let _waiting = self.inner.enter_waiting()?;
            return conn
                .open_in_session(self.inner.cfg.stream_buffer, |id| frame.with_stream(id))
                .await
                .map_err(|_| session_gone());
        }
        loop {
            let conn = self.inner.wait_conn().await?;
            self.span.record("conn", conn.shared.connection_id);
            let mut req = std::mem::take(&mut self.req);
            if self.read_your_writes {
                // At each attempt: a write that ended meanwhile counts too.
                req.causal_gtid = self.causal_position(&req.cluster);
            }
            if let Some(d) = self.deadline {
                let left = d.saturating_duration_since(Instant::now());
                req.timeout_ms = (left.as_millis() as u64).max(1);
            }
            let frame = req.to_frame(0);
            self.req = req;
            if frame.payload.len() > conn.shared.max_payload {
                return Err(Error::client(
                    ErrorCode::FrameTooLarge,
                    false,
                    format!(
                        "request of {} bytes exceeds the dispatcher's max_payload of {} bytes",
                        frame.payload.len(),
                        conn.shared.max_payload
                    ),
                ));
            }
            let _waiting = self.inner.enter_waiting()?;
            match conn
                .open(self.inner.cfg.stream_buffer, |id| frame.with_stream(id))
                .await
            {
                Ok(s) => return Ok(s),
                Err(_) => continue,
            }
        }
    }
}

/// What a [`RowStream`] yields: the start of a result set, or one row of it.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    ResultSet(Arc<ResultSetMeta>),
    Row(Row),
}

type NextFuture = Pin<Box<dyn Future<Output = (Box<Call>, Option<Result<Event, Error>>)> + Send>>;

/// Rows of a request as they arrive: a [`futures::Stream`] of
/// `Result<StreamItem, Error>`. Frames are pulled from the connection as you read;
/// at most [`ClientConfig::stream_buffer`](crate::ClientConfig::stream_buffer) data
/// frames (plus the closing ERROR/END) wait for you in memory.
///
/// Dropping a `RowStream` before it ends cancels the request (`CANCEL` is sent).
/// A request is resent automatically only until its first result set has been
/// yielded; after that a lost connection ends the stream with `OUTCOME_UNKNOWN`.
pub struct RowStream {
    call: Option<Box<Call>>,
    fut: Option<NextFuture>,
    pending: VecDeque<Vec<Value>>,
    meta: Option<Arc<ResultSetMeta>>,
    summary: Option<ExecResult>,
}

impl RowStream {
    pub(crate) fn new(call: Call) -> RowStream {
        RowStream {
            call: Some(Box::new(call)),
            fut: None,
            pending: VecDeque::new(),
            meta: None,
            summary: None,
        }
    }

    /// The summary, once the stream has ended successfully.
    pub fn summary(&self) -> Option<&ExecResult> {
        self.summary.as_ref()
    }

    /// The current result set's metadata.
    pub fn meta(&self) -> Option<&Arc<ResultSetMeta>> {
        self.meta.as_ref()
    }

    /// The next row, skipping result-set boundaries.
    ///
    /// ```no_run
    /// # async fn f(client: osprey_client::Client) -> Result<(), osprey_client::Error> {
    /// let mut rows = client.stream(osprey_client::Request::sql("SELECT id FROM big"));
    /// while let Some(row) = rows.next_row().await {
    ///     let id: i64 = row?.get(0)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn next_row(&mut self) -> Option<Result<Row, Error>> {
        use futures::StreamExt;
        loop {
            match self.next().await? {
                Ok(StreamItem::Row(r)) => return Some(Ok(r)),
                Ok(StreamItem::ResultSet(_)) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl Stream for RowStream {
    type Item = Result<StreamItem, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(values) = this.pending.pop_front() {
                let meta = this.meta.clone().expect("rows follow a result set");
                return Poll::Ready(Some(Ok(StreamItem::Row(Row::new(meta, values)))));
            }
            if this.fut.is_none() {
                let Some(mut call) = this.call.take() else {
                    return Poll::Ready(None);
                };
                this.fut = Some(Box::pin(async move {
                    let ev = call.next().await;
                    (call, ev)
                }));
            }
            let (call, ev) = ready!(this.fut.as_mut().expect("future set").as_mut().poll(cx));
            this.fut = None;
            match ev {
                None => return Poll::Ready(None),
                Some(Ok(Event::ResultSet(m))) => {
                    this.call = Some(call);
                    this.meta = Some(m.clone());
                    return Poll::Ready(Some(Ok(StreamItem::ResultSet(m))));
                }
                Some(Ok(Event::Rows(rows))) => {
                    this.call = Some(call);
                    this.pending.extend(rows);
                }
                Some(Ok(Event::Restart)) => {
                    this.call = Some(call);
                    this.pending.clear();
                }
                Some(Ok(Event::End(s))) => {
                    this.summary = Some(s);
                    return Poll::Ready(None);
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}

/// Reads a whole call into a [`QueryResult`].
pub(crate) async fn collect(mut call: Call) -> Result<QueryResult, Error> {
    let mut sets: Vec<ResultSet> = Vec::new();
    while let Some(ev) = call.next().await {
        match ev? {
            Event::ResultSet(meta) => sets.push(ResultSet { meta, rows: Vec::new() }),
            Event::Rows(rows) => {
                let set = sets.last_mut().expect("rows follow a result set");
                let meta = set.meta.clone();
                set.rows.extend(rows.into_iter().map(|v| Row::new(meta.clone(), v)));
            }
            Event::Restart => sets.clear(),
            Event::End(summary) => return Ok(QueryResult { sets, summary }),
        }
    }
    Err(Error::client(ErrorCode::Internal, true, "request ended without END"))
}

/// A session's connection closed: the session is gone (the dispatcher rolled back what it
/// had open), and this statement never left.
pub(crate) fn session_gone() -> Error {
    Error::client(
        ErrorCode::SessionAborted,
        false,
        "the session's connection to the dispatcher is gone: the session ended (an open transaction was rolled back by the dispatcher)",
    )
}

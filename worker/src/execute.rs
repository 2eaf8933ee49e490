//! One `REQUEST` in, its frames out: `COLUMNS`/`ROWS` per result set, then `END`, or
//! `ERROR` + `END`. Rows are streamed in batches, never collected.

use std::time::Duration;

use osprey_protocol::{
    End, ErrorBody, ErrorCode, Frame, GtidPos, Kind, Origin, ProtocolError, Request, ResultEnd, Rows, SessionReset,
    Statement, Value,
};
use osprey_wire::mysql_common::constants::SessionStateType;
use osprey_wire::mysql_common::packets::session_state_change::SessionStateChange;
use osprey_wire::{Event as DbEvent, OkPacket, Session, StatusFlags};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::cancel::{StopReason, Tracker};
use crate::convert::{self, ColumnKind};
use crate::link::{LinkGone, LinkOut, Queue};
use crate::session::{self, ErrorClass, ER_QUERY_INTERRUPTED, ER_STATEMENT_TIMEOUT};
mod columns_memo;
mod facts;
mod pipeline;

/// Room left in a frame for everything around the row values.
const FRAME_SLACK: usize = 1024;

/// What the serving loop must do after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered; keep serving.
    Served,
    /// Answered with `DATABASE_FATAL`; the session is gone: exit with code 2.
    Fatal,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExecError {
    #[error(transparent)]
    Db(#[from] osprey_wire::Error),
    /// The session's state is unknown (a clean-up failed): answered as fatal.
    #[error("{0}")]
    Lost(String),
    #[error(transparent)]
    Link(#[from] LinkGone),
    #[error("a row of about {0} bytes does not fit in one frame")]
    RowTooLarge(usize),
    #[error("stopped between statements")]
    Stopped(StopReason),
    #[error(
        "the request left a transaction open, which was rolled back: each request runs on \
         whichever worker is free, so send transactions as one batch"
    )]
    LeftOpen,
    /// Found while executing, before the statement was sent (`INVALID_REQUEST`).
    #[error("{0}")]
    Refused(String),
}

/// Limits for cutting `ROWS` frames.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub rows: usize,
    pub bytes: usize,
    pub max_payload: usize,
}

/// Runs requests on the worker's one database session.
pub struct Executor {
    conn: Session,
    tracker: Tracker,
    limits: BatchLimits,
    /// The server is MariaDB (`SET STATEMENT max_statement_time` is available).
    mariadb: bool,
    /// The session was found dead while idle: nothing more can run on it.
    dead: bool,
    reset: SessionReset,
    /// The server's `max_allowed_packet`: a larger packet makes the server close the session.
    max_packet: usize,
    /// The session reports `last_gtid` in OK packets (`session::TRACK_LAST_GTID`), to be
    /// asked again after each session reset.
    track_gtid: bool,
    /// The session's `@@last_gtid` as last seen (`None`: empty, as after a reset).
    session_gtid: Option<String>,
    /// A statement text to prepare when the session is next idle: a variant that a
    /// request needed to join a pipeline (see [`pipeline`]).
    to_prepare: Option<std::sync::Arc<str>>,
    /// Which texts are known to run fast (nothing is pipelined behind the others).
    speeds: pipeline::Speeds,
    /// What the texts seen lately are ([`facts`]).
    known: facts::Known,
    /// Requests the next pipeline may hold at most (the worker's `max_requests` budget).
    pipeline_limit: Option<u64>,
    /// Statements may be pipelined (the dispatcher knows `STARTED`).
    pipelining: bool,
    /// Prepared statements' `COLUMNS` payloads, encoded once ([`columns_memo`]).
    memo: std::rc::Rc<columns_memo::ColumnsMemo>,
    /// In a session: a statement may have left state beyond a transaction (variables,
    /// temporary tables, locks, ...): its end needs the full reset.
    session_dirty: bool,
    /// The database and tracked variables applied for requests that asked for them
    /// (`REQUEST.schema`/`vars`, protocol 1.6); empty after every reset.
    applied: Applied,
    /// No statement of the session pinned to this worker has run yet (or none is pinned):
    /// what it holds is not yet its client's.
    session_fresh: bool,
}

/// What `REQUEST.schema` and `REQUEST.vars` have made of the session since its last reset.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Applied {
    /// `None`: the backend's configured database.
    schema: Option<String>,
    vars: Vec<(String, String)>,
}

impl Applied {
    /// Whether a request runs on this session as it is.
    pub(crate) fn serves(&self, request: &Request) -> bool {
        self.schema == request.schema && self.vars == request.vars
    }
}

impl Executor {
    pub fn new(
        conn: Session,
        tracker: Tracker,
        limits: BatchLimits,
        mariadb: bool,
        reset: SessionReset,
        max_packet: usize,
        track_gtid: bool,
    ) -> Executor {
        Executor {
            conn,
            tracker,
            limits,
            mariadb,
            dead: false,
            reset,
            max_packet,
            track_gtid,
            session_gtid: None,
            to_prepare: None,
            speeds: pipeline::Speeds::default(),
            known: facts::Known::default(),
            pipeline_limit: None,
            pipelining: true,
            memo: Default::default(),
            session_dirty: false,
            applied: Applied::default(),
            session_fresh: true,
        }
    }

    /// Whether statements may be pipelined on the session: only for a dispatcher of
    /// protocol 1.4 or later, which knows `STARTED`.
    pub fn with_pipelining(mut self, on: bool) -> Executor {
        self.pipelining = on;
        self
    }

    /// The next [`Executor::serve`] answers at most `limit` requests (`None`: no limit):
    /// the requests this worker may still serve before it asks to retire.
    pub fn limit_pipeline(&mut self, limit: Option<u64>) {
        self.pipeline_limit = limit;
    }

    /// Closes the session cleanly.
    pub async fn close(self) {
        if !self.dead {
            match tokio::time::timeout(Duration::from_secs(5), self.conn.quit()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, "disconnect"),
                Err(_) => warn!("disconnect did not finish within 5 s"),
            }
        }
    }

    /// Checks an idle session (`COM_PING`). `Err` (and the session marked dead) when it is
    /// gone, e.g. closed by the server's `wait_timeout`.
    pub async fn check_idle(&mut self) -> Result<(), osprey_wire::Error> {
        if self.dead {
            return Ok(());
        }
        match self.conn.ping().await {
            Err(e) if session::classify(&e) == ErrorClass::Fatal => {
                self.dead = true;
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Checks a `REQUEST` frame without answering it: decoded, valid, allowed, within the
    /// server's packet limit. `Err`: the answer (never dispatched) and what follows it.
    pub(crate) fn inspect(&self, frame: &Frame) -> Result<Checked, (ErrorBody, Outcome)> {
        let stream = frame.stream;
        let refuse = |code, why: String| (ErrorBody::undispatched(Origin::Worker, code, why), Outcome::Served);
        let request = Request::from_frame(frame).map_err(|e| {
            let code = match e {
                ProtocolError::BadUtf8 => ErrorCode::BadUtf8,
                _ => ErrorCode::BadBody,
            };
            refuse(code, e.to_string())
        })?;
        request
            .validate()
            .map_err(|why| refuse(ErrorCode::InvalidRequest, why))?;
        // One statement, or each of a batch: its text's facts (kept per text).
        // (A single statement's without a Vec of its own.)
        let single: [std::rc::Rc<facts::Facts>; 1];
        let batch: Vec<std::rc::Rc<facts::Facts>>;
        let texts: &[std::rc::Rc<facts::Facts>] = if request.batch.is_empty() {
            single = [self.known.of(&request.sql)];
            &single
        } else {
            batch = request.batch.iter().map(|st| self.known.of(&st.sql)).collect();
            &batch
        };
        let controls_session = texts.iter().any(|f| f.controls_session);
        // In a session the worker is pinned to one client until the dispatcher's RESET:
        // its state is the client's to keep. Otherwise (statement-level pooling) the next
        // request may come from another client.
        let in_session = request.session.is_some();
        let leaves_state = !in_session && (self.reset == SessionReset::Always || texts.iter().any(|f| f.touches_state));
        let out_of_sight = texts.iter().any(|f| f.out_of_sight);
        if controls_session && !in_session && !request.prepare_only {
            return Err(refuse(ErrorCode::InvalidRequest, NEEDS_SESSION.into()));
        }
        for (name, value) in &request.vars {
            osprey_sql::vars::check(name, value)
                .map_err(|why| refuse(ErrorCode::InvalidRequest, format!("vars: {why}")))?;
            if !in_session && name == "autocommit" && osprey_sql::vars::autocommit_value(value) != Some(true) {
                return Err(refuse(
                    ErrorCode::InvalidRequest,
                    "vars: autocommit off opens a transaction: it needs a session".into(),
                ));
            }
        }
        // In a session: what the session's end must undo. A transaction alone (START
        // TRANSACTION, COMMIT, ROLLBACK, savepoints) a ROLLBACK undoes; anything else the
        // statement-level text scan would reset after (and table locks, XA) needs the full
        // reset, as `session_reset = always` does.
        let dirties_session = in_session
            && (self.reset == SessionReset::Always
                || texts.iter().any(|f| f.touches_state)
                || (controls_session && !only_transaction_control(&request.sql)));
        // Timeout: on MariaDB a single plain SELECT is bounded by the server itself;
        // anything else by a timer that sends KILL QUERY.
        let server_timeout =
            (request.timeout_ms > 0 && self.mariadb && request.batch.is_empty() && texts[0].plain_select)
                .then_some(request.timeout_ms);
        let sql: std::sync::Arc<str> = match server_timeout {
            Some(ms) => format!(
                "SET STATEMENT max_statement_time={:.3} FOR {}",
                ms as f64 / 1000.0,
                request.sql
            )
            .into(),
            None => request.sql.as_str().into(),
        };
        let checked = if request.batch.is_empty() {
            // As sent: with the server-side timeout's prefix, if any (not kept: each
            // timeout makes another text).
            let facts = if server_timeout.is_some() {
                std::rc::Rc::new(facts::Facts::scan(&sql))
            } else {
                texts[0].clone()
            };
            if request.prepare_only {
                facts.check_text()
            } else {
                preflight(&facts, &sql, &request.params, self.max_packet)
            }
        } else {
            request
                .batch
                .iter()
                .zip(texts)
                .enumerate()
                .try_for_each(|(i, (st, facts))| {
                    preflight(facts, &st.sql, &st.params, self.max_packet)
                        .map_err(|e| format!("batch statement {i}: {e}"))
                })
        };
        checked.map_err(|why| refuse(ErrorCode::InvalidRequest, why))?;
        if self.dead {
            let mut body = ErrorBody::undispatched(
                Origin::Worker,
                ErrorCode::DatabaseFatal,
                "the worker's database session was lost while idle",
            );
            body.retryable = true;
            return Err((body, Outcome::Fatal));
        }
        Ok(Checked {
            stream,
            request,
            sql,
            server_timeout,
            leaves_state,
            out_of_sight,
            in_session,
            dirties_session,
        })
    }

    /// Answers one `REQUEST` frame completely, and with it (pipelined, see
    /// [`pipeline`]) the requests queued behind it that may share the session's
    /// pipeline. Returns what the serving loop must do and how many requests were
    /// answered. `Err` only when the link is gone.
    pub async fn serve(&mut self, frame: Frame, queue: &Queue, link: &LinkOut) -> Result<(Outcome, u64), LinkGone> {
        let stream = frame.stream;
        let checked = match self.inspect(&frame) {
            Ok(c) => c,
            Err((body, outcome)) => {
                self.tracker.finish(stream).await;
                Emitter::new(link, &self.memo, stream, self.limits).fail(body).await?;
                return Ok((outcome, 1));
            }
        };
        if checked.request.session.is_some() && self.session_fresh && self.applied.serves(&checked.request) {
            self.session_fresh = false;
        }
        if !self.applied.serves(&checked.request) {
            if let Err(e) = self.apply(&checked.request).await {
                self.tracker.finish(stream).await;
                let e = Err::<(), _>(e);
                let fatal = is_fatal(&e);
                let Err(e) = e else { unreachable!() };
                let (mut body, _) = error_body(&e, None, false);
                // The statement itself never ran: nothing of it reached the database.
                body.dispatched = false;
                Emitter::new(link, &self.memo, stream, self.limits).fail(body).await?;
                return Ok((if fatal { Outcome::Fatal } else { Outcome::Served }, 1));
            }
        }
        if self.may_pipeline(&checked) && queue.peek_request(|_| ()).is_some() {
            return self.run_pipeline(checked, queue, link).await;
        }
        self.run_alone(checked, link).await.map(|o| (o, 1))
    }

    /// Runs one checked request by itself, with the session to itself.
    async fn run_alone(&mut self, checked: Checked, link: &LinkOut) -> Result<Outcome, LinkGone> {
        let Checked {
            stream,
            request,
            sql: single_sql,
            server_timeout,
            leaves_state,
            out_of_sight,
            in_session,
            dirties_session,
        } = checked;
        // Before it runs: even a failed statement may have left something.
        self.session_dirty |= dirties_session;
        let mut out = Emitter::new(link, &self.memo, stream, self.limits);
        if let Err(reason) = self.tracker.start(stream) {
            self.tracker.finish(stream).await;
            let code = stop_code(reason);
            out.fail(ErrorBody::undispatched(
                Origin::Worker,
                code,
                "stopped before it started",
            ))
            .await?;
            return Ok(Outcome::Served);
        }

        let mut timer = None;
        if request.timeout_ms > 0 && server_timeout.is_none() {
            let tracker = self.tracker.clone();
            let after = Duration::from_millis(request.timeout_ms);
            timer = Some(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                tracker.stop(stream, StopReason::TimedOut);
            }));
        }

        let started = Instant::now();
        let mut acc = Summary {
            text_rows: request.text_rows,
            raw_rows: request.raw_rows,
            multi_results: request.multi_results,
            in_session,
            ..Summary::default()
        };
        let result = if request.prepare_only {
            describe(&mut self.conn, &single_sql, &mut out).await
        } else if request.batch.is_empty() {
            let how = Send {
                prepared: request.prepared,
                blob: &request.blob_params,
                raw: request.raw_rows,
            };
            run_statement(&mut self.conn, &single_sql, &request.params, how, &mut out, &mut acc).await
        } else {
            run_batch(
                &mut self.conn,
                &self.tracker,
                stream,
                &request.batch,
                request.raw_rows,
                &mut out,
                &mut acc,
            )
            .await
        };
        if let Some(t) = timer {
            t.abort();
        }
        let elapsed = started.elapsed().as_micros() as u64;
        let stop = self.tracker.reason(stream);
        if request.batch.is_empty() && !matches!(result, Err(ExecError::Link(_))) {
            self.speeds.note(&request.sql, elapsed, stop.is_some());
        }
        // Waits for a KILL QUERY in flight, so it cannot hit the clean-up below.
        let settled = self.tracker.finish(stream).await;
        if self.track_gtid && settled && result.is_ok() && out_of_sight {
            self.ask_last_gtid(&mut acc).await;
        }
        let fatal = is_fatal(&result);
        let cleaned = if fatal || matches!(result, Err(ExecError::Link(_))) {
            Ok(false)
        } else if !settled {
            Err("a KILL QUERY did not settle in time".to_string())
        } else if in_session {
            // The session's transaction stays as the client left it (a failed statement
            // does not end it in MySQL); the dispatcher needs to know whether one is open.
            match self.in_transaction(&result).await {
                Ok(open) => {
                    acc.in_transaction = open;
                    self.follow_autocommit(acc.autocommit);
                    Ok(false)
                }
                Err(e) => Err(e.to_string()),
            }
        } else {
            let cleaned = match reset_session(&mut self.conn, result.is_err()).await {
                Ok(left_open) if leaves_state => self.reset().await.map(|()| left_open),
                r => r.map_err(|e| e.to_string()),
            };
            // Outside a session the clean-up turns autocommit back on, whatever a
            // statement (a CALL) did to it.
            if cleaned.is_ok() && acc.autocommit.is_some() {
                acc.autocommit = Some(true);
            }
            cleaned
        };
        // A reset empties @@last_gtid; otherwise the session keeps the last commit's.
        self.session_gtid = match &cleaned {
            Ok(_) if leaves_state => None,
            _ => acc.last_gtid.clone().or(self.session_gtid.take()),
        };
        let result = match (result, cleaned) {
            (Ok(()), Ok(true)) => Err(ExecError::LeftOpen),
            (r, Ok(_)) => r,
            // The session's state is unknown: answer with a fatal error, then let a fresh
            // worker take over.
            (r, Err(why)) => {
                let what = match &r {
                    Ok(()) => "the request succeeded".to_string(),
                    Err(e) => format!("the request failed ({e})"),
                };
                Err(ExecError::Lost(format!(
                    "{what}, but resetting the session afterwards failed: {why}"
                )))
            }
        };
        answer(&mut out, result, stop, !request.batch.is_empty(), &acc, elapsed).await
    }
}

/// Whether every statement of `sql` is plain transaction control (`START TRANSACTION`,
/// `COMMIT`, `ROLLBACK`, savepoints), which a ROLLBACK at the session's end undoes.
fn only_transaction_control(sql: &str) -> bool {
    osprey_sql::code_text(sql)
        .split(';')
        .filter(|st| !st.trim().is_empty())
        .all(|st| {
            let first = st.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
            matches!(
                first.as_str(),
                "start" | "commit" | "rollback" | "savepoint" | "release"
            )
        })
}

/// Why transaction control outside a session is refused, and what to do instead.
pub(crate) const NEEDS_SESSION: &str = "each request outside a session runs on whichever worker is free, so \
     transaction control (BEGIN, COMMIT, ROLLBACK, SET autocommit, XA) and table locks cannot be sent as \
     single statements: open a session (REQUEST open_session, then requests with session = its stream id; \
     the SDK's client.transaction() or client.session()), or send the statements as one batch, which runs \
     in one transaction";

/// Sends a request's terminal frames: `END` with the summary, or `ERROR` + `END`.
pub(crate) async fn answer(
    out: &mut Emitter<'_>,
    result: Result<(), ExecError>,
    stop: Option<StopReason>,
    batch: bool,
    acc: &Summary,
    elapsed: u64,
) -> Result<Outcome, LinkGone> {
    let stream = out.stream;
    match result {
        Ok(()) => {
            out.flush_rows(false).await?;
            if unasked_result_end() {
                // Test-only: a broken worker, for the dispatcher's check of what it relays.
                out.link
                    .push(&Frame::new(Kind::ResultEnd, stream, &ResultEnd::default()));
            }
            match (fault_rows(), acc.raw_rows) {
                // Test-only, the same: RAW_ROWS nobody asked for.
                (Some(FaultRows::Unasked), false) => out.link.push(&Frame::with_payload(
                    Kind::RawRows,
                    stream,
                    osprey_protocol::raw_rows::encode::<&[u8]>(&[]).into(),
                )),
                // A "row" a MySQL client would read as an ERR packet, or as the result's end.
                (Some(FaultRows::NotARow(forged)), true) => out.link.push(&Frame::with_payload(
                    Kind::RawRows,
                    stream,
                    osprey_protocol::raw_rows::encode(&[forged]).into(),
                )),
                _ => {}
            }
            let end = End {
                affected_rows: acc.affected_rows,
                last_insert_id: acc.last_insert_id,
                warnings: acc.warnings,
                rows: out.sent_rows,
                server_time_us: elapsed,
                queue_time_us: 0,
                gtid: (!acc.gtid.is_empty()).then(|| acc.gtid.to_text()),
                in_transaction: acc.in_transaction,
                info: acc.info.clone(),
                autocommit: acc.autocommit,
            };
            out.end(&end).await?;
            Ok(Outcome::Served)
        }
        Err(ExecError::Link(gone)) => Err(gone),
        Err(e) => {
            let (body, outcome) = error_body(&e, stop, batch);
            match outcome {
                Outcome::Fatal => warn!(stream, error = %e, "fatal database error"),
                Outcome::Served => debug!(stream, error = %e, "request failed"),
            }
            out.discard();
            // In a session the END after the ERROR still says whether a transaction is
            // open (a failed statement does not end one).
            out.link.push(&Frame::new(Kind::Error, stream, &body));
            // After an ERROR only these say something (in a session): the failed statement
            // left the transaction and autocommit as the statements before it had.
            let end = End {
                in_transaction: acc.in_transaction,
                autocommit: acc.autocommit.filter(|_| acc.in_session),
                ..End::default()
            };
            out.end(&end).await?;
            Ok(outcome)
        }
    }
}

/// Test-only (`OSPREY_FAULT_UNASKED_RESULT_END=1`): the worker sends a `RESULT_END` before
/// every `END`, asked for or not, as a broken worker would.
fn unasked_result_end() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("OSPREY_FAULT_UNASKED_RESULT_END").is_ok_and(|v| v == "1"))
}

/// What a broken worker sends among its rows (test-only, `OSPREY_FAULT_ROWS`).
#[derive(Clone, Copy)]
enum FaultRows {
    /// `unasked`: an empty `RAW_ROWS` before every `END` of a request that did not ask
    /// for raw rows.
    Unasked,
    /// `not_a_row` / `eof_row`: a `RAW_ROWS` whose row is an ERR packet / a 9-byte `0xFE`
    /// packet (the result's end to a client), before every `END` of a request that asked
    /// for raw rows.
    NotARow(&'static [u8]),
}

fn fault_rows() -> Option<FaultRows> {
    static ON: std::sync::OnceLock<Option<FaultRows>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("OSPREY_FAULT_ROWS").as_deref() {
        Ok("unasked") => Some(FaultRows::Unasked),
        Ok("not_a_row") => Some(FaultRows::NotARow(b"\xff\x15\x04#28000forged")),
        Ok("eof_row") => Some(FaultRows::NotARow(b"\xfe\x00\x00\x02\x00\x00\x00\x00\x00")),
        _ => None,
    })
}

/// The error ends the session.
pub(crate) fn is_fatal<T>(result: &Result<T, ExecError>) -> bool {
    match result {
        Err(ExecError::Db(e)) => session::classify(e) == ErrorClass::Fatal,
        Err(ExecError::Lost(_)) => true,
        _ => false,
    }
}

/// A request that passed [`Executor::inspect`].
pub(crate) struct Checked {
    pub(crate) stream: u32,
    pub(crate) request: Request,
    /// It runs in a session (`REQUEST.session`): no reset after it.
    pub(crate) in_session: bool,
    /// In a session, it may leave state that only the full reset undoes.
    pub(crate) dirties_session: bool,
    /// The single statement's text as sent (with the server-side timeout, if any).
    pub(crate) sql: std::sync::Arc<str>,
    pub(crate) server_timeout: Option<u64>,
    /// The request may leave session state behind (or `session_reset = always`).
    pub(crate) leaves_state: bool,
    /// It may commit a GTID out of the OK packets' sight ([`osprey_sql::commits_out_of_sight`]).
    pub(crate) out_of_sight: bool,
}

impl Executor {
    /// In a session, the client's own statements may turn autocommit on or off (several in
    /// one request): what the session holds now is what the server said (`on`), so that
    /// the next request, whose `vars` follow the server's status too, is served as it is
    /// rather than with a `SET` first (which would also replace its `ROW_COUNT()`).
    fn follow_autocommit(&mut self, on: Option<bool>) {
        let Some(on) = on else { return };
        let vars = &mut self.applied.vars;
        vars.retain(|(n, _)| n != "autocommit");
        if !on {
            // Where the front end puts it: last (`ClientState::request_vars`).
            vars.push(("autocommit".into(), "0".into()));
        }
    }

    /// Brings the session to the request's `schema` and `vars` (checked by `inspect`):
    /// only what it lacks is applied; a session that has other variables, or must go back
    /// to the configured database when there is none to `USE`, is reset first.
    async fn apply(&mut self, request: &Request) -> Result<(), ExecError> {
        let lost = |why: String| ExecError::Lost(format!("resetting the session to apply its variables failed: {why}"));
        let configured = self.conn.opts().database.clone().filter(|d| !d.is_empty());
        // In a session after its first statement the state is its client's (it may have
        // set things itself): never reset there, set what differs by name.
        let own_session = request.session.is_some() && !self.session_fresh;
        let mut sql = Vec::new();
        if own_session {
            let wanted = |name: &str| request.vars.iter().find(|(n, _)| n == name);
            for (name, value) in &request.vars {
                if !self.applied.vars.iter().any(|(n, v)| n == name && v == value) {
                    sql.extend(osprey_sql::vars::apply_statement(&[(name.clone(), value.clone())]));
                }
            }
            for (name, _) in &self.applied.vars {
                match name.as_str() {
                    _ if wanted(name).is_some() => {}
                    "autocommit" => sql.push("SET SESSION autocommit = 1".into()),
                    // SET NAMES is only ever replaced, never dropped, within a session.
                    "names" => {}
                    _ => sql.push(format!("SET SESSION {name} = DEFAULT")),
                }
            }
        } else {
            let extends = request.vars.starts_with(&self.applied.vars);
            let back_to_nothing = request.schema.is_none() && self.applied.schema.is_some() && configured.is_none();
            if !extends || back_to_nothing {
                self.reset().await.map_err(lost)?;
            }
            let new = &request.vars[self.applied.vars.len()..];
            sql.extend(osprey_sql::vars::apply_statement(new));
        }
        if self.applied.schema != request.schema {
            if let Some(db) = request.schema.as_ref().or(configured.as_ref()) {
                sql.insert(0, format!("USE `{}`", db.replace('`', "``")));
            }
        }
        if !sql.is_empty() {
            let r = self.conn.query_drop(&sql.join("; ")).await;
            if r.is_err() && !self.conn.is_broken() {
                if own_session {
                    // Part of it may have run on the client's own session: what it holds
                    // now is unknown, and it cannot be reset under the client.
                    // A failed SET changes nothing, but the USE before it may have run:
                    // a database no request names makes the next one `USE` its own again.
                    self.applied.schema = Some(String::new());
                } else {
                    // Part of it may have run: a reset puts the session back in a known state.
                    self.reset().await.map_err(lost)?;
                }
            }
            r?;
        }
        if request.session.is_some() {
            self.session_fresh = false;
        }
        self.applied = Applied {
            schema: request.schema.clone(),
            vars: request.vars.clone(),
        };
        Ok(())
    }

    /// The full reset ([`reset_connection`]), which also forgets what was applied.
    async fn reset(&mut self) -> Result<(), String> {
        self.applied = Applied::default();
        self.session_gtid = None;
        reset_connection(&mut self.conn, self.mariadb, self.track_gtid).await
    }

    /// In a session, after a request: whether a transaction is open on the session. After
    /// a success the server's status flags say; after an error they are stale, so MariaDB
    /// is asked (`@@in_transaction`); MySQL has no such variable: a deadlock (1213) rolled
    /// the transaction back, any other error left it as it was.
    async fn in_transaction(&mut self, result: &Result<(), ExecError>) -> Result<bool, osprey_wire::Error> {
        let was = self.conn.status_flags().contains(StatusFlags::SERVER_STATUS_IN_TRANS);
        match result {
            Ok(()) => Ok(was),
            Err(_) if self.mariadb => {
                let rows = session::query_rows(&mut self.conn, "SELECT @@in_transaction").await?;
                let v = rows.first().and_then(|r| r.first()).and_then(session::text);
                Ok(v.as_deref() == Some("1"))
            }
            Err(ExecError::Db(e)) if e.server().is_some_and(|s| s.code == 1213) => Ok(false),
            Err(_) => Ok(was),
        }
    }

    /// Ends the session this worker served (the dispatcher's `RESET`, protocol 1.5): the
    /// database session goes back to its initial state (an open transaction rolled back,
    /// temporary tables dropped, table and user locks released, variables reset), answered
    /// with `END`. A reset that fails leaves the state unknown: `ERROR DATABASE_FATAL`, and
    /// the worker exits.
    pub async fn end_session(&mut self, stream: u32, link: &LinkOut) -> Result<Outcome, LinkGone> {
        let mut out = Emitter::new(link, &self.memo, stream, self.limits);
        // Variables applied in the session need the full reset; a database (`USE`) and
        // autocommit do not: the ROLLBACK path turns autocommit back on (and it leaves
        // `applied`), the database stays what `applied` says. The full reset would drop the
        // prepared statements, which every session's client prepares again otherwise
        // (seen: sysbench's oltp_read_write through the MySQL port re-prepared its 9
        // statements per transaction).
        let full = std::mem::take(&mut self.session_dirty) || self.applied.vars.iter().any(|(n, _)| n != "autocommit");
        self.session_fresh = true;
        let result = if self.dead {
            Err("the database session was lost".to_string())
        } else if full {
            self.reset().await
        } else {
            // Only a transaction to end: a ROLLBACK (and autocommit back on), which keeps
            // the session's prepared statements; the full reset drops them, and the next
            // session would prepare each again.
            reset_session(&mut self.conn, true)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        match result {
            Ok(()) => {
                if full {
                    self.session_gtid = None;
                } else {
                    self.applied.vars.retain(|(n, _)| n != "autocommit");
                }
                out.end(&End::default()).await?;
                Ok(Outcome::Served)
            }
            Err(why) => {
                warn!(error = %why, "resetting the session at its end failed");
                let body = ErrorBody {
                    dispatched: true,
                    ..ErrorBody::undispatched(
                        Origin::Worker,
                        ErrorCode::DatabaseFatal,
                        format!("resetting the session failed: {why}"),
                    )
                };
                out.fail(body).await?;
                Ok(Outcome::Fatal)
            }
        }
    }

    /// The fallback for [`osprey_sql::commits_out_of_sight`]: reads `@@last_gtid` and takes it in if
    /// it is not what the session already had before (then this request committed it).
    async fn ask_last_gtid(&mut self, acc: &mut Summary) {
        let now = session::query_rows(&mut self.conn, "SELECT @@last_gtid")
            .await
            .map(|rows| rows.first().and_then(|r| r.first()).and_then(session::text));
        match now {
            Ok(Some(now)) if !now.is_empty() => {
                let known = acc.last_gtid.as_ref().or(self.session_gtid.as_ref());
                if known != Some(&now) {
                    take_gtid(&now, acc);
                }
            }
            Ok(_) => {}
            // The session reset that follows meets the same trouble and decides.
            Err(e) => debug!(error = %e, "SELECT @@last_gtid failed"),
        }
    }
}

/// [`osprey_sql::commits_out_of_sight`] for any statement of a request.
#[cfg(test)]
fn commits_out_of_sight(request: &Request) -> bool {
    if request.batch.is_empty() {
        osprey_sql::commits_out_of_sight(&request.sql)
    } else {
        request.batch.iter().any(|s| osprey_sql::commits_out_of_sight(&s.sql))
    }
}

/// The next request may come from another client: never hand it an open
/// transaction or autocommit turned off (e.g. by a stored procedure, or a
/// statement that failed inside one). The server's status flags on the last OK
/// packet tell without a round trip; after an error they are gone, so a failed
/// request always gets a ROLLBACK. Ok(true): a successful request had left a
/// transaction open, which was rolled back.
async fn reset_session(conn: &mut Session, failed: bool) -> Result<bool, osprey_wire::Error> {
    let flags = conn.last_ok().map(|ok| ok.status_flags());
    let in_trans = flags.is_some_and(|f| f.contains(StatusFlags::SERVER_STATUS_IN_TRANS));
    let autocommit_off = flags.is_some_and(|f| !f.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT));
    if !(failed || in_trans || autocommit_off) {
        return Ok(false);
    }
    if in_trans && !failed {
        warn!("request left a transaction open; rolling it back");
    }
    let ok = conn.query_drop("ROLLBACK").await?;
    let autocommit_off = !ok.status_flags().contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
    if autocommit_off {
        warn!("request turned autocommit off; turning it back on");
        conn.query_drop("SET autocommit = 1").await?;
    }
    Ok(in_trans && !failed)
}

/// Gives the session back its initial state: variables, temporary tables,
/// user locks, prepared statements, and the configured database; then asks again for
/// `last_gtid` tracking (`track_gtid`), which the reset turned off with the other
/// session variables.
async fn reset_connection(conn: &mut Session, mariadb: bool, track_gtid: bool) -> Result<(), String> {
    let db = conn
        .opts()
        .database
        .as_deref()
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('`', "``"));
    let reset = match db {
        Some(_) => match conn.reset_connection().await {
            Ok(()) => true,
            // ER_UNKNOWN_COM_ERROR: a server older than COM_RESET_CONNECTION.
            Err(osprey_wire::Error::Server(e)) if e.code == 1047 => false,
            Err(e) => return Err(e.to_string()),
        },
        None => false,
    };
    if !reset {
        // No database to go back to (COM_RESET_CONNECTION keeps the current one),
        // or a server without it: COM_CHANGE_USER with the same credentials resets
        // everything, the database included.
        conn.change_user().await.map_err(|e| e.to_string())?;
        if track_gtid {
            conn.query_drop(session::TRACK_LAST_GTID)
                .await
                .map_err(|e| e.to_string())?;
        }
        return Ok(());
    }
    let mut restore = format!("USE `{}`", db.unwrap_or_default());
    if !mariadb {
        // MySQL's reset also resets the connection character set to the server's
        // default (MySQL bug #97633); put back what the driver negotiated.
        restore.push_str("; SET NAMES utf8mb4 COLLATE utf8mb4_general_ci");
    }
    if track_gtid {
        // In the same round trip as the USE.
        restore.push_str("; ");
        restore.push_str(session::TRACK_LAST_GTID);
    }
    conn.query_drop(&restore).await.map(|_| ()).map_err(|e| e.to_string())
}

/// Sums over the statements of a request.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    affected_rows: u64,
    last_insert_id: Option<u64>,
    warnings: u32,
    /// GTIDs the server reported for the request's commits (`last_gtid`), merged per domain.
    gtid: GtidPos,
    /// The last `last_gtid` value reported, as the server wrote it.
    last_gtid: Option<String>,
    /// In a session: a transaction is open after the request (`END.in_transaction`).
    in_transaction: bool,
    /// `REQUEST.text_rows`: text-protocol values go out as the server's bytes.
    pub(crate) text_rows: bool,
    /// `REQUEST.raw_rows`: rows go out as `RAW_ROWS`.
    pub(crate) raw_rows: bool,
    /// The server's autocommit status after the last result (`END.autocommit`).
    autocommit: Option<bool>,
    /// The request ran in a session: after an error, `END` still says what it holds.
    in_session: bool,
    /// The last statement's OK message (`END.info`).
    info: Option<String>,
    /// `REQUEST.multi_results`: each result but the last ends with `RESULT_END`, and the
    /// counters start again for the next.
    pub(crate) multi_results: bool,
}

fn take_gtid(text: &str, acc: &mut Summary) {
    match GtidPos::parse(text) {
        Ok(pos) => {
            acc.gtid.merge(&pos);
            acc.last_gtid = Some(text.to_owned());
        }
        Err(e) => debug!(value = %text, error = %e, "last_gtid is not a GTID"),
    }
}

/// Takes in the `last_gtid` an OK packet reports: the server sends it only when it
/// changed, that is when the statement just ended committed a transaction. A packet
/// without the session-state flag (every read's) costs one bit test.
fn note_gtid(ok: Option<&OkPacket<'_>>, acc: &mut Summary) {
    let Some(ok) = ok.filter(|ok| ok.status_flags().contains(StatusFlags::SERVER_SESSION_STATE_CHANGED)) else {
        return;
    };
    let Ok(changes) = ok.session_state_info() else {
        return;
    };
    for change in changes {
        if change.data_type() != SessionStateType::SESSION_TRACK_SYSTEM_VARIABLES {
            continue;
        }
        let Ok(SessionStateChange::SystemVariables(vars)) = change.decode() else {
            continue;
        };
        for var in vars.iter().filter(|v| v.name_bytes() == b"last_gtid") {
            take_gtid(&String::from_utf8_lossy(var.value_bytes()), acc);
        }
    }
}

async fn run_batch(
    conn: &mut Session,
    tracker: &Tracker,
    stream: u32,
    batch: &[Statement],
    raw: bool,
    out: &mut Emitter<'_>,
    acc: &mut Summary,
) -> Result<(), ExecError> {
    conn.query_drop("START TRANSACTION").await?;
    let result = async {
        for st in batch {
            if let Some(reason) = tracker.reason(stream) {
                return Err(ExecError::Stopped(reason));
            }
            let how = Send {
                prepared: false,
                blob: &[],
                raw,
            };
            run_statement(conn, &st.sql, &st.params, how, out, acc).await?;
        }
        if let Some(reason) = tracker.reason(stream) {
            return Err(ExecError::Stopped(reason));
        }
        let ok = conn.query_drop("COMMIT").await?;
        // The statements' OK packets carry no GTID inside the transaction: the COMMIT's does.
        note_gtid(Some(&ok), acc);
        Ok(())
    }
    .await;
    match result {
        Ok(()) => Ok(()),
        Err(ExecError::Db(e)) if session::classify(&e) == ErrorClass::Fatal => Err(ExecError::Db(e)),
        Err(e) => {
            // A KILL QUERY still in flight must not hit the ROLLBACK.
            tracker.settle().await;
            if let Err(rb) = conn.query_drop("ROLLBACK").await {
                // A transaction we cannot end would leak into the next request.
                warn!(error = %rb, "ROLLBACK failed; giving up the session");
                return Err(ExecError::Lost(format!("ROLLBACK after `{e}` failed: {rb}")));
            }
            Err(e)
        }
    }
}

async fn run_statement(
    conn: &mut Session,
    sql: &str,
    params: &[Value],
    how: Send<'_>,
    out: &mut Emitter<'_>,
    acc: &mut Summary,
) -> Result<(), ExecError> {
    send_statement(conn, sql, params, how).await?;
    stream_results(conn, out, acc).await
}

/// How a statement goes to the database, from its REQUEST.
#[derive(Clone, Copy)]
pub(crate) struct Send<'a> {
    /// `REQUEST.prepared`: the binary protocol even without parameters.
    pub prepared: bool,
    /// `REQUEST.blob_params`.
    pub blob: &'a [u16],
    /// `REQUEST.raw_rows`: its rows are handed on as the server sent them (`RAW_ROWS`).
    pub raw: bool,
}

/// `REQUEST.prepare_only`: the statement's parameters (result set 0) and result columns
/// (result set 1), from the server's own prepare (kept in the statement cache).
async fn describe(conn: &mut Session, sql: &str, out: &mut Emitter<'_>) -> Result<(), ExecError> {
    let stmt = conn.prepare(sql).await?;
    out.columns(stmt.params(), false).await?;
    out.columns(&stmt.columns(), false).await?;
    Ok(())
}

/// Sends one statement: `COM_QUERY` without parameters (unless `prepared`), else
/// `COM_STMT_EXECUTE` of the cached prepared statement (prepared now on a miss: a round
/// trip).
async fn send_statement(conn: &mut Session, sql: &str, params: &[Value], how: Send<'_>) -> Result<(), ExecError> {
    let Send { prepared, blob, raw } = how;
    if params.is_empty() && !prepared {
        conn.send_query(sql)?;
    } else {
        // The server's own count of markers (the statement is cached, so this costs a
        // round trip only the first time). `preflight` leaves the count to this check
        // where the server may read the text differently (a `/*!NNNNN` comment for a
        // newer version, NO_BACKSLASH_ESCAPES).
        let stmt = conn.prepare(sql).await?;
        if usize::from(stmt.num_params()) != params.len() {
            return Err(ExecError::Refused(format!(
                "the database counts {} parameter markers (?) in the statement, but {} parameters were sent",
                stmt.num_params(),
                params.len()
            )));
        }
        // `Bytes` is binary: bound as a BLOB, as a driver binds a byte buffer (a string
        // type would make the server read it in the connection's character set).
        let binary = convert::binary_params(params, blob);
        let params: Vec<osprey_wire::Value> = params.iter().map(convert::param).collect();
        conn.send_execute_typed(&stmt, &params, &binary)?;
    }
    if raw {
        conn.raw_rows();
    }
    Ok(())
}

/// Checks one statement against what the worker does not support, or the server would
/// answer by closing the session, before it is sent. `Err` is an `INVALID_REQUEST` message.
fn preflight(facts: &facts::Facts, sql: &str, params: &[Value], max_packet: usize) -> Result<(), String> {
    facts.check_params(params.len())?;
    let packet = packet_size(sql, params);
    if packet >= max_packet {
        return Err(format!(
            "the statement needs a packet of {packet} bytes to the database, whose max_allowed_packet is {max_packet}"
        ));
    }
    Ok(())
}

/// The size of the largest packet the statement sends: `COM_QUERY` (text) or
/// `COM_STMT_PREPARE` + `COM_STMT_EXECUTE` (with parameters), as mysql_common builds them.
fn packet_size(sql: &str, params: &[Value]) -> usize {
    let text = 1 + sql.len();
    if params.is_empty() {
        return text;
    }
    let values: usize = params.iter().map(convert::param_bin_len).sum();
    // header 10, null bitmap, bound flag 1, two type bytes per parameter, values
    let execute = 10 + params.len().div_ceil(8) + 1 + 2 * params.len() + values;
    text.max(execute)
}

/// Streams every result set of the oldest pending response (one statement's): rows in
/// batches, affected rows, last insert id, GTIDs and warnings into `acc`. On a row that
/// does not fit a frame, the rest of the response is read and dropped, so that the
/// session stays in step.
async fn stream_results(conn: &mut Session, out: &mut Emitter<'_>, acc: &mut Summary) -> Result<(), ExecError> {
    // The current result set's column kinds (`None`: a result without rows).
    let mut kinds: Option<Vec<ColumnKind>> = None;
    loop {
        if !conn.packet_buffered() {
            // About to wait on the database: what is queued for the dispatcher (a
            // pipelined neighbour's END, this result's COLUMNS) goes out first.
            out.link.flush().await?;
        }
        match conn.next_event().await? {
            DbEvent::Columns(columns) => {
                kinds = Some(columns.iter().map(ColumnKind::of).collect());
                out.columns(&columns, conn.columns_kept()).await?;
            }
            DbEvent::RawRow(packet) => {
                if kinds.is_none() {
                    continue;
                }
                if let Err(e) = out.raw_row(packet).await {
                    return Err(drained(conn, e).await);
                }
            }
            DbEvent::Row(row) => {
                let Some(kinds) = &kinds else {
                    continue;
                };
                let values = row
                    .unwrap_raw()
                    .into_iter()
                    .zip(kinds)
                    .map(|(v, k)| match v {
                        None => Value::Null,
                        Some(osprey_wire::Value::Bytes(b)) if acc.text_rows => Value::Bytes(b),
                        Some(v) => convert::value(*k, v),
                    })
                    .collect();
                if let Err(e) = out.row(values).await {
                    return Err(drained(conn, e).await);
                }
            }
            DbEvent::End { ok, more_results } => {
                // Every OK packet may carry a commit's GTID: DML, the end of a result set
                // (`INSERT ... RETURNING`), a CALL's status.
                note_gtid(Some(&ok), acc);
                acc.autocommit = Some(ok.status_flags().contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT));
                if more_results && acc.multi_results {
                    let affected_rows = if kinds.take().is_none() { ok.affected_rows() } else { 0 };
                    let end = ResultEnd {
                        affected_rows,
                        last_insert_id: ok.last_insert_id().filter(|id| *id != 0),
                        warnings: u32::from(ok.warnings()),
                        info: ok
                            .info_ref()
                            .filter(|i| !i.is_empty())
                            .map(|i| String::from_utf8_lossy(i).into_owned()),
                        in_transaction: ok.status_flags().contains(StatusFlags::SERVER_STATUS_IN_TRANS),
                        autocommit: acc.autocommit,
                    };
                    out.result_end(&end).await?;
                    continue;
                }
                if kinds.take().is_none() {
                    // An OK packet: DML, DDL, or the status at the end of a CALL.
                    acc.affected_rows += ok.affected_rows();
                    if let Some(id) = ok.last_insert_id().filter(|id| *id != 0) {
                        acc.last_insert_id = Some(id);
                    }
                }
                if !more_results {
                    // The last OK/EOF packet of the statement carries its warning count.
                    acc.warnings += u32::from(ok.warnings());
                    acc.info = ok
                        .info_ref()
                        .filter(|i| !i.is_empty())
                        .map(|i| String::from_utf8_lossy(i).into_owned());
                    return Ok(());
                }
            }
        }
    }
}

/// A row could not go out (`e`): unless the link is gone, the rest of the response is
/// read and dropped, so that the session stays in step; a fatal error doing so wins.
async fn drained(conn: &mut Session, e: ExecError) -> ExecError {
    if !matches!(e, ExecError::Link(_)) {
        if let Err(d) = conn.drain().await {
            if d.is_fatal() {
                return d.into();
            }
        }
    }
    e
}

/// The wire answer for a failure, and whether the session survives it.
fn error_body(e: &ExecError, stop: Option<StopReason>, batch: bool) -> (ErrorBody, Outcome) {
    let mut body = ErrorBody {
        origin: Origin::Worker,
        code: ErrorCode::Internal,
        errno: None,
        sqlstate: None,
        message: e.to_string(),
        dispatched: true,
        retryable: false,
        transaction: None,
    };
    let mut outcome = Outcome::Served;
    match e {
        ExecError::Db(db) => {
            if let Some(s) = db.server() {
                body.errno = Some(s.code);
                body.sqlstate = Some(s.state.clone());
                body.message = s.message.clone();
            }
            match session::classify(db) {
                ErrorClass::Fatal => {
                    body.code = ErrorCode::DatabaseFatal;
                    outcome = Outcome::Fatal;
                }
                ErrorClass::Rejected => {
                    body.code = ErrorCode::InvalidRequest;
                    // In a batch, earlier statements ran (and were rolled back).
                    body.dispatched = batch;
                }
                ErrorClass::Database => {
                    body.origin = Origin::Database;
                    body.code = match (body.errno, stop) {
                        (Some(ER_QUERY_INTERRUPTED), Some(reason)) => stop_code(reason),
                        (Some(ER_STATEMENT_TIMEOUT), _) => ErrorCode::RequestTimeout,
                        _ => ErrorCode::Database,
                    };
                    // Deadlock and lock wait timeout: the same request may well succeed again.
                    body.retryable = matches!(body.errno, Some(1213 | 1205));
                }
            }
        }
        ExecError::Lost(_) => {
            body.code = ErrorCode::DatabaseFatal;
            outcome = Outcome::Fatal;
        }
        ExecError::RowTooLarge(_) => body.code = ErrorCode::FrameTooLarge,
        ExecError::LeftOpen => body.code = ErrorCode::InvalidRequest,
        ExecError::Refused(_) => {
            body.code = ErrorCode::InvalidRequest;
            // In a batch, earlier statements ran (and were rolled back).
            body.dispatched = batch;
        }
        ExecError::Stopped(reason) => body.code = stop_code(*reason),
        ExecError::Link(_) => {}
    }
    (body, outcome)
}

fn stop_code(reason: StopReason) -> ErrorCode {
    match reason {
        StopReason::Cancelled => ErrorCode::Cancelled,
        StopReason::TimedOut => ErrorCode::RequestTimeout,
    }
}

/// Builds the frames of one stream: result sets, row batches, the terminal frame.
pub(crate) struct Emitter<'o> {
    link: &'o LinkOut,
    memo: std::rc::Rc<columns_memo::ColumnsMemo>,
    stream: u32,
    limits: BatchLimits,
    next_result_set: u32,
    rows: Vec<Vec<Value>>,
    /// Rows as the server sent them (`REQUEST.raw_rows`), for a `RAW_ROWS` frame.
    raw: Vec<bytes::Bytes>,
    bytes: usize,
    sent_rows: u64,
    /// Result sets and rows are dropped, not sent (a pipelined statement cancelled before
    /// it ran: its result is read from the session, and thrown away).
    discarding: bool,
    /// `END` is queued, not flushed: a pipelined statement's answer with another behind
    /// it, whose own end (or a wait on the database, [`stream_results`]) flushes both in
    /// one write. That check is a heuristic (it sees the next packet's first chunk only);
    /// what guarantees nothing stays held while the worker waits is `Link::drive`, under
    /// which every `serve` runs: it flushes whatever is pending whenever the work waits.
    hold_end: bool,
}

impl<'o> Emitter<'o> {
    fn new(
        link: &'o LinkOut,
        memo: &std::rc::Rc<columns_memo::ColumnsMemo>,
        stream: u32,
        limits: BatchLimits,
    ) -> Emitter<'o> {
        Emitter {
            link,
            memo: memo.clone(),
            stream,
            limits,
            next_result_set: 0,
            rows: Vec::new(),
            raw: Vec::new(),
            bytes: 0,
            sent_rows: 0,
            discarding: false,
            hold_end: false,
        }
    }

    fn byte_limit(&self) -> usize {
        self.limits
            .bytes
            .clamp(1, self.limits.max_payload.saturating_sub(FRAME_SLACK).max(1))
    }

    /// `kept`: the definitions are a prepared statement's ([`columns_memo`]).
    async fn columns(&mut self, columns: &std::sync::Arc<[osprey_wire::Column]>, kept: bool) -> Result<(), LinkGone> {
        if self.discarding {
            return Ok(());
        }
        self.flush_rows(false).await?;
        let frame = self.memo.frame(self.stream, self.next_result_set, columns, kept);
        self.next_result_set += 1;
        self.link.push(&frame);
        Ok(())
    }

    async fn row(&mut self, row: Vec<Value>) -> Result<(), ExecError> {
        if self.discarding {
            return Ok(());
        }
        let size = 5 + row.iter().map(convert::encoded_size_bound).sum::<usize>();
        self.make_room(size, self.rows.len()).await?;
        self.rows.push(row);
        self.joined(size, self.rows.len()).await
    }

    /// [`Emitter::row`] for a row handed on undecoded (`RAW_ROWS`), batched by the same
    /// limits.
    async fn raw_row(&mut self, packet: bytes::Bytes) -> Result<(), ExecError> {
        if self.discarding {
            return Ok(());
        }
        let size = osprey_protocol::raw_rows::row_size(packet.len());
        self.make_room(size, self.raw.len()).await?;
        self.raw.push(packet);
        self.joined(size, self.raw.len()).await
    }

    /// Before a row of `size` bytes joins a batch of `held` rows: a row no frame can hold
    /// fails the statement; one the batch has no room for sends the batch first.
    async fn make_room(&mut self, size: usize, held: usize) -> Result<(), ExecError> {
        if size > self.limits.max_payload.saturating_sub(FRAME_SLACK) {
            return Err(ExecError::RowTooLarge(size));
        }
        if held > 0 && self.bytes + size > self.byte_limit() {
            self.flush_batch().await?;
        }
        Ok(())
    }

    /// After a row of `size` bytes joined, the batch holding `held` rows: a full batch goes.
    async fn joined(&mut self, size: usize, held: usize) -> Result<(), ExecError> {
        self.bytes += size;
        if held >= self.limits.rows.max(1) || self.bytes >= self.byte_limit() {
            self.flush_batch().await?;
        }
        Ok(())
    }

    /// A full batch goes out; then the link gets its turn (`Link::drive` reads the
    /// dispatcher's frames first). While both sockets take and give bytes the statement
    /// is never pending, and ran on for megabytes, up to tokio's budget, before a reclaim
    /// or a cancel was read: the dispatcher reads at most 1 MiB to reach a reclaim's
    /// answer. One extra task poll per batch, for results of more than one batch only.
    async fn flush_batch(&mut self) -> Result<(), LinkGone> {
        self.flush_rows(true).await?;
        tokio::task::yield_now().await;
        Ok(())
    }

    /// Sends the rows gathered so far (flushing the link if `flush`).
    async fn flush_rows(&mut self, flush: bool) -> Result<(), LinkGone> {
        if !self.rows.is_empty() {
            self.sent_rows += self.rows.len() as u64;
            self.bytes = 0;
            self.link.push(&Rows::to_frame(&self.rows, self.stream));
            self.rows.clear();
        }
        if !self.raw.is_empty() {
            let payload = osprey_protocol::raw_rows::encode(&self.raw);
            self.sent_rows += self.raw.len() as u64;
            self.raw.clear();
            self.bytes = 0;
            self.link
                .push(&Frame::with_payload(Kind::RawRows, self.stream, payload.into()));
        }
        if flush {
            self.link.flush().await?;
        }
        Ok(())
    }

    /// A result of a multi-result request ended, another follows (`RESULT_END`).
    async fn result_end(&mut self, end: &ResultEnd) -> Result<(), LinkGone> {
        if self.discarding {
            return Ok(());
        }
        self.flush_rows(false).await?;
        self.link.push(&Frame::new(Kind::ResultEnd, self.stream, end));
        Ok(())
    }

    fn discard(&mut self) {
        self.rows.clear();
        self.raw.clear();
        self.bytes = 0;
    }

    async fn end(&mut self, end: &End) -> Result<(), LinkGone> {
        self.link.push(&end.to_frame(self.stream));
        if self.hold_end {
            return Ok(());
        }
        self.link.flush().await
    }

    async fn fail(&mut self, body: ErrorBody) -> Result<(), LinkGone> {
        self.link.push(&Frame::new(Kind::Error, self.stream, &body));
        self.end(&End::default()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_commits_out_of_sight_if_any_statement_does() {
        assert!(commits_out_of_sight(&Request::sql("CALL p()")));
        assert!(!commits_out_of_sight(&Request::sql("SELECT 'CALL p()'")));
        let batch = Request {
            batch: vec![
                Statement {
                    sql: "INSERT INTO t VALUES (1)".into(),
                    params: vec![],
                },
                Statement {
                    sql: "CALL p()".into(),
                    params: vec![],
                },
            ],
            ..Default::default()
        };
        assert!(commits_out_of_sight(&batch));
    }
}

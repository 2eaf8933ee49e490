//! One `REQUEST` in, its frames out: `COLUMNS`/`ROWS` per result set, then `END`, or
//! `ERROR` + `END`. Rows are streamed in batches, never collected.

use std::borrow::Cow;
use std::time::Duration;

use futures::TryStreamExt;
use mysql_async::consts::StatusFlags;
use mysql_async::prelude::{Protocol, Queryable};
use mysql_async::{Conn, Params, QueryResult, Row};
use osprey_protocol::{
    Columns, End, ErrorBody, ErrorCode, Frame, Kind, Origin, ProtocolError, Request, Rows, SessionReset, Statement,
    Value,
};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::cancel::{StopReason, Tracker};
use crate::convert::{self, ColumnKind};
use crate::link::{LinkGone, LinkOut};
use crate::session::{self, ErrorClass, ER_QUERY_INTERRUPTED, ER_STATEMENT_TIMEOUT};

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
enum ExecError {
    #[error(transparent)]
    Db(#[from] mysql_async::Error),
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
    conn: Conn,
    tracker: Tracker,
    limits: BatchLimits,
    /// The server is MariaDB (`SET STATEMENT max_statement_time` is available).
    mariadb: bool,
    /// The session was found dead while idle: nothing more can run on it.
    dead: bool,
    reset: SessionReset,
}

impl Executor {
    pub fn new(conn: Conn, tracker: Tracker, limits: BatchLimits, mariadb: bool, reset: SessionReset) -> Executor {
        Executor {
            conn,
            tracker,
            limits,
            mariadb,
            dead: false,
            reset,
        }
    }

    /// Closes the session cleanly.
    pub async fn close(self) {
        if !self.dead {
            match tokio::time::timeout(Duration::from_secs(5), self.conn.disconnect()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, "disconnect"),
                Err(_) => warn!("disconnect did not finish within 5 s"),
            }
        }
    }

    /// Checks an idle session (`COM_PING`). `Err` (and the session marked dead) when it is
    /// gone, e.g. closed by the server's `wait_timeout`.
    pub async fn check_idle(&mut self) -> Result<(), mysql_async::Error> {
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

    /// Answers one `REQUEST` frame completely (its frames leave with one flush, plus
    /// one per full `ROWS` batch). `Err` only when the link is gone.
    pub async fn serve(&mut self, frame: Frame, link: &LinkOut) -> Result<Outcome, LinkGone> {
        let stream = frame.stream;
        let mut out = Emitter::new(link, stream, self.limits);
        let request: Request = match frame.body() {
            Ok(r) => r,
            Err(e) => {
                let code = match e {
                    ProtocolError::BadUtf8 => ErrorCode::BadUtf8,
                    _ => ErrorCode::BadBody,
                };
                self.tracker.finish(stream).await;
                out.fail(ErrorBody::undispatched(Origin::Worker, code, e.to_string()))
                    .await?;
                return Ok(Outcome::Served);
            }
        };
        if let Err(why) = request.validate() {
            self.tracker.finish(stream).await;
            out.fail(ErrorBody::undispatched(Origin::Worker, ErrorCode::InvalidRequest, why))
                .await?;
            return Ok(Outcome::Served);
        }
        let controls_session = if request.batch.is_empty() {
            controls_session(&request.sql)
        } else {
            request.batch.iter().any(|st| controls_session(&st.sql))
        };
        // Statement-level pooling: the next request may come from another client.
        let leaves_state = self.reset == SessionReset::Always
            || if request.batch.is_empty() {
                touches_session_state(&request.sql)
            } else {
                request.batch.iter().any(|st| touches_session_state(&st.sql))
            };
        if controls_session {
            self.tracker.finish(stream).await;
            out.fail(ErrorBody::undispatched(
                Origin::Worker,
                ErrorCode::InvalidRequest,
                "each request runs on whichever worker is free, so transaction control (BEGIN, COMMIT, \
                 ROLLBACK, SET autocommit, XA) and table locks cannot be sent as statements: send the \
                 statements as one batch, which runs in one transaction",
            ))
            .await?;
            return Ok(Outcome::Served);
        }
        if self.dead {
            self.tracker.finish(stream).await;
            let mut body = ErrorBody::undispatched(
                Origin::Worker,
                ErrorCode::DatabaseFatal,
                "the worker's database session was lost while idle",
            );
            body.retryable = true;
            out.fail(body).await?;
            return Ok(Outcome::Fatal);
        }
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

        // Timeout: on MariaDB a single plain SELECT is bounded by the server itself;
        // anything else by a timer that sends KILL QUERY.
        let mut server_timeout = None;
        let mut timer = None;
        if request.timeout_ms > 0 {
            if self.mariadb && request.batch.is_empty() && is_plain_select(&request.sql) {
                server_timeout = Some(request.timeout_ms);
            } else {
                let tracker = self.tracker.clone();
                let after = Duration::from_millis(request.timeout_ms);
                timer = Some(tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    tracker.stop(stream, StopReason::TimedOut);
                }));
            }
        }

        let started = Instant::now();
        let mut acc = Summary::default();
        let result = if request.batch.is_empty() {
            let sql = match server_timeout {
                Some(ms) => Cow::Owned(format!(
                    "SET STATEMENT max_statement_time={:.3} FOR {}",
                    ms as f64 / 1000.0,
                    request.sql
                )),
                None => Cow::Borrowed(request.sql.as_str()),
            };
            run_statement(&mut self.conn, &sql, &request.params, &mut out, &mut acc).await
        } else {
            run_batch(
                &mut self.conn,
                &self.tracker,
                stream,
                &request.batch,
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
        // Waits for a KILL QUERY in flight, so it cannot hit the clean-up below.
        let settled = self.tracker.finish(stream).await;
        let fatal = matches!(&result, Err(ExecError::Db(e)) if session::classify(e) == ErrorClass::Fatal);
        let cleaned = if fatal || matches!(result, Err(ExecError::Link(_))) {
            Ok(false)
        } else if !settled {
            Err("a KILL QUERY did not settle in time".to_string())
        } else {
            match reset_session(&mut self.conn, result.is_err()).await {
                Ok(left_open) if leaves_state => {
                    reset_connection(&mut self.conn, self.mariadb).await.map(|()| left_open)
                }
                r => r.map_err(|e| e.to_string()),
            }
        };
        let result = match (result, cleaned) {
            (Ok(()), Ok(true)) => Err(ExecError::LeftOpen),
            (r, Ok(_)) => r,
            // The session's state is unknown: answer with a fatal error (a non-server
            // error is classified fatal), then let a fresh worker take over.
            (r, Err(why)) => {
                let what = match &r {
                    Ok(()) => "the request succeeded".to_string(),
                    Err(e) => format!("the request failed ({e})"),
                };
                Err(ExecError::Db(mysql_async::Error::Other(
                    format!("{what}, but resetting the session afterwards failed: {why}").into(),
                )))
            }
        };

        match result {
            Ok(()) => {
                out.flush_rows(false).await?;
                let end = End {
                    affected_rows: acc.affected_rows,
                    last_insert_id: acc.last_insert_id,
                    warnings: acc.warnings,
                    rows: out.sent_rows,
                    server_time_us: elapsed,
                    queue_time_us: 0,
                };
                out.end(&end).await?;
                Ok(Outcome::Served)
            }
            Err(ExecError::Link(gone)) => Err(gone),
            Err(e) => {
                let (body, outcome) = error_body(&e, stop, !request.batch.is_empty());
                match outcome {
                    Outcome::Fatal => warn!(stream, error = %e, "fatal database error"),
                    Outcome::Served => debug!(stream, error = %e, "request failed"),
                }
                out.discard();
                out.fail(body).await?;
                Ok(outcome)
            }
        }
    }
}

/// The next request may come from another client: never hand it an open
/// transaction or autocommit turned off (e.g. by a stored procedure, or a
/// statement that failed inside one). The server's status flags on the last OK
/// packet tell without a round trip; after an error they are gone, so a failed
/// request always gets a ROLLBACK. Ok(true): a successful request had left a
/// transaction open, which was rolled back.
async fn reset_session(conn: &mut Conn, failed: bool) -> Result<bool, mysql_async::Error> {
    let flags = conn.last_ok_packet().map(|ok| ok.status_flags());
    let in_trans = flags.is_some_and(|f| f.contains(StatusFlags::SERVER_STATUS_IN_TRANS));
    let autocommit_off = flags.is_some_and(|f| !f.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT));
    if !(failed || in_trans || autocommit_off) {
        return Ok(false);
    }
    if in_trans && !failed {
        warn!("request left a transaction open; rolling it back");
    }
    conn.query_drop("ROLLBACK").await?;
    let autocommit_off = conn
        .last_ok_packet()
        .is_some_and(|ok| !ok.status_flags().contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT));
    if autocommit_off {
        warn!("request turned autocommit off; turning it back on");
        conn.query_drop("SET autocommit = 1").await?;
    }
    Ok(in_trans && !failed)
}

/// Statements that control the transaction or take table locks, in any of the
/// top-level `;`-separated statements of `sql`: with statement-level pooling (like
/// PgBouncer's statement mode) they would leave state behind for the next client, or
/// break a batch's all-or-nothing. `CREATE`/`ALTER` (a routine's body) are not looked into.
fn controls_session(sql: &str) -> bool {
    top_level_statements(&code_text(sql)).any(|part| {
        let mut words = part
            .split(|c: char| c.is_whitespace() || c == '=' || c == '(')
            .filter(|w| !w.is_empty());
        let first = words.next().unwrap_or("");
        let mut second = words.next().unwrap_or("");
        let is = |w: &str, lit: &str| w.eq_ignore_ascii_case(lit);
        if is(first, "rollback") && is(second, "work") {
            second = words.next().unwrap_or("");
        }
        if is(first, "begin") {
            !is(second, "not")
        } else if is(first, "start") {
            is(second, "transaction")
        } else if is(first, "commit") || is(first, "xa") {
            true
        } else if is(first, "rollback") {
            !is(second, "to")
        } else if is(first, "lock") || is(first, "unlock") {
            is(second, "table") || is(second, "tables")
        } else if is(first, "set") {
            part.as_bytes()
                .windows(10)
                .any(|w| w.eq_ignore_ascii_case(b"autocommit"))
        } else {
            false
        }
    })
}

/// Gives the session back its initial state: variables, temporary tables,
/// user locks, prepared statements, and the configured database.
async fn reset_connection(conn: &mut Conn, mariadb: bool) -> Result<(), String> {
    let db = conn
        .opts()
        .db_name()
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('`', "``"));
    let reset = match db {
        Some(_) => conn.reset().await.map_err(|e| e.to_string())?,
        None => false,
    };
    if !reset {
        // No database to go back to (COM_RESET_CONNECTION keeps the current one),
        // or a server without it: COM_CHANGE_USER with the same credentials resets
        // everything, the database included.
        return conn.change_user(Default::default()).await.map_err(|e| e.to_string());
    }
    let mut restore = format!("USE `{}`", db.unwrap_or_default());
    if !mariadb {
        // MySQL's reset also resets the connection character set to the server's
        // default (MySQL bug #97633); put back what the driver negotiated.
        restore.push_str("; SET NAMES utf8mb4 COLLATE utf8mb4_general_ci");
    }
    conn.query_drop(restore).await.map_err(|e| e.to_string())
}

/// `sql` with everything inside quotes, backticks and comments (delimiters
/// included) blanked out, so that keywords and `;` found in it are code. The
/// inside of an executable comment (`/*! … */`, `/*M! … */`) is code: the
/// server runs it. Assumes the default sql_mode (backslash escapes, `"` strings).
fn code_text(sql: &str) -> String {
    #[derive(PartialEq)]
    enum In {
        Code,
        Quote(u8),
        LineComment,
        BlockComment,
    }
    let b = sql.as_bytes();
    let mut mask = b.to_vec();
    let mut state = In::Code;
    let mut in_executable_comment = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        let mut code = false;
        match state {
            In::Code => match c {
                b'\'' | b'"' | b'`' => state = In::Quote(c),
                b'#' => state = In::LineComment,
                // `--` starts a comment only before whitespace or a control character.
                b'-' if next == Some(b'-')
                    && b.get(i + 2)
                        .is_none_or(|c| c.is_ascii_whitespace() || c.is_ascii_control()) =>
                {
                    state = In::LineComment
                }
                b'/' if next == Some(b'*') => {
                    let rest = &b[i + 2..];
                    let opener = if rest.starts_with(b"!") {
                        Some(1)
                    } else if rest.len() >= 2 && rest[0].eq_ignore_ascii_case(&b'm') && rest[1] == b'!' {
                        Some(2)
                    } else {
                        None
                    };
                    match opener {
                        Some(n) if !in_executable_comment => {
                            // Blank `/*!` (or `/*M!`) and the version digits; the rest runs.
                            let digits = rest[n..].iter().take_while(|c| c.is_ascii_digit()).count();
                            let end = i + 2 + n + digits;
                            mask[i..end].fill(b' ');
                            in_executable_comment = true;
                            i = end;
                            continue;
                        }
                        _ => {
                            // The `*` belongs to the opening: `/*/` does not close it.
                            state = In::BlockComment;
                            mask[i] = b' ';
                            i += 1;
                        }
                    }
                }
                b'*' if next == Some(b'/') && in_executable_comment => {
                    in_executable_comment = false;
                    mask[i] = b' ';
                    i += 1;
                }
                _ => code = true,
            },
            In::Quote(q) => {
                if c == b'\\' && q != b'`' {
                    mask[i] = b' ';
                    i += 1;
                } else if c == q {
                    state = In::Code;
                }
            }
            In::LineComment => {
                if c == b'\n' {
                    state = In::Code;
                }
            }
            In::BlockComment => {
                if c == b'*' && next == Some(b'/') {
                    state = In::Code;
                    mask[i] = b' ';
                    i += 1;
                }
            }
        }
        if !code {
            if let Some(m) = mask.get_mut(i) {
                *m = b' ';
            }
        }
        i += 1;
    }
    // Only whole characters were blanked (every byte of one inside a quote or a
    // comment, none in code), so this is still UTF-8.
    String::from_utf8_lossy(&mask).into_owned()
}

/// The code (see [`code_text`]) of each statement of `sql`, split at `;`.
/// A CREATE/ALTER (procedure, trigger, event) carries its body, which is not
/// run now: it is one statement, and left out.
fn top_level_statements(code: &str) -> impl Iterator<Item = &str> {
    let first_word = |s: &str| s.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
    let whole = first_word(code);
    let parts: Vec<&str> = if whole == "create" || whole == "alter" {
        vec![code]
    } else {
        code.split(';').collect()
    };
    parts.into_iter().filter(move |p| {
        let w = first_word(p);
        !(w == "create" || w == "alter")
    })
}

/// Whether `sql` may leave session state behind for the next request on this
/// session: session or user variables (`SET`, `@var`), the current database,
/// temporary tables, user locks (`GET_LOCK`), SQL-level prepared statements,
/// open HANDLERs, or a procedure that may do any of these. Errs on the side of
/// a reset: reading a variable counts too.
fn touches_session_state(sql: &str) -> bool {
    let code = code_text(sql).to_ascii_lowercase();
    let c = code.as_bytes();
    // `@name`, not `@@system_variable`.
    let user_variable =
        (0..c.len()).any(|i| c[i] == b'@' && c.get(i + 1) != Some(&b'@') && (i == 0 || c[i - 1] != b'@'));
    user_variable
        || code.split(';').any(|statement| {
            let mut words = statement
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty());
            let first = words.next();
            matches!(
                first,
                Some(
                    "set" | "use" | "prepare" | "execute" | "deallocate" | "call" | "handler"
                    // session locks (LOCK TABLES itself is refused)
                    | "flush" | "backup" | "lock" | "unlock"
                    // MariaDB compound statements outside stored programs: their
                    // inner statements are not at the start of a `;` piece
                    | "begin" | "if" | "case" | "loop" | "while" | "repeat"
                )
            ) || first
                .into_iter()
                .chain(words)
                .any(|w| w == "temporary" || w == "get_lock")
        })
}

/// Sums over the statements of a request.
#[derive(Debug, Default)]
struct Summary {
    affected_rows: u64,
    last_insert_id: Option<u64>,
    warnings: u32,
}

async fn run_batch(
    conn: &mut Conn,
    tracker: &Tracker,
    stream: u32,
    batch: &[Statement],
    out: &mut Emitter<'_>,
    acc: &mut Summary,
) -> Result<(), ExecError> {
    conn.query_drop("START TRANSACTION").await?;
    let result = async {
        for st in batch {
            if let Some(reason) = tracker.reason(stream) {
                return Err(ExecError::Stopped(reason));
            }
            run_statement(conn, &st.sql, &st.params, out, acc).await?;
        }
        if let Some(reason) = tracker.reason(stream) {
            return Err(ExecError::Stopped(reason));
        }
        conn.query_drop("COMMIT").await?;
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
                return Err(ExecError::Db(mysql_async::Error::Other(
                    format!("ROLLBACK after `{e}` failed: {rb}").into(),
                )));
            }
            Err(e)
        }
    }
}

async fn run_statement(
    conn: &mut Conn,
    sql: &str,
    params: &[Value],
    out: &mut Emitter<'_>,
    acc: &mut Summary,
) -> Result<(), ExecError> {
    if params.is_empty() {
        let mut result = conn.query_iter(sql).await?;
        stream_results(&mut result, out, acc).await
    } else {
        let params = Params::Positional(params.iter().map(convert::param).collect());
        let mut result = conn.exec_iter(sql, params).await?;
        stream_results(&mut result, out, acc).await
    }
}

/// Streams every result set of one statement.
async fn stream_results<P: Protocol + Unpin>(
    result: &mut QueryResult<'_, '_, P>,
    out: &mut Emitter<'_>,
    acc: &mut Summary,
) -> Result<(), ExecError> {
    while let Some(mut set) = result.stream::<Row>().await? {
        let columns = set.columns();
        if columns.is_empty() {
            // An OK packet: DML, DDL, or the status at the end of a CALL.
            while set.try_next().await?.is_some() {}
            acc.affected_rows += set.affected_rows();
            if let Some(id) = set.last_insert_id().filter(|id| *id != 0) {
                acc.last_insert_id = Some(id);
            }
            continue;
        }
        let kinds: Vec<ColumnKind> = columns.iter().map(ColumnKind::of).collect();
        out.columns(&columns).await?;
        while let Some(row) = set.try_next().await? {
            let values = row
                .unwrap_raw()
                .into_iter()
                .zip(&kinds)
                .map(|(v, k)| v.map_or(Value::Null, |v| convert::value(*k, v)))
                .collect();
            out.row(values).await?;
        }
    }
    // The last OK/EOF packet of the statement carries its warning count.
    acc.warnings += u32::from(result.warnings());
    Ok(())
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
    };
    let mut outcome = Outcome::Served;
    match e {
        ExecError::Db(db) => {
            if let mysql_async::Error::Server(s) = db {
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
        ExecError::RowTooLarge(_) => body.code = ErrorCode::FrameTooLarge,
        ExecError::LeftOpen => body.code = ErrorCode::InvalidRequest,
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

/// A single SELECT that `SET STATEMENT ... FOR` can wrap as is.
fn is_plain_select(sql: &str) -> bool {
    let s = sql.trim_start();
    let body = s.trim_end().trim_end_matches(';');
    s.len() > 7
        && s.as_bytes()[..6].eq_ignore_ascii_case(b"select")
        && s.as_bytes()[6].is_ascii_whitespace()
        && !body.contains(';')
}

/// Builds the frames of one stream: result sets, row batches, the terminal frame.
struct Emitter<'o> {
    link: &'o LinkOut,
    stream: u32,
    limits: BatchLimits,
    next_result_set: u32,
    rows: Vec<Vec<Value>>,
    bytes: usize,
    sent_rows: u64,
}

impl<'o> Emitter<'o> {
    fn new(link: &'o LinkOut, stream: u32, limits: BatchLimits) -> Emitter<'o> {
        Emitter {
            link,
            stream,
            limits,
            next_result_set: 0,
            rows: Vec::new(),
            bytes: 0,
            sent_rows: 0,
        }
    }

    fn byte_limit(&self) -> usize {
        self.limits
            .bytes
            .clamp(1, self.limits.max_payload.saturating_sub(FRAME_SLACK).max(1))
    }

    async fn columns(&mut self, columns: &[mysql_async::Column]) -> Result<(), LinkGone> {
        self.flush_rows(false).await?;

        let body = Columns {
            result_set: self.next_result_set,
            columns: columns.iter().map(convert::column).collect(),
        };
        self.next_result_set += 1;
        self.link.push(&Frame::new(Kind::Columns, self.stream, &body));
        Ok(())
    }

    async fn row(&mut self, row: Vec<Value>) -> Result<(), ExecError> {
        let size = 5 + row.iter().map(convert::encoded_size_bound).sum::<usize>();
        if size > self.limits.max_payload.saturating_sub(FRAME_SLACK) {
            return Err(ExecError::RowTooLarge(size));
        }
        if !self.rows.is_empty() && self.bytes + size > self.byte_limit() {
            self.flush_rows(true).await?;
        }
        self.rows.push(row);
        self.bytes += size;
        if self.rows.len() >= self.limits.rows.max(1) || self.bytes >= self.byte_limit() {
            self.flush_rows(true).await?;
        }
        Ok(())
    }

    /// Sends the rows gathered so far (flushing the link if `flush`).
    async fn flush_rows(&mut self, flush: bool) -> Result<(), LinkGone> {
        if !self.rows.is_empty() {
            let rows = Rows {
                rows: std::mem::take(&mut self.rows),
            };
            self.sent_rows += rows.rows.len() as u64;
            self.bytes = 0;
            self.link.push(&Frame::new(Kind::Rows, self.stream, &rows));
        }
        if flush {
            self.link.flush().await?;
        }
        Ok(())
    }

    fn discard(&mut self) {
        self.rows.clear();
        self.bytes = 0;
    }

    async fn end(&mut self, end: &End) -> Result<(), LinkGone> {
        self.link.send(&Frame::new(Kind::End, self.stream, end)).await
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
    fn session_control_statements() {
        for sql in [
            "BEGIN",
            "begin;",
            "START TRANSACTION READ ONLY",
            "LOCK TABLES t WRITE",
            "unlock tables",
            "set autocommit=0",
            "SET @@session.autocommit=0",
            "SET LOCAL autocommit = 0",
            "set @@local.AUTOCOMMIT=0",
            "XA START 'x'",
            "COMMIT",
            "rollback",
            "SELECT 1; SET autocommit=0",
            "SELECT 1; LOCK TABLES t WRITE",
            "/*!40000 LOCK TABLES t WRITE */",
            "/* why */ LOCK TABLES t WRITE",
            "/*!40000 SET autocommit=0 */",
        ] {
            assert!(controls_session(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "set @a = 1",
            "INSERT INTO begin_t VALUES (1)",
            "startx transaction",
            "ROLLBACK TO SAVEPOINT a",
            "ROLLBACK WORK TO SAVEPOINT a",
            "SELECT 'x'",
            "BEGIN NOT ATOMIC SELECT 1; END",
            "INSERT INTO notes VALUES ('fixed; commit later')",
            "INSERT INTO notes VALUES (\"a; begin the test\")",
            "SELECT 1 -- a; commit b",
            "SELECT 1 /* ; rollback */",
            "CREATE PROCEDURE p() BEGIN START TRANSACTION; UPDATE t SET a = 1; COMMIT; END",
            "SELECT * FROM commit_log WHERE lock_id = 1",
        ] {
            assert!(!controls_session(sql), "{sql}");
        }
    }

    #[test]
    fn session_state_statements() {
        for sql in [
            "SET @x = 1",
            "set names utf8mb4",
            "SET SESSION sql_mode = ''",
            "set time_zone = '+05:00'",
            "SELECT @x := 5",
            "SELECT 1 INTO @v",
            "SELECT @v",
            "USE mysql",
            "CREATE TEMPORARY TABLE t (a INT)",
            "create or replace temporary table t (a INT)",
            "DROP TEMPORARY TABLE t",
            "SELECT GET_LOCK('l', 0)",
            "select get_lock ( 'l' , 0 )",
            "PREPARE s FROM 'SELECT 1'",
            "EXECUTE s",
            "CALL p()",
            "SELECT 1; SET @a = 2",
            "SELECT 1;set @a=2",
            "  /* hint */ SET @a = 2",
            "SET STATEMENT max_statement_time=1 FOR SELECT 1",
            "HANDLER t OPEN",
            // mysqldump headers: executable comments run
            "/*!40101 SET time_zone='+05:00' */",
            "/*!40014 SET FOREIGN_KEY_CHECKS=0 */;",
            "/*M!100100 SET sql_mode = '' */",
            // MariaDB compound statements
            "IF 1 THEN SET time_zone='+05:00'; END IF",
            "BEGIN NOT ATOMIC SET SESSION sql_mode=''; END",
            // session locks
            "FLUSH TABLES WITH READ LOCK",
            "BACKUP STAGE START",
            // `--` without a space is arithmetic, not a comment
            "SELECT 2--1;SET time_zone='+05:00'",
        ] {
            assert!(touches_session_state(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "SELECT 'a@b.example'",
            "SELECT `odd@name` FROM t",
            "SELECT @@version, @@session.time_zone",
            "SELECT 1 -- SET @x = 1",
            "SELECT 1 # USE mysql",
            "SELECT 1 /*/ ; SET @x = 1 */",
            "SELECT 'it''s; set @x = 1'",
            "SELECT 'a\\'; set @x = 1'",
            "INSERT INTO t VALUES ('set @x', \"get_lock(1)\")",
            "UPDATE t SET a = 1 WHERE id = ?",
            "INSERT INTO t SET a = 1",
            "SELECT temporary_flag, get_lock_count FROM t",
            "SELECT * FROM users WHERE email = ?",
        ] {
            assert!(!touches_session_state(sql), "{sql}");
        }
    }

    #[test]
    fn plain_selects() {
        assert!(is_plain_select("SELECT 1"));
        assert!(is_plain_select("  select\n* from t;"));
        assert!(!is_plain_select("SELECT 1; DROP TABLE t"));
        assert!(!is_plain_select("/* x */ SELECT 1"));
        assert!(!is_plain_select("SELECTION"));
        assert!(!is_plain_select("UPDATE t SET a=1"));
        assert!(!is_plain_select("select"));
        assert!(!is_plain_select("séléct 1"));
    }
}

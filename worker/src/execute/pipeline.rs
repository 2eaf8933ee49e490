//! Pipelining: several requests' statements written to the one database session before
//! their results are read. MariaDB runs them one after the other and answers in order;
//! each result is relayed on its own stream as it comes, and each stream gets its own
//! `END` (or `ERROR` + `END`), in the order the requests arrived.
//!
//! # Rules
//!
//! Only independent single statements share a pipeline. A request joins one only if:
//! - the server is MariaDB, and the dispatcher speaks protocol 1.4 or later (`STARTED`);
//! - it is a single statement (no batch), that passed every check ([`Executor::inspect`]);
//! - the session scan says it leaves no session state (`touches_session_state`), and
//!   `session_reset` is not `always`; it may not report its commit's GTID out of sight
//!   (`CALL`, `EXECUTE`, compound statements: [`osprey_sql::commits_out_of_sight`]);
//! - with parameters, only when its prepared statement is already cached (a prepare is
//!   a round trip, which needs the pipeline empty: such a request runs at its turn, and
//!   prepares, as the first of a new pipeline or alone);
//! - with `timeout_ms`, only when the server bounds it itself (`SET STATEMENT
//!   max_statement_time`, a plain SELECT): a KILL timer would need the session alone;
//! - its text as sent differs from every other statement in the pipeline (so that the
//!   processlist tells which one runs: see cancel below). A text already in the pipeline
//!   (the same point select with other parameters, typically) is sent with a leading
//!   comment that tells it apart, `/* osprey:N */ `, N the smallest free; prepared, that
//!   variant is one more cached statement, prepared when the session is next idle (until
//!   then the request waits its turn);
//! - no stop was asked for it while it was queued, nor for the statement now running.
//!
//! Nothing is written behind a statement that is not known to be fast: one whose text
//! (the request's SQL) ran on this worker before, last time in under [`FAST_BOUND_US`]
//! and without being stopped. So one slow statement cannot hold fast ones behind it: the
//! dispatcher can still take those back (reclaim) and give them to another worker. A slow
//! or unknown one may still be the last of a pipeline.
//!
//! The first request that does not qualify is a barrier: nothing is written past it; it
//! runs alone once everything written is answered. At most the requests the link has
//! queued are written (the dispatcher bounds them by `pipeline_depth`), and never more
//! than [`osprey_protocol::MAX_PIPELINE_DEPTH`] behind the running one, nor more than the
//! worker may still serve before `max_requests` (it asks to retire on time, so that a
//! worker life stays within `max_requests + pipeline_depth`). Statements are
//! added only when a result has just ended, never behind one that is still running.
//!
//! Before a statement is written behind an unanswered one, `STARTED` goes to the
//! dispatcher for its stream and the link is flushed: from then on the dispatcher treats
//! it as possibly run (no reclaim; `WORKER_LOST` dispatched=true if this worker dies).
//!
//! Per statement: its GTID, affected rows, last insert id and warnings come from its own
//! OK packets. An error ends only its own response: the others are separate autocommit
//! statements. After each, if the status flags show an open transaction or autocommit
//! off (a function or trigger did it), nothing more is written; it and every statement
//! behind it (they ran inside that transaction) are answered with an error once all are
//! read and the session is rolled back. A failed statement with nothing behind it gets
//! the ROLLBACK the single-request path gives (its status flags are unknown).
//!
//! Cancel: a `CANCEL` (or reclaim) of a statement written but not yet running leaves it
//! running on the server when its turn comes, killed as soon as it starts; its result is
//! read and discarded, and it is answered `CANCELLED` with dispatched=true (it may have
//! run). A `CANCEL` of the running statement with statements written behind it is
//! `KILL QUERY ID <query_id>`, the id read from `information_schema.PROCESSLIST` where
//! `INFO` is the statement's exact text, repeated until it ends: a plain `KILL QUERY`
//! could stop a neighbour that started meanwhile. With nothing behind it, the plain
//! `KILL QUERY` (and nothing is written behind a statement being stopped).
//!
//! A fatal error fails every written statement with `DATABASE_FATAL` (dispatched=true)
//! and the worker exits; the requests not written yet are the dispatcher's to re-queue.

use std::collections::VecDeque;

use osprey_protocol::{ErrorBody, Frame, Kind, Origin, Started, MAX_PIPELINE_DEPTH};
use osprey_wire::StatusFlags;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{
    answer, is_fatal, reset_session, send_statement, stop_code, stream_results, Checked, Emitter, ExecError, Executor,
    Outcome, Send, Summary,
};
use crate::link::{LinkGone, LinkOut, Queue};

/// A statement that took this long (µs) or more is not known to be fast.
pub const FAST_BOUND_US: u64 = 10_000;
/// Texts remembered as fast at most; past it the memory starts again.
const MAX_FAST_TEXTS: usize = 4096;

/// The texts known to be fast ([`FAST_BOUND_US`]).
#[derive(Debug, Default)]
pub(crate) struct Speeds(foldhash::HashSet<String>);

impl Speeds {
    /// `sql` ran in `elapsed_us`; `stopped`: it was cancelled or timed out, which says
    /// nothing about its speed unless it was slow anyway.
    pub(crate) fn note(&mut self, sql: &str, elapsed_us: u64, stopped: bool) {
        if elapsed_us >= FAST_BOUND_US {
            self.0.remove(sql);
        } else if !stopped && !self.0.contains(sql) {
            if self.0.len() >= MAX_FAST_TEXTS {
                self.0.clear();
            }
            self.0.insert(sql.to_owned());
        }
    }

    pub(crate) fn is_fast(&self, sql: &str) -> bool {
        self.0.contains(sql)
    }
}

/// A statement written to the session, its result still to be read.
struct Slot {
    checked: Checked,
    /// Writing it failed before anything was sent (the first one's prepare): its answer.
    unsent: Option<ExecError>,
}

impl Executor {
    /// Whether `c` may share a pipeline (the rules of the module that need no session).
    pub(super) fn may_pipeline(&self, c: &Checked) -> bool {
        self.pipelining
            && self.mariadb
            && c.request.batch.is_empty()
            && !c.leaves_state
            && !c.in_session
            && (c.request.timeout_ms == 0 || c.server_timeout.is_some())
            && !c.out_of_sight
            && self.applied.serves(&c.request)
            && !c.request.prepare_only
    }

    /// Runs `head` and, pipelined behind it, the requests queued after it that qualify.
    pub(super) async fn run_pipeline(
        &mut self,
        head: Checked,
        queue: &Queue,
        link: &LinkOut,
    ) -> Result<(Outcome, u64), LinkGone> {
        let stream = head.stream;
        if let Err(reason) = self.tracker.start(stream) {
            self.tracker.finish(stream).await;
            let body = ErrorBody::undispatched(Origin::Worker, stop_code(reason), "stopped before it started");
            Emitter::new(link, &self.memo, stream, self.limits).fail(body).await?;
            return Ok((Outcome::Served, 1));
        }
        if let Some(sql) = self.to_prepare.take() {
            // A variant a request could not be pipelined without (see the rules); a failure
            // here shows again, where it matters, when a statement is sent.
            if let Err(e) = self.conn.prepare(&sql).await {
                debug!(error = %e, "preparing a pipeline variant failed");
            }
        }
        let how = Send {
            prepared: head.request.prepared,
            blob: &head.request.blob_params,
            raw: head.request.raw_rows,
        };
        let unsent = send_statement(&mut self.conn, &head.sql, &head.request.params, how)
            .await
            .err();
        let mut slots = VecDeque::from([Slot { checked: head, unsent }]);
        let mut answered = 0u64;
        // Statements answered only after the session is rolled back (see the rules).
        let mut tainted: Vec<(u32, Summary, u64, u64)> = Vec::new();
        // The first statement whose status showed an open transaction.
        let mut taint_at: Option<u32> = None;
        let mut lost: Option<String> = None;
        while let Some(slot) = slots.pop_front() {
            let stream = slot.checked.stream;
            let stopped_before = self.tracker.advance(stream, slot.checked.sql.clone());
            if taint_at.is_none() && lost.is_none() && slot.unsent.is_none() && stopped_before.is_none() {
                // This one and those behind it are answered in this pipeline.
                let limit = self.pipeline_limit.map(|l| l.saturating_sub(answered));
                self.fill(&slot.checked, &mut slots, queue, link, limit).await?;
            }
            let mut out = Emitter::new(link, &self.memo, stream, self.limits);
            out.discarding = stopped_before.is_some();
            // With a statement behind it, its END goes out with that one's answer (or as
            // soon as the worker would wait on the database): one write for several.
            out.hold_end = !slots.is_empty();
            let started = Instant::now();
            let mut acc = Summary {
                text_rows: slot.checked.request.text_rows,
                raw_rows: slot.checked.request.raw_rows,
                multi_results: slot.checked.request.multi_results,
                ..Summary::default()
            };
            let result = match (slot.unsent, &lost) {
                (Some(e), _) => Err(e),
                (None, Some(why)) => Err(ExecError::Lost(why.clone())),
                (None, None) => stream_results(&mut self.conn, &mut out, &mut acc).await,
            };
            let elapsed = started.elapsed().as_micros() as u64;
            let stop = self.tracker.reason(stream);
            if stop.is_some() || stopped_before.is_some() {
                // Its KILL may take a moment to settle: answers held meanwhile go now.
                link.flush().await?;
            }
            if !matches!(result, Err(ExecError::Link(_)) | Err(ExecError::Lost(_))) {
                self.speeds.note(
                    &slot.checked.request.sql,
                    elapsed,
                    stop.is_some() || stopped_before.is_some(),
                );
            }
            let settled = self.tracker.finish(stream).await;
            answered += 1;
            if lost.is_none() && is_fatal(&result) {
                lost = Some(format!("the database session was lost: {}", err_text(&result)));
            }
            if lost.is_none() && !settled {
                // A KILL that did not settle may still hit a neighbour: nothing here can
                // be trusted any more.
                lost = Some("a KILL QUERY did not settle in time".into());
            }
            if let Some(why) = &lost {
                let result = match result {
                    Err(e) if is_fatal_ref(&e) => Err(e),
                    _ => Err(ExecError::Lost(why.clone())),
                };
                answer(&mut out, result, stop, false, &acc, elapsed).await?;
                continue;
            }
            let flags = self.conn.status_flags();
            let open = result.is_ok()
                && (flags.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
                    || !flags.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT));
            if open && taint_at.is_none() {
                warn!(stream, "a pipelined statement left a transaction open; rolling it back");
                taint_at = Some(stream);
            }
            self.session_gtid = acc.last_gtid.clone().or(self.session_gtid.take());
            if taint_at.is_some() {
                out.flush_rows(false).await?;
                tainted.push((stream, acc, elapsed, out.sent_rows));
                continue;
            }
            let result = match (result, stopped_before) {
                // Cancelled while it waited: whatever it did, its result is not given.
                (Ok(()), Some(reason)) | (Err(_), Some(reason)) => Err(ExecError::Stopped(reason)),
                (r, None) => r,
            };
            if result.is_err() && slots.is_empty() {
                // Nothing behind it shows the session's state: roll back as a lone
                // request is, before answering.
                link.flush().await?;
                if let Err(e) = reset_session(&mut self.conn, true).await {
                    let why = format!("the request failed, and resetting the session afterwards failed: {e}");
                    answer(&mut out, Err(ExecError::Lost(why)), stop, false, &acc, elapsed).await?;
                    return Ok((Outcome::Fatal, answered));
                }
            }
            answer(&mut out, result, stop, false, &acc, elapsed).await?;
        }
        if lost.is_some() {
            return Ok((Outcome::Fatal, answered));
        }
        if taint_at.is_some() {
            link.flush().await?;
            let rolled_back = reset_session(&mut self.conn, true).await;
            for (stream, acc, elapsed, sent_rows) in tainted {
                let mut out = Emitter::new(link, &self.memo, stream, self.limits);
                out.sent_rows = sent_rows;
                let result = match &rolled_back {
                    Ok(_) if Some(stream) == taint_at => Err(ExecError::LeftOpen),
                    Ok(_) => Err(ExecError::Refused(
                        "rolled back: a statement pipelined before it on the same database session left \
                         a transaction open"
                            .into(),
                    )),
                    Err(e) => Err(ExecError::Lost(format!(
                        "ROLLBACK of a transaction left open failed: {e}"
                    ))),
                };
                answer(&mut out, result, None, true, &acc, elapsed).await?;
            }
            if rolled_back.is_err() {
                return Ok((Outcome::Fatal, answered));
            }
        }
        Ok((Outcome::Served, answered))
    }

    /// Writes behind `running` the queued requests that qualify, until the first that
    /// does not (or the bound). Their `STARTED`s go to the dispatcher in one write, before
    /// the statements (queued in the session's buffer) reach the database.
    async fn fill(
        &mut self,
        running: &Checked,
        slots: &mut VecDeque<Slot>,
        queue: &Queue,
        link: &LinkOut,
        limit: Option<u64>,
    ) -> Result<(), LinkGone> {
        let before = slots.len();
        // `running` counts against `limit`.
        let room = limit.map_or(MAX_PIPELINE_DEPTH, |l| {
            (l.saturating_sub(1) as usize).min(MAX_PIPELINE_DEPTH)
        });
        self.queue_behind(running, slots, queue, link, room).await;
        if slots.len() > before {
            link.flush().await?;
        }
        Ok(())
    }

    /// [`Executor::fill`]'s choice: takes the requests that qualify off `queue`, pushes
    /// their `STARTED`s to `link` and queues their statements in the session (no I/O:
    /// prepared statements come from the cache only).
    async fn queue_behind(
        &mut self,
        running: &Checked,
        slots: &mut VecDeque<Slot>,
        queue: &Queue,
        link: &LinkOut,
        room: usize,
    ) {
        if !self.speeds.is_fast(&running.request.sql)
            || slots
                .back()
                .is_some_and(|s| !self.speeds.is_fast(&s.checked.request.sql))
        {
            return;
        }
        while slots.len() < room {
            if self.tracker.stopping(running.stream) {
                return;
            }
            let Some(Ok(mut c)) = queue.peek_request(|f| self.inspect(f)) else {
                return;
            };
            if !self.may_pipeline(&c) {
                return;
            }
            let in_flight =
                |sql: &str| running.sql.as_ref() == sql || slots.iter().any(|s| s.checked.sql.as_ref() == sql);
            if in_flight(&c.sql) {
                // Checked without building each candidate (a `format!` per try and per
                // request was ~4 % of the worker's instructions).
                let taken = |tag: &str| {
                    let is = |sql: &str| sql.strip_prefix(tag) == Some(&*c.sql);
                    is(&running.sql) || slots.iter().any(|s| is(&s.checked.sql))
                };
                let Some(tag) = tags().iter().find(|t| !taken(t)) else {
                    return;
                };
                let mut tagged = String::with_capacity(tag.len() + c.sql.len());
                tagged.push_str(tag);
                tagged.push_str(&c.sql);
                c.sql = tagged.into();
            }
            let stmt = if c.request.params.is_empty() && !c.request.prepared {
                None
            } else {
                // Cached only: with responses pending, a miss is refused without a round trip.
                match self.conn.prepare(&c.sql).await {
                    Ok(stmt) if usize::from(stmt.num_params()) == c.request.params.len() => Some(stmt),
                    Ok(_) => return,
                    Err(_) => {
                        self.to_prepare = Some(c.sql.clone());
                        return;
                    }
                }
            };
            if self.tracker.write_ahead(c.stream).is_err() {
                return;
            }
            let Some(frame) = queue.pop_request() else {
                return;
            };
            debug_assert_eq!(frame.stream, c.stream);
            // The dispatcher must know before the database has it: [`Executor::fill`]
            // flushes these before anything reaches the session's socket.
            link.push(&Frame::with_payload(
                Kind::Started,
                c.stream,
                bytes::Bytes::from_static(Started::BODY),
            ));
            let sent = match &stmt {
                None => self.conn.send_query(&c.sql),
                Some(stmt) => {
                    let binary = crate::convert::binary_params(&c.request.params, &c.request.blob_params);
                    let params: Vec<osprey_wire::Value> = c.request.params.iter().map(crate::convert::param).collect();
                    self.conn.send_execute_typed(stmt, &params, &binary)
                }
            };
            if sent.is_ok() && c.request.raw_rows {
                self.conn.raw_rows();
            }
            debug!(stream = c.stream, behind = slots.len() + 1, "pipelined");
            let fast = self.speeds.is_fast(&c.request.sql);
            slots.push_back(Slot {
                checked: c,
                unsent: sent.err().map(ExecError::Db),
            });
            if !fast {
                // It may be slow: nothing behind it.
                return;
            }
        }
    }
}

/// The leading comments that tell apart a text already in the pipeline: `/* osprey:N */ `,
/// N from 1, one more than statements may be behind the running one.
fn tags() -> &'static [String] {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        (1..=MAX_PIPELINE_DEPTH + 1)
            .map(|n| format!("/* osprey:{n} */ "))
            .collect()
    })
}

fn err_text(r: &Result<(), ExecError>) -> String {
    match r {
        Ok(()) => String::new(),
        Err(e) => e.to_string(),
    }
}

fn is_fatal_ref(e: &ExecError) -> bool {
    matches!(e, ExecError::Db(db) if crate::session::classify(db) == crate::session::ErrorClass::Fatal)
        || matches!(e, ExecError::Lost(_))
}

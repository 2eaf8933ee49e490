//! A worker pinned to a session (protocol 1.5). The link that takes a session's opening
//! job writes nothing to the worker: it answers `SESSION` on the session's stream and from
//! then on takes its requests from the session's own queue, one at a time (nothing is
//! pipelined, nothing comes from the slot group), until the session ends: closed by its
//! client (`CANCEL` on its stream), its connection gone, idle or too old, its worker
//! re-targeted, or the worker lost. Then the worker gets `RESET` (its database session
//! back to a clean state) and returns to the group; a lost worker's session is answered
//! with what became of its transaction.

use std::sync::Arc;
use std::time::Duration;

use osprey_protocol::{ErrorBody, ErrorCode, Frame, Kind, Origin, Request, Reset, SessionOpened, TransactionOutcome};
use tokio::sync::mpsc;
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::pool::wait_queue::Held;
use crate::request::job::Job;
use crate::request::session::{GatePermit, PinnedTo, Session};
use crate::request::streams::StreamGuard;

use super::*;

/// The session a worker link is pinned to.
pub(super) struct Pinned {
    pub(super) session: Arc<Session>,
    /// The session's stream: its terminal frame ends the session for the client.
    guard: StreamGuard,
    /// Cancelled by the client's `CANCEL` on the session's stream (close) or its
    /// connection closing.
    pub(super) closed: CancellationToken,
    jobs: mpsc::Receiver<Job>,
    /// Its places under the group's `sessions.max_per_group` and its connection's
    /// `sessions.max_per_connection`.
    _permits: (GatePermit, GatePermit),
    opened: TokioInstant,
    last_active: TokioInstant,
    /// A transaction is open (the last END's `in_transaction`).
    in_txn: bool,
    /// The statement on the worker (or the last one, if it ended the worker) may commit:
    /// if the worker is lost with it, the transaction's outcome is unknown.
    may_commit: bool,
    /// Why the session ends, once decided.
    pub(super) ending: Option<Ending>,
    /// The `RESET` on the link (its stream id) and when it must have been answered.
    pub(super) reset: Option<(u32, TokioInstant)>,
    /// The worker answered the `RESET` with an error: it exits after its `END`.
    reset_failed: bool,
    /// The group stopped dispatching (a switchover, the primary lost) while a transaction
    /// was open: the session ends once it is not in one.
    end_after_transaction: bool,
}

/// Why a session ends.
#[derive(Debug, Clone)]
pub(super) enum Ending {
    /// The client closed it: `END` on its stream.
    Closed,
    /// Anything else: `ERROR SESSION_ABORTED` (the metrics' `reason`, the message).
    Aborted(&'static str, String),
}

impl Pinned {
    /// When the session's idle or age bound ends it (`None`: never).
    pub(super) fn due(&self, limits: &crate::request::session::SessionsConfig) -> Option<TokioInstant> {
        let ms = |v: u64| (v > 0).then(|| Duration::from_millis(v));
        let idle = if self.in_txn {
            ms(limits.idle_in_transaction_timeout_ms)
        } else {
            ms(limits.idle_timeout_ms)
        };
        let idle = idle.map(|d| later(self.last_active, d));
        let age = ms(limits.max_duration_ms).map(|d| later(self.opened, d));
        match (idle, age) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The session is serving statements (not ending).
    pub(super) fn serving(&self) -> bool {
        self.ending.is_none()
    }

    /// What became of the transaction if the worker is lost now.
    fn outcome(&self) -> Option<TransactionOutcome> {
        if self.may_commit {
            Some(TransactionOutcome::Unknown)
        } else if self.in_txn {
            Some(TransactionOutcome::RolledBack)
        } else {
            None
        }
    }
}

/// The text that goes with an outcome.
fn outcome_text(outcome: Option<TransactionOutcome>) -> &'static str {
    match outcome {
        Some(TransactionOutcome::Unknown) => {
            "a statement that may commit (COMMIT, or one that commits implicitly) was in flight: \
             the transaction's outcome is unknown, check the data before retrying"
        }
        Some(_) => "the open transaction was rolled back (no commit was in flight)",
        None => "no transaction was open",
    }
}

/// Why a session ended at a hold of its group.
fn held_text(outcome: Option<TransactionOutcome>) -> String {
    format!(
        "session ended: its member stopped taking requests (a switchover or failover in progress, the \
         primary lost); {}",
        outcome_text(outcome)
    )
}

/// A `SESSION_ABORTED` body.
fn aborted(message: String, dispatched: bool, transaction: Option<TransactionOutcome>) -> ErrorBody {
    ErrorBody {
        dispatched,
        transaction,
        retryable: false,
        ..ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::SessionAborted, message)
    }
}

/// Ends with the session's next statement (never, when not pinned or ending).
pub(super) async fn next_statement(pinned: &mut Option<Pinned>) -> Option<Job> {
    match pinned {
        Some(p) if p.serving() => p.jobs.recv().await,
        _ => std::future::pending().await,
    }
}

impl Relay {
    /// Pins the worker to the session `job` opens: `SESSION` goes out on its stream.
    pub(super) async fn pin(&mut self, job: Job) -> Result<(), LinkError> {
        let Job {
            mut guard,
            cancel,
            opens,
            ..
        } = job;
        let opening = *opens.expect("an opening job");
        let (session, jobs) = (opening.session, opening.jobs);
        let member = self.pool.target_member().unwrap_or_default();
        let read_only = self.pool.read_member().is_some();
        session.set_pinned(PinnedTo {
            member: member.clone(),
            slot: self.slot,
            read_only,
        });
        guard.set_dispatched();
        let opened = SessionOpened {
            member: member.clone(),
            slot: self.slot,
            read_only,
        };
        let now = TokioInstant::now();
        // As any frame to a client: a slow one does not stall the link's keepalive.
        let alive = self.forward(&mut guard, Frame::new(Kind::Session, 0, &opened)).await?;
        info!(
            conn = session.conn,
            session = session.stream,
            slot = self.slot,
            %member,
            "session opened"
        );
        self.pool.sessions.pinned(&session);
        self.env.metrics.sessions.opened.inc();
        self.env.metrics.sessions.open.inc();
        self.pinned = Some(Pinned {
            session,
            guard,
            closed: cancel,
            jobs,
            _permits: (opening.permit, opening.conn_permit),
            opened: now,
            last_active: now,
            in_txn: false,
            may_commit: false,
            ending: (!alive).then(|| Ending::Aborted("disconnected", "the client went away".into())),
            reset: None,
            reset_failed: false,
            end_after_transaction: false,
        });
        // Holds before this session are not its business; one in force now is (it may
        // have come while SESSION went out).
        self.holds.borrow_and_update();
        if !self.pool.is_dispatching() {
            self.session_held(false);
        }
        Ok(())
    }

    /// The session's next statement, taken from its queue: it becomes the worker's
    /// request, unless the worker no longer serves the session's member (then the session
    /// ends, the statement never ran).
    pub(super) async fn session_statement(&mut self, current: &mut Option<Current>, job: Job) -> Result<(), LinkError> {
        let stale = self.pool.slot_stale(self.slot, self.generation);
        let Some(p) = self.pinned.as_mut() else { return Ok(()) };
        p.last_active = TokioInstant::now();
        if stale {
            let outcome = if p.in_txn {
                Some(TransactionOutcome::RolledBack)
            } else {
                None
            };
            let why = format!(
                "the session's worker no longer serves its member (failover or switchover, or the slot retired); {}",
                outcome_text(outcome)
            );
            fail_later_body(job, aborted(why.clone(), false, outcome));
            p.ending = Some(Ending::Aborted("retargeted", why));
            return Ok(());
        }
        let may_commit = Request::from_frame(&job.frame).map_or(true, |r| osprey_sql::may_commit(&r.sql, p.in_txn));
        if self.start(current, job).await? {
            // Written: from now on a lost worker may have run it.
            if let Some(p) = self.pinned.as_mut() {
                p.may_commit = may_commit;
            }
            // Writes it out (nothing is added behind a pinned worker's request).
            self.top_up(current).await?;
        }
        Ok(())
    }

    /// The client closes the session (or its connection went): a statement still
    /// running is stopped first; the `RESET` follows when the worker is free.
    pub(super) async fn close_session(&mut self, current: &mut Option<Current>) -> Result<(), LinkError> {
        let Some(p) = self.pinned.as_mut() else { return Ok(()) };
        p.ending = Some(if p.guard.shared().closed.load(std::sync::atomic::Ordering::Relaxed) {
            Ending::Aborted("disconnected", "the client's connection closed".into())
        } else {
            Ending::Closed
        });
        if let Some(cur) = current.as_mut() {
            self.send_cancel(cur).await?;
        }
        Ok(())
    }

    /// An operator ends the session (`POST /sessions/kill`): a statement still running is
    /// stopped first.
    pub(super) async fn kill_session(&mut self, current: &mut Option<Current>) -> Result<(), LinkError> {
        let Some(p) = self.pinned.as_mut() else { return Ok(()) };
        let outcome = p.in_txn.then_some(TransactionOutcome::RolledBack);
        let text = format!("session ended by an operator; {}", outcome_text(outcome));
        p.ending = Some(Ending::Aborted("operator", text));
        if let Some(cur) = current.as_mut() {
            self.send_cancel(cur).await?;
        }
        Ok(())
    }

    /// The session's idle or age bound passed (the worker is free).
    pub(super) fn session_expired(&mut self) {
        let limits = &self.env.sessions;
        let Some(p) = self.pinned.as_mut() else { return };
        let now = TokioInstant::now();
        let (reason, what) =
            if limits.max_duration_ms > 0 && now >= later(p.opened, Duration::from_millis(limits.max_duration_ms)) {
                (
                    "max_duration",
                    format!(
                        "it was open longer than sessions.max_duration_ms = {}",
                        limits.max_duration_ms
                    ),
                )
            } else if p.in_txn {
                (
                    "idle_in_transaction",
                    format!(
                        "it was idle inside a transaction for sessions.idle_in_transaction_timeout_ms = {}",
                        limits.idle_in_transaction_timeout_ms
                    ),
                )
            } else {
                (
                    "idle",
                    format!("it was idle for sessions.idle_timeout_ms = {}", limits.idle_timeout_ms),
                )
            };
        let outcome = p.in_txn.then_some(TransactionOutcome::RolledBack);
        p.ending = Some(Ending::Aborted(
            reason,
            format!("session ended: {what}; {}", outcome_text(outcome)),
        ));
    }

    /// A session statement's END: whether a transaction is open now.
    pub(super) fn session_statement_ended(&mut self, end: Option<&osprey_protocol::End>, fatal: bool) {
        // A hold that is over (a short "primary down") ends nothing.
        let held = !self.pool.is_dispatching();
        if let Some(p) = self.pinned.as_mut() {
            p.last_active = TokioInstant::now();
            if !fatal {
                p.may_commit = false;
                p.in_txn = end.is_some_and(|e| e.in_transaction);
                p.session.set_in_transaction(p.in_txn);
                if p.end_after_transaction && !p.in_txn && p.serving() && held {
                    p.ending = Some(Ending::Aborted("held", held_text(None)));
                }
            }
        }
    }

    /// The group stopped (or resumed) dispatching. Stopped: a switchover waits for the
    /// requests on the member's workers to end, and a pinned worker counts; so a session
    /// ends now when no transaction is open (nothing is lost), or right after its
    /// transaction ends (the switchover waits for that, within its own timeout).
    pub(super) fn session_held(&mut self, busy: bool) {
        let held = !self.pool.is_dispatching();
        let Some(p) = self.pinned.as_mut() else { return };
        if !held {
            p.end_after_transaction = false;
            return;
        }
        if !p.in_txn && !busy {
            p.ending = Some(Ending::Aborted("held", held_text(None)));
        } else {
            p.end_after_transaction = true;
        }
    }

    /// For the statement on a worker that is given up (killed at its deadline, or at the
    /// shutdown's): in a session, `SESSION_ABORTED` with what became of the transaction.
    pub(super) fn session_lost_body(&self, why: &str) -> Option<ErrorBody> {
        let p = self.pinned.as_ref()?;
        let outcome = p.outcome();
        Some(aborted(
            format!("session aborted: {why}; {}", outcome_text(outcome)),
            true,
            outcome,
        ))
    }

    /// A fatal ERROR from the pinned worker (its database session is gone): the client
    /// is told the session is aborted and what became of its transaction, not just the
    /// database's error.
    pub(super) fn session_fatal(&self, frame: Frame) -> Frame {
        let Some(p) = self.pinned.as_ref() else { return frame };
        let Ok(mut body) = frame.body::<ErrorBody>() else {
            return frame;
        };
        let outcome = p.outcome();
        body.message = format!(
            "session aborted: its database session was lost ({}); {}",
            body.message,
            outcome_text(outcome)
        );
        body.code = ErrorCode::SessionAborted;
        body.transaction = outcome;
        body.retryable = false;
        Frame::new(Kind::Error, frame.stream, &body)
    }

    /// Writes `RESET` when the session ends and the worker is free.
    pub(super) async fn reset_if_due(&mut self, busy: bool) -> Result<(), LinkError> {
        let due = self
            .pinned
            .as_ref()
            .is_some_and(|p| p.ending.is_some() && p.reset.is_none());
        if !due || busy {
            return Ok(());
        }
        let wstream = self.next_wstream();
        let by = later(TokioInstant::now(), self.env.bounds.keepalive_timeout);
        if let Some(p) = self.pinned.as_mut() {
            p.reset = Some((wstream, by));
        }
        self.write(Frame::new(Kind::Reset, wstream, &Reset {})).await
    }

    /// Whether `frame` answers the session's `RESET`.
    pub(super) fn is_reset_answer(&self, frame: &Frame) -> bool {
        self.pinned
            .as_ref()
            .and_then(|p| p.reset)
            .is_some_and(|(ws, _)| ws == frame.stream)
    }

    /// The worker answered the `RESET`: `END` ends the session (its stream answered) and
    /// the worker serves the group again; `ERROR` means the reset failed and the worker exits.
    pub(super) async fn reset_answered(
        &mut self,
        frame: Frame,
        current: &mut Option<Current>,
    ) -> Result<bool, LinkError> {
        match frame.kind {
            Kind::Error => {
                // Its END follows; the worker exits after it.
                if let Some(p) = self.pinned.as_mut() {
                    p.reset_failed = true;
                }
                warn!(slot = self.slot, "session reset failed; the worker exits");
                Ok(false)
            }
            Kind::End => {
                let p = self.pinned.take().expect("pinned");
                let failed = p.reset_failed;
                // A failed reset still ended the transaction: the worker's exit closes
                // its database session, which rolls it back.
                self.unpin(p, None);
                if failed {
                    return Err(LinkError::WorkerFatal);
                }
                // Back to the group: its next job, idle, or QUIT_NOW. The session held its
                // worker from its opening until now.
                self.advance(current, Held::SinceStart).await
            }
            Kind::Ping | Kind::Pong | Kind::Started => Ok(false),
            _ => Err(LinkError::UnexpectedKind),
        }
    }

    /// Ends the session: its stream answered as its ending says (or, `lost`, as the
    /// worker's loss says), its waiting statements refused.
    pub(super) fn unpin(&mut self, mut p: Pinned, lost: Option<(LinkError, Option<Current>)>) {
        let metrics = &self.env.metrics;
        metrics.sessions.open.dec();
        self.pool.sessions.unpinned(&p.session);
        let (reason, answer) = match (lost, p.ending.take()) {
            (Some((why, cur)), ending) => {
                let outcome = p.outcome();
                let text = format!(
                    "session aborted: its worker was lost ({why}); {}",
                    outcome_text(outcome)
                );
                if let Some(cur) = cur {
                    // The statement on the worker: it may have run.
                    metrics.outcome("session_aborted");
                    tokio::spawn(cur.guard.fail(aborted(text.clone(), true, outcome)));
                }
                match ending {
                    // The client asked to close: its transaction is gone either way.
                    Some(Ending::Closed) => ("closed", None),
                    _ => ("worker_lost", Some(aborted(text, true, outcome))),
                }
            }
            (None, Some(Ending::Closed) | None) => ("closed", None),
            (None, Some(Ending::Aborted(reason, text))) => {
                let outcome = p.in_txn.then_some(TransactionOutcome::RolledBack);
                (reason, Some(aborted(text, true, outcome)))
            }
        };
        metrics.sessions.ended(reason);
        let outcome = answer.as_ref().and_then(|b| b.transaction);
        p.session.set_ended(outcome);
        debug!(
            conn = p.session.conn,
            session = p.session.stream,
            slot = self.slot,
            reason,
            "session ended"
        );
        // Statements that never reached the worker.
        p.jobs.close();
        let mut waiting = Vec::new();
        while let Ok(job) = p.jobs.try_recv() {
            waiting.push(job);
        }
        for job in waiting {
            let body = aborted(
                format!(
                    "session {} ended before this statement ran; {}",
                    p.session.stream,
                    outcome_text(outcome)
                ),
                false,
                outcome,
            );
            fail_later_body(job, body);
        }
        let guard = p.guard;
        tokio::spawn(async move {
            match answer {
                Some(body) => guard.fail(body).await,
                None => {
                    let mut guard = guard;
                    guard
                        .forward(Frame::new(Kind::End, 0, &osprey_protocol::End::default()))
                        .await;
                }
            }
        });
    }
}

/// Fails a job with `body`, without waiting for room in its client's queue.
fn fail_later_body(job: Job, body: ErrorBody) {
    tokio::spawn(job.guard.fail(body));
}

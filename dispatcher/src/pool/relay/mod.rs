//! Serves requests on one registered worker link. One task owns the worker
//! socket and the request on it: it writes the REQUEST, relays the response
//! frames straight into the client's write queue, enforces the request timeout
//! and cancellation, and on END takes the next queued job itself. A request
//! therefore costs the dispatcher two task wake-ups (this one, the client's
//! writer) instead of one per hand-off.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use osprey_protocol::link_socket::{LinkRead, LinkWrite};
use osprey_protocol::{End, ErrorBody, ErrorCode, Frame, FrameCodec, Origin};
use tokio::sync::mpsc;
use tokio::time::{Instant as TokioInstant, Interval};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tracing::{debug, warn};

use crate::pool::env::WorkerEnv;
use crate::pool::stash::Stash;
use crate::pool::{SlotGroup, SubmitError};
use crate::request::job::{fail_later, Job, MAX_DISPATCH_ATTEMPTS};
use crate::request::streams::StreamGuard;

mod ahead;
mod deadline;
mod error;
mod forward;
mod io;
mod pinned;
mod serve;

pub use error::LinkError;

pub type Reader = FramedRead<LinkRead, FrameCodec>;
pub type Writer = FramedWrite<LinkWrite, FrameCodec>;

/// After the dispatcher gave up a worker that had requests written behind its current
/// one, it reads what the worker wrote before it died for at most this long, to tell
/// the requests it started from those it never did (see [`Relay::settle_ahead`]).
const SETTLE_AFTER_KILL: Duration = Duration::from_secs(2);

/// Frames already read that the serving loop acts on before it looks at its timers and
/// other waits again.
const INLINE_FRAMES: usize = 32;

/// A cancelled statement still running this many `cancel_grace_ms` after its CANCEL gets
/// its worker killed, however alive the worker is (see [`Draining`]).
pub const CANCEL_HARD_GRACES: u32 = 5;

/// The request on the worker.
struct Current {
    /// Its stream id on the worker link (the link numbers its requests).
    wstream: u32,
    /// When it became the worker's current request (written to an idle worker, or the
    /// one before it ended): the pipeline bound counts from here.
    started: TokioInstant,
    /// Taken back while it waited behind another (`CANCEL reclaim`): if the worker
    /// confirms it never ran it, it is queued again instead of answered.
    reclaimed: bool,
    /// The worker confirmed that (ERROR CANCELLED, dispatched=false).
    returned: bool,
    /// Kept to queue it again (see `reclaimed`).
    timeout: Option<Duration>,
    queue_deadline: Instant,
    attempts: u32,
    guard: StreamGuard,
    cancel: CancellationToken,
    received: Instant,
    queue_time: Duration,
    deadline: TokioInstant,
    /// The request's own deadline (`deadline` moves earlier at a CANCEL).
    limit: TokioInstant,
    cancel_sent: bool,
    client_alive: bool,
    errored: bool,
    /// The worker answered DATABASE_FATAL: it exits after this request.
    fatal: bool,
    /// The stream had no credit for client_write_timeout (its reader returned none): it
    /// got ERROR SLOW_CONSUMER from us; the worker's further frames but END are dropped.
    stalled: bool,
    /// A data frame was withheld (after a CANCEL): the result cannot end as a success.
    data_dropped: bool,
    /// [`Relay::client_waits`] when it became current.
    client_waits: u64,
    /// The statement's digest (interception on, one statement): END accounts it.
    digest: Option<osprey_sql::Digest>,
    /// The REQUEST as received (its bytes are held by the stream's budget until the end
    /// anyway): the statement is decoded from it again only for a slow execution.
    request: Frame,
    /// The request asked for `RESULT_END`s (`multi_results`): without it one is a broken
    /// worker's.
    multi_results: bool,
    /// The request asked for `RAW_ROWS` instead of `ROWS` (`raw_rows`): without it one is
    /// a broken worker's.
    raw_rows: bool,
}

/// A cancelled request whose statement was still running at `cancel_grace_ms`. MariaDB may
/// hold a killed statement for up to 2 s (`Killed / Executing`): its KILL, holding the
/// victim's mutex, retries for that long to take the mutex the victim waits on, which the
/// victim holds while it waits for its own — seen with several `SLEEP`s (one server mutex)
/// killed at once. Killing the worker then would cost a process for a statement the server
/// ends a moment later, while the worker keeps repeating `KILL QUERY`. So the client's stream is
/// answered (ERROR CANCELLED + END) and the worker stays busy, its frames dropped, until its
/// END. It is killed if it leaves a PING unanswered for `cancel_grace_ms` (it hangs), or if
/// the statement outlives [`CANCEL_HARD_GRACES`] graces after the CANCEL or the request's
/// own deadline.
struct Draining {
    /// Its stream id on the worker link.
    wstream: u32,
    conn: u64,
    stream: u32,
    /// When the stream was answered (for the log).
    answered: TokioInstant,
    hard: TokioInstant,
    /// When the last PING went out: a frame from the worker after it shows it alive.
    probed: TokioInstant,
    fatal: bool,
}

/// A request written to the worker behind the one it runs (prefetch,
/// `pool.pipeline_depth`). The worker takes its requests in order, and starts one only
/// after the `END` of the one before has left it, so one not yet current never ran.
struct Ahead {
    wstream: u32,
    state: AheadState,
    /// The worker answered it as never run (it took it out of its queue at a reclaim):
    /// its `END` follows, out of turn.
    never_ran: bool,
    /// The worker said `STARTED` for it (a pipelining worker sent its statement to the
    /// database already): it may have run, so it is never taken back or queued again.
    started: bool,
}

enum AheadState {
    /// In the worker's socket; the future ends at the client's CANCEL.
    Waiting(Job, Pin<Box<WaitForCancellationFutureOwned>>),
    /// Taken back (`CANCEL reclaim` sent): queued again if the worker confirms it never
    /// ran it, relayed as usual if it had.
    Reclaimed(Job),
    /// Cancelled by its client, who was answered then (dispatched: it may still run);
    /// whatever the worker sends for it is dropped.
    Answered { conn: u64, stream: u32 },
}

/// Why waiting to hand a data frame on ended without it (the frame is dropped; the
/// stream cannot succeed any more).
enum GiveUp {
    /// The request's deadline passed, the dispatcher is aborting, or the stream was
    /// cancelled (by the client, or because its connection closed).
    Stopped,
    /// No credit for client_write_timeout.
    Stalled,
    /// The worker link failed meanwhile.
    Link(LinkError),
}

pub struct Relay {
    env: Arc<WorkerEnv>,
    /// The slot group the worker belongs to.
    pool: Arc<SlotGroup>,
    slot: u32,
    generation: u64,
    reader: Reader,
    writer: Writer,
    jobs: mpsc::Receiver<Job>,
    quit: CancellationToken,
    /// Keepalive: PINGs to the worker, and its silence measured from `last_rx`.
    tick: Interval,
    last_rx: TokioInstant,
    nonce: u64,
    /// Requests written behind the current one, in the order the worker takes them.
    ahead: VecDeque<Ahead>,
    /// `pool.pipeline_depth`: requests written to the worker at most, current included.
    depth: usize,
    /// `pool.pipeline_hold_ms`.
    hold: Duration,
    /// The link's last stream id (they count up, skipping 0).
    last_wstream: u32,
    /// The stream id of the request the worker runs: written, and its END not yet seen
    /// (kept when the dispatcher answers it without the worker, e.g. at a timeout).
    head_ws: Option<u32>,
    /// Frames of the worker's read while a slow client held the relay (see
    /// [`Relay::side_work`]): the worker's next frames.
    stash: Stash,
    /// Frames queued for the worker and not flushed yet: while the worker's frames are at
    /// hand (buffered whole), the requests written at their ENDs go out together, in one
    /// write (see [`Relay::flush_soon`]).
    unflushed: bool,
    /// Times a frame waited for its client (its queue or its stream's credit): the
    /// current request held its worker for the client too if this moved while it was
    /// current ([`Current::client_waits`]).
    client_waits: u64,
    /// The session the worker is pinned to (protocol 1.5; see `pinned.rs`).
    pinned: Option<pinned::Pinned>,
    /// The group's holds (a switchover, the primary lost): a pinned session ends.
    holds: tokio::sync::watch::Receiver<u64>,
    /// Its group's traffic series (`osprey_group_requests_total`, …), for its member.
    traffic: crate::metrics::GroupTraffic,
}

impl Relay {
    pub fn new(
        env: Arc<WorkerEnv>,
        pool: Arc<SlotGroup>,
        (slot, generation): (u32, u64),
        reader: Reader,
        writer: Writer,
        jobs: mpsc::Receiver<Job>,
        quit: CancellationToken,
    ) -> Relay {
        let mut tick = tokio::time::interval(env.bounds.keepalive_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset();
        let depth = env.pool.pipeline_depth.clamp(1, osprey_protocol::MAX_PIPELINE_DEPTH);
        let hold = Duration::from_millis(env.pool.pipeline_hold_ms);
        let holds = pool.hold_changes();
        let role = if pool.read_member().is_some() { "read" } else { "write" };
        let member = pool.member_for(slot, generation).unwrap_or_default();
        let traffic = crate::metrics::GroupTraffic::of(&env.metrics, pool.cluster(), role, &member);
        Relay {
            traffic,
            env,
            pool,
            slot,
            generation,
            reader,
            writer,
            jobs,
            quit,
            tick,
            last_rx: TokioInstant::now(),
            nonce: 0,
            ahead: VecDeque::new(),
            depth,
            hold,
            last_wstream: 0,
            head_ws: None,
            stash: Stash::default(),
            unflushed: false,
            client_waits: 0,
            holds,
            pinned: None,
        }
    }

    /// Runs until the link ends. The slot's fate (respawn, kill) is settled with
    /// the pool here, and no job is left behind.
    pub async fn run(mut self) {
        let mut current = None;
        let mut drain = None;
        let Err(why) = self.serve(&mut current, &mut drain).await;
        debug!("worker link ended: {why}");
        let env = self.env.clone();
        self.pool
            .link_lost(self.slot, self.generation, why.as_str(), why.worker_exits());
        let head = self.head_ws;
        // Requests behind the current one never ran, unless the worker had ended the ones
        // before them in frames still unread: those are read first (the worker is dying).
        let mut lost = Vec::new();
        if !self.ahead.is_empty() {
            lost = self.settle_ahead(head, &mut current).await;
        }
        if let Some(p) = self.pinned.take() {
            // A pinned worker's request is its session's: never moved to another worker.
            let cur = current.take();
            self.unpin(p, Some((why, cur)));
        }
        if let Some(cur) = current.take() {
            if cur.returned {
                self.requeue(cur);
            } else {
                lost.push(cur.guard);
            }
        }
        for guard in lost {
            env.metrics.outcome("worker_lost");
            warn!(slot = self.slot, "worker link lost mid-request: {why}");
            let body = ErrorBody {
                retryable: false,
                dispatched: true,
                ..ErrorBody::undispatched(
                    Origin::Worker,
                    ErrorCode::WorkerLost,
                    "the worker serving this request died",
                )
            };
            tokio::spawn(guard.fail(body));
        }
        // What is still ahead never reached the database: another worker gets it. Not an
        // attempt of theirs: their worker did not vanish with them on it.
        for a in std::mem::take(&mut self.ahead) {
            match a.state {
                AheadState::Waiting(job, _) | AheadState::Reclaimed(job) => {
                    give_back_counted(&env, &self.pool, job, false)
                }
                AheadState::Answered { .. } => {}
            }
        }
        if let Some(dr) = drain {
            // Its stream was answered at cancel_grace_ms; nothing is owed to anyone.
            debug!(
                conn = dr.conn,
                stream = dr.stream,
                "link ended while a cancelled statement drained"
            );
        }
        // After link_lost nobody sends us jobs; whatever reached the channel
        // never reached the worker: another worker gets it.
        self.jobs.close();
        while let Ok(job) = self.jobs.try_recv() {
            give_back(&env, &self.pool, job);
        }
    }

    /// Queues again a request the worker answered as never run (it was reclaimed).
    fn requeue(&self, mut cur: Current) {
        self.env.metrics.pipeline.reclaimed.inc();
        cur.guard.set_undispatched();
        let job = Job {
            guard: cur.guard,
            cancel: cur.cancel,
            frame: cur.request,
            timeout: cur.timeout,
            received: cur.received,
            queue_deadline: cur.queue_deadline,
            attempts: cur.attempts,
            digest: cur.digest,
            opens: None,
            in_session: false,
            multi_results: cur.multi_results,
            raw_rows: cur.raw_rows,
        };
        give_back_counted(&self.env, &self.pool, job, false);
    }
}

/// Hands a job that never reached its worker to another one.
fn give_back(env: &WorkerEnv, pool: &Arc<SlotGroup>, job: Job) {
    give_back_counted(env, pool, job, true)
}

/// [`give_back`]; `vanished`: its worker vanished (counts towards
/// [`MAX_DISPATCH_ATTEMPTS`]), rather than handing it back alive (a reclaim).
fn give_back_counted(env: &WorkerEnv, pool: &Arc<SlotGroup>, mut job: Job, vanished: bool) {
    if job.in_session {
        // Only its session's pinned worker may run it, and that worker is gone.
        fail_later(
            vec![job],
            env.metrics.clone(),
            "session_aborted",
            ErrorCode::SessionAborted,
            "the session's worker was lost before this statement reached it",
        );
        return;
    }
    job.attempts += u32::from(vanished);
    let failed: Option<(Job, &'static str, ErrorCode, Cow<'static, str>)> = if job.attempts >= MAX_DISPATCH_ATTEMPTS {
        Some((
            job,
            "worker_lost",
            ErrorCode::WorkerLost,
            "workers kept vanishing before dispatch".into(),
        ))
    } else {
        match pool.requeue(job) {
            Ok(()) => None,
            Err((job, SubmitError::Cancelled)) => Some((
                job,
                "cancelled",
                ErrorCode::Cancelled,
                "cancelled while waiting for a worker".into(),
            )),
            Err((job, SubmitError::Unavailable)) => {
                let why = pool.unavailable_reason().unwrap_or_default();
                let msg = format!("cluster {}: no member can serve: {why}", pool.cluster());
                Some((job, "unavailable", ErrorCode::BackendUnavailable, msg.into()))
            }
            Err((job, _)) => Some((
                job,
                "shutting_down",
                ErrorCode::ShuttingDown,
                "the dispatcher is shutting down".into(),
            )),
        }
    };
    if let Some((job, outcome, code, msg)) = failed {
        fail_later(vec![job], env.metrics.clone(), outcome, code, msg);
    }
}

/// `at + d`, or a year on for a `d` beyond any clock (a configured timeout may be huge).
fn later(at: TokioInstant, d: Duration) -> TokioInstant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(86_400 * 365))
}

/// Whether an ERROR frame from the worker says it never ran the request (the answer to a
/// reclaim: "stopped before it started", dispatched=false).
fn never_ran(frame: &Frame) -> bool {
    frame
        .body::<ErrorBody>()
        .is_ok_and(|e| !e.dispatched && e.code == ErrorCode::Cancelled)
}

/// Whether an ERROR frame from the worker says its session is gone (it exits next).
fn is_fatal(frame: &Frame) -> bool {
    frame
        .body::<ErrorBody>()
        .is_ok_and(|e| e.code == ErrorCode::DatabaseFatal)
}

/// Fills in the time the request waited for a worker; the END body, when it is one.
fn with_queue_time(frame: Frame, queue_time: Duration) -> (Frame, Option<End>) {
    match End::from_frame(&frame) {
        Ok(mut end) => {
            end.queue_time_us = queue_time.as_micros() as u64;
            (end.to_frame(frame.stream), Some(end))
        }
        Err(_) => (frame, None),
    }
}

/// Ends with the index of the first request behind the current one whose client
/// cancelled it.
fn next_cancelled(ahead: &mut VecDeque<Ahead>) -> impl std::future::Future<Output = usize> + '_ {
    std::future::poll_fn(move |cx| {
        for (i, a) in ahead.iter_mut().enumerate() {
            if let AheadState::Waiting(_, cancelled) = &mut a.state {
                if std::future::Future::poll(cancelled.as_mut(), cx).is_ready() {
                    return Poll::Ready(i);
                }
            }
        }
        Poll::Pending
    })
}

//! Sessions' way through admission (protocol 1.5). Opening one: decode → route (a
//! read-only session may pin a replica's worker) → reserve (its stream) → the connection's
//! `sessions.max_per_connection` and the group's `sessions.max_per_group` (bounded waits)
//! → submit, as a job that the worker link taking it turns into a pinned worker. A
//! statement in one: intercept → reserve → throttle (one token per statement, the pinned
//! member's, in the order sent) → the session's own queue, which only its pinned worker
//! reads.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::HashMap;
use osprey_protocol::{ErrorBody, ErrorCode, Frame, Request};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, Instrument};

use crate::admit::{decode, intercept, refuse, reserve, route, submit, Refusal};
use crate::ctx::Ctx;
use crate::request::job::{Job, Opening};
use crate::request::session::{GateError, GatePermit, Session, SessionGate, TenantShare};
use crate::request::streams::ClientShared;

/// Statements one session may have waiting for its worker (a session runs one at a time;
/// a client that sends more before the first ended waits behind it). Past it: QUEUE_FULL.
pub const SESSION_QUEUE: usize = 16;

/// The sessions of one client connection, by the id of the stream that opened each, and
/// its `sessions.max_per_connection` gate. Owned by the connection's front end.
#[derive(Default)]
pub struct Sessions {
    lines: Mutex<HashMap<u32, Arc<Line>>>,
    gate: Arc<SessionGate>,
}

impl Sessions {
    fn lines(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Line>>> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a session; those that ended leave the table here (so it holds at most the
    /// connection's open streams' worth).
    fn add(&self, line: Arc<Line>) {
        let mut lines = self.lines();
        lines.retain(|_, l| !l.ended());
        lines.insert(line.session.stream, line);
    }

    /// Whether the session opened on stream `id` is still open (a front end asks after a
    /// statement failed: was it the session that ended?).
    pub fn is_open(&self, id: u32) -> bool {
        self.get(id).is_some()
    }

    /// The session opened on stream `id`, unless it ended.
    fn get(&self, id: u32) -> Option<Arc<Line>> {
        self.lines().get(&id).filter(|l| !l.ended()).cloned()
    }
}

/// A session's statements on their way to its pinned worker: the sending end of its
/// queue (the worker link holds the other; once that is gone, the session has ended),
/// and the statements waiting for a throttle token, in arrival order.
struct Line {
    session: Arc<Session>,
    jobs: mpsc::Sender<Job>,
    throttled: Mutex<Lane>,
}

/// A [`Line`]'s statements waiting for a throttle token: a later statement waits behind
/// them even when a token is at hand, so that the session runs what its client sent in the
/// order sent. Bounded by the connection's streams and request bytes.
#[derive(Default)]
struct Lane {
    waiting: VecDeque<Job>,
    /// The first has been taken and is being handed on: a later one still waits.
    handing: bool,
}

/// Why a statement could not be handed to its session.
enum SendError {
    /// No worker is pinned yet (the client did not wait for `SESSION`).
    NotOpen,
    /// [`SESSION_QUEUE`] statements wait already.
    Full,
    /// The session ended (its link is gone).
    Ended,
}

impl Line {
    fn ended(&self) -> bool {
        self.jobs.is_closed()
    }

    fn lane(&self) -> std::sync::MutexGuard<'_, Lane> {
        self.throttled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether statements wait for a throttle token (a new one goes behind them).
    fn throttled_waiting(&self) -> bool {
        let lane = self.lane();
        !lane.waiting.is_empty() || lane.handing
    }

    /// Puts a statement behind those waiting for a token. True: none waited, so the
    /// caller starts the one task that gives them their tokens in order.
    fn wait_for_token(&self, job: Job) -> bool {
        let mut lane = self.lane();
        let first = lane.waiting.is_empty() && !lane.handing;
        lane.waiting.push_back(job);
        first
    }

    /// The cancel token of the first statement waiting for a token (`None`: none waits).
    fn first_waiting(&self) -> Option<CancellationToken> {
        self.lane().waiting.front().map(|j| j.cancel.clone())
    }

    /// Takes the first waiting statement to hand it on (its token came, or its wait
    /// ended); later ones keep waiting until [`Line::handed`].
    fn take_waiting(&self) -> Option<Job> {
        let mut lane = self.lane();
        let job = lane.waiting.pop_front();
        lane.handing = job.is_some();
        job
    }

    /// The statement taken is handed on (sent, or answered); whether more wait.
    fn handed(&self) -> bool {
        let mut lane = self.lane();
        lane.handing = false;
        !lane.waiting.is_empty()
    }

    /// Hands a statement to the pinned worker's link; a refusal gives it back.
    // The job comes back with the refusal (to be answered): as `SlotGroup::submit`.
    #[allow(clippy::result_large_err)]
    fn send(&self, job: Job) -> Result<(), (Job, SendError)> {
        if self.session.pinned().is_none() {
            return Err((job, SendError::NotOpen));
        }
        self.jobs.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(job) => (job, SendError::Full),
            mpsc::error::TrySendError::Closed(job) => (job, SendError::Ended),
        })
    }
}

/// Opens the session that `frame` (a REQUEST with `open_session`) asks for. `Err`: the
/// peer is broken (see [`crate::admit::admit`]).
pub async fn open(
    ctx: &Arc<Ctx>,
    shared: &Arc<ClientShared>,
    sessions: &Sessions,
    frame: Frame,
    request: Request,
    draining: bool,
) -> Result<(), ErrorBody> {
    let stream = frame.stream;
    let write = match decode::cluster_group(ctx, &request) {
        Ok(g) => g,
        Err(refusal) => return refuse(ctx, shared, stream, refusal).await,
    };
    let cluster = ctx.cluster(request.cluster.as_deref());
    let group = match route::session(write, cluster.map(|c| &**c), &request) {
        Ok(g) => g,
        Err(refusal) => return refuse(ctx, shared, stream, refusal).await,
    };
    let Some((guard, cancel)) = reserve::stream(ctx, shared, stream, frame.payload.len(), draining).await? else {
        return Ok(());
    };
    let limits = &ctx.config.sessions;
    let wait = match (request.timeout_ms, limits.open_timeout_ms) {
        (0, 0) => ctx.queue_timeout(),
        (0, ms) => Duration::from_millis(ms),
        (asked, 0) => Duration::from_millis(asked).min(ctx.queue_timeout()),
        (asked, ms) => Duration::from_millis(asked.min(ms)),
    };
    let session = Session::new(shared.id, stream, group.cluster().to_owned());
    let (jobs, queued) = mpsc::channel(SESSION_QUEUE);
    sessions.add(Arc::new(Line {
        session: session.clone(),
        jobs,
        throttled: Mutex::default(),
    }));
    let job = Job::new(guard, cancel, frame, None, wait, None);
    // The waits for places run in their own task: the connection goes on reading.
    let ctx = ctx.clone();
    let conn_gate = sessions.gate.clone();
    let conn_id = shared.id;
    tokio::spawn(
        async move {
            let limits = ctx.config.sessions.clone();
            let per_conn = limits.max_per_connection;
            let deadline = tokio::time::Instant::now() + wait;
            // First a place among this connection's sessions, then one among the group's.
            let Some((job, conn_permit)) = enter(&ctx, job, conn_gate.enter(|| per_conn, usize::MAX, wait), |_| {
                format!(
                    "this connection kept sessions.max_per_connection = {per_conn} sessions open for {} ms",
                    wait.as_millis()
                )
            })
            .await
            else {
                return;
            };
            let (sized, queue) = (group.clone(), limits.queue);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let cap = || limits.cap(sized.target_size());
            let tenant = group.tenant_of(conn_id);
            let tenant_cap = |others: usize| limits.tenant_cap(cap(), others);
            let share = Some(TenantShare {
                tenant,
                cap: tenant_cap,
            });
            let opening = group.sessions.enter_as(share, cap, queue, left);
            let Some((job, permit)) = enter(&ctx, job, opening, |e| {
                let cap = cap();
                match e {
                    GateError::TenantShare => format!(
                        "this client's token or MySQL user holds {} of the {cap} sessions this slot group \
                         allows (sessions.max_per_tenant: the others are kept for other tenants) and none \
                         of its own ended within {} ms",
                        group.sessions.share_of(tenant, tenant_cap),
                        wait.as_millis()
                    ),
                    GateError::Full => format!(
                        "{cap} sessions pin this slot group's workers (sessions.max_per_group) and \
                         sessions.queue = {queue} more wait already"
                    ),
                    GateError::Timeout => format!(
                        "{cap} sessions pin this slot group's workers (sessions.max_per_group) and none \
                         ended within {} ms",
                        wait.as_millis()
                    ),
                }
            })
            .await
            else {
                return;
            };
            let job = Job {
                opens: Some(Box::new(Opening {
                    session,
                    jobs: queued,
                    permit,
                    conn_permit,
                })),
                ..job
            };
            submit::submit(&ctx, &group, job).await;
        }
        .in_current_span(),
    );
    Ok(())
}

/// A place under a gate for the opening `job`, or its stream answered: cancelled while it
/// waited, or `SESSION_LIMIT` saying `why`.
async fn enter(
    ctx: &Ctx,
    job: Job,
    wait: impl std::future::Future<Output = Result<GatePermit, GateError>>,
    why: impl FnOnce(GateError) -> String,
) -> Option<(Job, GatePermit)> {
    let refused = tokio::select! {
        r = wait => match r {
            Ok(permit) => return Some((job, permit)),
            Err(e) => Some(e),
        },
        _ = job.cancel.cancelled() => None,
    };
    match refused {
        Some(e) => {
            let why = why(e);
            debug!(conn = job.conn(), stream = job.stream(), "session refused: {why}");
            let refusal = Refusal::new("session_limit", ErrorCode::SessionLimit, why);
            ctx.metrics.outcome(refusal.outcome);
            job.guard.fail(refusal.body()).await;
        }
        None => {
            job.fail(
                &ctx.metrics,
                "cancelled",
                ErrorCode::Cancelled,
                "cancelled while waiting to open a session",
            )
            .await
        }
    }
    None
}

/// Runs the statement in `frame` in the connection's session `id`.
pub async fn statement(
    ctx: &Arc<Ctx>,
    shared: &Arc<ClientShared>,
    sessions: &Sessions,
    frame: Frame,
    request: Request,
    id: u32,
) -> Result<(), ErrorBody> {
    let stream = frame.stream;
    let Some(line) = sessions.get(id) else {
        let why = format!(
            "no session is open on stream {id} of this connection (it ended, or never opened: see that stream's terminal frame)"
        );
        return refuse(
            ctx,
            shared,
            stream,
            Refusal::new("bad_request", ErrorCode::InvalidRequest, why),
        )
        .await;
    };
    let Some(pinned) = line.session.pinned() else {
        let why = format!("session {id} is not open yet: wait for its SESSION frame");
        return refuse(
            ctx,
            shared,
            stream,
            Refusal::new("bad_request", ErrorCode::InvalidRequest, why),
        )
        .await;
    };
    let digest = match intercept::check(ctx, &request) {
        Ok(d) => d,
        Err(refusal) => return refuse(ctx, shared, stream, refusal).await,
    };
    // A session open at a drain goes on until drain_timeout: its statements are taken.
    let Some((guard, cancel)) = reserve::stream(ctx, shared, stream, frame.payload.len(), false).await? else {
        return Ok(());
    };
    let timeout = (request.timeout_ms > 0).then(|| Duration::from_millis(request.timeout_ms));
    let job = Job {
        in_session: true,
        multi_results: request.multi_results,
        raw_rows: request.raw_rows,
        ..Job::new(guard, cancel, frame, timeout, ctx.queue_timeout(), digest)
    };
    // In order: behind the session's statements that wait for a token, even with one at
    // hand or no limit any more (this connection's frames are admitted one by one, so
    // nothing races here).
    if line.throttled_waiting() || ctx.policy.throttle.any_limit() {
        let key = Ctx::throttle_key(&line.session.cluster, &pinned.member);
        if line.throttled_waiting() || !ctx.policy.throttle.try_acquire(&key) {
            if line.wait_for_token(job) {
                tokio::spawn(give_tokens(ctx.clone(), line, key).in_current_span());
            }
            return Ok(());
        }
    }
    send(ctx, &line, job).await;
    Ok(())
}

/// Gives the statements of `line` that wait for a throttle token their tokens, one after
/// the other, and sends each on at once: the session runs them in the order sent. A
/// statement leaves the line only once handled, so that a later one waits behind it.
async fn give_tokens(ctx: Arc<Ctx>, line: Arc<Line>, key: String) {
    // Once one is refused, those sent behind it are too: a session must not run the
    // statements after one that did not run (a COMMIT without the write before it).
    let mut refused: Option<Refusal> = None;
    while let Some(cancel) = line.first_waiting() {
        let got = match &refused {
            Some(_) => Some(Ok(())),
            None => tokio::select! {
                r = ctx.policy.acquire(&key) => Some(r),
                _ = cancel.cancelled() => None,
            },
        };
        let Some(job) = line.take_waiting() else { return };
        match (got, &refused) {
            (Some(Ok(())), Some(first)) => {
                let refusal = Refusal::new(
                    first.outcome,
                    first.code,
                    format!(
                        "a statement sent before this one in session {} was refused: {}",
                        line.session.stream, first.message
                    ),
                );
                ctx.metrics.outcome(refusal.outcome);
                job.guard.fail(refusal.body()).await;
            }
            (Some(Ok(())), None) => send(&ctx, &line, job).await,
            (Some(Err(throttled)), _) => {
                debug!(member = %key, "throttled: {throttled}");
                let refusal = Refusal::from(throttled);
                ctx.metrics.outcome(refusal.outcome);
                job.guard.fail(refusal.body()).await;
                refused = Some(refusal);
            }
            (None, _) => {
                job.fail(
                    &ctx.metrics,
                    "cancelled",
                    ErrorCode::Cancelled,
                    "cancelled while waiting for a throttle token",
                )
                .await
            }
        }
        if !line.handed() {
            return;
        }
    }
}

/// Hands the job to the session's pinned worker; a refusal answers its stream.
async fn send(ctx: &Ctx, line: &Line, job: Job) {
    let id = line.session.stream;
    let Err((job, e)) = line.send(job) else { return };
    let refusal = match e {
        SendError::NotOpen => Refusal::new(
            "bad_request",
            ErrorCode::InvalidRequest,
            format!("session {id} is not open yet: wait for its SESSION frame"),
        ),
        SendError::Full => Refusal::new(
            "queue_full",
            ErrorCode::QueueFull,
            format!("session {id} runs one statement at a time and {SESSION_QUEUE} wait already"),
        ),
        SendError::Ended => Refusal::new(
            "session_aborted",
            ErrorCode::SessionAborted,
            format!("session {id} ended before this statement ran (see its stream's terminal frame)"),
        ),
    };
    ctx.metrics.outcome(refusal.outcome);
    let mut body = refusal.body();
    if body.code == ErrorCode::SessionAborted {
        // What became of the session's transaction, as its own stream was told.
        body.transaction = line.session.ended_outcome();
    }
    job.guard.fail(body).await;
}

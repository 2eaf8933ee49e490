//! Sessions' way through admission (protocol 1.5). Opening one: decode → route (a
//! read-only session may pin a replica's worker) → reserve (its stream, the connection's
//! `sessions.max_per_connection`) → the group's `sessions.max_per_group` (a bounded wait)
//! → submit, as a job that the worker link taking it turns into a pinned worker. A
//! statement in one: intercept → reserve → throttle (one token per statement, the pinned
//! member's) → the session's own queue, which only its pinned worker reads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use osprey_protocol::{ErrorBody, ErrorCode, Frame, Request};
use tracing::{debug, Instrument};

use crate::admit::{decode, intercept, reserve, route, submit, Refusal};
use crate::ctx::Ctx;
use crate::request::job::{Job, Opening};
use crate::request::session::{GateError, SendError, Session};
use crate::request::streams::ClientShared;

/// Opens the session that `frame` (a REQUEST with `open_session`) asks for. `Err`: the
/// peer is broken (see [`crate::admit::admit`]).
pub async fn open(
    ctx: &Arc<Ctx>,
    shared: &Arc<ClientShared>,
    frame: Frame,
    request: Request,
    draining: bool,
) -> Result<(), ErrorBody> {
    let stream = frame.stream;
    let refuse = |refusal: Refusal| async move {
        ctx.metrics.outcome(refusal.outcome);
        shared.reject(stream, refusal.body()).await;
        Ok(())
    };
    let write = match decode::cluster_group(ctx, &request) {
        Ok(g) => g,
        Err(refusal) => return refuse(refusal).await,
    };
    let cluster = ctx.cluster(request.cluster.as_deref());
    let group = match route::session(write, cluster.map(|c| &**c), &request) {
        Ok(g) => g,
        Err(refusal) => return refuse(refusal).await,
    };
    let (mut guard, cancel) = match reserve::open(ctx, shared, stream)? {
        Ok(opened) => opened,
        Err(refusal) => return refuse(refusal).await,
    };
    if let Err(refusal) = reserve::budget(ctx, shared, &mut guard, frame.payload.len(), draining) {
        ctx.metrics.outcome(refusal.outcome);
        guard.fail(refusal.body()).await;
        return Ok(());
    }
    let limits = &ctx.config.sessions;
    let session = Session::new(shared.id, stream, group.cluster().to_owned());
    shared.add_session(session.clone());
    let received = Instant::now();
    let wait = match (request.timeout_ms, limits.open_timeout_ms) {
        (0, 0) => ctx.queue_timeout(),
        (0, ms) => Duration::from_millis(ms),
        (asked, 0) => Duration::from_millis(asked).min(ctx.queue_timeout()),
        (asked, ms) => Duration::from_millis(asked.min(ms)),
    };
    let job = Job {
        guard,
        cancel,
        frame,
        timeout: None,
        received,
        queue_deadline: received + wait,
        attempts: 0,
        digest: None,
        opens: None,
        in_session: false,
    };
    // The wait for a place runs in its own task: the connection goes on reading.
    let ctx = ctx.clone();
    let conn_gate = shared.session_gate.clone();
    tokio::spawn(
        async move {
            let (cap_cfg, queue) = (ctx.config.sessions.clone(), ctx.config.sessions.queue);
            let per_conn = cap_cfg.max_per_connection;
            let deadline = tokio::time::Instant::now() + wait;
            // First a place among this connection's sessions, then one among the group's.
            let entered = tokio::select! {
                r = conn_gate.enter(|| per_conn, usize::MAX, wait) => r,
                _ = job.cancel.cancelled() => {
                    job.fail(&ctx.metrics, "cancelled", ErrorCode::Cancelled, "cancelled while waiting to open a session").await;
                    return;
                }
            };
            let conn_permit = match entered {
                Ok(p) => p,
                Err(_) => {
                    let why = format!(
                        "this connection kept sessions.max_per_connection = {per_conn} sessions open for {} ms",
                        wait.as_millis()
                    );
                    let refusal = Refusal::new("session_limit", ErrorCode::SessionLimit, why);
                    ctx.metrics.outcome(refusal.outcome);
                    job.guard.fail(refusal.body()).await;
                    return;
                }
            };
            let sized = group.clone();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let entered = tokio::select! {
                r = group.sessions.enter(|| cap_cfg.cap(sized.target_size()), queue, left) => r,
                _ = job.cancel.cancelled() => {
                    job.fail(&ctx.metrics, "cancelled", ErrorCode::Cancelled, "cancelled while waiting to open a session").await;
                    return;
                }
            };
            let permit = match entered {
                Ok(p) => p,
                Err(e) => {
                    let cap = ctx.config.sessions.cap(group.target_size());
                    let why = match e {
                        GateError::Full => format!(
                            "{cap} sessions pin this slot group's workers (sessions.max_per_group) and \
                             sessions.queue = {queue} more wait already"
                        ),
                        GateError::Timeout => format!(
                            "{cap} sessions pin this slot group's workers (sessions.max_per_group) and none \
                             ended within {} ms",
                            wait.as_millis()
                        ),
                    };
                    debug!(conn = session.conn, stream = session.stream, "session refused: {why}");
                    let refusal = Refusal::new("session_limit", ErrorCode::SessionLimit, why);
                    ctx.metrics.outcome(refusal.outcome);
                    job.guard.fail(refusal.body()).await;
                    return;
                }
            };
            let job = Job {
                opens: Some(Box::new(Opening {
                    session,
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

/// Runs the statement in `frame` in the connection's session `id`.
pub async fn statement(
    ctx: &Arc<Ctx>,
    shared: &Arc<ClientShared>,
    frame: Frame,
    request: Request,
    id: u32,
) -> Result<(), ErrorBody> {
    let stream = frame.stream;
    let refuse = |refusal: Refusal| async move {
        ctx.metrics.outcome(refusal.outcome);
        shared.reject(stream, refusal.body()).await;
        Ok(())
    };
    let Some(session) = shared.session(id) else {
        return refuse(Refusal::new(
            "bad_request",
            ErrorCode::InvalidRequest,
            format!("no session is open on stream {id} of this connection (it ended, or never opened: see that stream's terminal frame)"),
        ))
        .await;
    };
    let Some(pinned) = session.pinned() else {
        return refuse(Refusal::new(
            "bad_request",
            ErrorCode::InvalidRequest,
            format!("session {id} is not open yet: wait for its SESSION frame"),
        ))
        .await;
    };
    let digest = match intercept::check(ctx, &request) {
        Ok(d) => d,
        Err(refusal) => return refuse(refusal).await,
    };
    let (mut guard, cancel) = match reserve::open(ctx, shared, stream)? {
        Ok(opened) => opened,
        Err(refusal) => return refuse(refusal).await,
    };
    // A session open at a drain goes on until drain_timeout: its statements are taken.
    if let Err(refusal) = reserve::budget(ctx, shared, &mut guard, frame.payload.len(), false) {
        ctx.metrics.outcome(refusal.outcome);
        guard.fail(refusal.body()).await;
        return Ok(());
    }
    let received = Instant::now();
    let job = Job {
        guard,
        cancel,
        frame,
        timeout: (request.timeout_ms > 0).then(|| Duration::from_millis(request.timeout_ms)),
        received,
        queue_deadline: received + ctx.queue_timeout(),
        attempts: 0,
        digest,
        opens: None,
        in_session: true,
    };
    // In order: behind the session's statements that wait for a token, even with one at
    // hand or no limit any more (this connection's frames are admitted one by one, so
    // nothing races here).
    if session.throttled_waiting() || ctx.policy.throttle.any_limit() {
        let key = Ctx::throttle_key(&session.cluster, &pinned.member);
        if session.throttled_waiting() || !ctx.policy.throttle.try_acquire(&key) {
            if session.wait_for_token(job) {
                tokio::spawn(give_tokens(ctx.clone(), session, key).in_current_span());
            }
            return Ok(());
        }
    }
    send(ctx, &session, job).await;
    Ok(())
}

/// Gives the statements of `session` that wait for a throttle token their tokens, one
/// after the other, and sends each on at once: the session runs them in the order sent.
/// A statement leaves the line only once handled, so that a later one waits behind it.
async fn give_tokens(ctx: Arc<Ctx>, session: Arc<Session>, key: String) {
    // Once one is refused, those sent behind it are too: a session must not run the
    // statements after one that did not run (a COMMIT without the write before it).
    let mut refused: Option<Refusal> = None;
    while let Some(cancel) = session.first_waiting() {
        let got = match &refused {
            Some(_) => Some(Ok(())),
            None => tokio::select! {
                r = ctx.policy.acquire(&key) => Some(r),
                _ = cancel.cancelled() => None,
            },
        };
        let Some(job) = session.take_waiting() else { return };
        match (got, &refused) {
            (Some(Ok(())), Some(first)) => {
                let refusal = Refusal::new(
                    first.outcome,
                    first.code,
                    format!(
                        "a statement sent before this one in session {} was refused: {}",
                        session.stream, first.message
                    ),
                );
                ctx.metrics.outcome(refusal.outcome);
                job.guard.fail(refusal.body()).await;
            }
            (Some(Ok(())), None) => send(&ctx, &session, job).await,
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
        if !session.handed() {
            return;
        }
    }
}

/// Hands the job to the session's pinned worker; a refusal answers its stream.
async fn send(ctx: &Ctx, session: &Session, job: Job) {
    let id = session.stream;
    let (job, refusal) = match session.send(job) {
        Ok(()) => return,
        Err(SendError::NotOpen(job)) => (
            job,
            Refusal::new(
                "bad_request",
                ErrorCode::InvalidRequest,
                format!("session {id} is not open yet: wait for its SESSION frame"),
            ),
        ),
        Err(SendError::Full(job)) => (
            job,
            Refusal::new(
                "queue_full",
                ErrorCode::QueueFull,
                format!(
                    "session {id} runs one statement at a time and {} wait already",
                    crate::request::session::SESSION_QUEUE
                ),
            ),
        ),
        Err(SendError::Ended(job)) => (
            job,
            Refusal::new(
                "session_aborted",
                ErrorCode::SessionAborted,
                format!("session {id} ended before this statement ran (see its stream's terminal frame)"),
            ),
        ),
    };
    ctx.metrics.outcome(refusal.outcome);
    let mut body = refusal.body();
    if body.code == ErrorCode::SessionAborted {
        // What became of the session's transaction, as its own stream was told.
        body.transaction = session.ended_outcome();
    }
    job.guard.fail(body).await;
}

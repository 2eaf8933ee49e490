//! One client request, from REQUEST to its terminal frame: wait for a worker,
//! hand the request over, relay the response, enforce timeouts and cancellation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use osprey_protocol::{End, ErrorBody, ErrorCode, Frame, Kind, Origin};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant as TokioInstant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn, Instrument};

use crate::ctx::Ctx;
use crate::pool::{AcquireError, Assignment, Lease};
use crate::streams::StreamGuard;

/// Frames buffered between a worker link's reader and the request task.
const RELAY_QUEUE: usize = 32;
/// How often a request whose worker vanished before dispatch tries another one.
const MAX_DISPATCH_ATTEMPTS: usize = 3;

pub struct RequestMeta {
    pub timeout: Option<Duration>,
}

pub fn spawn(ctx: Arc<Ctx>, guard: StreamGuard, cancel: CancellationToken, frame: Frame, meta: RequestMeta) {
    let span = tracing::debug_span!("request", conn = guard.shared().id, stream = guard.stream());
    tokio::spawn(run(ctx, guard, cancel, frame, meta).instrument(span));
}

fn dispatcher_error(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
    ErrorBody::undispatched(Origin::Dispatcher, code, message)
}

async fn run(ctx: Arc<Ctx>, mut guard: StreamGuard, cancel: CancellationToken, frame: Frame, meta: RequestMeta) {
    let started = Instant::now();
    let mut attempts = 0;
    let (lease, mut rx, wstream) = loop {
        attempts += 1;
        let lease = tokio::select! {
            r = ctx.pool.acquire(ctx.queue_timeout()) => r,
            _ = cancel.cancelled() => {
                ctx.metrics.outcome("cancelled");
                return guard.fail(dispatcher_error(ErrorCode::Cancelled, "cancelled while waiting for a worker")).await;
            }
            _ = ctx.abort.cancelled() => Err(AcquireError::ShuttingDown),
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(e) => {
                let (code, outcome, msg) = match e {
                    AcquireError::QueueFull => (
                        ErrorCode::QueueFull,
                        "queue_full",
                        "all workers busy and the wait queue is full",
                    ),
                    AcquireError::QueueTimeout => (
                        ErrorCode::QueueTimeout,
                        "queue_timeout",
                        "no worker became free within queue_timeout",
                    ),
                    AcquireError::ShuttingDown => (
                        ErrorCode::ShuttingDown,
                        "shutting_down",
                        "the dispatcher is shutting down",
                    ),
                };
                ctx.metrics.outcome(outcome);
                return guard.fail(dispatcher_error(code, msg)).await;
            }
        };
        ctx.metrics.queue_wait.observe(started.elapsed().as_secs_f64());
        match hand_over(lease, &frame).await {
            Ok(handed) => break handed,
            Err(()) if attempts < MAX_DISPATCH_ATTEMPTS => continue,
            Err(()) => {
                ctx.metrics.outcome("worker_lost");
                return guard
                    .fail(dispatcher_error(
                        ErrorCode::WorkerLost,
                        "workers kept vanishing before dispatch",
                    ))
                    .await;
            }
        }
    };
    let queue_time = started.elapsed();
    guard.set_dispatched();
    debug!(slot = lease.slot, "dispatched");

    let timeout = meta
        .timeout
        .unwrap_or_else(|| ctx.request_timeout())
        .min(ctx.request_timeout());
    let mut deadline = TokioInstant::now() + timeout;
    let mut cancel_sent = false;
    let mut client_alive = true;
    let mut errored = false;
    loop {
        tokio::select! {
            frame = rx.recv() => match frame {
                Some(frame) if frame.kind == Kind::End => {
                    let frame = with_queue_time(frame, queue_time);
                    if client_alive { guard.forward(frame).await; } else { drop(guard); }
                    lease.release();
                    ctx.metrics.latency.observe(started.elapsed().as_secs_f64());
                    ctx.metrics.outcome(match (cancel_sent, errored) {
                        (true, _) => "cancelled",
                        (false, true) => "error",
                        (false, false) => "ok",
                    });
                    return;
                }
                Some(frame) => {
                    errored |= frame.kind == Kind::Error;
                    if client_alive && !guard.forward(frame).await {
                        // The client is gone: stop the statement, keep draining to END.
                        client_alive = false;
                        cancel_sent = send_cancel(&lease, wstream, cancel_sent, &mut deadline, &ctx);
                    }
                }
                None => {
                    ctx.metrics.outcome("worker_lost");
                    warn!(slot = lease.slot, "worker link lost mid-request");
                    lease.kill("link lost mid-request");
                    let body = ErrorBody {
                        retryable: false,
                        ..dispatcher_error(ErrorCode::WorkerLost, "the worker serving this request died")
                    };
                    return guard.fail(ErrorBody { origin: Origin::Worker, ..body }).await;
                }
            },
            _ = sleep_until(deadline) => {
                ctx.metrics.outcome("timeout");
                let msg = if cancel_sent {
                    "the worker did not stop after CANCEL; it was killed"
                } else {
                    "request_timeout passed; the worker was killed"
                };
                warn!(slot = lease.slot, "{msg}");
                lease.kill("request timeout");
                let code = if cancel_sent { ErrorCode::Cancelled } else { ErrorCode::RequestTimeout };
                return guard.fail(dispatcher_error(code, msg)).await;
            }
            _ = cancel.cancelled(), if !cancel_sent => {
                cancel_sent = send_cancel(&lease, wstream, cancel_sent, &mut deadline, &ctx);
            }
            _ = ctx.abort.cancelled() => {
                ctx.metrics.outcome("shutting_down");
                lease.kill("dispatcher shutdown");
                return guard.fail(dispatcher_error(ErrorCode::ShuttingDown, "drain_timeout passed during shutdown")).await;
            }
        }
    }
}

/// Routes the worker's answer to us and sends it the request. Err: the worker
/// vanished before the request reached it (the lease is dropped, the slot refilled).
async fn hand_over(mut lease: Lease, frame: &Frame) -> Result<(Lease, mpsc::Receiver<Frame>, u32), ()> {
    let (tx, rx) = mpsc::channel(RELAY_QUEUE);
    // One request at a time per worker, so a fixed worker-side stream id is enough;
    // the reader still checks it.
    let wstream = 1;
    if lease
        .link
        .assign
        .send(Assignment { stream: wstream, tx })
        .await
        .is_err()
    {
        lease.kill("link closed before dispatch");
        return Err(());
    }
    lease.mark_in_use();
    if lease
        .link
        .to_worker
        .send(frame.clone().with_stream(wstream))
        .await
        .is_err()
    {
        lease.kill("link closed before dispatch");
        return Err(());
    }
    Ok((lease, rx, wstream))
}

fn send_cancel(lease: &Lease, wstream: u32, already: bool, deadline: &mut TokioInstant, ctx: &Ctx) -> bool {
    if !already {
        let cancel = Frame::new(
            Kind::Cancel,
            wstream,
            &osprey_protocol::Cancel {
                reason: "client".into(),
            },
        );
        let _ = lease.link.to_worker.try_send(cancel);
        let grace = TokioInstant::now() + Duration::from_millis(ctx.config.timeouts.cancel_grace_ms);
        *deadline = (*deadline).min(grace);
    }
    true
}

/// Fills in the time the request waited for a worker.
fn with_queue_time(frame: Frame, queue_time: Duration) -> Frame {
    match frame.body::<End>() {
        Ok(mut end) => {
            end.queue_time_us = queue_time.as_micros() as u64;
            Frame::new(Kind::End, frame.stream, &end)
        }
        Err(_) => frame,
    }
}

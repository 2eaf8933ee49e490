//! Serves requests on one registered worker link. One task owns the worker
//! socket and the request on it: it writes the REQUEST, relays the response
//! frames straight into the client's write queue, enforces the request timeout
//! and cancellation, and on END takes the next queued job itself. A request
//! therefore costs the dispatcher two task wake-ups (this one, the client's
//! writer) instead of one per hand-off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use osprey_protocol::{Cancel, End, ErrorBody, ErrorCode, Frame, FrameCodec, Kind, Origin, Ping, QuitNow};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, timeout_at, Instant as TokioInstant};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::ctx::Ctx;
use crate::job::{fail_later, Job, MAX_DISPATCH_ATTEMPTS};
use crate::pool::Next;
use crate::streams::StreamGuard;

pub type Reader = FramedRead<OwnedReadHalf, FrameCodec>;
pub type Writer = FramedWrite<OwnedWriteHalf, FrameCodec>;

/// Why a link ended when the worker closed it (it is exiting by itself).
pub const WORKER_CLOSED: &str = "worker closed the connection";

/// One request at a time per worker, so a fixed worker-side stream id is enough;
/// responses on any other id are a broken worker.
const WORKER_STREAM: u32 = 1;

/// The request on the worker.
struct Current {
    guard: StreamGuard,
    cancel: CancellationToken,
    received: Instant,
    queue_time: Duration,
    deadline: TokioInstant,
    cancel_sent: bool,
    client_alive: bool,
    errored: bool,
}

pub struct Relay {
    pub ctx: Arc<Ctx>,
    pub slot: u32,
    pub generation: u64,
    pub reader: Reader,
    pub writer: Writer,
    pub jobs: mpsc::Receiver<Job>,
    pub quit: CancellationToken,
}

impl Relay {
    /// Runs until the link ends; returns why. The slot's fate (respawn, kill)
    /// is settled with the pool here, and no job is left behind.
    pub async fn run(mut self) {
        let mut current = None;
        let why = self.serve(&mut current).await;
        debug!("worker link ended: {why}");
        let ctx = self.ctx.clone();
        ctx.pool
            .link_lost(self.slot, self.generation, why, why == WORKER_CLOSED);
        if let Some(cur) = current.take() {
            ctx.metrics.outcome("worker_lost");
            warn!(slot = self.slot, "worker link lost mid-request: {why}");
            let body = ErrorBody {
                retryable: false,
                ..ErrorBody::undispatched(
                    Origin::Worker,
                    ErrorCode::WorkerLost,
                    "the worker serving this request died",
                )
            };
            tokio::spawn(cur.guard.fail(body));
        }
        // After link_lost nobody sends us jobs; whatever reached the channel
        // never reached the worker: another worker gets it.
        self.jobs.close();
        while let Ok(job) = self.jobs.try_recv() {
            give_back(&ctx, job);
        }
    }

    async fn serve(&mut self, current: &mut Option<Current>) -> &'static str {
        let ctx = self.ctx.clone();
        let mut last_rx = TokioInstant::now();
        let mut tick = tokio::time::interval(ctx.keepalive_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset();
        let mut nonce = 0u64;
        let mut quit_sent = false;
        let far = TokioInstant::now() + Duration::from_secs(86_400 * 365);
        let never = CancellationToken::new();
        loop {
            let busy = current.is_some();
            let deadline = current.as_ref().map_or(far, |c| c.deadline);
            let cancel = current
                .as_ref()
                .filter(|c| !c.cancel_sent)
                .map_or_else(|| never.clone(), |c| c.cancel.clone());
            tokio::select! {
                biased;
                _ = cancel.cancelled(), if busy => {
                    let cur = current.as_mut().expect("busy");
                    if let Err(why) = self.send_cancel(cur).await {
                        return why;
                    }
                }
                _ = sleep_until(deadline), if busy => {
                    let cur = current.take().expect("busy");
                    ctx.metrics.outcome("timeout");
                    let (code, msg) = if cur.cancel_sent {
                        (ErrorCode::Cancelled, "the worker did not stop after CANCEL; it was killed")
                    } else {
                        (ErrorCode::RequestTimeout, "request_timeout passed; the worker was killed")
                    };
                    warn!(slot = self.slot, conn = cur.guard.shared().id, stream = cur.guard.stream(), "{msg}");
                    ctx.pool.kill(self.slot, self.generation, "request timeout");
                    tokio::spawn(cur.guard.fail(ErrorBody::undispatched(Origin::Dispatcher, code, msg)));
                    return "request timeout";
                }
                _ = ctx.abort.cancelled(), if busy => {
                    let cur = current.take().expect("busy");
                    ctx.metrics.outcome("shutting_down");
                    ctx.pool.kill(self.slot, self.generation, "dispatcher shutdown");
                    tokio::spawn(cur.guard.fail(ErrorBody::undispatched(
                        Origin::Dispatcher,
                        ErrorCode::ShuttingDown,
                        "drain_timeout passed during shutdown",
                    )));
                    return "dispatcher shutdown";
                }
                _ = tick.tick() => {
                    if last_rx.elapsed() > ctx.keepalive_timeout() {
                        warn!("worker silent past keepalive_timeout");
                        return "keepalive timeout";
                    }
                    nonce += 1;
                    if let Err(why) = self.write(Frame::new(Kind::Ping, 0, &Ping { nonce })).await {
                        return why;
                    }
                }
                frame = self.reader.next() => {
                    let frame = match frame {
                        None => return WORKER_CLOSED,
                        Some(Err(e)) => {
                            warn!("bad frame from worker: {e}");
                            return "bad frame from worker";
                        }
                        Some(Ok(frame)) => frame,
                    };
                    last_rx = TokioInstant::now();
                    match frame.kind {
                        Kind::Columns | Kind::Rows | Kind::Error | Kind::End => {
                            let Some(cur) = current.as_mut() else { return "response frame without a request" };
                            if frame.stream != WORKER_STREAM {
                                return "response frame on the wrong stream";
                            }
                            if frame.kind != Kind::End {
                                cur.errored |= frame.kind == Kind::Error;
                                if cur.client_alive && !cur.guard.forward(frame).await {
                                    // The client is gone: stop the statement, keep draining to END.
                                    cur.client_alive = false;
                                    if let Err(why) = self.send_cancel(cur).await {
                                        return why;
                                    }
                                }
                                continue;
                            }
                            let cur = current.take().expect("checked above");
                            self.finish(cur, frame).await;
                            match self.advance(current, true).await {
                                Ok(quit) => quit_sent |= quit,
                                Err(why) => return why,
                            }
                        }
                        Kind::Ping => {
                            let Ok(ping) = frame.body::<Ping>() else { return "bad PING body" };
                            if let Err(why) = self.write(Frame::new(Kind::Pong, 0, &ping)).await {
                                return why;
                            }
                        }
                        Kind::Pong => {}
                        Kind::QuitRequest => {
                            debug!("worker asks to retire");
                            ctx.pool.quit_requested(self.slot, self.generation);
                        }
                        _ => return "unexpected frame kind from worker",
                    }
                }
                job = self.jobs.recv(), if !busy => {
                    let Some(job) = job else { return "pool dropped the link" };
                    match self.start(current, job).await {
                        Ok(true) => {}
                        // Skipped (cancelled meanwhile): the slot wants its next job.
                        Ok(false) => match self.advance(current, false).await {
                            Ok(quit) => quit_sent |= quit,
                            Err(why) => return why,
                        },
                        Err(why) => return why,
                    }
                }
                _ = self.quit.cancelled(), if !busy && !quit_sent => {
                    quit_sent = true;
                    if let Err(why) = self.write(Frame::new(Kind::QuitNow, 0, &QuitNow {})).await {
                        return why;
                    }
                }
            }
        }
    }

    /// Sends `job` to the worker. Ok(false): the job needed no worker after all
    /// (cancelled or its client gone) and was answered.
    async fn start(&mut self, current: &mut Option<Current>, mut job: Job) -> Result<bool, &'static str> {
        let ctx = &self.ctx;
        if job.guard.shared().closed.load(std::sync::atomic::Ordering::Relaxed) {
            drop(job); // nobody to answer; the guard closes the stream
            return Ok(false);
        }
        if job.cancel.is_cancelled() {
            fail_later(
                vec![job],
                ctx.metrics.clone(),
                "cancelled",
                ErrorCode::Cancelled,
                "cancelled while waiting for a worker",
            );
            return Ok(false);
        }
        let queue_time = job.received.elapsed();
        ctx.metrics.queue_wait.observe(queue_time.as_secs_f64());
        let timeout = job
            .timeout
            .unwrap_or_else(|| ctx.request_timeout())
            .min(ctx.request_timeout());
        let deadline = TokioInstant::now() + timeout;
        let frame = job.frame.clone().with_stream(WORKER_STREAM);
        // A worker that takes no bytes is as hung as one that does not answer.
        let sent = timeout_at(deadline, self.writer.send(frame)).await;
        if !matches!(sent, Ok(Ok(()))) {
            // It may be mid-way into the socket, but a worker reads a REQUEST
            // whole before it acts: the link closes now, so it never ran.
            give_back(ctx, job);
            return Err(match sent {
                Err(_) => "worker does not read",
                // The worker closed its end: it is exiting; let it (exit status kept).
                Ok(_) => WORKER_CLOSED,
            });
        }
        job.guard.set_dispatched();
        debug!(slot = self.slot, conn = job.conn(), stream = job.stream(), "dispatched");
        *current = Some(Current {
            guard: job.guard,
            cancel: job.cancel,
            received: job.received,
            queue_time,
            deadline,
            cancel_sent: false,
            client_alive: true,
            errored: false,
        });
        Ok(true)
    }

    /// After a request: the next queued job, idle, or QUIT_NOW. Ok(true): QUIT_NOW sent.
    async fn advance(&mut self, current: &mut Option<Current>, mut served: bool) -> Result<bool, &'static str> {
        loop {
            match self.ctx.pool.next_job(self.slot, self.generation, served) {
                Next::Job(job) => {
                    if self.start(current, job).await? {
                        return Ok(false);
                    }
                    served = false;
                }
                Next::Idle => return Ok(false),
                Next::Quit => {
                    self.write(Frame::new(Kind::QuitNow, 0, &QuitNow {})).await?;
                    return Ok(true);
                }
                Next::Gone => return Err("slot taken from the link"),
            }
        }
    }

    /// Relays END (with the time the request waited) and accounts for the request.
    async fn finish(&self, mut cur: Current, frame: Frame) {
        let frame = with_queue_time(frame, cur.queue_time);
        if cur.client_alive {
            cur.guard.forward(frame).await;
        }
        let ctx = &self.ctx;
        ctx.metrics.latency.observe(cur.received.elapsed().as_secs_f64());
        ctx.metrics.outcome(match (cur.cancel_sent, cur.errored) {
            (true, _) => "cancelled",
            (false, true) => "error",
            (false, false) => "ok",
        });
    }

    async fn send_cancel(&mut self, cur: &mut Current) -> Result<(), &'static str> {
        if cur.cancel_sent {
            return Ok(());
        }
        cur.cancel_sent = true;
        let grace = TokioInstant::now() + Duration::from_millis(self.ctx.config.timeouts.cancel_grace_ms);
        cur.deadline = cur.deadline.min(grace);
        let cancel = Cancel {
            reason: "client".into(),
        };
        self.write(Frame::new(Kind::Cancel, WORKER_STREAM, &cancel)).await
    }

    /// Writes a control frame. These are small; a worker that cannot take one
    /// within keepalive_timeout is hung.
    async fn write(&mut self, frame: Frame) -> Result<(), &'static str> {
        match timeout(self.ctx.keepalive_timeout(), self.writer.send(frame)).await {
            Ok(Ok(())) => Ok(()),
            // The worker closed its end: it is exiting; let it (exit status kept).
            Ok(Err(_)) => Err(WORKER_CLOSED),
            Err(_) => Err("worker does not read"),
        }
    }
}

/// Hands a job that never reached its worker to another one.
fn give_back(ctx: &Ctx, mut job: Job) {
    job.attempts += 1;
    let failed = if job.attempts >= MAX_DISPATCH_ATTEMPTS {
        Some((job, ErrorCode::WorkerLost, "workers kept vanishing before dispatch"))
    } else {
        match ctx.pool.requeue(job) {
            Ok(()) => None,
            Err((job, _)) => Some((job, ErrorCode::ShuttingDown, "the dispatcher is shutting down")),
        }
    };
    if let Some((job, code, msg)) = failed {
        let outcome = if code == ErrorCode::WorkerLost {
            "worker_lost"
        } else {
            "shutting_down"
        };
        fail_later(vec![job], ctx.metrics.clone(), outcome, code, msg);
    }
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

//! Serves requests on one registered worker link. One task owns the worker
//! socket and the request on it: it writes the REQUEST, relays the response
//! frames straight into the client's write queue, enforces the request timeout
//! and cancellation, and on END takes the next queued job itself. A request
//! therefore costs the dispatcher two task wake-ups (this one, the client's
//! writer) instead of one per hand-off.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::{FutureExt, SinkExt, StreamExt};
use osprey_protocol::{
    Cancel, End, ErrorBody, ErrorCode, Frame, FrameCodec, Kind, Origin, Ping, ProtocolError, QuitNow,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, Instant as TokioInstant, Interval};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tracing::{debug, info, warn};

use crate::ctx::Ctx;
use crate::pool::stash::{next_frame, Stash};
use crate::pool::{Next, SlotGroup, SubmitError};
use crate::request::job::{fail_later, Job, MAX_DISPATCH_ATTEMPTS};
use crate::request::streams::StreamGuard;

pub type Reader = FramedRead<OwnedReadHalf, FrameCodec>;
pub type Writer = FramedWrite<OwnedWriteHalf, FrameCodec>;

/// Why a link ended when the worker closed it (it is exiting by itself).
pub const WORKER_CLOSED: &str = "worker closed the connection";
/// Why a link ended after the worker answered with a fatal database error: it
/// exits next (status 2) and must not be given another request meanwhile.
const WORKER_FATAL: &str = "worker reported a fatal database error";

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
    /// The statement's digest (interception on, one statement): END accounts it.
    digest: Option<osprey_sql::Digest>,
    /// The REQUEST as received (its bytes are held by the stream's budget until the end
    /// anyway): the statement is decoded from it again only for a slow execution.
    request: Frame,
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
    Link(&'static str),
}

pub struct Relay {
    ctx: Arc<Ctx>,
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
}

impl Relay {
    pub fn new(
        ctx: Arc<Ctx>,
        pool: Arc<SlotGroup>,
        (slot, generation): (u32, u64),
        reader: Reader,
        writer: Writer,
        jobs: mpsc::Receiver<Job>,
        quit: CancellationToken,
    ) -> Relay {
        let mut tick = tokio::time::interval(ctx.keepalive_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset();
        let depth = ctx
            .config
            .pool
            .pipeline_depth
            .clamp(1, osprey_protocol::MAX_PIPELINE_DEPTH);
        let hold = Duration::from_millis(ctx.config.pool.pipeline_hold_ms);
        Relay {
            ctx,
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
        }
    }

    /// Runs until the link ends. The slot's fate (respawn, kill) is settled with
    /// the pool here, and no job is left behind.
    pub async fn run(mut self) {
        let mut current = None;
        let mut drain = None;
        let Err(why) = self.serve(&mut current, &mut drain).await;
        debug!("worker link ended: {why}");
        let ctx = self.ctx.clone();
        let exiting = why == WORKER_CLOSED || why == WORKER_FATAL;
        self.pool.link_lost(self.slot, self.generation, why, exiting);
        let head = self.head_ws;
        // Requests behind the current one never ran, unless the worker had ended the ones
        // before them in frames still unread: those are read first (the worker is dying).
        let mut lost = Vec::new();
        if !self.ahead.is_empty() {
            lost = self.settle_ahead(head, &mut current).await;
        }
        if let Some(cur) = current.take() {
            if cur.returned {
                self.requeue(cur);
            } else {
                lost.push(cur.guard);
            }
        }
        for guard in lost {
            ctx.metrics.outcome("worker_lost");
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
                    give_back_counted(&ctx, &self.pool, job, false)
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
            give_back(&ctx, &self.pool, job);
        }
    }

    /// The worker is given up with requests written behind its current one (`head`, its
    /// stream id). It takes them in order and starts one only after the `END` of the one
    /// before has left it, so what it started shows in what it wrote before it died: that
    /// is read now (not relayed: the link is given up), for at most [`SETTLE_AFTER_KILL`].
    /// A request it ended is lost (dispatched) unless it answered it as never run, which is
    /// queued again; the first it did not end may have started (lost); those behind it
    /// stay in `self.ahead` (never ran). Returns the guards to answer as lost.
    async fn settle_ahead(&mut self, head: Option<u32>, current: &mut Option<Current>) -> Vec<StreamGuard> {
        let mut lost = Vec::new();
        let until = TokioInstant::now() + SETTLE_AFTER_KILL;
        // The frames that come now are the head's (its END not seen yet), or, once it has
        // ended, those of the first request behind it, which may have started.
        let mut at_head = head.is_some();
        let mut at = head.or_else(|| self.ahead.front().map(|a| a.wstream));
        let mut never_ran = false;
        let mut closed = false;
        while let Some(ws) = at {
            let frame = match tokio::time::timeout_at(until, next_frame(&mut self.stash, &mut self.reader)).await {
                Ok(Some(Ok(frame))) => frame,
                Ok(_) => {
                    closed = true;
                    break;
                }
                Err(_) => break,
            };
            if frame.stream == 0 {
                continue;
            }
            if frame.stream != ws {
                if self.out_of_turn(frame).is_err() {
                    break;
                }
                continue;
            }
            match frame.kind {
                Kind::Error => never_ran = frame.body::<ErrorBody>().is_ok_and(|e| !e.dispatched),
                Kind::End => {
                    if at_head {
                        at_head = false;
                        if let Some(cur) = current.take() {
                            if cur.returned || (cur.reclaimed && never_ran) {
                                self.requeue(cur);
                            } else {
                                lost.push(cur.guard);
                            }
                        }
                    } else if let Some(a) = self.ahead.pop_front() {
                        match a.state {
                            AheadState::Waiting(job, _) | AheadState::Reclaimed(job) if never_ran && !a.started => {
                                self.ctx.metrics.pipeline.reclaimed.inc();
                                give_back_counted(&self.ctx, &self.pool, job, false);
                            }
                            AheadState::Waiting(job, _) | AheadState::Reclaimed(job) => lost.push(job.guard),
                            AheadState::Answered { .. } => {}
                        }
                    }
                    never_ran = false;
                    at = self.ahead.front().map(|a| a.wstream);
                }
                _ => {}
            }
        }
        // The first not ended behind the head may have started; with no EOF (the worker
        // still not dead after the bound) nothing behind can be vouched for.
        let maybe_started = match (at.is_some() && !at_head, closed) {
            (_, false) => self.ahead.len(),
            (true, true) => 1,
            (false, true) => 0,
        };
        for _ in 0..maybe_started {
            if let Some(a) = self.ahead.pop_front() {
                if let AheadState::Waiting(job, _) | AheadState::Reclaimed(job) = a.state {
                    lost.push(job.guard);
                }
            }
        }
        // A pipelining worker sent these to its database: they may have run.
        let mut i = 0;
        while i < self.ahead.len() {
            if !self.ahead[i].started {
                i += 1;
                continue;
            }
            if let Some(a) = self.ahead.remove(i) {
                if let AheadState::Waiting(job, _) | AheadState::Reclaimed(job) = a.state {
                    lost.push(job.guard);
                }
            }
        }
        lost
    }

    /// A frame for a request behind the current one: `STARTED` (a pipelining worker sent
    /// its statement to the database), or the answer to a reclaim, which the worker gives
    /// at once for one still in its queue (ERROR "never ran", then END). Anything else out
    /// of turn is a broken worker.
    fn out_of_turn(&mut self, frame: Frame) -> Result<(), &'static str> {
        let Some(i) = self.ahead.iter().position(|a| a.wstream == frame.stream) else {
            return Err("response frame on the wrong stream");
        };
        let a = &mut self.ahead[i];
        if frame.kind == Kind::Started {
            a.started = true;
            self.ctx.metrics.pipeline.started.inc();
            return Ok(());
        }
        if matches!(a.state, AheadState::Waiting(..)) || a.started {
            return Err("response frame out of turn");
        }
        match frame.kind {
            Kind::Error if never_ran(&frame) => {
                a.never_ran = true;
                Ok(())
            }
            Kind::End if a.never_ran => {
                if let Some(a) = self.ahead.remove(i) {
                    // Back at the front of its connection's queue before its holder is
                    // released, so that a later request of the connection cannot pass it.
                    if let AheadState::Reclaimed(job) = a.state {
                        self.ctx.metrics.pipeline.reclaimed.inc();
                        give_back_counted(&self.ctx, &self.pool, job, false);
                    }
                    self.pool.unprefetch_at(self.slot, self.generation, i);
                }
                Ok(())
            }
            _ => Err("response frame out of turn"),
        }
    }

    /// Queues again a request the worker answered as never run (it was reclaimed).
    fn requeue(&self, mut cur: Current) {
        self.ctx.metrics.pipeline.reclaimed.inc();
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
        };
        give_back_counted(&self.ctx, &self.pool, job, false);
    }

    /// Serves until the link must end; the error says why.
    async fn serve(
        &mut self,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
    ) -> Result<Infallible, &'static str> {
        let ctx = self.ctx.clone();
        let mut quit_sent = false;
        let far = TokioInstant::now() + Duration::from_secs(86_400 * 365);
        let never = CancellationToken::new();
        let grace = self.grace();
        loop {
            if self.unflushed && !self.frame_at_hand() {
                // About to wait: whatever was queued for the worker goes out first.
                self.flush().await?;
            }
            let busy = current.is_some() || drain.is_some();
            let deadline = match (&*current, &*drain) {
                (Some(c), _) => c.deadline,
                (None, Some(d)) => d.hard,
                (None, None) => far,
            };
            let probe_due = drain.as_ref().map_or(far, |d| later(d.probed, grace));
            // Requests waiting behind a current one that has run for `hold` are taken back.
            let reclaim_due = match &*current {
                Some(c) if self.has_waiting() => later(c.started, self.hold),
                _ => far,
            };
            let cancel = current
                .as_ref()
                .filter(|c| !c.cancel_sent)
                .map_or_else(|| never.clone(), |c| c.cancel.clone());
            // Biased: timers first, so that a worker streaming without pause cannot
            // starve its own timeout or the keepalive PINGs it needs.
            tokio::select! {
                biased;
                _ = sleep_until(deadline), if busy => {
                    if let Some(dr) = drain.take() {
                        warn!(
                            slot = self.slot, conn = dr.conn, stream = dr.stream,
                            "cancelled statement still running at its hard bound; killing the worker"
                        );
                        self.pool.kill(self.slot, self.generation, "cancelled statement did not end");
                        return Err("cancelled statement did not end");
                    }
                    let cur = current.take().expect("busy");
                    if cur.cancel_sent && TokioInstant::now() < cur.limit {
                        *drain = Some(self.overrun(cur).await?);
                        continue;
                    }
                    ctx.metrics.outcome(if cur.stalled { "slow_consumer" } else { "timeout" });
                    let (code, msg) = if cur.cancel_sent {
                        (ErrorCode::Cancelled, "cancelled, and the request's deadline passed; the worker was killed")
                    } else {
                        (ErrorCode::RequestTimeout, "request_timeout passed; the worker was killed")
                    };
                    warn!(slot = self.slot, conn = cur.guard.shared().id, stream = cur.guard.stream(), "{msg}");
                    self.pool.kill(self.slot, self.generation, "request timeout");
                    tokio::spawn(cur.guard.fail(ErrorBody::undispatched(Origin::Dispatcher, code, msg)));
                    return Err("request timeout");
                }
                _ = ctx.abort.cancelled(), if busy => {
                    self.pool.kill(self.slot, self.generation, "dispatcher shutdown");
                    let Some(cur) = current.take() else {
                        // Draining: its stream was answered already.
                        return Err("dispatcher shutdown");
                    };
                    ctx.metrics.outcome("shutting_down");
                    tokio::spawn(cur.guard.fail(ErrorBody::undispatched(
                        Origin::Dispatcher,
                        ErrorCode::ShuttingDown,
                        "drain_timeout passed during shutdown",
                    )));
                    return Err("dispatcher shutdown");
                }
                _ = cancel.cancelled(), if current.is_some() => {
                    let cur = current.as_mut().expect("busy");
                    self.send_cancel(cur).await?;
                }
                i = next_cancelled(&mut self.ahead), if !self.ahead.is_empty() => {
                    self.cancel_ahead(i).await?;
                }
                _ = sleep_until(reclaim_due), if reclaim_due != far => {
                    self.reclaim_all().await?;
                }
                _ = self.tick.tick() => {
                    if self.last_rx.elapsed() > ctx.keepalive_timeout() {
                        warn!("worker silent past keepalive_timeout");
                        return Err("keepalive timeout");
                    }
                    self.ping().await?;
                }
                // Frames a wait for a slow client read and kept come first, here, after
                // the timers: a deadline that passed during that wait is a timeout even
                // when the request's END is among them.
                frame = next_frame(&mut self.stash, &mut self.reader) => {
                    self.received(frame, current, drain, &mut quit_sent).await?;
                    // The frames read with it are acted on here, up to a bound: going
                    // round this select! for each set up its timers and waits again,
                    // about a fifth of the dispatcher's instructions (callgrind). The
                    // bound keeps the arms above from waiting behind a worker that
                    // streams without pause.
                    for _ in 0..INLINE_FRAMES {
                        if !self.stash.is_empty() || !self.frame_buffered() || self.loop_due(current, drain)
                        {
                            break;
                        }
                        // Decoded from the buffer: no read, so ready at once.
                        let Some(frame) = self.reader.next().now_or_never() else {
                            break;
                        };
                        self.received(frame, current, drain, &mut quit_sent).await?;
                    }
                }
                // After the worker's frames: a PONG already in the socket counts.
                _ = sleep_until(probe_due), if drain.is_some() => {
                    let dr = drain.as_mut().expect("draining");
                    if self.last_rx < dr.probed {
                        warn!(
                            slot = self.slot, conn = dr.conn, stream = dr.stream,
                            "worker answered no PING within cancel_grace_ms while its cancelled statement drained; killing it"
                        );
                        self.pool.kill(self.slot, self.generation, "worker hung after CANCEL");
                        return Err("worker hung after CANCEL");
                    }
                    self.ping().await?;
                    dr.probed = TokioInstant::now();
                }
                job = self.jobs.recv(), if !busy => {
                    let Some(job) = job else { return Err("pool dropped the link") };
                    if self.start(current, job).await? {
                        self.top_up(current).await?;
                    } else {
                        // Skipped (cancelled meanwhile): the slot wants its next job.
                        quit_sent |= self.advance(current, false).await?;
                    }
                }
                _ = self.quit.cancelled(), if !busy && !quit_sent => {
                    quit_sent = true;
                    self.write(Frame::new(Kind::QuitNow, 0, &QuitNow {})).await?;
                }
            }
        }
    }

    /// Whether a deadline, a shutdown or a CANCEL wants the serving loop's own arms now:
    /// frames at hand then wait for them. A data frame that gave up waiting for a slow
    /// client at the deadline leaves the timeout to the loop (`give_up`): an `END` at hand
    /// must not end that request first, as dropped rows (`CANCELLED`).
    fn loop_due(&self, current: &Option<Current>, drain: &Option<Draining>) -> bool {
        let now = TokioInstant::now();
        self.ctx.abort.is_cancelled()
            || current
                .as_ref()
                .is_some_and(|c| now >= c.deadline || (!c.cancel_sent && c.cancel.is_cancelled()))
            || drain.as_ref().is_some_and(|d| now >= d.hard)
    }

    /// What the worker's socket gave: a frame is acted on, the end or a bad frame ends
    /// the link.
    async fn received(
        &mut self,
        frame: Option<Result<Frame, ProtocolError>>,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
        quit_sent: &mut bool,
    ) -> Result<(), &'static str> {
        let frame = match frame {
            None => return Err(WORKER_CLOSED),
            Some(Err(e)) => {
                warn!("bad frame from worker: {e}");
                return Err("bad frame from worker");
            }
            Some(Ok(frame)) => frame,
        };
        self.last_rx = TokioInstant::now();
        self.on_frame(frame, current, drain, quit_sent).await
    }

    /// Acts on one frame from the worker (see [`Relay::serve`]).
    async fn on_frame(
        &mut self,
        frame: Frame,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
        quit_sent: &mut bool,
    ) -> Result<(), &'static str> {
        let head = current
            .as_ref()
            .map(|c| c.wstream)
            .or(drain.as_ref().map(|d| d.wstream));
        if frame.stream != 0 && Some(frame.stream) != head {
            // Only the answer to a reclaim comes out of turn.
            self.out_of_turn(frame)?;
            return Ok(());
        }
        match frame.kind {
            Kind::Columns | Kind::Rows if drain.is_some() => {
                if Some(frame.stream) != head {
                    return Err("response frame on the wrong stream");
                }
            }
            Kind::Columns | Kind::Rows => {
                let Some(cur) = current.as_mut() else {
                    return Err("response frame without a request");
                };
                if Some(frame.stream) != head {
                    return Err("response frame on the wrong stream");
                }
                cur.guard.set_dispatched();
                // After a CANCEL nobody wants the data: only ERROR and END go on.
                if cur.cancel_sent {
                    cur.data_dropped = true;
                } else if cur.client_alive {
                    self.forward_data(cur, frame).await?;
                }
            }
            Kind::Error if drain.is_some() => {
                if Some(frame.stream) != head {
                    return Err("response frame on the wrong stream");
                }
                if let Some(dr) = drain.as_mut() {
                    dr.fatal |= is_fatal(&frame);
                }
            }
            Kind::Error => {
                let Some(cur) = current.as_mut() else {
                    return Err("response frame without a request");
                };
                if Some(frame.stream) != head {
                    return Err("response frame on the wrong stream");
                }
                if cur.reclaimed && !cur.returned && never_ran(&frame) {
                    // Taken back in time: queued again at its END, not answered.
                    cur.returned = true;
                    return Ok(());
                }
                cur.guard.set_dispatched();
                cur.errored = true;
                if is_fatal(&frame) && !cur.fatal {
                    // Before the client hears of it (and sends its next request):
                    // the other idle sessions to this member likely died too.
                    self.pool.session_lost(self.slot, self.generation);
                }
                cur.fatal |= is_fatal(&frame);
                if cur.client_alive && !cur.stalled && !self.forward(&mut cur.guard, frame).await? {
                    // The client is gone: stop the statement, keep draining to END.
                    cur.client_alive = false;
                    self.send_cancel(cur).await?;
                }
            }
            Kind::End => {
                if Some(frame.stream) != head {
                    return Err("response frame on the wrong stream");
                }
                self.head_ws = None;
                if let Some(dr) = drain.take() {
                    info!(
                        slot = self.slot,
                        conn = dr.conn,
                        stream = dr.stream,
                        after_ms = dr.answered.elapsed().as_millis() as u64,
                        "cancelled statement ended after its stream was answered; the worker is free"
                    );
                    if dr.fatal {
                        return Err(WORKER_FATAL);
                    }
                    *quit_sent |= self.next(current, drain, true).await?;
                } else {
                    let Some(cur) = current.take() else {
                        return Err("response frame without a request");
                    };
                    if cur.returned {
                        self.requeue(cur);
                        *quit_sent |= self.next(current, drain, false).await?;
                        return Ok(());
                    }
                    if self.finish(cur, frame).await? {
                        return Err(WORKER_FATAL);
                    }
                    *quit_sent |= self.next(current, drain, true).await?;
                }
            }
            // For the current request: it runs (or may) already.
            Kind::Started => {}
            Kind::Ping => {
                let Ok(ping) = frame.body::<Ping>() else {
                    return Err("bad PING body");
                };
                self.write(Frame::new(Kind::Pong, 0, &ping)).await?;
            }
            Kind::Pong => {
                if frame.body::<Ping>().is_err() {
                    return Err("bad PONG body");
                }
            }
            Kind::QuitRequest => {
                debug!("worker asks to retire");
                self.pool.quit_requested(self.slot, self.generation);
            }
            _ => return Err("unexpected frame kind from worker"),
        }
        Ok(())
    }

    /// Sends `job` to the worker. Ok(false): the job needed no worker after all
    /// (cancelled, its client gone, or the dispatcher aborting) and was answered.
    async fn start(&mut self, current: &mut Option<Current>, job: Job) -> Result<bool, &'static str> {
        let Some(job) = self.skip(job) else { return Ok(false) };
        let wstream = self.next_wstream();
        let job = self.write_request(job, wstream).await?;
        self.head_ws = Some(wstream);
        self.ctx.metrics.pipeline.depth.observe(1.0);
        *current = Some(self.become_current(job, wstream, false));
        Ok(true)
    }

    /// The job, unless it needs no worker after all (cancelled, its client gone, or the
    /// dispatcher aborting): then it is answered.
    fn skip(&self, job: Job) -> Option<Job> {
        let ctx = &self.ctx;
        if job.guard.shared().closed.load(std::sync::atomic::Ordering::Relaxed) {
            ctx.metrics.outcome("cancelled");
            drop(job); // nobody to answer; the guard closes the stream
            return None;
        }
        let skip = if job.cancel.is_cancelled() {
            Some((
                "cancelled",
                ErrorCode::Cancelled,
                "cancelled while waiting for a worker",
            ))
        } else if ctx.abort.is_cancelled() {
            Some((
                "shutting_down",
                ErrorCode::ShuttingDown,
                "the dispatcher is shutting down",
            ))
        } else {
            None
        };
        match skip {
            Some((outcome, code, msg)) => {
                fail_later(vec![job], ctx.metrics.clone(), outcome, code, msg);
                None
            }
            None => Some(job),
        }
    }

    fn next_wstream(&mut self) -> u32 {
        self.last_wstream = self.last_wstream.checked_add(1).unwrap_or(1);
        self.last_wstream
    }

    /// Queues the job's REQUEST for the worker on `wstream`; [`Relay::top_up`] writes it
    /// with the ones it adds behind, in one write, so that the worker reads them together
    /// (and may pipeline them). On a failure the job is given back (it never ran) and the
    /// link ends.
    async fn write_request(&mut self, job: Job, wstream: u32) -> Result<Job, &'static str> {
        let frame = job.frame.clone().with_stream(wstream);
        // Bounded by the worker's liveness, not by the request's deadline: a large
        // REQUEST with a short timeout is a timeout (handled by the loop), not a
        // dead worker.
        let sent = timeout(self.ctx.keepalive_timeout(), self.writer.feed(frame)).await;
        if !matches!(sent, Ok(Ok(()))) {
            // It may be mid-way into the socket, but a worker reads a REQUEST
            // whole before it acts: the link closes now, so it never ran.
            give_back(&self.ctx, &self.pool, job);
            return Err(match sent {
                Err(_) => "worker does not read",
                // The worker closed its end: it is exiting; let it (exit status kept).
                Ok(_) => WORKER_CLOSED,
            });
        }
        Ok(job)
    }

    /// The job, written to the worker already, is the worker's current request from now:
    /// its deadline counts from here. A `reclaimed` one is known to have reached the
    /// database only once the worker sends anything but "never ran" for it.
    fn become_current(&self, job: Job, wstream: u32, reclaimed: bool) -> Current {
        let ctx = &self.ctx;
        let queue_time = job.received.elapsed();
        ctx.metrics.queue_wait.observe(queue_time.as_secs_f64());
        let limit = job
            .timeout
            .unwrap_or_else(|| ctx.request_timeout())
            .min(ctx.request_timeout());
        let now = TokioInstant::now();
        let deadline = later(now, limit);
        // Taken back or not, it may have started (a reclaim reaches a worker that has
        // started it too late): only the worker's "never ran" says otherwise.
        let mut guard = job.guard;
        guard.set_dispatched();
        debug!(
            slot = self.slot,
            conn = guard.shared().id,
            stream = guard.stream(),
            wstream,
            "dispatched"
        );
        Current {
            wstream,
            started: now,
            reclaimed,
            returned: false,
            timeout: job.timeout,
            queue_deadline: job.queue_deadline,
            attempts: job.attempts,
            guard,
            cancel: job.cancel,
            received: job.received,
            queue_time,
            deadline,
            limit: deadline,
            cancel_sent: false,
            client_alive: true,
            errored: false,
            fatal: false,
            stalled: false,
            data_dropped: false,
            digest: job.digest,
            request: job.frame,
        }
    }

    /// After the current request ended (`served`: the worker ran it): the next one
    /// written to the worker becomes current, or else the pool's next job, idle, or
    /// QUIT_NOW. Ok(true): QUIT_NOW sent.
    async fn next(
        &mut self,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
        served: bool,
    ) -> Result<bool, &'static str> {
        let Some(a) = self.ahead.pop_front() else {
            return self.advance(current, served).await;
        };
        let keep = self.pool.promote(self.slot, self.generation, served);
        self.head_ws = Some(a.wstream);
        match a.state {
            AheadState::Waiting(job, _) if !keep && !a.started => {
                // It may not have started yet: taken back with the rest.
                *current = Some(self.become_current(job, a.wstream, true));
                let reclaim = Cancel {
                    reason: osprey_protocol::CANCEL_RECLAIM.into(),
                };
                self.feed(Frame::new(Kind::Cancel, a.wstream, &reclaim)).await?;
            }
            AheadState::Waiting(job, _) => {
                *current = Some(self.become_current(job, a.wstream, false));
            }
            AheadState::Reclaimed(job) => {
                *current = Some(self.become_current(job, a.wstream, !a.started));
            }
            AheadState::Answered { conn, stream } => {
                // Its stream was answered at its CANCEL; the worker is busy with it until
                // its END, bounded as any cancelled statement.
                let now = TokioInstant::now();
                *drain = Some(Draining {
                    wstream: a.wstream,
                    conn,
                    stream,
                    answered: now,
                    hard: later(now, self.grace().saturating_mul(CANCEL_HARD_GRACES)),
                    probed: now,
                    fatal: false,
                });
                self.reclaim_all().await?;
                // Probed at once, as any drain: a lingering killed statement is no hang.
                self.ping().await?;
                return Ok(false);
            }
        }
        if !keep {
            // Retired or re-targeted meanwhile (failover, switchover, hold): what is
            // behind goes back to the pool before the worker gets to it.
            self.reclaim_all().await?;
        } else {
            self.top_up(current).await?;
        }
        Ok(false)
    }

    /// Prefetch: while requests wait, writes the next ones to the worker behind its
    /// current request, up to `pool.pipeline_depth` in all, so that it finds them in its
    /// socket when it ends the one it runs. Nothing goes behind a request that is being
    /// cancelled, has run for `pool.pipeline_hold_ms`, or whose digest ran slow lately,
    /// nor behind one taken back.
    /// Ends with the flush of everything queued for the worker (the current request's
    /// REQUEST included).
    async fn top_up(&mut self, current: &Option<Current>) -> Result<(), &'static str> {
        let added = self.add_behind(current).await;
        // A failure here leaves requests half written: the link ends, and what the worker
        // may have read is settled as for any lost worker.
        self.flush_soon().await?;
        added
    }

    /// Whether the worker's next frame is at hand without a read (stashed, or buffered
    /// whole).
    fn frame_at_hand(&self) -> bool {
        !self.stash.is_empty() || self.frame_buffered()
    }

    /// Whether the worker's next frame is read whole already (decoded without a read).
    fn frame_buffered(&self) -> bool {
        osprey_protocol::frame_buffered(self.reader.read_buffer())
    }

    /// Flushes what is queued for the worker now, or, while its next frame is at hand,
    /// once the relay has acted on the frames at hand (before the serving loop or a wait
    /// on a client blocks): the requests written at several ENDs the worker sent together
    /// then reach it in one write. A worker never waits for it: it has sent those frames
    /// already and is not idle until it reads the requests.
    async fn flush_soon(&mut self) -> Result<(), &'static str> {
        if self.frame_at_hand() {
            self.unflushed = true;
            return Ok(());
        }
        self.flush().await
    }

    async fn add_behind(&mut self, current: &Option<Current>) -> Result<(), &'static str> {
        let Some(cur) = current else { return Ok(()) };
        if self.depth <= 1 || cur.cancel_sent || cur.reclaimed || cur.started.elapsed() >= self.hold {
            return Ok(());
        }
        let mut last_slow = self.known_slow(cur.digest.as_ref());
        while 1 + self.ahead.len() < self.depth && !last_slow {
            if self.ahead.iter().any(|a| !matches!(a.state, AheadState::Waiting(..))) {
                return Ok(());
            }
            let Some(job) = self.pool.prefetch(self.slot, self.generation) else {
                return Ok(());
            };
            let Some(job) = self.skip(job) else {
                self.pool.unprefetch(self.slot, self.generation);
                continue;
            };
            let wstream = self.next_wstream();
            let job = self.write_request(job, wstream).await?;
            last_slow = self.known_slow(job.digest.as_ref());
            let cancelled = Box::pin(job.cancel.clone().cancelled_owned());
            self.ahead.push_back(Ahead {
                wstream,
                state: AheadState::Waiting(job, cancelled),
                never_ran: false,
                started: false,
            });
            let metrics = &self.ctx.metrics.pipeline;
            metrics.prefetched.inc();
            metrics.depth.observe((1 + self.ahead.len()) as f64);
        }
        Ok(())
    }

    /// Whether a statement with this digest ran over the slow threshold lately: it may
    /// run long again, so nothing is written behind it.
    fn known_slow(&self, digest: Option<&osprey_sql::Digest>) -> bool {
        digest.is_some_and(|d| self.ctx.policy.intercept.ran_slow_lately(d.hash))
    }

    fn has_waiting(&self) -> bool {
        self.ahead
            .iter()
            .any(|a| !a.started && matches!(a.state, AheadState::Waiting(..)))
    }

    /// Takes back every request waiting behind the current one (`CANCEL reclaim`): the
    /// worker answers those it has not started as never run, and they are queued again.
    async fn reclaim_all(&mut self) -> Result<(), &'static str> {
        let mut streams = Vec::new();
        for a in self.ahead.iter_mut().filter(|a| !a.started) {
            if let AheadState::Waiting(..) = a.state {
                let AheadState::Waiting(job, _) =
                    std::mem::replace(&mut a.state, AheadState::Answered { conn: 0, stream: 0 })
                else {
                    continue;
                };
                a.state = AheadState::Reclaimed(job);
                streams.push(a.wstream);
            }
        }
        if !streams.is_empty() {
            debug!(
                slot = self.slot,
                count = streams.len(),
                "taking back requests written ahead"
            );
        }
        let reclaim = Cancel {
            reason: osprey_protocol::CANCEL_RECLAIM.into(),
        };
        for ws in streams {
            self.feed(Frame::new(Kind::Cancel, ws, &reclaim)).await?;
        }
        self.flush().await
    }

    /// The client of the request `i` places behind the current one cancelled it: it is
    /// answered now (it may still run: it reached the worker), the worker is told to stop
    /// it, and whatever the worker sends for it is dropped.
    async fn cancel_ahead(&mut self, i: usize) -> Result<(), &'static str> {
        let Some(a) = self.ahead.get_mut(i) else { return Ok(()) };
        let AheadState::Waiting(job, _) = std::mem::replace(&mut a.state, AheadState::Answered { conn: 0, stream: 0 })
        else {
            return Ok(());
        };
        let (conn, stream) = (job.conn(), job.stream());
        a.state = AheadState::Answered { conn, stream };
        let wstream = a.wstream;
        self.ctx.metrics.outcome("cancelled");
        let mut guard = job.guard;
        guard.set_dispatched();
        let body = ErrorBody {
            dispatched: true,
            ..ErrorBody::undispatched(
                Origin::Dispatcher,
                ErrorCode::Cancelled,
                "cancelled; it had been sent to a worker, behind another request, and may still run",
            )
        };
        tokio::spawn(guard.fail(body));
        // Out of the worker's queue if it is still there (answered at once); stopped with
        // KILL QUERY if the worker has just started it.
        let reclaim = Cancel {
            reason: osprey_protocol::CANCEL_RECLAIM.into(),
        };
        self.feed(Frame::new(Kind::Cancel, wstream, &reclaim)).await?;
        let cancel = Cancel {
            reason: "client".into(),
        };
        self.write(Frame::new(Kind::Cancel, wstream, &cancel)).await
    }

    /// After a request: the next queued job, idle, or QUIT_NOW. Ok(true): QUIT_NOW sent.
    async fn advance(&mut self, current: &mut Option<Current>, mut served: bool) -> Result<bool, &'static str> {
        loop {
            match self.pool.next_job(self.slot, self.generation, served) {
                Next::Job(job) => {
                    if self.start(current, job).await? {
                        self.top_up(current).await?;
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

    /// Relays END (with the time the request waited) and accounts for the
    /// request. Ok(true): the worker is exiting (fatal database error).
    async fn finish(&mut self, mut cur: Current, frame: Frame) -> Result<bool, &'static str> {
        let (frame, end) = with_queue_time(frame, cur.queue_time);
        if let (Some(digest), Some(end)) = (&cur.digest, &end) {
            self.record(&cur, digest, end);
        }
        let relayed = if cur.client_alive {
            if cur.data_dropped && !cur.errored && !cur.stalled {
                // Cancelled, but the worker finished first: rows were withheld, so the
                // outcome is CANCELLED, not an END that would pass for a whole result.
                let body = ErrorBody {
                    dispatched: true,
                    ..ErrorBody::undispatched(
                        Origin::Dispatcher,
                        ErrorCode::Cancelled,
                        "cancelled; the rows that were still to come were dropped",
                    )
                };
                self.forward(&mut cur.guard, Frame::new(Kind::Error, 0, &body)).await?;
            }
            self.forward(&mut cur.guard, frame).await.map(drop)
        } else {
            Ok(())
        };
        let ctx = &self.ctx;
        ctx.metrics.latency.observe(cur.received.elapsed().as_secs_f64());
        ctx.metrics.outcome(match (cur.stalled, cur.cancel_sent, cur.errored) {
            (true, _, _) => "slow_consumer",
            (false, true, _) => "cancelled",
            (false, false, true) => "error",
            (false, false, false) => "ok",
        });
        relayed?;
        Ok(cur.fatal)
    }

    /// Accounts the execution with the policy (statistics, slow accounting, slow log).
    /// Never waits; the statement text and the member are looked up only for a slow one.
    fn record(&self, cur: &Current, digest: &osprey_sql::Digest, end: &End) {
        let policy = &self.ctx.policy;
        let server_time = Duration::from_micros(end.server_time_us);
        let kind = crate::policy::StatementKind::guess(digest);
        let (sql, member, client);
        if policy.intercept.is_slow(server_time) {
            sql = cur
                .request
                .body::<osprey_protocol::Request>()
                .map(|r| r.sql)
                .unwrap_or_default();
            member = self.pool.target_member().unwrap_or_default();
            client = format!("conn {}", cur.guard.shared().id);
        } else {
            (sql, member, client) = (String::new(), String::new(), String::new());
        }
        policy.record(&crate::policy::Execution {
            digest,
            kind,
            server_time,
            sql: &sql,
            rows: end.rows.max(end.affected_rows),
            member: &member,
            client: &client,
        });
    }

    /// Puts a response frame into the client's write queue. While a slow client
    /// keeps that queue full the worker's frames wait in its socket, so the
    /// link is kept alive meanwhile (PINGs out, the worker's silence not
    /// counted). A frame in hand is always delivered: if the link fails
    /// meanwhile, that is reported after. Ok(false): the client is gone.
    async fn forward(&mut self, guard: &mut StreamGuard, frame: Frame) -> Result<bool, &'static str> {
        let forward = guard.forward(frame);
        tokio::pin!(forward);
        if let Poll::Ready(alive) = futures::poll!(&mut forward) {
            return Ok(alive);
        }
        let mut link_error = None;
        if self.unflushed {
            // The worker must not wait on the client with us. A failure is reported once
            // the frame is delivered, as any other of the link meanwhile.
            if let Err(why) = self.flush().await {
                link_error = Some(why);
            }
        }
        let give_back_at = later(TokioInstant::now(), self.hold);
        let alive = loop {
            tokio::select! {
                biased;
                alive = &mut forward => break alive,
                r = self.side_work(give_back_at), if link_error.is_none() => {
                    if let Err(why) = r {
                        link_error = Some(why);
                    }
                }
            }
        };
        self.last_rx = TokioInstant::now();
        match link_error {
            Some(why) => Err(why),
            None => Ok(alive),
        }
    }

    /// Hands a COLUMNS/ROWS frame to the client: first the stream's credit (flow
    /// control on), then room in the client's queue. Unlike ERROR and END, a data frame
    /// may be given up: while it waits, the request's deadline, a CANCEL and the
    /// dispatcher's abort still count, and a stream without credit for
    /// client_write_timeout ends with SLOW_CONSUMER, so a stream that is not read cannot
    /// pin the worker. (A connection that takes no bytes is the writer's to cut off.)
    async fn forward_data(&mut self, cur: &mut Current, frame: Frame) -> Result<(), &'static str> {
        let deadline = cur.deadline;
        let credit = match cur.guard.credit() {
            None => None,
            Some(credit) => match credit.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let stall = Some(self.ctx.client_write_timeout());
                    match self.wait(credit.acquire_owned(), deadline, &cur.cancel, stall).await {
                        Ok(Ok(permit)) => Some(permit),
                        // The semaphore is never closed; treat it as a client that is gone.
                        Ok(Err(_)) => return self.client_gone(cur).await,
                        Err(why) => return self.give_up(cur, why).await,
                    }
                }
            },
        };
        let sent = cur.guard.forward_spending(frame, credit);
        match self.wait(sent, deadline, &cur.cancel, None).await {
            Ok(true) => Ok(()),
            Ok(false) => self.client_gone(cur).await,
            Err(why) => self.give_up(cur, why).await,
        }
    }

    /// Awaits `work` while the link stays alive (PINGs out), until the request's
    /// deadline, a CANCEL, the abort, or (`stall`) that long. The usual case, `work`
    /// ready at once, arms no timer.
    async fn wait<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
        deadline: TokioInstant,
        cancel: &CancellationToken,
        stall: Option<Duration>,
    ) -> Result<T, GiveUp> {
        tokio::pin!(work);
        if let Poll::Ready(v) = futures::poll!(&mut work) {
            return Ok(v);
        }
        if self.unflushed {
            // The worker must not wait on the client with us.
            self.flush().await.map_err(GiveUp::Link)?;
        }
        let ctx = self.ctx.clone();
        let expired = sleep_until(deadline);
        let stalled = sleep_until(TokioInstant::now() + stall.unwrap_or(Duration::from_secs(86_400 * 365)));
        tokio::pin!(expired, stalled);
        let give_back_at = later(TokioInstant::now(), self.hold);
        let result = loop {
            tokio::select! {
                biased;
                v = &mut work => break Ok(v),
                _ = &mut expired => break Err(GiveUp::Stopped),
                _ = ctx.abort.cancelled() => break Err(GiveUp::Stopped),
                _ = cancel.cancelled() => break Err(GiveUp::Stopped),
                _ = &mut stalled, if stall.is_some() => break Err(GiveUp::Stalled),
                r = self.side_work(give_back_at) => {
                    if let Err(why) = r {
                        break Err(GiveUp::Link(why));
                    }
                }
            }
        };
        // The worker's frames waited in its socket meanwhile: its silence is ours.
        self.last_rx = TokioInstant::now();
        result
    }

    /// While a slow client holds the relay (a frame of the current request waits for its
    /// queue or credit), the requests written behind it must not wait with it: after
    /// `pipeline_hold_ms` they are taken back, client cancels of them are answered, and
    /// the worker's out-of-turn answers are read (one other frame is kept for later, so
    /// reading stays bounded). Ends after one such step.
    /// Keeps the link alive meanwhile (PINGs out).
    async fn side_work(&mut self, give_back_at: TokioInstant) -> Result<(), &'static str> {
        let ahead = !self.ahead.is_empty();
        let waiting = self.has_waiting();
        // Read on only to reach the answers to reclaims sent: reading before would fill
        // the bound with rows that the answers then queue behind.
        let answers_due = self
            .ahead
            .iter()
            .any(|a| !a.started && !matches!(a.state, AheadState::Waiting(..)));
        let readable = answers_due && self.stash.has_room();
        tokio::select! {
            biased;
            _ = self.tick.tick() => self.ping().await,
            _ = sleep_until(give_back_at), if waiting => self.reclaim_all().await,
            i = next_cancelled(&mut self.ahead), if ahead => self.cancel_ahead(i).await,
            frame = self.reader.next(), if readable => {
                self.last_rx = TokioInstant::now();
                match frame {
                    // Before the current request's END only reclaim answers and STARTED can
                    // come for a request behind it. After it (read, or already acted on while
                    // its own forward waits: no head), the worker may run the next, whose
                    // answer is in turn: everything is kept, in order.
                    Some(Ok(f)) if self.head_ws.is_some() && !self.stash.holds_the_end() && f.stream != 0 && Some(f.stream) != self.head_ws && self.ahead.iter().any(|a| a.wstream == f.stream) => {
                        self.out_of_turn(f)
                    }
                    Some(Ok(f)) => {
                        let ends_current = self.head_ws.is_none() || (f.kind == Kind::End && Some(f.stream) == self.head_ws);
                        self.stash.push(f, ends_current);
                        Ok(())
                    }
                    None => Err(WORKER_CLOSED),
                    Some(Err(e)) => {
                        warn!("bad frame from worker: {e}");
                        Err("bad frame from worker")
                    }
                }
            }
        }
    }

    /// The client is gone: stop the statement, keep draining to END.
    async fn client_gone(&mut self, cur: &mut Current) -> Result<(), &'static str> {
        cur.client_alive = false;
        self.send_cancel(cur).await
    }

    /// A data frame was given up (see [`GiveUp`]).
    async fn give_up(&mut self, cur: &mut Current, why: GiveUp) -> Result<(), &'static str> {
        cur.data_dropped = true;
        match why {
            GiveUp::Link(why) => Err(why),
            // Deadline and abort: the loop's timers act next. A CANCEL: the loop would
            // send it too, but nothing of this stream is wanted any more.
            GiveUp::Stopped => {
                if cur.cancel.is_cancelled() {
                    self.send_cancel(cur).await?;
                }
                Ok(())
            }
            GiveUp::Stalled => {
                warn!(
                    slot = self.slot,
                    conn = cur.guard.shared().id,
                    stream = cur.guard.stream(),
                    "stream without credit for client_write_timeout; cancelling it"
                );
                cur.stalled = true;
                let body = ErrorBody {
                    dispatched: true,
                    ..ErrorBody::undispatched(
                        Origin::Dispatcher,
                        ErrorCode::SlowConsumer,
                        "the stream's reader returned no flow-control credit for client_write_timeout; \
                         the request was cancelled",
                    )
                };
                if !self.forward(&mut cur.guard, Frame::new(Kind::Error, 0, &body)).await? {
                    cur.client_alive = false;
                }
                self.send_cancel(cur).await
            }
        }
    }

    fn grace(&self) -> Duration {
        Duration::from_millis(self.ctx.config.timeouts.cancel_grace_ms)
    }

    /// `cancel_grace_ms` passed since the CANCEL and the statement still runs: the client's
    /// stream ends now, the worker drains (see [`Draining`]), probed by a PING at once.
    async fn overrun(&mut self, cur: Current) -> Result<Draining, &'static str> {
        let ctx = &self.ctx;
        let (conn, stream) = (cur.guard.shared().id, cur.guard.stream());
        ctx.metrics.cancel_overruns.inc();
        ctx.metrics.latency.observe(cur.received.elapsed().as_secs_f64());
        ctx.metrics
            .outcome(if cur.stalled { "slow_consumer" } else { "cancelled" });
        warn!(
            slot = self.slot,
            conn,
            stream,
            "statement still running cancel_grace_ms after CANCEL; stream answered, worker kept busy until it ends"
        );
        let body = ErrorBody {
            dispatched: true,
            ..ErrorBody::undispatched(
                Origin::Dispatcher,
                ErrorCode::Cancelled,
                "cancelled; the statement had not stopped within cancel_grace_ms",
            )
        };
        // Spawned, as on every path that answers without the worker: a client with a full
        // queue must not hold up the worker's link.
        tokio::spawn(cur.guard.fail(body));
        // The CANCEL went out one grace ago; the bound counts from it.
        let hard = cur.limit.min(later(
            TokioInstant::now(),
            self.grace().saturating_mul(CANCEL_HARD_GRACES - 1),
        ));
        self.ping().await?;
        // Nothing more may wait behind a statement that does not stop.
        self.reclaim_all().await?;
        Ok(Draining {
            wstream: cur.wstream,
            conn,
            stream,
            answered: TokioInstant::now(),
            hard,
            probed: TokioInstant::now(),
            fatal: cur.fatal,
        })
    }

    async fn ping(&mut self) -> Result<(), &'static str> {
        self.nonce += 1;
        let ping = Ping { nonce: self.nonce };
        self.write(Frame::new(Kind::Ping, 0, &ping)).await
    }

    async fn send_cancel(&mut self, cur: &mut Current) -> Result<(), &'static str> {
        if cur.cancel_sent {
            return Ok(());
        }
        cur.cancel_sent = true;
        cur.deadline = cur.deadline.min(later(TokioInstant::now(), self.grace()));
        let cancel = Cancel {
            reason: "client".into(),
        };
        self.write(Frame::new(Kind::Cancel, cur.wstream, &cancel)).await
    }

    /// Queues a control frame for the next [`Relay::flush`].
    async fn feed(&mut self, frame: Frame) -> Result<(), &'static str> {
        match timeout(self.ctx.keepalive_timeout(), self.writer.feed(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(WORKER_CLOSED),
            Err(_) => Err("worker does not read"),
        }
    }

    async fn flush(&mut self) -> Result<(), &'static str> {
        match timeout(self.ctx.keepalive_timeout(), SinkExt::<Frame>::flush(&mut self.writer)).await {
            Ok(Ok(())) => {
                self.unflushed = false;
                Ok(())
            }
            Ok(Err(_)) => Err(WORKER_CLOSED),
            Err(_) => Err("worker does not read"),
        }
    }

    /// Writes a control frame. These are small; a worker that cannot take one
    /// within keepalive_timeout is hung.
    async fn write(&mut self, frame: Frame) -> Result<(), &'static str> {
        match timeout(self.ctx.keepalive_timeout(), self.writer.send(frame)).await {
            Ok(Ok(())) => {
                self.unflushed = false;
                Ok(())
            }
            // The worker closed its end: it is exiting; let it (exit status kept).
            Ok(Err(_)) => Err(WORKER_CLOSED),
            Err(_) => Err("worker does not read"),
        }
    }
}

/// Hands a job that never reached its worker to another one.
fn give_back(ctx: &Ctx, pool: &Arc<SlotGroup>, job: Job) {
    give_back_counted(ctx, pool, job, true)
}

/// [`give_back`]; `vanished`: its worker vanished (counts towards
/// [`MAX_DISPATCH_ATTEMPTS`]), rather than handing it back alive (a reclaim).
fn give_back_counted(ctx: &Ctx, pool: &Arc<SlotGroup>, mut job: Job, vanished: bool) {
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
        fail_later(vec![job], ctx.metrics.clone(), outcome, code, msg);
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

/// Whether an ERROR frame from the worker says its session is gone (it exits next).
fn is_fatal(frame: &Frame) -> bool {
    frame
        .body::<ErrorBody>()
        .is_ok_and(|e| e.code == ErrorCode::DatabaseFatal)
}

/// Fills in the time the request waited for a worker; the END body, when it is one.
fn with_queue_time(frame: Frame, queue_time: Duration) -> (Frame, Option<End>) {
    match frame.body::<End>() {
        Ok(mut end) => {
            end.queue_time_us = queue_time.as_micros() as u64;
            (Frame::new(Kind::End, frame.stream, &end), Some(end))
        }
        Err(_) => (frame, None),
    }
}

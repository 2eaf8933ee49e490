//! The serving loop: frames from the worker and jobs from the group, the request's
//! deadlines and keepalive, and a request's start and end on the link.

use std::convert::Infallible;
use std::time::Duration;

use futures::{FutureExt, SinkExt, StreamExt};
use osprey_protocol::{Cancel, End, ErrorBody, ErrorCode, Frame, Kind, Origin, Ping, ProtocolError, QuitNow};
use tokio::time::{sleep_until, timeout, Instant as TokioInstant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::pool::stash::next_frame;
use crate::pool::wait_queue::Held;
use crate::pool::Next;
use crate::request::job::{fail_later, Job};

use super::*;

impl Relay {
    /// Serves until the link must end; the error says why.
    pub(super) async fn serve(
        &mut self,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
    ) -> Result<Infallible, LinkError> {
        let env = self.env.clone();
        let mut quit_sent = false;
        let far = TokioInstant::now() + Duration::from_secs(86_400 * 365);
        let never = CancellationToken::new();
        let grace = self.grace();
        // Made once, not in each round of the loop: a wait made anew registers with its
        // timer or token and leaves it again, in every round while a request runs. (The
        // timer stays at a finished request's deadline while the worker is idle: one
        // wake-up for nothing if it stays idle that long, cheaper than moving it twice
        // per request.)
        let abort = env.abort.cancelled();
        let deadline_timer = tokio::time::sleep_until(far);
        tokio::pin!(abort, deadline_timer);
        loop {
            if self.unflushed && !self.frame_at_hand() {
                // About to wait: whatever was queued for the worker goes out first.
                self.flush().await?;
            }
            // A pinned worker is its session's: it takes nothing from the group.
            let busy = current.is_some() || drain.is_some() || self.pinned.is_some();
            let working =
                current.is_some() || drain.is_some() || self.pinned.as_ref().is_some_and(|p| p.reset.is_some());
            self.reset_if_due(working).await?;
            let serving = self.pinned.as_ref().is_some_and(|p| p.serving());
            let session_close = self.pinned.as_ref().map_or_else(|| never.clone(), |p| p.closed.clone());
            let session_kill = self
                .pinned
                .as_ref()
                .map_or_else(|| never.clone(), |p| p.session.killed.clone());
            let session_due = match &self.pinned {
                Some(p) if serving && !working => p.due(&env.sessions).unwrap_or(far),
                Some(p) => p.reset.map_or(far, |(_, by)| by),
                None => far,
            };
            let deadline = match (&*current, &*drain) {
                (Some(c), _) => c.deadline,
                (None, Some(d)) => d.hard,
                (None, None) => far,
            };
            if busy && deadline_timer.deadline() != deadline {
                deadline_timer.as_mut().reset(deadline);
            }
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
                _ = &mut deadline_timer, if busy => {
                    if let Some(dr) = drain.take() {
                        warn!(
                            slot = self.slot, conn = dr.conn, stream = dr.stream,
                            "cancelled statement still running at its hard bound; killing the worker"
                        );
                        self.pool.kill(self.slot, self.generation, "cancelled statement did not end");
                        return Err(LinkError::CancelNotEnded);
                    }
                    let cur = current.take().expect("busy");
                    if cur.cancel_sent && TokioInstant::now() < cur.limit {
                        *drain = Some(self.overrun(cur).await?);
                        continue;
                    }
                    env.metrics.outcome(if cur.stalled { "slow_consumer" } else { "timeout" });
                    let (code, msg) = if cur.cancel_sent {
                        (ErrorCode::Cancelled, "cancelled, and the request's deadline passed; the worker was killed")
                    } else {
                        (ErrorCode::RequestTimeout, "request_timeout passed; the worker was killed")
                    };
                    warn!(slot = self.slot, conn = cur.guard.shared().id, stream = cur.guard.stream(), "{msg}");
                    self.pool.kill(self.slot, self.generation, "request timeout");
                    let body = self
                        .session_lost_body(msg)
                        .unwrap_or_else(|| ErrorBody::undispatched(Origin::Dispatcher, code, msg));
                    tokio::spawn(cur.guard.fail(body));
                    return Err(LinkError::RequestTimeout);
                }
                _ = &mut abort, if busy => {
                    self.pool.kill(self.slot, self.generation, "dispatcher shutdown");
                    let Some(cur) = current.take() else {
                        // Draining: its stream was answered already.
                        return Err(LinkError::Shutdown);
                    };
                    env.metrics.outcome("shutting_down");
                    let msg = "drain_timeout passed during shutdown";
                    let body = self
                        .session_lost_body(msg)
                        .unwrap_or_else(|| ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::ShuttingDown, msg));
                    tokio::spawn(cur.guard.fail(body));
                    return Err(LinkError::Shutdown);
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
                _ = session_close.cancelled(), if serving => {
                    self.close_session(current).await?;
                }
                _ = session_kill.cancelled(), if serving => {
                    self.kill_session(current).await?;
                }
                _ = self.holds.changed(), if serving => {
                    self.session_held(current.is_some() || drain.is_some());
                }
                _ = sleep_until(session_due), if session_due != far => {
                    if self.pinned.as_ref().is_some_and(|p| p.reset.is_some()) {
                        warn!(slot = self.slot, "session RESET not answered within keepalive_timeout; killing the worker");
                        self.pool.kill(self.slot, self.generation, "session reset not answered");
                        return Err(LinkError::ResetTimeout);
                    }
                    self.session_expired();
                }
                _ = self.tick.tick() => {
                    if self.last_rx.elapsed() > env.bounds.keepalive_timeout {
                        warn!("worker silent past keepalive_timeout");
                        return Err(LinkError::KeepaliveTimeout);
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
                        return Err(LinkError::HungAfterCancel);
                    }
                    self.ping().await?;
                    dr.probed = TokioInstant::now();
                }
                job = pinned::next_statement(&mut self.pinned), if serving && !working => {
                    if let Some(job) = job {
                        self.session_statement(current, job).await?;
                    }
                }
                job = self.jobs.recv(), if !busy => {
                    let Some(job) = job else { return Err(LinkError::Dropped) };
                    if self.start(current, job).await? {
                        self.top_up(current).await?;
                    } else {
                        // Skipped (cancelled meanwhile): the slot wants its next job.
                        quit_sent |= self.advance(current, Held::NotRun).await?;
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
    pub(super) fn loop_due(&self, current: &Option<Current>, drain: &Option<Draining>) -> bool {
        let now = TokioInstant::now();
        self.env.abort.is_cancelled()
            || current
                .as_ref()
                .is_some_and(|c| now >= c.deadline || (!c.cancel_sent && c.cancel.is_cancelled()))
            || drain.as_ref().is_some_and(|d| now >= d.hard)
    }

    /// What the worker's socket gave: a frame is acted on, the end or a bad frame ends
    /// the link.
    pub(super) async fn received(
        &mut self,
        frame: Option<Result<Frame, ProtocolError>>,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
        quit_sent: &mut bool,
    ) -> Result<(), LinkError> {
        let frame = match frame {
            None => return Err(LinkError::WorkerClosed),
            Some(Err(e)) => {
                warn!("bad frame from worker: {e}");
                return Err(LinkError::BadFrame);
            }
            Some(Ok(frame)) => frame,
        };
        self.last_rx = TokioInstant::now();
        self.on_frame(frame, current, drain, quit_sent).await
    }

    /// Acts on one frame from the worker (see [`Relay::serve`]).
    pub(super) async fn on_frame(
        &mut self,
        frame: Frame,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
        quit_sent: &mut bool,
    ) -> Result<(), LinkError> {
        if frame.stream != 0 && self.is_reset_answer(&frame) {
            if frame.kind == Kind::End {
                self.head_ws = None;
            }
            *quit_sent |= self.reset_answered(frame, current).await?;
            return Ok(());
        }
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
            Kind::Columns | Kind::Rows | Kind::RawRows | Kind::ResultEnd if drain.is_some() => {
                if Some(frame.stream) != head {
                    return Err(LinkError::WrongStream);
                }
            }
            Kind::Columns | Kind::Rows | Kind::RawRows | Kind::ResultEnd => {
                let Some(cur) = current.as_mut() else {
                    return Err(LinkError::NoRequest);
                };
                if Some(frame.stream) != head {
                    return Err(LinkError::WrongStream);
                }
                // Never sent on a stream that did not ask for it (docs/PROTOCOL.md). (ROWS
                // where RAW_ROWS were asked for is a worker before 1.8: the asker takes both.)
                let unasked = match frame.kind {
                    Kind::ResultEnd => !cur.multi_results,
                    Kind::RawRows => !cur.raw_rows,
                    _ => false,
                };
                if unasked {
                    return Err(LinkError::UnexpectedKind);
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
                    return Err(LinkError::WrongStream);
                }
                if let Some(dr) = drain.as_mut() {
                    dr.fatal |= is_fatal(&frame);
                }
            }
            Kind::Error => {
                let Some(cur) = current.as_mut() else {
                    return Err(LinkError::NoRequest);
                };
                if Some(frame.stream) != head {
                    return Err(LinkError::WrongStream);
                }
                if cur.reclaimed && !cur.returned && never_ran(&frame) {
                    // Taken back in time: queued again at its END, not answered.
                    cur.returned = true;
                    return Ok(());
                }
                cur.guard.set_dispatched();
                cur.errored = true;
                let fatal = is_fatal(&frame);
                if fatal && !cur.fatal {
                    // Before the client hears of it (and sends its next request):
                    // the other idle sessions to this member likely died too.
                    self.pool.session_lost(self.slot, self.generation);
                }
                cur.fatal |= fatal;
                // In a session the client learns that the session is over and what became
                // of its transaction, not just the database's error.
                let frame = if fatal && self.pinned.is_some() {
                    self.session_fatal(frame)
                } else {
                    frame
                };
                if cur.client_alive && !cur.stalled && !self.forward(&mut cur.guard, frame).await? {
                    // The client is gone: stop the statement, keep draining to END.
                    cur.client_alive = false;
                    self.send_cancel(cur).await?;
                }
            }
            Kind::End => {
                if Some(frame.stream) != head {
                    return Err(LinkError::WrongStream);
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
                    if self.pinned.is_some() {
                        // The session learns what the statement left (a COMMIT that ended
                        // after its client gave up on it, say).
                        let end = End::from_frame(&frame).ok();
                        self.session_statement_ended(end.as_ref(), dr.fatal);
                    }
                    if dr.fatal {
                        return Err(LinkError::WorkerFatal);
                    }
                    // Its END says how long it ran, but the worker was held until now.
                    *quit_sent |= self.next(current, drain, Held::SinceStart).await?;
                } else {
                    let Some(cur) = current.take() else {
                        return Err(LinkError::NoRequest);
                    };
                    if cur.returned {
                        self.requeue(cur);
                        *quit_sent |= self.next(current, drain, Held::NotRun).await?;
                        return Ok(());
                    }
                    let (fatal, held) = self.finish(cur, frame).await?;
                    if fatal {
                        return Err(LinkError::WorkerFatal);
                    }
                    *quit_sent |= self.next(current, drain, held).await?;
                }
            }
            // For the current request: it runs (or may) already.
            Kind::Started => {}
            Kind::Ping => {
                let Ok(ping) = frame.body::<Ping>() else {
                    return Err(LinkError::BadPing);
                };
                self.write(Frame::new(Kind::Pong, 0, &ping)).await?;
            }
            Kind::Pong => {
                if frame.body::<Ping>().is_err() {
                    return Err(LinkError::BadPong);
                }
            }
            Kind::QuitRequest => {
                debug!("worker asks to retire");
                self.pool.quit_requested(self.slot, self.generation);
            }
            _ => return Err(LinkError::UnexpectedKind),
        }
        Ok(())
    }

    /// Sends `job` to the worker. Ok(false): the job needed no worker after all
    /// (cancelled, its client gone, or the dispatcher aborting) and was answered.
    pub(super) async fn start(&mut self, current: &mut Option<Current>, job: Job) -> Result<bool, LinkError> {
        let Some(job) = self.skip(job) else { return Ok(false) };
        if job.opens.is_some() {
            self.pin(job).await?;
            return Ok(true);
        }
        let wstream = self.next_wstream();
        let job = self.write_request(job, wstream).await?;
        self.head_ws = Some(wstream);
        self.env.metrics.pipeline.depth.observe(1.0);
        *current = Some(self.become_current(job, wstream, false));
        Ok(true)
    }

    /// The job, unless it needs no worker after all (cancelled, its client gone, or the
    /// dispatcher aborting): then it is answered.
    pub(super) fn skip(&self, job: Job) -> Option<Job> {
        let env = &self.env;
        if job.guard.shared().closed.load(std::sync::atomic::Ordering::Relaxed) {
            env.metrics.outcome("cancelled");
            drop(job); // nobody to answer; the guard closes the stream
            return None;
        }
        let skip = if job.cancel.is_cancelled() {
            Some((
                "cancelled",
                ErrorCode::Cancelled,
                "cancelled while waiting for a worker",
            ))
        } else if env.abort.is_cancelled() {
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
                fail_later(vec![job], env.metrics.clone(), outcome, code, msg);
                None
            }
            None => Some(job),
        }
    }

    pub(super) fn next_wstream(&mut self) -> u32 {
        self.last_wstream = self.last_wstream.checked_add(1).unwrap_or(1);
        self.last_wstream
    }

    /// Queues the job's REQUEST for the worker on `wstream`; [`Relay::top_up`] writes it
    /// with the ones it adds behind, in one write, so that the worker reads them together
    /// (and may pipeline them). On a failure the job is given back (it never ran) and the
    /// link ends.
    pub(super) async fn write_request(&mut self, job: Job, wstream: u32) -> Result<Job, LinkError> {
        let frame = job.frame.clone().with_stream(wstream);
        // Bounded by the worker's liveness, not by the request's deadline: a large
        // REQUEST with a short timeout is a timeout (handled by the loop), not a
        // dead worker.
        let sent = timeout(self.env.bounds.keepalive_timeout, self.writer.feed(frame)).await;
        if !matches!(sent, Ok(Ok(()))) {
            // It may be mid-way into the socket, but a worker reads a REQUEST
            // whole before it acts: the link closes now, so it never ran.
            give_back(&self.env, &self.pool, job);
            return Err(match sent {
                Err(_) => LinkError::NotReading,
                // The worker closed its end: it is exiting; let it (exit status kept).
                Ok(_) => LinkError::WorkerClosed,
            });
        }
        Ok(job)
    }

    /// The job, written to the worker already, is the worker's current request from now:
    /// its deadline counts from here. A `reclaimed` one is known to have reached the
    /// database only once the worker sends anything but "never ran" for it.
    pub(super) fn become_current(&self, job: Job, wstream: u32, reclaimed: bool) -> Current {
        let env = &self.env;
        let queue_time = job.received.elapsed();
        env.metrics.queue_wait.observe(queue_time.as_secs_f64());
        let limit = job
            .timeout
            .unwrap_or_else(|| env.bounds.request_timeout)
            .min(env.bounds.request_timeout);
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
            client_waits: self.client_waits,
            digest: job.digest,
            request: job.frame,
            multi_results: job.multi_results,
            raw_rows: job.raw_rows,
        }
    }

    /// After the current request ended (`held`: how long the worker ran it, if it did):
    /// the next one written to the worker becomes current, or else the pool's next job,
    /// idle, or QUIT_NOW. Ok(true): QUIT_NOW sent.
    pub(super) async fn next(
        &mut self,
        current: &mut Option<Current>,
        drain: &mut Option<Draining>,
        held: Held,
    ) -> Result<bool, LinkError> {
        let Some(a) = self.ahead.pop_front() else {
            return self.advance(current, held).await;
        };
        let keep = self.pool.promote(self.slot, self.generation, held);
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

    /// After a request: the next queued job, idle, or QUIT_NOW. Ok(true): QUIT_NOW sent.
    pub(super) async fn advance(&mut self, current: &mut Option<Current>, mut held: Held) -> Result<bool, LinkError> {
        if self.pinned.is_some() {
            // The session's next statement comes from its own queue.
            return Ok(false);
        }
        loop {
            match self.pool.next_job(self.slot, self.generation, held) {
                Next::Job(job) => {
                    if self.start(current, job).await? {
                        self.top_up(current).await?;
                        return Ok(false);
                    }
                    held = Held::NotRun;
                }
                Next::Idle => return Ok(false),
                Next::Quit => {
                    self.write(Frame::new(Kind::QuitNow, 0, &QuitNow {})).await?;
                    return Ok(true);
                }
                Next::Gone => return Err(LinkError::SlotTaken),
            }
        }
    }

    /// Relays END (with the time the request waited) and accounts for the request.
    /// Ok((fatal, held)): whether the worker is exiting (fatal database error), and how
    /// long the request held it.
    pub(super) async fn finish(&mut self, mut cur: Current, frame: Frame) -> Result<(bool, Held), LinkError> {
        let (frame, end) = with_queue_time(frame, cur.queue_time);
        let ran = end.as_ref().map(|e| Duration::from_micros(e.server_time_us));
        self.session_statement_ended(end.as_ref(), cur.fatal);
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
        let env = &self.env;
        let seconds = cur.received.elapsed().as_secs_f64();
        let outcome = match (cur.stalled, cur.cancel_sent, cur.errored) {
            (true, _, _) => "slow_consumer",
            (false, true, _) => "cancelled",
            (false, false, true) => "error",
            (false, false, false) => "ok",
        };
        env.metrics.latency.observe(seconds);
        env.metrics.outcome(outcome);
        self.traffic.ended(outcome, seconds);
        relayed?;
        // The worker's measure, unless the worker was held for more than its statement:
        // its frames waited for the client, or it failed or was stopped (END after an
        // ERROR carries no time). Then the wall clock since it became current.
        let plain = !(cur.errored || cur.cancel_sent || cur.stalled || cur.data_dropped)
            && self.client_waits == cur.client_waits;
        let held = match ran {
            Some(ran) if plain => Held::Ran(ran),
            _ => Held::SinceStart,
        };
        Ok((cur.fatal, held))
    }

    /// Accounts the execution with the policy (statistics, slow accounting, slow log).
    /// Never waits; the statement text and the member are looked up only for a slow one.
    pub(super) fn record(&self, cur: &Current, digest: &osprey_sql::Digest, end: &End) {
        let policy = &self.env.policy;
        let server_time = Duration::from_micros(end.server_time_us);
        let kind = crate::policy::StatementKind::guess(digest);
        let (sql, member, client);
        if policy.intercept.is_slow(server_time) {
            sql = osprey_protocol::Request::from_frame(&cur.request)
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
}

//! Requests written to the worker behind the one it runs (`pool.pipeline_depth`): adding
//! them, taking them back when they would wait behind a slow one, cancelling one, and
//! settling them when the worker is lost.

use osprey_protocol::{Cancel, ErrorBody, ErrorCode, Frame, Kind, Origin};
use tokio::time::Instant as TokioInstant;
use tracing::debug;

use crate::pool::stash::next_frame;
use crate::request::streams::StreamGuard;

use super::*;

impl Relay {
    /// The worker is given up with requests written behind its current one (`head`, its
    /// stream id). It takes them in order and starts one only after the `END` of the one
    /// before has left it, so what it started shows in what it wrote before it died: that
    /// is read now (not relayed: the link is given up), for at most [`SETTLE_AFTER_KILL`].
    /// A request it ended is lost (dispatched) unless it answered it as never run, which is
    /// queued again; the first it did not end may have started (lost); those behind it
    /// stay in `self.ahead` (never ran). Returns the guards to answer as lost.
    pub(super) async fn settle_ahead(&mut self, head: Option<u32>, current: &mut Option<Current>) -> Vec<StreamGuard> {
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
                                self.env.metrics.pipeline.reclaimed.inc();
                                give_back_counted(&self.env, &self.pool, job, false);
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
    pub(super) fn out_of_turn(&mut self, frame: Frame) -> Result<(), LinkError> {
        let Some(i) = self.ahead.iter().position(|a| a.wstream == frame.stream) else {
            return Err(LinkError::WrongStream);
        };
        let a = &mut self.ahead[i];
        if frame.kind == Kind::Started {
            a.started = true;
            self.env.metrics.pipeline.started.inc();
            return Ok(());
        }
        if matches!(a.state, AheadState::Waiting(..)) || a.started {
            return Err(LinkError::OutOfTurn);
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
                        self.env.metrics.pipeline.reclaimed.inc();
                        give_back_counted(&self.env, &self.pool, job, false);
                    }
                    self.pool.unprefetch_at(self.slot, self.generation, i);
                }
                Ok(())
            }
            _ => Err(LinkError::OutOfTurn),
        }
    }

    /// Prefetch: while requests wait, writes the next ones to the worker behind its
    /// current request, up to `pool.pipeline_depth` in all, so that it finds them in its
    /// socket when it ends the one it runs. Nothing goes behind a request that is being
    /// cancelled, has run for `pool.pipeline_hold_ms`, or whose digest ran slow lately,
    /// nor behind one taken back.
    /// Ends with the flush of everything queued for the worker (the current request's
    /// REQUEST included).
    pub(super) async fn top_up(&mut self, current: &Option<Current>) -> Result<(), LinkError> {
        let added = self.add_behind(current).await;
        // A failure here leaves requests half written: the link ends, and what the worker
        // may have read is settled as for any lost worker.
        self.flush_soon().await?;
        added
    }

    /// Whether the worker's next frame is at hand without a read (stashed, or buffered
    /// whole).
    pub(super) fn frame_at_hand(&self) -> bool {
        !self.stash.is_empty() || self.frame_buffered()
    }

    /// Whether the worker's next frame is read whole already (decoded without a read).
    pub(super) fn frame_buffered(&self) -> bool {
        osprey_protocol::frame_buffered(self.reader.read_buffer())
    }

    /// Flushes what is queued for the worker now, or, while its next frame is at hand,
    /// once the relay has acted on the frames at hand (before the serving loop or a wait
    /// on a client blocks): the requests written at several ENDs the worker sent together
    /// then reach it in one write. A worker never waits for it: it has sent those frames
    /// already and is not idle until it reads the requests.
    pub(super) async fn flush_soon(&mut self) -> Result<(), LinkError> {
        if self.frame_at_hand() {
            self.unflushed = true;
            return Ok(());
        }
        self.flush().await
    }

    pub(super) async fn add_behind(&mut self, current: &Option<Current>) -> Result<(), LinkError> {
        let Some(cur) = current else { return Ok(()) };
        // A pinned worker runs its session's statements only, one at a time.
        if self.depth <= 1
            || self.pinned.is_some()
            || cur.cancel_sent
            || cur.reclaimed
            || cur.started.elapsed() >= self.hold
        {
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
            let metrics = &self.env.metrics.pipeline;
            metrics.prefetched.inc();
            metrics.depth.observe((1 + self.ahead.len()) as f64);
        }
        Ok(())
    }

    /// Whether a statement with this digest ran over the slow threshold lately: it may
    /// run long again, so nothing is written behind it.
    pub(super) fn known_slow(&self, digest: Option<&osprey_sql::Digest>) -> bool {
        digest.is_some_and(|d| self.env.policy.intercept.ran_slow_lately(d.hash))
    }

    pub(super) fn has_waiting(&self) -> bool {
        self.ahead
            .iter()
            .any(|a| !a.started && matches!(a.state, AheadState::Waiting(..)))
    }

    /// Takes back every request waiting behind the current one (`CANCEL reclaim`): the
    /// worker answers those it has not started as never run, and they are queued again.
    pub(super) async fn reclaim_all(&mut self) -> Result<(), LinkError> {
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
    pub(super) async fn cancel_ahead(&mut self, i: usize) -> Result<(), LinkError> {
        let Some(a) = self.ahead.get_mut(i) else { return Ok(()) };
        let AheadState::Waiting(job, _) = std::mem::replace(&mut a.state, AheadState::Answered { conn: 0, stream: 0 })
        else {
            return Ok(());
        };
        let (conn, stream) = (job.conn(), job.stream());
        a.state = AheadState::Answered { conn, stream };
        let wstream = a.wstream;
        self.env.metrics.outcome("cancelled");
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
}

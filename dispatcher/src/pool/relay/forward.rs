//! Response frames to a client: straight into its write queue while it has credit; for
//! a slow client the relay waits (bounded by `client_write_timeout`), meanwhile reading
//! the worker's next frames into the stash and answering its PINGs.

use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use osprey_protocol::{ErrorBody, ErrorCode, Frame, Kind, Origin};
use tokio::time::{sleep_until, Instant as TokioInstant};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::request::streams::StreamGuard;

use super::*;

impl Relay {
    /// Puts a response frame into the client's write queue. While a slow client
    /// keeps that queue full the worker's frames wait in its socket, so the
    /// link is kept alive meanwhile (PINGs out, the worker's silence not
    /// counted). A frame in hand is always delivered: if the link fails
    /// meanwhile, that is reported after. Ok(false): the client is gone.
    pub(super) async fn forward(&mut self, guard: &mut StreamGuard, frame: Frame) -> Result<bool, LinkError> {
        let forward = guard.forward(frame);
        tokio::pin!(forward);
        if let Poll::Ready(alive) = futures::poll!(&mut forward) {
            return Ok(alive);
        }
        self.client_waits += 1;
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
    pub(super) async fn forward_data(&mut self, cur: &mut Current, frame: Frame) -> Result<(), LinkError> {
        let deadline = cur.deadline;
        let credit = match cur.guard.credit() {
            None => None,
            Some(credit) => match credit.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let stall = Some(self.env.bounds.client_write_timeout);
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
    pub(super) async fn wait<T>(
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
        self.client_waits += 1;
        if self.unflushed {
            // The worker must not wait on the client with us.
            self.flush().await.map_err(GiveUp::Link)?;
        }
        let env = self.env.clone();
        let expired = sleep_until(deadline);
        let stalled = sleep_until(TokioInstant::now() + stall.unwrap_or(Duration::from_secs(86_400 * 365)));
        tokio::pin!(expired, stalled);
        let give_back_at = later(TokioInstant::now(), self.hold);
        let result = loop {
            tokio::select! {
                biased;
                v = &mut work => break Ok(v),
                _ = &mut expired => break Err(GiveUp::Stopped),
                _ = env.abort.cancelled() => break Err(GiveUp::Stopped),
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
    pub(super) async fn side_work(&mut self, give_back_at: TokioInstant) -> Result<(), LinkError> {
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
                    None => Err(LinkError::WorkerClosed),
                    Some(Err(e)) => {
                        warn!("bad frame from worker: {e}");
                        Err(LinkError::BadFrame)
                    }
                }
            }
        }
    }

    /// The client is gone: stop the statement, keep draining to END.
    pub(super) async fn client_gone(&mut self, cur: &mut Current) -> Result<(), LinkError> {
        cur.client_alive = false;
        self.send_cancel(cur).await
    }

    /// A data frame was given up (see [`GiveUp`]).
    pub(super) async fn give_up(&mut self, cur: &mut Current, why: GiveUp) -> Result<(), LinkError> {
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
}

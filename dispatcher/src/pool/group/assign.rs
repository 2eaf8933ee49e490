//! Assignment: a request goes to an idle worker or waits in the group's wait queue
//! (`wait_queue.rs`); a link that finished takes the next job itself; prefetch and
//! take-back for pipelining; hold and unavailable; the queue reaper.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use osprey_protocol::ErrorCode;
use tokio::sync::watch;

use crate::pool::wait_queue::{Full, Held, Holder, QueueLimits};
use crate::request::job::{fail_later, Job};

use super::*;

impl SlotGroup {
    /// Stops dispatching (requests wait, bounded by their queue deadline); in-flight
    /// requests finish. `why` shows in status.
    pub fn hold(&self, why: String) {
        let mut g = self.lock();
        g.hold = Some(why);
        g.unavailable = None;
        drop(g);
        self.hold_tx.send_modify(|n| *n += 1);
    }

    /// Changes when the group stops dispatching ([`SlotGroup::hold`], unavailable).
    pub fn hold_changes(&self) -> watch::Receiver<u64> {
        self.hold_tx.subscribe()
    }

    /// Fails waiting and new requests at once (`BACKEND_UNAVAILABLE`, not dispatched)
    /// until a target is set again. A read group with a fallback hands its waiting
    /// requests to it instead (they never reached a worker).
    pub fn set_unavailable(&self, why: String) {
        let mut g = self.lock();
        if g.unavailable.as_deref() == Some(why.as_str()) && g.queue.is_empty() {
            return;
        }
        g.hold = Some(why.clone());
        let waiting: Vec<Job> = g.queue.drain();
        self.set_depth(&g);
        g.unavailable = Some(why.clone());
        drop(g);
        self.hold_tx.send_modify(|n| *n += 1);
        let waiting = match self.fallback() {
            Some(fallback) => waiting
                .into_iter()
                .filter_map(|job| fallback.requeue(job).err().map(|(job, _)| job))
                .collect(),
            None => waiting,
        };
        let why = format!("cluster {}: {why}", self.cluster);
        fail_later(
            waiting,
            self.metrics.clone(),
            "unavailable",
            ErrorCode::BackendUnavailable,
            why,
        );
    }

    /// Follows the number of requests running on this group's workers.
    pub fn busy_watch(&self) -> watch::Receiver<usize> {
        self.busy_tx.subscribe()
    }

    /// Requests running on this group's workers now.
    pub fn busy_count(&self) -> usize {
        self.lock()
            .slots
            .values()
            .filter(|s| s.state == SlotState::Busy)
            .count()
    }

    /// Whether requests are handed to workers now (a target and no hold).
    pub fn is_dispatching(&self) -> bool {
        SlotGroup::dispatching(&self.lock())
    }

    pub(super) fn dispatching(g: &Inner) -> bool {
        g.hold.is_none() && g.target.is_some()
    }

    /// A client connection authenticated with the client token of index `tenant`
    /// (`auth.client_tokens`): its requests count against that token's turn and cap.
    /// It is forgotten by [`SlotGroup::take_waiting_conn`] when it closes.
    pub fn open_conn(&self, conn: u64, tenant: u32) {
        self.lock().queue.register(conn, tenant);
    }

    /// The tenant of connection `conn` (0 if it never registered).
    pub fn tenant_of(&self, conn: u64) -> u32 {
        self.lock().queue.tenant_of(conn)
    }

    /// New wait-queue bounds and caps (SIGHUP).
    pub fn set_limits(self: &Arc<Self>, limits: QueueLimits) {
        let mut g = self.lock();
        let size = g.target_size;
        g.queue.set_limits(limits, size);
        self.pump(&mut g);
    }

    /// Hands a job to an idle worker (LIFO) if its connection may have one more,
    /// else queues it behind the connection's earlier jobs (bounded).
    /// Err gives the job back with the reason it cannot be served (by value:
    /// boxing it would cost an allocation on every request's path).
    #[allow(clippy::result_large_err)]
    pub fn submit(self: &Arc<Self>, job: Job) -> Result<(), (Job, SubmitError)> {
        let mut g = self.lock();
        if g.shutting_down {
            return Err((job, SubmitError::ShuttingDown));
        }
        if g.unavailable.is_some() {
            return Err((job, SubmitError::Unavailable));
        }
        // Saturated (no idle worker) is the hot path here: straight to the queue.
        let runnable = if g.idle.is_empty() || !SlotGroup::dispatching(&g) {
            None
        } else {
            g.queue.may_run_now(job.conn())
        };
        let job = match runnable {
            Some(holder) => match self.to_idle_worker(&mut g, job, holder) {
                Ok(()) => {
                    g.queue.charge(holder);
                    return Ok(());
                }
                Err(job) => job,
            },
            _ => job,
        };
        let was_empty = g.queue.next_deadline().is_none();
        if let Err((job, full)) = g.queue.push_back(job) {
            let e = match full {
                Full::Queue => SubmitError::QueueFull,
                Full::Connection => SubmitError::ConnectionQueueFull,
            };
            return Err((job, e));
        }
        self.set_depth(&g);
        if was_empty {
            self.reaper.notify_one();
        }
        Ok(())
    }

    /// Why requests fail at once, if they do.
    pub fn unavailable_reason(&self) -> Option<String> {
        self.lock().unavailable.clone()
    }

    /// A link could not deliver `job` (its worker vanished first): another worker
    /// gets it, ahead of its connection's later jobs since it was admitted earlier.
    #[allow(clippy::result_large_err)]
    pub fn requeue(self: &Arc<Self>, job: Job) -> Result<(), (Job, SubmitError)> {
        let mut g = self.lock();
        if g.shutting_down {
            return Err((job, SubmitError::ShuttingDown));
        }
        // Under the lock: a CANCEL (or close) marks the job before it looks for it
        // in the queue, so a job it could not find yet is caught here.
        if job.cancel.is_cancelled() || job.guard.shared().closed.load(Ordering::Relaxed) {
            return Err((job, SubmitError::Cancelled));
        }
        // It never reached a worker: it fails as every waiting request did, or (a read
        // group) moves on to the fallback.
        if g.unavailable.is_some() {
            drop(g);
            return match self.fallback() {
                Some(fallback) => fallback.requeue(job),
                None => Err((job, SubmitError::Unavailable)),
            };
        }
        g.queue.push_front(job);
        self.set_depth(&g);
        self.pump(&mut g);
        self.reaper.notify_one();
        Ok(())
    }

    // The Err hands the job back to be queued: boxing it would cost an allocation for
    // every request that waits for a worker, to shorten a move.
    #[allow(clippy::result_large_err)]
    pub(super) fn to_idle_worker(&self, g: &mut Inner, mut job: Job, holder: Holder) -> Result<(), Job> {
        while let Some((index, generation)) = g.idle.pop() {
            let Some(slot) = g.slots.get_mut(&index) else { continue };
            if slot.generation != generation || slot.state != SlotState::Idle {
                continue;
            }
            let Some(link) = &slot.link else { continue };
            match link.jobs.try_send(job) {
                Ok(()) => {
                    slot.state = SlotState::Busy;
                    slot.holder = Some(holder);
                    self.publish_states(g);
                    return Ok(());
                }
                // The link task is gone; its `link_lost` will clean up the slot.
                Err(e) => job = e.into_inner(),
            }
        }
        Err(job)
    }

    /// Hands waiting jobs that may be served to idle workers, after something let a
    /// connection or token have one more worker (the pool's invariant).
    pub(super) fn pump(&self, g: &mut Inner) {
        if g.idle.is_empty() || !g.queue.servable() || !SlotGroup::dispatching(g) {
            return;
        }
        while !g.idle.is_empty() {
            let Some((job, holder)) = g.queue.pick() else { break };
            if let Err(job) = self.to_idle_worker(g, job, holder) {
                g.queue.unpick(job, holder);
                break;
            }
        }
        self.set_depth(g);
    }

    /// The worker of a slot is free or gone: its holder may have another one.
    pub(super) fn release_slot(&self, g: &mut Inner, index: u32) {
        let Some(slot) = g.slots.get_mut(&index) else {
            return;
        };
        let ahead = slot.ahead.len();
        // The current request ran until now; those written behind it are taken as never
        // run (their connections' last judgement stands).
        let current = slot.holder.take().map(|h| (h, Held::SinceStart));
        let held: Vec<(Holder, Held)> = current
            .into_iter()
            .chain(slot.ahead.drain(..).map(|h| (h, Held::NotRun)))
            .collect();
        g.ahead = g.ahead.saturating_sub(ahead);
        self.metrics.pipeline.ahead.dec_by(ahead as i64);
        let mut servable = false;
        for (h, how) in held {
            servable |= g.queue.release(h, how);
        }
        if servable {
            self.pump(g);
        }
    }

    /// The worker of `index` finished a request, having held it as `held` says, or
    /// skipped one ([`Held::NotRun`]); what next.
    pub fn next_job(self: &Arc<Self>, index: u32, generation: u64, held: Held) -> Next {
        let mut g = self.lock();
        let Some(slot) = g.linked(index, generation) else {
            return Next::Gone;
        };
        if held != Held::NotRun {
            slot.requests += 1;
        }
        let holder = slot.holder.take();
        debug_assert!(slot.ahead.is_empty(), "next_job with jobs ahead");
        if let Some(h) = holder {
            g.queue.release(h, held);
        }
        let next = self.next_for(&mut g, index);
        // A job its holder may now run can wait only if this worker did not take it.
        if holder.is_some() {
            self.pump(&mut g);
        }
        next
    }

    /// Prefetch: one more waiting job for the busy worker of `index`, to be written to
    /// it behind the one it runs (`pool.pipeline_depth`). None when nothing may be served
    /// now, or when the worker must not take more (it is to retire, or serves an old
    /// target: what it has is all it gets).
    pub fn prefetch(self: &Arc<Self>, index: u32, generation: u64) -> Option<Job> {
        let mut g = self.lock();
        if g.queue.is_empty() || g.shutting_down || !SlotGroup::dispatching(&g) {
            return None;
        }
        let current = g.target.as_ref().map(|t| t.epoch);
        let slot = g.linked(index, generation)?;
        if slot.state != SlotState::Busy
            || slot.quit_pending
            || slot.retiring
            || slot.target.as_ref().map(|t| t.epoch) != current
        {
            return None;
        }
        // Nothing behind a request of a connection that was heavy lately while others
        // wait: it may run long, and what waited behind it could not be taken back once
        // the worker had sent it to its database (STARTED).
        if slot.holder.is_some_and(|h| g.queue.holds_back(h.conn)) {
            return None;
        }
        let (job, holder) = g.queue.pick_light()?;
        if let Some(slot) = g.slots.get_mut(&index) {
            slot.ahead.push_back(holder);
        }
        g.ahead += 1;
        self.metrics.pipeline.ahead.inc();
        self.set_depth(&g);
        Some(job)
    }

    /// Whether the worker of `index` no longer serves what the group serves now: re-targeted
    /// (failover, switchover), retiring, or gone. A pinned session ends on it rather than
    /// run on at the member it no longer belongs to.
    pub fn slot_stale(&self, index: u32, generation: u64) -> bool {
        let mut g = self.lock();
        let current = g.target.as_ref().map(|t| t.epoch);
        match g.linked(index, generation) {
            Some(slot) => slot.retiring || slot.target.as_ref().map(|t| t.epoch) != current,
            None => true,
        }
    }

    /// The worker of `index` ended its request, having held it as `held` says, or
    /// answered one it never ran ([`Held::NotRun`]), and has more written to it: the
    /// first of those is its request now.
    /// False: what is still behind it must be taken back (it serves an old target, is to retire, or the group stopped dispatching: held, unavailable, shutting down).
    pub fn promote(self: &Arc<Self>, index: u32, generation: u64, held: Held) -> bool {
        let mut g = self.lock();
        let current = g.target.as_ref().map(|t| t.epoch);
        let dispatching = SlotGroup::dispatching(&g) && !g.shutting_down;
        let Some(slot) = g.linked(index, generation) else {
            return false;
        };
        let keep = dispatching && !slot.retiring && slot.target.as_ref().map(|t| t.epoch) == current;
        if held != Held::NotRun {
            slot.requests += 1;
        }
        // The next one's hold starts now, not when it was written behind this one.
        let next = slot.ahead.pop_front().map(|h| Holder {
            since: Instant::now(),
            ..h
        });
        let done = std::mem::replace(&mut slot.holder, next);
        let moved = slot.holder.is_some();
        if moved {
            g.ahead = g.ahead.saturating_sub(1);
            self.metrics.pipeline.ahead.dec();
        }
        if let Some(h) = done {
            if g.queue.release(h, held) {
                self.pump(&mut g);
            }
        }
        keep
    }

    /// Undoes a [`SlotGroup::prefetch`] whose job needed no worker after all (cancelled
    /// meanwhile): its holder may have another.
    pub fn unprefetch(self: &Arc<Self>, index: u32, generation: u64) {
        let at = self
            .lock()
            .slots
            .get(&index)
            .map_or(0, |s| s.ahead.len().saturating_sub(1));
        self.unprefetch_at(index, generation, at);
    }

    /// The job `at` places behind the current one of `index` left the worker without
    /// running (taken back): its holder may have another.
    pub fn unprefetch_at(self: &Arc<Self>, index: u32, generation: u64, at: usize) {
        let mut g = self.lock();
        let Some(holder) = g.linked(index, generation).and_then(|s| s.ahead.remove(at)) else {
            return;
        };
        g.ahead = g.ahead.saturating_sub(1);
        self.metrics.pipeline.ahead.dec();
        if g.queue.release(holder, Held::NotRun) {
            self.pump(&mut g);
        }
    }

    /// Puts a newly ready worker to use (see [`SlotGroup::next_for`]).
    pub(super) fn make_available(self: &Arc<Self>, g: &mut Inner, index: u32) {
        let Some(link) = g.slots.get(&index).and_then(|s| s.link.clone()) else {
            return;
        };
        match self.next_for(g, index) {
            Next::Quit => link.quit.cancel(),
            Next::Job(job) => {
                if let Err(e) = link.jobs.try_send(job) {
                    // The link is gone already (its loss resets the slot): the job keeps its place.
                    if let Some(h) = g.slots.get_mut(&index).and_then(|s| s.holder.take()) {
                        g.queue.unpick(e.into_inner(), h);
                    }
                    self.set_depth(g);
                }
            }
            Next::Idle | Next::Gone => {}
        }
    }

    /// The next step of a ready worker, after registering or after a request:
    /// retire, the next waiting job in turn, or the idle stack. Sets the slot's state.
    pub(super) fn next_for(self: &Arc<Self>, g: &mut Inner, index: u32) -> Next {
        let shutting_down = g.shutting_down;
        let current = g.target.as_ref().map(|t| t.epoch);
        let dispatching = SlotGroup::dispatching(g);
        let Some(slot) = g.slots.get_mut(&index) else {
            return Next::Gone;
        };
        let (generation, before) = (slot.generation, slot.state);
        let stale = slot.target.as_ref().map(|t| t.epoch) != current;
        let next = if slot.quit_pending || slot.retiring || shutting_down || stale {
            slot.state = SlotState::Quitting;
            slot.quit_pending = false;
            self.arm_quit_deadline(index, generation);
            Next::Quit
        } else if let Some((job, holder)) = dispatching.then(|| g.queue.pick()).flatten() {
            slot.state = SlotState::Busy;
            slot.holder = Some(holder);
            self.set_depth(g);
            Next::Job(job)
        } else {
            slot.state = SlotState::Idle;
            g.idle.push((index, generation));
            Next::Idle
        };
        // Busy -> busy (the next queued job) is the saturated hot path: no gauges to move.
        if g.slots.get(&index).is_some_and(|s| s.state != before) {
            self.publish_states(g);
        }
        next
    }

    /// Takes a job that is still waiting (the client cancelled it).
    pub fn take_waiting(&self, conn: u64, stream: u32) -> Option<Job> {
        let mut g = self.lock();
        let job = g.queue.take(conn, stream);
        self.set_depth(&g);
        job
    }

    /// Takes every waiting job of a connection that closed, and forgets the connection.
    pub fn take_waiting_conn(&self, conn: u64) -> Vec<Job> {
        let mut g = self.lock();
        let jobs = g.queue.take_conn(conn);
        if !jobs.is_empty() {
            self.set_depth(&g);
        }
        jobs
    }

    /// Fails waiting jobs whose queue deadline passed, for as long as the pool lives.
    pub async fn run_reaper(self: Arc<Self>) {
        loop {
            let (expired, next) = {
                let mut g = self.lock();
                let expired = g.queue.expire(Instant::now());
                if !expired.is_empty() {
                    self.set_depth(&g);
                }
                (expired, g.queue.next_deadline())
            };
            fail_later(
                expired,
                self.metrics.clone(),
                "queue_timeout",
                ErrorCode::QueueTimeout,
                "no worker became free within queue_timeout",
            );
            match next {
                Some(deadline) => {
                    let deadline = deadline.max(Instant::now() + REAPER_GRAIN);
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline.into()) => {}
                        _ = self.reaper.notified() => {}
                    }
                }
                None => self.reaper.notified().await,
            }
        }
    }

    pub fn queue_depth(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn idle_count(&self) -> usize {
        self.lock()
            .slots
            .values()
            .filter(|s| s.state == SlotState::Idle)
            .count()
    }
}

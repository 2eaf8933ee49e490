//! The slot table and worker assignment: which slot is starting, idle, busy or
//! quitting, the LIFO stack of idle workers and the bounded FIFO of requests
//! waiting for one. The pool is the single owner of this state; the supervisor
//! (processes) and the worker links (sockets) report to it.
//!
//! Requests are pushed to workers, not pulled by tasks: `submit` hands a job to
//! an idle worker's link or queues it, and a link that finished a request takes
//! the next queued job itself (`next_job`), in the same wake-up.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use osprey_protocol::ErrorCode;
use serde::Serialize;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::job::{fail_later, Job};
use crate::metrics::Metrics;

/// A worker that closed its link gets this long to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// A worker told to quit (QUIT_NOW) that has not exited by then is killed.
const QUIT_DEADLINE: Duration = Duration::from_secs(10);
/// Jobs a link's channel holds. Only an idle link is sent a job, so one is
/// enough; the spare absorbs nothing but keeps `try_send` from ever failing
/// for a live link.
pub const LINK_JOBS: usize = 2;

/// How the pool reaches one registered worker's link task.
#[derive(Clone, Debug)]
pub struct WorkerLink {
    /// Jobs for the worker; sent only while the slot is idle.
    pub jobs: mpsc::Sender<Job>,
    /// Cancelled when the (idle) worker must retire: the link sends QUIT_NOW.
    pub quit: CancellationToken,
}

/// What a link does after its worker finished a request.
pub enum Next {
    /// Serve this queued job (the slot stays busy).
    Job(Job),
    /// Nothing waiting: the slot is idle.
    Idle,
    /// The worker must retire: send QUIT_NOW.
    Quit,
    /// The slot no longer belongs to this link (killed or exited).
    Gone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Process spawned (or about to be); not registered and ready yet.
    Starting,
    Idle,
    Busy,
    /// QUIT_NOW sent; waiting for the process to exit.
    Quitting,
}

#[derive(Debug)]
struct Slot {
    generation: u64,
    state: SlotState,
    pid: Option<u32>,
    link: Option<WorkerLink>,
    db_connection_id: Option<u32>,
    requests: u64,
    started: Instant,
    /// The worker asked to retire while busy: QUIT_NOW right after its response.
    quit_pending: bool,
    /// The slot is being removed (pool shrink or shutdown): no respawn.
    retiring: bool,
    kill: mpsc::UnboundedSender<&'static str>,
}

/// Why a request was not accepted for a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull,
    ShuttingDown,
    /// (requeue) The client cancelled the request or closed its connection.
    Cancelled,
}

struct Inner {
    slots: BTreeMap<u32, Slot>,
    /// Idle slots, most recently used last (LIFO keeps sessions and caches warm).
    idle: Vec<(u32, u64)>,
    /// Jobs waiting for a worker, oldest first.
    waiting: VecDeque<Job>,
    queue_capacity: usize,
    target_size: usize,
    shutting_down: bool,
    next_generation: u64,
}

impl Inner {
    /// Slot `index` if it still holds the link of `generation`.
    fn linked(&mut self, index: u32, generation: u64) -> Option<&mut Slot> {
        self.slots
            .get_mut(&index)
            .filter(|s| s.generation == generation && s.link.is_some())
    }
}

/// Public view of one slot, for the admin API.
#[derive(Debug, Clone, Serialize)]
pub struct SlotView {
    pub slot: u32,
    pub pid: Option<u32>,
    pub state: SlotState,
    pub requests: u64,
    pub age_s: f64,
    pub backend: String,
    pub db_connection_id: Option<u32>,
    pub retiring: bool,
}

/// Pool-wide figures, for the admin API.
#[derive(Debug, Clone, Serialize)]
pub struct PoolView {
    pub size: usize,
    pub slots: usize,
    pub idle: usize,
    pub busy: usize,
    pub starting: usize,
    pub quitting: usize,
    pub queue_depth: usize,
    pub queue_capacity: usize,
    pub respawns: u64,
    pub recycles: u64,
    pub fatal_exits: u64,
}

pub struct Pool {
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
    backend_name: String,
    /// Wakes the queue reaper when the wait queue stops being empty.
    reaper: Notify,
}

impl Pool {
    pub fn new(target_size: usize, queue_capacity: usize, backend_name: String, metrics: Arc<Metrics>) -> Arc<Pool> {
        Arc::new(Pool {
            inner: Mutex::new(Inner {
                slots: BTreeMap::new(),
                idle: Vec::new(),
                waiting: VecDeque::new(),
                queue_capacity,
                target_size,
                shutting_down: false,
                next_generation: 1,
            }),
            metrics,
            backend_name,
            reaper: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands a job to an idle worker (LIFO), else queues it (bounded FIFO).
    /// Err gives the job back with the reason it cannot be served (by value:
    /// boxing it would cost an allocation on every request's path).
    #[allow(clippy::result_large_err)]
    pub fn submit(self: &Arc<Self>, job: Job) -> Result<(), (Job, SubmitError)> {
        let mut g = self.lock();
        if g.shutting_down {
            return Err((job, SubmitError::ShuttingDown));
        }
        let job = match self.to_idle_worker(&mut g, job) {
            Ok(()) => return Ok(()),
            Err(job) => job,
        };
        if g.waiting.len() >= g.queue_capacity {
            return Err((job, SubmitError::QueueFull));
        }
        g.waiting.push_back(job);
        self.metrics.queue_depth.set(g.waiting.len() as i64);
        if g.waiting.len() == 1 {
            self.reaper.notify_one();
        }
        Ok(())
    }

    /// A link could not deliver `job` (its worker vanished first): another worker
    /// gets it, ahead of the queue since it was admitted earlier.
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
        if let Err(job) = self.to_idle_worker(&mut g, job) {
            g.waiting.push_front(job);
            self.metrics.queue_depth.set(g.waiting.len() as i64);
            self.reaper.notify_one();
        }
        Ok(())
    }

    // The Err hands the job back to be queued: boxing it would cost an allocation for
    // every request that waits for a worker, to shorten a move.
    #[allow(clippy::result_large_err)]
    fn to_idle_worker(&self, g: &mut Inner, mut job: Job) -> Result<(), Job> {
        while let Some((index, generation)) = g.idle.pop() {
            let Some(slot) = g.slots.get_mut(&index) else { continue };
            if slot.generation != generation || slot.state != SlotState::Idle {
                continue;
            }
            let Some(link) = &slot.link else { continue };
            match link.jobs.try_send(job) {
                Ok(()) => {
                    slot.state = SlotState::Busy;
                    self.publish_states(g);
                    return Ok(());
                }
                // The link task is gone; its `link_lost` will clean up the slot.
                Err(e) => job = e.into_inner(),
            }
        }
        Err(job)
    }

    /// The worker of `index` finished a request (`served`) or skipped one; what next.
    pub fn next_job(self: &Arc<Self>, index: u32, generation: u64, served: bool) -> Next {
        let mut g = self.lock();
        let Some(slot) = g.linked(index, generation) else {
            return Next::Gone;
        };
        if served {
            slot.requests += 1;
        }
        self.next_for(&mut g, index)
    }

    /// Puts a newly ready worker to use (see [`Pool::next_for`]).
    fn make_available(self: &Arc<Self>, g: &mut Inner, index: u32) {
        let Some(link) = g.slots.get(&index).and_then(|s| s.link.clone()) else {
            return;
        };
        match self.next_for(g, index) {
            Next::Quit => link.quit.cancel(),
            Next::Job(job) => {
                if let Err(e) = link.jobs.try_send(job) {
                    // The link is gone already (its loss resets the slot): the job keeps its place.
                    g.waiting.push_front(e.into_inner());
                    self.metrics.queue_depth.set(g.waiting.len() as i64);
                }
            }
            Next::Idle | Next::Gone => {}
        }
    }

    /// The next step of a ready worker, after registering or after a request:
    /// retire, the oldest waiting job, or the idle stack. Sets the slot's state.
    fn next_for(self: &Arc<Self>, g: &mut Inner, index: u32) -> Next {
        let shutting_down = g.shutting_down;
        let Some(slot) = g.slots.get_mut(&index) else {
            return Next::Gone;
        };
        let (generation, before) = (slot.generation, slot.state);
        let next = if slot.quit_pending || slot.retiring || shutting_down {
            slot.state = SlotState::Quitting;
            slot.quit_pending = false;
            self.arm_quit_deadline(index, generation);
            Next::Quit
        } else if let Some(job) = g.waiting.pop_front() {
            slot.state = SlotState::Busy;
            self.metrics.queue_depth.set(g.waiting.len() as i64);
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
        let at = g
            .waiting
            .iter()
            .position(|j| j.conn() == conn && j.stream() == stream)?;
        let job = g.waiting.remove(at);
        self.metrics.queue_depth.set(g.waiting.len() as i64);
        job
    }

    /// Takes every waiting job of a connection that closed.
    pub fn take_waiting_conn(&self, conn: u64) -> Vec<Job> {
        let mut g = self.lock();
        if !g.waiting.iter().any(|j| j.conn() == conn) {
            return Vec::new();
        }
        let (gone, kept): (VecDeque<Job>, VecDeque<Job>) = g.waiting.drain(..).partition(|j| j.conn() == conn);
        g.waiting = kept;
        self.metrics.queue_depth.set(g.waiting.len() as i64);
        gone.into()
    }

    /// Fails waiting jobs whose queue deadline passed, for as long as the pool lives.
    pub async fn run_reaper(self: Arc<Self>) {
        loop {
            let (expired, next) = {
                let mut g = self.lock();
                let now = Instant::now();
                let mut expired = Vec::new();
                // Deadlines grow along the queue (one queue_timeout for all; a
                // requeued job at the front is older still).
                while g.waiting.front().is_some_and(|j| j.queue_deadline <= now) {
                    expired.extend(g.waiting.pop_front());
                }
                if !expired.is_empty() {
                    self.metrics.queue_depth.set(g.waiting.len() as i64);
                }
                (expired, g.waiting.front().map(|j| j.queue_deadline))
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
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline.into()) => {}
                        _ = self.reaper.notified() => {}
                    }
                }
                None => self.reaper.notified().await,
            }
        }
    }

    /// Registers a new slot (the supervisor then spawns its process).
    pub fn add_slot(&self, index: u32, kill: mpsc::UnboundedSender<&'static str>) -> u64 {
        let mut g = self.lock();
        let generation = g.next_generation;
        g.next_generation += 1;
        g.slots.insert(
            index,
            Slot {
                generation,
                state: SlotState::Starting,
                pid: None,
                link: None,
                db_connection_id: None,
                requests: 0,
                started: Instant::now(),
                quit_pending: false,
                retiring: false,
                kill,
            },
        );
        self.publish_states(&g);
        generation
    }

    /// A new process is being started in `index`; returns its generation.
    /// None: the slot is retiring or the pool shutting down; it is removed.
    pub fn begin_spawn(&self, index: u32) -> Option<u64> {
        let mut g = self.lock();
        if g.shutting_down || g.slots.get(&index).is_some_and(|s| s.retiring) {
            g.slots.remove(&index);
            self.publish_states(&g);
            return None;
        }
        let generation = g.next_generation;
        g.next_generation += 1;
        let slot = g.slots.get_mut(&index)?;
        slot.generation = generation;
        slot.state = SlotState::Starting;
        slot.pid = None;
        slot.link = None;
        slot.db_connection_id = None;
        slot.requests = 0;
        slot.quit_pending = false;
        slot.started = Instant::now();
        self.publish_states(&g);
        Some(generation)
    }

    pub fn set_pid(&self, index: u32, generation: u64, pid: u32) {
        let mut g = self.lock();
        if let Some(slot) = g.slots.get_mut(&index).filter(|s| s.generation == generation) {
            slot.pid = Some(pid);
        }
    }

    /// The pid the supervisor spawned for a slot that is waiting to register.
    pub fn expected_registration(&self, index: u32) -> Option<(u64, u32)> {
        let g = self.lock();
        let slot = g.slots.get(&index)?;
        (slot.state == SlotState::Starting && slot.link.is_none()).then_some((slot.generation, slot.pid?))
    }

    /// The worker of `index` registered and opened its database session.
    pub fn worker_ready(
        self: &Arc<Self>,
        index: u32,
        generation: u64,
        link: WorkerLink,
        db_connection_id: u32,
    ) -> bool {
        let mut g = self.lock();
        let Some(slot) = g.slots.get_mut(&index).filter(|s| s.generation == generation) else {
            return false;
        };
        slot.link = Some(link);
        slot.db_connection_id = Some(db_connection_id);
        slot.started = Instant::now();
        self.make_available(&mut g, index);
        true
    }

    pub fn is_ready(&self, index: u32, generation: u64) -> bool {
        let g = self.lock();
        g.slots
            .get(&index)
            .is_some_and(|s| s.generation == generation && s.link.is_some())
    }

    /// The worker asked to retire (`QUIT_REQUEST`).
    pub fn quit_requested(self: &Arc<Self>, index: u32, generation: u64) {
        let mut g = self.lock();
        let Some(slot) = g.slots.get_mut(&index).filter(|s| s.generation == generation) else {
            return;
        };
        self.metrics.recycles.inc();
        match slot.state {
            SlotState::Idle => {
                slot.state = SlotState::Quitting;
                if let Some(link) = &slot.link {
                    link.quit.cancel();
                }
                g.idle.retain(|&(i, _)| i != index);
                self.arm_quit_deadline(index, generation);
            }
            SlotState::Busy => slot.quit_pending = true,
            SlotState::Starting | SlotState::Quitting => {}
        }
        self.publish_states(&g);
    }

    /// The link to the worker of `index` ended; its process is told to die.
    pub fn link_lost(self: &Arc<Self>, index: u32, generation: u64, why: &'static str, closed_by_worker: bool) {
        let mut g = self.lock();
        // No link: already handled (killed by `kill`, or never registered).
        let Some(slot) = g.linked(index, generation) else {
            return;
        };
        slot.link = None;
        if slot.state != SlotState::Quitting {
            slot.state = SlotState::Starting;
            if closed_by_worker {
                // A worker closes its link as it exits (fatal error, lost session): let
                // it finish, so its exit status (e.g. 2 = fatal database error) is kept.
                self.arm_exit_deadline(index, generation, why);
            } else {
                self.metrics.worker_kills.inc();
                let _ = slot.kill.send(why);
            }
        }
        g.idle.retain(|&(i, _)| i != index);
        self.publish_states(&g);
    }

    /// Kills the process of `index` if it has not exited by itself within [`EXIT_GRACE`].
    fn arm_exit_deadline(self: &Arc<Self>, index: u32, generation: u64, why: &'static str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep(EXIT_GRACE).await;
            let Some(pool) = pool.upgrade() else { return };
            let g = pool.lock();
            if let Some(slot) = g
                .slots
                .get(&index)
                .filter(|s| s.generation == generation && s.pid.is_some())
            {
                pool.metrics.worker_kills.inc();
                let _ = slot.kill.send(why);
            }
        });
    }

    /// A worker told to quit must be gone within [`QUIT_DEADLINE`] (it may have
    /// hung, or missed its QUIT_NOW); otherwise it is killed and the slot refilled.
    fn arm_quit_deadline(self: &Arc<Self>, index: u32, generation: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep(QUIT_DEADLINE).await;
            let Some(pool) = pool.upgrade() else { return };
            let g = pool.lock();
            if let Some(slot) = g
                .slots
                .get(&index)
                .filter(|s| s.generation == generation && s.state == SlotState::Quitting)
            {
                pool.metrics.worker_kills.inc();
                let _ = slot.kill.send("did not exit after QUIT_NOW");
            }
        });
    }

    /// Kills the process of `index` (request timeout, abandoned request).
    pub fn kill(&self, index: u32, generation: u64, why: &'static str) {
        let mut g = self.lock();
        if let Some(slot) = g.linked(index, generation) {
            self.metrics.worker_kills.inc();
            slot.link = None;
            slot.state = SlotState::Starting;
            let _ = slot.kill.send(why);
            g.idle.retain(|&(i, _)| i != index);
            self.publish_states(&g);
        }
    }

    /// The process of `index` exited. Returns false when the slot must not be refilled.
    pub fn process_exited(&self, index: u32, generation: u64) -> bool {
        let mut g = self.lock();
        let shutting_down = g.shutting_down;
        let Some(slot) = g.slots.get_mut(&index) else {
            return false;
        };
        if slot.generation == generation {
            slot.link = None;
            slot.pid = None;
            slot.state = SlotState::Starting;
        }
        let keep = !slot.retiring && !shutting_down;
        if !keep {
            g.slots.remove(&index);
        }
        g.idle.retain(|&(i, _)| i != index);
        self.publish_states(&g);
        keep
    }

    pub fn target_size(&self) -> usize {
        self.lock().target_size
    }

    /// Changes the number of slots. Returns the indices of slots to create; slots
    /// over the target retire through the quit handshake (idle ones first).
    pub fn resize(self: &Arc<Self>, size: usize) -> Vec<u32> {
        let mut g = self.lock();
        g.target_size = size;
        let active: Vec<u32> = g.slots.iter().filter(|(_, s)| !s.retiring).map(|(i, _)| *i).collect();
        let mut created = Vec::new();
        if active.len() < size {
            let mut index = 0u32;
            while active.len() + created.len() < size {
                if !g.slots.contains_key(&index) {
                    created.push(index);
                }
                index += 1;
            }
        } else if active.len() > size {
            let mut excess = active.len() - size;
            // Idle first, then starting, then busy; highest index first within each.
            for wanted in [
                SlotState::Idle,
                SlotState::Starting,
                SlotState::Busy,
                SlotState::Quitting,
            ] {
                let candidates: Vec<u32> = active
                    .iter()
                    .rev()
                    .copied()
                    .filter(|i| g.slots.get(i).is_some_and(|s| s.state == wanted))
                    .collect();
                for index in candidates {
                    if excess == 0 {
                        break;
                    }
                    excess -= 1;
                    self.retire(&mut g, index);
                }
            }
        }
        self.publish_states(&g);
        created
    }

    fn retire(self: &Arc<Self>, g: &mut Inner, index: u32) {
        let Some(slot) = g.slots.get_mut(&index) else { return };
        slot.retiring = true;
        match slot.state {
            SlotState::Idle => {
                slot.state = SlotState::Quitting;
                if let Some(link) = &slot.link {
                    link.quit.cancel();
                }
                let generation = slot.generation;
                g.idle.retain(|&(i, _)| i != index);
                self.arm_quit_deadline(index, generation);
            }
            // No request can be on its way to a worker that has not registered.
            SlotState::Starting => {
                let _ = slot.kill.send("slot retired before registration");
            }
            SlotState::Busy | SlotState::Quitting => {}
        }
    }

    /// Stops handing out workers: waiting jobs fail, idle workers quit, busy ones
    /// quit after their response.
    pub fn shutdown(self: &Arc<Self>) {
        let mut g = self.lock();
        g.shutting_down = true;
        let waiting: Vec<Job> = g.waiting.drain(..).collect();
        self.metrics.queue_depth.set(0);
        fail_later(
            waiting,
            self.metrics.clone(),
            "shutting_down",
            ErrorCode::ShuttingDown,
            "the dispatcher is shutting down",
        );
        let indices: Vec<u32> = g.slots.keys().copied().collect();
        for index in indices {
            self.retire(&mut g, index);
        }
        self.publish_states(&g);
    }

    pub fn slot_count(&self) -> usize {
        self.lock().slots.len()
    }

    pub fn queue_depth(&self) -> usize {
        self.lock().waiting.len()
    }

    pub fn idle_count(&self) -> usize {
        self.lock()
            .slots
            .values()
            .filter(|s| s.state == SlotState::Idle)
            .count()
    }

    pub fn view(&self) -> (PoolView, Vec<SlotView>) {
        let g = self.lock();
        let count = |st: SlotState| g.slots.values().filter(|s| s.state == st).count();
        let pool = PoolView {
            size: g.target_size,
            slots: g.slots.len(),
            idle: count(SlotState::Idle),
            busy: count(SlotState::Busy),
            starting: count(SlotState::Starting),
            quitting: count(SlotState::Quitting),
            queue_depth: g.waiting.len(),
            queue_capacity: g.queue_capacity,
            respawns: self.metrics.respawns.get(),
            recycles: self.metrics.recycles.get(),
            fatal_exits: self.metrics.fatal_exits.get(),
        };
        let slots = g
            .slots
            .iter()
            .map(|(i, s)| SlotView {
                slot: *i,
                pid: s.pid,
                state: s.state,
                requests: s.requests,
                age_s: s.started.elapsed().as_secs_f64(),
                backend: self.backend_name.clone(),
                db_connection_id: s.db_connection_id,
                retiring: s.retiring,
            })
            .collect();
        (pool, slots)
    }

    fn publish_states(&self, g: &Inner) {
        for st in [
            SlotState::Starting,
            SlotState::Idle,
            SlotState::Busy,
            SlotState::Quitting,
        ] {
            let n = g.slots.values().filter(|s| s.state == st).count();
            self.metrics.slot_state(st).set(n as i64);
        }
    }
}

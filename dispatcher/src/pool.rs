//! The slot table and worker assignment: which slot is starting, idle, busy or
//! quitting, the LIFO stack of idle workers and the bounded FIFO of requests
//! waiting for one. The pool is the single owner of this state; the supervisor
//! (processes) and the worker links (sockets) report to it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use osprey_protocol::{Frame, Kind, QuitNow};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

/// A worker that closed its link gets this long to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// A worker told to quit (QUIT_NOW) that has not exited by then is killed.
const QUIT_DEADLINE: Duration = Duration::from_secs(10);

/// What a request task holds to talk to one registered worker.
#[derive(Clone, Debug)]
pub struct WorkerLink {
    /// Frames to the worker (REQUEST, CANCEL, PING, PONG, QUIT_NOW), written by its writer task.
    pub to_worker: mpsc::Sender<Frame>,
    /// Where the link's reader must forward the response frames of the next request.
    pub assign: mpsc::Sender<Assignment>,
}

/// Response routing for one request on a worker.
#[derive(Debug)]
pub struct Assignment {
    pub stream: u32,
    pub tx: mpsc::Sender<Frame>,
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

/// Why a request did not get a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireError {
    QueueFull,
    QueueTimeout,
    ShuttingDown,
}

struct Inner {
    slots: BTreeMap<u32, Slot>,
    /// Idle slots, most recently used last (LIFO keeps sessions and caches warm).
    idle: Vec<(u32, u64)>,
    waiters: VecDeque<oneshot::Sender<Lease>>,
    queue_capacity: usize,
    target_size: usize,
    shutting_down: bool,
    next_generation: u64,
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
}

impl Pool {
    pub fn new(target_size: usize, queue_capacity: usize, backend_name: String, metrics: Arc<Metrics>) -> Arc<Pool> {
        Arc::new(Pool {
            inner: Mutex::new(Inner {
                slots: BTreeMap::new(),
                idle: Vec::new(),
                waiters: VecDeque::new(),
                queue_capacity,
                target_size,
                shutting_down: false,
                next_generation: 1,
            }),
            metrics,
            backend_name,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for an idle worker: LIFO among idle ones, else FIFO in a bounded queue.
    pub async fn acquire(self: &Arc<Self>, timeout: Duration) -> Result<Lease, AcquireError> {
        let rx = {
            let mut g = self.lock();
            if g.shutting_down {
                return Err(AcquireError::ShuttingDown);
            }
            if let Some(lease) = self.pop_idle(&mut g) {
                return Ok(lease);
            }
            if g.waiters.len() >= g.queue_capacity {
                g.waiters.retain(|w| !w.is_closed());
                if g.waiters.len() >= g.queue_capacity {
                    return Err(AcquireError::QueueFull);
                }
            }
            let (tx, rx) = oneshot::channel();
            g.waiters.push_back(tx);
            self.metrics.queue_depth.set(g.waiters.len() as i64);
            rx
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(lease)) => Ok(lease),
            Ok(Err(_)) => Err(AcquireError::ShuttingDown),
            Err(_) => Err(AcquireError::QueueTimeout),
        }
    }

    fn pop_idle(self: &Arc<Self>, g: &mut Inner) -> Option<Lease> {
        while let Some((index, generation)) = g.idle.pop() {
            let Some(slot) = g.slots.get_mut(&index) else { continue };
            if slot.generation != generation || slot.state != SlotState::Idle {
                continue;
            }
            let Some(link) = slot.link.clone() else { continue };
            slot.state = SlotState::Busy;
            return Some(Lease::new(self.clone(), index, generation, link));
        }
        None
    }

    /// Puts a ready worker to use: to the first live waiter, else on the idle stack;
    /// or, if it should retire, tells it to quit.
    fn make_available(self: &Arc<Self>, g: &mut Inner, index: u32) {
        let shutting_down = g.shutting_down;
        let Some(slot) = g.slots.get_mut(&index) else { return };
        let Some(link) = slot.link.clone() else { return };
        let generation = slot.generation;
        if slot.quit_pending || slot.retiring || shutting_down {
            slot.state = SlotState::Quitting;
            self.arm_quit_deadline(index, generation);
            slot.quit_pending = false;
            // The worker is idle and off the idle stack: nothing can be on its way to it.
            let _ = link.to_worker.try_send(Frame::new(Kind::QuitNow, 0, &QuitNow {}));
            return;
        }
        slot.state = SlotState::Busy;
        while let Some(waiter) = g.waiters.pop_front() {
            match waiter.send(Lease::new(self.clone(), index, generation, link.clone())) {
                Ok(()) => {
                    self.metrics.queue_depth.set(g.waiters.len() as i64);
                    return;
                }
                Err(mut lease) => lease.disarm(),
            }
        }
        self.metrics.queue_depth.set(0);
        let slot = g.slots.get_mut(&index).expect("slot looked up above");
        slot.state = SlotState::Idle;
        g.idle.push((index, generation));
    }

    fn release(self: &Arc<Self>, index: u32, generation: u64, served: bool) {
        let mut g = self.lock();
        let Some(slot) = g.slots.get_mut(&index) else { return };
        if slot.generation != generation || slot.link.is_none() {
            return;
        }
        if served {
            slot.requests += 1;
        }
        self.make_available(&mut g, index);
        self.publish_states(&g);
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
        self.publish_states(&g);
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
                    let _ = link.to_worker.try_send(Frame::new(Kind::QuitNow, 0, &QuitNow {}));
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
        let Some(slot) = g
            .slots
            .get_mut(&index)
            .filter(|s| s.generation == generation && s.link.is_some())
        else {
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
        if let Some(slot) = g
            .slots
            .get_mut(&index)
            .filter(|s| s.generation == generation && s.link.is_some())
        {
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
                    let _ = link.to_worker.try_send(Frame::new(Kind::QuitNow, 0, &QuitNow {}));
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

    /// Stops handing out workers: waiters fail, idle workers quit, busy ones quit
    /// after their response.
    pub fn shutdown(self: &Arc<Self>) {
        let mut g = self.lock();
        g.shutting_down = true;
        g.waiters.clear();
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
        let mut g = self.lock();
        g.waiters.retain(|w| !w.is_closed());
        g.waiters.len()
    }

    pub fn idle_count(&self) -> usize {
        self.lock()
            .slots
            .values()
            .filter(|s| s.state == SlotState::Idle)
            .count()
    }

    pub fn view(&self) -> (PoolView, Vec<SlotView>) {
        let mut g = self.lock();
        g.waiters.retain(|w| !w.is_closed());
        let count = |st: SlotState| g.slots.values().filter(|s| s.state == st).count();
        let pool = PoolView {
            size: g.target_size,
            slots: g.slots.len(),
            idle: count(SlotState::Idle),
            busy: count(SlotState::Busy),
            starting: count(SlotState::Starting),
            quitting: count(SlotState::Quitting),
            queue_depth: g.waiters.len(),
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

/// The right to use one worker for one request. Dropped unused, the worker goes
/// back to the pool; dropped while a request is on the worker (the request task
/// died), the worker's state is unknown and it is killed.
pub struct Lease {
    pool: Arc<Pool>,
    pub slot: u32,
    pub generation: u64,
    pub link: WorkerLink,
    in_use: bool,
    armed: bool,
}

impl Lease {
    fn new(pool: Arc<Pool>, slot: u32, generation: u64, link: WorkerLink) -> Lease {
        Lease {
            pool,
            slot,
            generation,
            link,
            in_use: false,
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }

    /// A REQUEST is about to be sent to the worker.
    pub fn mark_in_use(&mut self) {
        self.in_use = true;
    }

    /// The worker sent END: it is free for the next request.
    pub fn release(mut self) {
        self.armed = false;
        self.pool.release(self.slot, self.generation, true);
    }

    /// The worker must die (timeout, lost link); its slot is refilled.
    pub fn kill(mut self, why: &'static str) {
        self.armed = false;
        self.pool.kill(self.slot, self.generation, why);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.in_use {
            self.pool
                .kill(self.slot, self.generation, "request abandoned while on the worker");
        } else {
            self.pool.release(self.slot, self.generation, false);
        }
    }
}

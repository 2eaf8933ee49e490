//! The slot table and worker assignment: which slot is starting, idle, busy or
//! quitting, the LIFO stack of idle workers, and the requests waiting for one
//! (`wait_queue.rs`: one queue per client connection, served in turn, with a cap
//! on the workers one connection or token may hold). The pool is the single owner
//! of this state; the supervisor (processes) and the worker links (sockets) report
//! to it.
//!
//! Requests are pushed to workers, not pulled by tasks: `submit` hands a job to
//! an idle worker's link or queues it, and a link that finished a request takes
//! the next queued job itself (`next_job`), in the same wake-up.
//!
//! Invariant: no worker is idle while a job waits that it may serve (one not held
//! back by its connection's or token's cap). Whatever frees a holder's worker
//! (`release`) hands jobs to idle workers before the lock is let go.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use osprey_protocol::{ErrorCode, WorkerSettings};
use serde::Serialize;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pool::wait_queue::{Full, Holder, QueueFigures, QueueLimits, WaitQueue};
use crate::request::job::{fail_later, Job};

/// A worker that closed its link gets this long to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// A worker told to quit (QUIT_NOW) that has not exited by then is killed.
const QUIT_DEADLINE: Duration = Duration::from_secs(10);
/// The queue reaper looks at most this often: QUEUE_TIMEOUT comes up to this late,
/// and a queue that turns over fast does not wake it for every job.
const REAPER_GRAIN: Duration = Duration::from_millis(5);
/// Jobs a link's channel holds. Only an idle link is sent a job, so one is
/// enough; the spare absorbs nothing but keeps `try_send` from ever failing
/// for a live link.
pub const LINK_JOBS: usize = 2;

/// Slot ids of group `g` are `g * GROUP_SLOTS ..`: unique across the dispatcher, so
/// that a registering worker's slot names its group.
pub const GROUP_SLOTS: u32 = 1 << 16;

/// The member a slot group's workers serve, and what they are told at registration.
#[derive(Debug)]
pub struct Target {
    pub member: String,
    pub settings: WorkerSettings,
    /// Bumped on every change of member or settings: a worker spawned for an older
    /// target is retired (idle at once, busy after its response).
    pub epoch: u64,
}

/// Told of workers that could not open, or lost, their database session: the member's
/// health model counts it (the passive factor).
pub type PassiveSink = Arc<dyn Fn(&str, &'static str) + Send + Sync>;

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

impl SlotState {
    /// As in `/status` and the `osprey_slots{state}` label.
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Starting => "starting",
            SlotState::Idle => "idle",
            SlotState::Busy => "busy",
            SlotState::Quitting => "quitting",
        }
    }
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
    /// Whose job the worker runs (busy with a job taken from the pool).
    holder: Option<Holder>,
    /// Whose jobs the link wrote to the worker behind that one (prefetch, in order).
    ahead: VecDeque<Holder>,
    kill: mpsc::UnboundedSender<&'static str>,
    /// The target the process was spawned for.
    target: Option<Arc<Target>>,
}

/// What a slot task does next (see [`Pool::begin_spawn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spawn {
    /// Start a process of this generation.
    Go(u64),
    /// The group has no target yet: wait for one ([`Pool::target_changes`]).
    NoTarget,
    /// The slot was removed (retired, or the pool is shutting down).
    Gone,
}

/// Why a request was not accepted for a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull,
    /// The connection's own share of the wait queue (bytes) is full.
    ConnectionQueueFull,
    ShuttingDown,
    /// (requeue) The client cancelled the request or closed its connection.
    Cancelled,
    /// The group's cluster has no member to serve it (every member down); the reason.
    Unavailable,
}

struct Inner {
    slots: BTreeMap<u32, Slot>,
    /// Idle slots, most recently used last (LIFO keeps sessions and caches warm).
    idle: Vec<(u32, u64)>,
    /// Jobs waiting for a worker, per connection.
    queue: WaitQueue,
    target_size: usize,
    shutting_down: bool,
    next_generation: u64,
    /// The member served, `None` until the cluster names one.
    target: Option<Arc<Target>>,
    /// No dispatch while set (switch in progress, member down or in maintenance):
    /// requests wait in the queue, bounded by `queue_timeout_ms`.
    hold: Option<String>,
    /// Requests fail at once while set (no member can serve: all down).
    unavailable: Option<String>,
    /// Jobs written to busy workers behind the one each runs (prefetch), all slots.
    ahead: usize,
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
    pub cluster: String,
    pub db_connection_id: Option<u32>,
    pub retiring: bool,
    /// Requests written to the worker and not ended: the one it runs and those behind it
    /// (prefetch, `pool.pipeline_depth`).
    pub pipeline: usize,
}

/// Pool-wide figures, for the admin API.
#[derive(Debug, Clone, Serialize)]
pub struct PoolView {
    /// `write` (the primary's slots) or `read` (a replica's read slots).
    pub role: &'static str,
    pub cluster: String,
    /// The member the workers serve (`null` before the cluster names one).
    pub member: Option<String>,
    /// Why requests wait instead of being dispatched, if they do.
    pub hold: Option<String>,
    /// Why requests fail at once, if they do.
    pub unavailable: Option<String>,
    pub size: usize,
    pub slots: usize,
    pub idle: usize,
    pub busy: usize,
    pub starting: usize,
    pub quitting: usize,
    pub queue_depth: usize,
    pub queue_capacity: usize,
    /// Bytes of REQUEST payload waiting, and their bound.
    pub queue_bytes: usize,
    pub queue_bytes_capacity: usize,
    /// Client connections with at least one request waiting.
    pub waiting_connections: usize,
    /// Of those, connections whose requests wait because they hold their cap of
    /// workers (`pool.max_per_connection` / `pool.max_per_token`).
    pub capped_connections: usize,
    /// Requests waiting in the longest connection queue.
    pub longest_connection_queue: usize,
    /// How long the request waiting longest has waited so far, in ms (0: none waits).
    pub longest_wait_ms: u64,
    /// Workers one connection may hold at once (0 = no cap).
    pub max_per_connection: usize,
    pub respawns: u64,
    pub recycles: u64,
    pub fatal_exits: u64,
}

/// One slot group: the write slots of a cluster, or the read slots of one of its
/// members (read/write split). The single owner of its slots, idle stack and queue.
pub struct Pool {
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
    /// The cluster whose primary (write group) or member (read group) the workers serve.
    cluster: String,
    /// A read group: the member whose read slots these are.
    reads: Option<String>,
    /// A read group: where its waiting requests go when it stops serving (the cluster's
    /// write group), so that a read that never reached a worker moves on instead of
    /// failing.
    fallback: Mutex<Option<Arc<Pool>>>,
    /// The size its owner (a read group's cluster follower) wants; the supervisor follows it.
    wanted_size: watch::Sender<usize>,
    /// Slot ids start here ([`GROUP_SLOTS`]).
    base: u32,
    /// Wakes the queue reaper when the wait queue stops being empty.
    reaper: Notify,
    /// The target's epoch: slot tasks waiting for a target (or backing off) wake on it.
    target_tx: watch::Sender<u64>,
    passive: Mutex<Option<PassiveSink>>,
    /// Requests running on this group's workers (busy slots), for a switchover that
    /// waits for in-flight writes to end.
    busy_tx: watch::Sender<usize>,
    /// What this group last added to the shared gauges (slot states, queue depth).
    published: [AtomicI64; 4],
    published_depth: AtomicI64,
}

impl Pool {
    pub fn new(target_size: usize, limits: QueueLimits, cluster: String, metrics: Arc<Metrics>) -> Arc<Pool> {
        Pool::with_base(0, target_size, limits, cluster, metrics)
    }

    /// Group number `group` (its slot ids start at `group * GROUP_SLOTS`).
    pub fn with_base(
        group: u32,
        target_size: usize,
        limits: QueueLimits,
        cluster: String,
        metrics: Arc<Metrics>,
    ) -> Arc<Pool> {
        Pool::build(group, target_size, limits, cluster, None, metrics)
    }

    /// Group number `group`: the read slots of `member` (empty until its follower sizes it).
    pub fn read_group(
        group: u32,
        limits: QueueLimits,
        cluster: String,
        member: String,
        metrics: Arc<Metrics>,
    ) -> Arc<Pool> {
        Pool::build(group, 0, limits, cluster, Some(member), metrics)
    }

    fn build(
        group: u32,
        target_size: usize,
        limits: QueueLimits,
        cluster: String,
        reads: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            inner: Mutex::new(Inner {
                slots: BTreeMap::new(),
                idle: Vec::new(),
                queue: WaitQueue::new(limits, target_size),
                target_size,
                shutting_down: false,
                next_generation: 1,
                target: None,
                hold: None,
                unavailable: None,
                ahead: 0,
            }),
            metrics,
            cluster,
            reads,
            fallback: Mutex::new(None),
            wanted_size: watch::channel(target_size).0,
            base: group * GROUP_SLOTS,
            reaper: Notify::new(),
            target_tx: watch::channel(0).0,
            passive: Mutex::new(None),
            busy_tx: watch::channel(0).0,
            published: Default::default(),
            published_depth: AtomicI64::new(0),
        })
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// A read group's member (`None`: the write group).
    pub fn read_member(&self) -> Option<&str> {
        self.reads.as_deref()
    }

    /// A read group hands what it cannot serve to `fallback` (the write group).
    pub fn set_fallback(&self, fallback: Arc<Pool>) {
        *self.fallback.lock().unwrap_or_else(|e| e.into_inner()) = Some(fallback);
    }

    pub fn fallback(&self) -> Option<Arc<Pool>> {
        self.fallback.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Asks the supervisor for `size` slots (a read group, as its member becomes a
    /// replica or stops being one).
    pub fn want_size(&self, size: usize) {
        self.wanted_size
            .send_if_modified(|s| std::mem::replace(s, size) != size);
    }

    pub fn wanted_size(&self) -> watch::Receiver<usize> {
        self.wanted_size.subscribe()
    }

    /// Requests running or waiting here (what "least outstanding" compares), or `None`
    /// while no worker is registered (none idle or busy): a group that cannot serve now,
    /// whatever its member's health says.
    pub fn outstanding(&self) -> Option<usize> {
        let g = self.lock();
        let busy = *self.busy_tx.borrow();
        if busy == 0 && g.idle.is_empty() {
            return None;
        }
        Some(g.queue.len() + busy + g.ahead)
    }

    /// Whether slot id `index` belongs to this group.
    pub fn owns(&self, index: u32) -> bool {
        index / GROUP_SLOTS == self.base / GROUP_SLOTS
    }

    pub fn set_passive_sink(&self, sink: PassiveSink) {
        *self.passive.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// A worker of `index` (generation) could not open or lost its database session.
    pub fn report_passive(&self, index: u32, generation: u64, why: &'static str) {
        let member = {
            let g = self.lock();
            g.slots
                .get(&index)
                .filter(|s| s.generation == generation)
                .and_then(|s| s.target.as_ref().map(|t| t.member.clone()))
        };
        let sink = self.passive.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Some(member), Some(sink)) = (member, sink) {
            sink(&member, why);
        }
    }

    /// Wakes on every change of target, and when a hold ends (a slot task waiting for a
    /// target, or backing off).
    pub fn target_changes(&self) -> watch::Receiver<u64> {
        self.target_tx.subscribe()
    }

    /// Points the group at `member` with `settings`. A change of member or settings
    /// retires every worker of the old target: idle ones at once, busy ones right after
    /// their response, unregistered ones are killed; fresh ones connect to the new
    /// target. Clears a hold.
    pub fn set_target(self: &Arc<Self>, member: &str, settings: WorkerSettings) {
        let mut g = self.lock();
        let held = g.hold.take().is_some();
        g.unavailable = None;
        let same = g
            .target
            .as_ref()
            .is_some_and(|t| t.member == member && t.settings == settings);
        if !same {
            let epoch = g.target.as_ref().map_or(1, |t| t.epoch + 1);
            tracing::info!(cluster = %self.cluster, member, epoch, reads = self.reads.is_some(), "slots re-targeted");
            g.target = Some(Arc::new(Target {
                member: member.to_owned(),
                settings,
                epoch,
            }));
            let stale: Vec<u32> = g
                .slots
                .iter()
                .filter(|(_, s)| s.target.as_ref().is_none_or(|t| t.epoch != epoch))
                .map(|(i, _)| *i)
                .collect();
            for index in stale {
                self.retarget_slot(&mut g, index);
            }
            self.target_tx.send_replace(epoch);
        } else if held {
            // The member is back (no switch): slots backing off after failing to reach
            // it respawn now, not at the end of a back-off longer than queue_timeout_ms.
            self.target_tx.send_modify(|_| {});
        }
        self.pump(&mut g);
        self.publish_states(&g);
    }

    /// The worker of `index` lost its database session (it answered `DATABASE_FATAL`
    /// and exits). The other idle workers of the same target share its fate when the
    /// server died or the network to it broke: they are retired now (fresh ones replace
    /// them), so that the next requests wait for a working session instead of each
    /// meeting a dead one (each would end with an outcome-unknown error).
    pub fn session_lost(self: &Arc<Self>, index: u32, generation: u64) {
        let mut g = self.lock();
        let Some(epoch) = g
            .slots
            .get(&index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.target.as_ref().map(|t| t.epoch))
        else {
            return;
        };
        let idle: Vec<u32> = g
            .slots
            .iter()
            .filter(|(i, s)| {
                **i != index && s.state == SlotState::Idle && s.target.as_ref().is_some_and(|t| t.epoch == epoch)
            })
            .map(|(i, _)| *i)
            .collect();
        if !idle.is_empty() {
            tracing::info!(cluster = %self.cluster, slot = index, retired = idle.len(), "a session died: idle sessions to the same member retired");
        }
        for i in idle {
            self.retarget_slot(&mut g, i);
        }
        self.publish_states(&g);
    }

    /// The member the workers serve now died for us (failover): the requests in flight on
    /// its workers will never be answered (a dead or cut-off server), so those workers are
    /// killed and each request ends with `WORKER_LOST` (dispatched: outcome unknown) now,
    /// rather than at `request_timeout`.
    pub fn abandon_member(self: &Arc<Self>, member: &str) {
        let g = self.lock();
        let busy: Vec<(u32, u64)> = g
            .slots
            .iter()
            .filter(|(_, s)| {
                s.state == SlotState::Busy && s.link.is_some() && s.target.as_ref().is_some_and(|t| t.member == member)
            })
            .map(|(i, s)| (*i, s.generation))
            .collect();
        drop(g);
        for (index, generation) in busy {
            self.kill(
                index,
                generation,
                "its member failed over while a request was in flight",
            );
        }
    }

    /// Stops dispatching (requests wait, bounded by their queue deadline); in-flight
    /// requests finish. `why` shows in status.
    pub fn hold(&self, why: String) {
        let mut g = self.lock();
        g.hold = Some(why);
        g.unavailable = None;
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

    /// The worker settings a registering worker of `index` gets: those of the target
    /// it was spawned for.
    pub fn settings_for(&self, index: u32, generation: u64) -> Option<WorkerSettings> {
        let g = self.lock();
        g.slots
            .get(&index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.target.as_ref().map(|t| t.settings.clone()))
    }

    fn retarget_slot(self: &Arc<Self>, g: &mut Inner, index: u32) {
        let Some(slot) = g.slots.get_mut(&index) else { return };
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
            SlotState::Busy => slot.quit_pending = true,
            // Not registered: no request can be on its way to it. A slot waiting for a
            // target or backing off has no process (no pid) and wakes on the new epoch.
            SlotState::Starting => {
                if slot.pid.is_some() {
                    let _ = slot.kill.send("re-targeted before registration");
                }
            }
            SlotState::Quitting => {}
        }
    }

    /// The member the group's workers serve now (`None` before the cluster names one).
    pub fn target_member(&self) -> Option<String> {
        self.lock().target.as_ref().map(|t| t.member.clone())
    }

    /// Whether requests are handed to workers now (a target and no hold).
    pub fn is_dispatching(&self) -> bool {
        Pool::dispatching(&self.lock())
    }

    fn dispatching(g: &Inner) -> bool {
        g.hold.is_none() && g.target.is_some()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client connection authenticated with the client token of index `tenant`
    /// (`auth.client_tokens`): its requests count against that token's turn and cap.
    /// It is forgotten by [`Pool::take_waiting_conn`] when it closes.
    pub fn open_conn(&self, conn: u64, tenant: u32) {
        self.lock().queue.register(conn, tenant);
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
        let runnable = if g.idle.is_empty() || !Pool::dispatching(&g) {
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
    fn to_idle_worker(&self, g: &mut Inner, mut job: Job, holder: Holder) -> Result<(), Job> {
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
    fn pump(&self, g: &mut Inner) {
        if g.idle.is_empty() || !g.queue.servable() || !Pool::dispatching(g) {
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
    fn release_slot(&self, g: &mut Inner, index: u32) {
        let Some(slot) = g.slots.get_mut(&index) else {
            return;
        };
        let ahead = slot.ahead.len();
        let held: Vec<Holder> = slot.holder.take().into_iter().chain(slot.ahead.drain(..)).collect();
        g.ahead = g.ahead.saturating_sub(ahead);
        self.metrics.pipeline.ahead.dec_by(ahead as i64);
        let mut servable = false;
        for h in held {
            servable |= g.queue.release(h);
        }
        if servable {
            self.pump(g);
        }
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
        let holder = slot.holder.take();
        debug_assert!(slot.ahead.is_empty(), "next_job with jobs ahead");
        if let Some(h) = holder {
            g.queue.release(h);
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
        if g.queue.is_empty() || g.shutting_down || !Pool::dispatching(&g) {
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

    /// The worker of `index` ended its request (`served`) or answered one it never ran,
    /// and has more written to it: the first of those is its request now.
    /// False: what is still behind it must be taken back (it serves an old target, is to retire, or the group stopped dispatching: held, unavailable, shutting down).
    pub fn promote(self: &Arc<Self>, index: u32, generation: u64, served: bool) -> bool {
        let mut g = self.lock();
        let current = g.target.as_ref().map(|t| t.epoch);
        let dispatching = Pool::dispatching(&g) && !g.shutting_down;
        let Some(slot) = g.linked(index, generation) else {
            return false;
        };
        let keep = dispatching && !slot.retiring && slot.target.as_ref().map(|t| t.epoch) == current;
        if served {
            slot.requests += 1;
        }
        let done = std::mem::replace(&mut slot.holder, slot.ahead.pop_front());
        let moved = slot.holder.is_some();
        if moved {
            g.ahead = g.ahead.saturating_sub(1);
            self.metrics.pipeline.ahead.dec();
        }
        if let Some(h) = done {
            if g.queue.release(h) {
                self.pump(&mut g);
            }
        }
        keep
    }

    /// Undoes a [`Pool::prefetch`] whose job needed no worker after all (cancelled
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
        if g.queue.release(holder) {
            self.pump(&mut g);
        }
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
    fn next_for(self: &Arc<Self>, g: &mut Inner, index: u32) -> Next {
        let shutting_down = g.shutting_down;
        let current = g.target.as_ref().map(|t| t.epoch);
        let dispatching = Pool::dispatching(g);
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

    /// Registers a new slot (the supervisor then spawns its process).
    pub fn add_slot(&self, index: u32, kill: mpsc::UnboundedSender<&'static str>) -> u64 {
        let mut g = self.lock();
        let generation = g.next_generation;
        g.next_generation += 1;
        let target = g.target.clone();
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
                holder: None,
                ahead: VecDeque::new(),
                kill,
                target,
            },
        );
        self.publish_states(&g);
        generation
    }

    /// A new process is being started in `index`: its generation, or why not.
    pub fn begin_spawn(&self, index: u32) -> Spawn {
        let mut g = self.lock();
        self.release_slot(&mut g, index);
        if g.shutting_down || g.slots.get(&index).is_some_and(|s| s.retiring) {
            g.slots.remove(&index);
            self.publish_states(&g);
            return Spawn::Gone;
        }
        let Some(target) = g.target.clone() else {
            return Spawn::NoTarget;
        };
        let generation = g.next_generation;
        g.next_generation += 1;
        let Some(slot) = g.slots.get_mut(&index) else {
            return Spawn::Gone;
        };
        slot.generation = generation;
        slot.state = SlotState::Starting;
        slot.pid = None;
        slot.link = None;
        slot.db_connection_id = None;
        slot.requests = 0;
        slot.quit_pending = false;
        slot.started = Instant::now();
        slot.target = Some(target);
        self.publish_states(&g);
        Spawn::Go(generation)
    }

    pub fn set_pid(&self, index: u32, generation: u64, pid: u32) {
        let mut g = self.lock();
        let current = g.target.as_ref().map(|t| t.epoch);
        if let Some(slot) = g.slots.get_mut(&index).filter(|s| s.generation == generation) {
            slot.pid = Some(pid);
            // Re-targeted while the process was being forked: `retarget_slot` saw no pid
            // and sent no kill. The slot task drained its kill channel before
            // `begin_spawn`, so this one reaches this process.
            if slot.target.as_ref().map(|t| t.epoch) != current {
                let _ = slot.kill.send("re-targeted before registration");
            }
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
        self.release_slot(&mut g, index);
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
            self.release_slot(&mut g, index);
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
        let current = slot.generation == generation;
        if current {
            slot.link = None;
            slot.pid = None;
            slot.state = SlotState::Starting;
        }
        let keep = !slot.retiring && !shutting_down;
        g.idle.retain(|&(i, _)| i != index);
        if current {
            self.release_slot(&mut g, index);
        }
        if !keep {
            g.slots.remove(&index);
        }
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
        // The default per-connection cap follows the pool's size.
        let limits = g.queue.limits();
        g.queue.set_limits(limits, size);
        let active: Vec<u32> = g.slots.iter().filter(|(_, s)| !s.retiring).map(|(i, _)| *i).collect();
        let mut created = Vec::new();
        if active.len() < size {
            let mut index = self.base;
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
        // A larger default cap may let capped connections have a worker that is idle.
        self.pump(&mut g);
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
        let waiting: Vec<Job> = g.queue.drain();
        self.set_depth(&g);
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
        self.lock().queue.len()
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
        let q: QueueFigures = g.queue.figures();
        let limits = g.queue.limits();
        let pool = PoolView {
            cluster: self.cluster.clone(),
            role: if self.reads.is_some() { "read" } else { "write" },
            member: g.target.as_ref().map(|t| t.member.clone()),
            hold: g.hold.clone(),
            unavailable: g.unavailable.clone(),
            size: g.target_size,
            slots: g.slots.len(),
            idle: count(SlotState::Idle),
            busy: count(SlotState::Busy),
            starting: count(SlotState::Starting),
            quitting: count(SlotState::Quitting),
            queue_depth: q.jobs,
            queue_capacity: limits.capacity,
            queue_bytes: q.bytes,
            queue_bytes_capacity: limits.bytes,
            waiting_connections: q.waiting_connections,
            capped_connections: q.capped_connections,
            longest_connection_queue: q.longest_connection_queue,
            longest_wait_ms: q.longest_wait.as_millis() as u64,
            max_per_connection: q.max_per_connection,
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
                backend: s.target.as_ref().map_or_else(String::new, |t| t.member.clone()),
                cluster: self.cluster.clone(),
                db_connection_id: s.db_connection_id,
                retiring: s.retiring,
                pipeline: usize::from(s.state == SlotState::Busy) + s.ahead.len(),
            })
            .collect();
        (pool, slots)
    }

    /// The gauges are shared by every group: each adds what changed in its own counts.
    fn publish_states(&self, g: &Inner) {
        for (i, st) in [
            SlotState::Starting,
            SlotState::Idle,
            SlotState::Busy,
            SlotState::Quitting,
        ]
        .into_iter()
        .enumerate()
        {
            let n = g.slots.values().filter(|s| s.state == st).count() as i64;
            if st == SlotState::Busy {
                self.busy_tx
                    .send_if_modified(|b| std::mem::replace(b, n as usize) != n as usize);
            }
            // Under the pool's lock: the swap and the add cannot interleave with another.
            let delta = n - self.published[i].swap(n, Ordering::Relaxed);
            if delta != 0 {
                self.metrics.slot_state(st.name()).inc_by(delta);
            }
        }
    }

    fn set_depth(&self, g: &Inner) {
        let n = g.queue.len() as i64;
        let delta = n - self.published_depth.swap(n, Ordering::Relaxed);
        if delta != 0 {
            self.metrics.queue_depth.inc_by(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use bytes::Bytes;
    use osprey_protocol::{Frame, Kind};

    use super::*;
    use crate::request::streams::{outbox, ClientShared, Inbox};

    struct Fixture {
        pool: Arc<Pool>,
        links: Vec<(u64, mpsc::Receiver<Job>)>,
        conns: Vec<(Arc<ClientShared>, Inbox)>,
    }

    /// A pool of `workers` registered workers (fake links) and `conns` client
    /// connections; connection `i` authenticated with token `tenants[i]` (0 if absent).
    fn settings(member: &str) -> WorkerSettings {
        WorkerSettings {
            backend: osprey_protocol::Backend {
                name: member.into(),
                host: "127.0.0.1".into(),
                port: 3306,
                user: "u".into(),
                password: String::new(),
                database: None,
            },
            max_requests: 0,
            max_age_ms: 0,
            batch_rows: 1,
            batch_bytes: 1,
            connect_timeout_ms: 1,
            session_reset: Default::default(),
            backend_tls: None,
        }
    }

    fn fixture(workers: u32, conns: u64, tenants: &[u32], limits: QueueLimits) -> Fixture {
        let metrics = Arc::new(Metrics::new());
        let pool = Pool::new(workers as usize, limits, "test".into(), metrics.clone());
        pool.set_target("m", settings("m"));
        let mut links = Vec::new();
        for index in 0..workers {
            let (kill, _) = mpsc::unbounded_channel();
            let generation = pool.add_slot(index, kill);
            let (jobs, rx) = mpsc::channel(LINK_JOBS);
            let link = WorkerLink {
                jobs,
                quit: CancellationToken::new(),
            };
            assert!(pool.worker_ready(index, generation, link, index));
            links.push((generation, rx));
        }
        let conns = (0..conns)
            .map(|i| {
                let (out, rx) = outbox(64, 1 << 30);
                let shared = ClientShared::new(100 + i, out, 4096, 0, 1 << 30, metrics.clone());
                pool.open_conn(shared.id, tenants.get(i as usize).copied().unwrap_or(0));
                (shared, rx)
            })
            .collect();
        Fixture { pool, links, conns }
    }

    impl Fixture {
        fn job(&self, conn: usize, stream: u32) -> Job {
            self.job_sized(conn, stream, 16)
        }

        fn job_sized(&self, conn: usize, stream: u32, size: usize) -> Job {
            let (guard, cancel) = self.conns[conn].0.open(stream).expect("stream is free");
            let received = Instant::now();
            Job {
                guard,
                cancel,
                frame: Frame {
                    kind: Kind::Request,
                    flags: 0,
                    stream,
                    payload: Bytes::from(vec![0u8; size]),
                },
                timeout: None,
                received,
                queue_deadline: received + Duration::from_secs(60),
                attempts: 0,
                digest: None,
            }
        }

        fn submit(&self, conn: usize, stream: u32) {
            assert!(self.pool.submit(self.job(conn, stream)).is_ok(), "submit refused");
        }

        /// (slot, job) for every job a worker link received since the last call.
        fn delivered(&mut self) -> Vec<(u32, Job)> {
            let mut got = Vec::new();
            for (i, (_, rx)) in self.links.iter_mut().enumerate() {
                while let Ok(job) = rx.try_recv() {
                    got.push((i as u32, job));
                }
            }
            got
        }

        /// The worker of `slot` finished its job: what it takes next, as (conn index, stream).
        fn done(&self, slot: u32) -> Option<(usize, u32)> {
            match self.pool.next_job(slot, self.links[slot as usize].0, true) {
                Next::Job(j) => Some(self.name(&j)),
                Next::Idle => None,
                Next::Quit | Next::Gone => panic!("slot {slot} must stay"),
            }
        }

        fn name(&self, j: &Job) -> (usize, u32) {
            let conn = self
                .conns
                .iter()
                .position(|(s, _)| s.id == j.conn())
                .expect("known conn");
            (conn, j.stream())
        }
    }

    fn no_caps() -> QueueLimits {
        QueueLimits::uncapped(1024)
    }

    #[test]
    fn default_cap_leaves_a_quarter_of_the_pool() {
        use crate::pool::wait_queue::default_connection_cap as cap;
        assert_eq!(
            [cap(1), cap(2), cap(3), cap(4), cap(8), cap(10), cap(16)],
            [1, 1, 2, 3, 6, 7, 12]
        );
    }

    /// One worker, three connections: A queued three jobs while its first ran, before B
    /// and C queued theirs; the worker serves B, C (they held no worker: A did), then
    /// A, B, A, A in turn, not A's three first.
    #[test]
    fn connections_are_served_in_turn() {
        let mut f = fixture(1, 3, &[], no_caps());
        f.submit(0, 1); // runs at once
        for s in 2..=4 {
            f.submit(0, s);
        }
        f.submit(1, 1);
        f.submit(1, 2);
        f.submit(2, 1);
        assert_eq!(f.delivered().len(), 1);
        let order: Vec<_> = std::iter::from_fn(|| f.done(0)).collect();
        assert_eq!(order, [(1, 1), (2, 1), (0, 2), (1, 2), (0, 3), (0, 4)]);
        assert_eq!(f.pool.queue_depth(), 0);
    }

    /// Tokens take turns first: token 0 has two connections, token 1 one; token 1's
    /// connection gets every other worker, not a third. (Token 1 and connection 1 go
    /// first: they held no worker while connection 0's first job ran.)
    #[test]
    fn tokens_are_served_in_turn_then_their_connections() {
        let mut f = fixture(1, 3, &[0, 0, 1], no_caps());
        f.submit(0, 100); // occupies the worker
        for s in 1..=3 {
            f.submit(0, s);
            f.submit(1, s);
        }
        for s in 1..=3 {
            f.submit(2, s);
        }
        f.delivered();
        let order: Vec<_> = std::iter::from_fn(|| f.done(0)).collect();
        assert_eq!(
            order,
            [(2, 1), (1, 1), (2, 2), (0, 1), (2, 3), (1, 2), (0, 2), (1, 3), (0, 3)]
        );
    }

    /// The default cap (pool of 4: 3) holds a connection's fourth job back while a
    /// worker is idle; another connection gets that worker at once; a worker of the
    /// capped connection that finishes takes its next job, one of another connection
    /// that finishes does not.
    #[test]
    fn a_connection_holds_at_most_its_cap() {
        let mut limits = no_caps();
        limits.max_per_connection = None;
        let mut f = fixture(4, 2, &[], limits);
        for s in 1..=5 {
            f.submit(0, s);
        }
        let running = f.delivered();
        assert_eq!(running.len(), 3, "capped at 3 of 4");
        assert_eq!(f.pool.queue_depth(), 2);
        assert_eq!(f.pool.idle_count(), 1);
        let (view, _) = f.pool.view();
        assert_eq!((view.waiting_connections, view.capped_connections), (1, 1));
        assert_eq!(view.max_per_connection, 3);

        f.submit(1, 1);
        let b = f.delivered();
        assert_eq!(b.len(), 1, "the other connection got the idle worker");
        let b_slot = b[0].0;
        // B's worker finishes: A is at its cap, so it goes idle.
        assert_eq!(f.done(b_slot), None);
        assert_eq!(f.pool.queue_depth(), 2);
        // One of A's workers finishes: it takes A's next job.
        let a_slot = running[0].0;
        assert_eq!(f.done(a_slot), Some((0, 4)));
        // A worker of A is killed: A may have another, and the idle one takes it.
        f.pool.kill(running[1].0, f.links[running[1].0 as usize].0, "test");
        let next = f.delivered();
        assert_eq!(next.len(), 1);
        assert_eq!(f.name(&next[0].1), (0, 5));
        assert_eq!(f.pool.queue_depth(), 0);
    }

    /// Prefetch takes waiting jobs for a busy worker, charged to their connections as
    /// workers they hold (the caps count them); promotion and loss release them.
    #[test]
    fn prefetched_jobs_count_as_held_and_are_released_in_turn() {
        let mut limits = no_caps();
        limits.max_per_connection = Some(2);
        let mut f = fixture(1, 2, &[], limits);
        let gen = f.links[0].0;
        for s in 1..=4 {
            f.submit(0, s);
        }
        f.submit(1, 1);
        assert_eq!(f.delivered().len(), 1, "the one worker runs A's first");
        // B holds no worker: its job goes behind first. A holds one worker and may hold
        // two: its second goes behind next; then A is at its cap.
        let b1 = f.pool.prefetch(0, gen).expect("B's first");
        assert_eq!(f.name(&b1), (1, 1));
        let a2 = f.pool.prefetch(0, gen).expect("A's second");
        assert_eq!(f.name(&a2), (0, 2));
        assert!(f.pool.prefetch(0, gen).is_none(), "A is at its cap, B has nothing more");
        assert_eq!(f.pool.view().1[0].pipeline, 3);
        assert_eq!(f.pool.outstanding(), Some(2 + 1 + 2), "queued + running + ahead");
        // The running one ends: A's second runs now, and A may have one more behind it.
        assert!(f.pool.promote(0, gen, true));
        let a3 = f.pool.prefetch(0, gen).expect("A's third");
        assert_eq!(f.name(&a3), (0, 3));
        assert_eq!(f.pool.view().1[0].pipeline, 3);
        // One taken back (e.g. cancelled) from the middle: its holder is free again.
        f.pool.unprefetch_at(0, gen, 0);
        assert_eq!(f.pool.view().1[0].pipeline, 2);
        // The worker dies: everything it held is released; nothing is lost from the queue.
        f.pool.kill(0, gen, "test");
        assert_eq!(f.pool.queue_depth(), 1, "A's fourth still waits");
        assert_eq!(f.pool.outstanding(), None, "no worker registered");
    }

    /// Nothing is written ahead to a worker that is to retire or serves an old target, and
    /// promotion says to take back what is ahead then.
    #[test]
    fn no_prefetch_for_a_retiring_or_retargeted_worker() {
        let mut f = fixture(1, 1, &[], no_caps());
        let gen = f.links[0].0;
        for s in 1..=4 {
            f.submit(0, s);
        }
        assert_eq!(f.delivered().len(), 1);
        assert!(f.pool.prefetch(0, gen).is_some());
        f.pool.quit_requested(0, gen);
        assert!(f.pool.prefetch(0, gen).is_none(), "retiring: it gets no more");
        assert!(f.pool.promote(0, gen, true), "what it has it may still serve");
        f.pool.set_target("other", settings("other"));
        assert!(!f.pool.promote(0, gen, true), "re-targeted: take back what is ahead");
        assert!(f.pool.prefetch(0, gen).is_none());
    }

    /// Growing the pool grows the default cap: an idle worker takes a capped job.
    #[test]
    fn resize_lifts_the_default_cap() {
        let mut limits = no_caps();
        limits.max_per_connection = None;
        let mut f = fixture(4, 1, &[], limits);
        for s in 1..=5 {
            f.submit(0, s);
        }
        assert_eq!(f.delivered().len(), 3);
        f.pool.resize(8);
        let more = f.delivered();
        assert_eq!(more.len(), 1, "the idle worker took a job under the larger cap");
        assert_eq!(f.pool.queue_depth(), 1);
        assert_eq!(f.pool.view().0.max_per_connection, 6);
    }

    /// A token's connections together hold at most max_per_token workers.
    #[test]
    fn a_token_holds_at_most_its_cap() {
        let mut limits = no_caps();
        limits.max_per_token = 2;
        let mut f = fixture(4, 3, &[0, 0, 1], limits);
        f.submit(0, 1);
        f.submit(1, 1);
        f.submit(1, 2);
        assert_eq!(f.delivered().len(), 2);
        assert_eq!(f.pool.queue_depth(), 1);
        f.submit(2, 1);
        assert_eq!(f.delivered().len(), 1, "token 1 is under its cap");
        assert_eq!(f.pool.idle_count(), 1);
    }

    /// A job given back by a link whose worker died goes ahead of its connection's
    /// later jobs, and its connection first in line (its turn had come).
    #[test]
    fn requeued_job_goes_first_in_its_connection() {
        let mut f = fixture(1, 2, &[], no_caps());
        f.submit(0, 1);
        let (_, first) = f.delivered().pop().expect("delivered");
        f.submit(0, 2);
        f.submit(1, 1);
        // The worker vanished before the job reached it.
        f.pool.link_lost(0, f.links[0].0, "test", false);
        assert!(f.pool.requeue(first).is_ok());
        assert_eq!(f.pool.queue_depth(), 3);
        let Spawn::Go(generation) = f.pool.begin_spawn(0) else {
            panic!("respawn")
        };
        let (jobs, rx) = mpsc::channel(LINK_JOBS);
        f.links[0] = (generation, rx);
        let link = WorkerLink {
            jobs,
            quit: CancellationToken::new(),
        };
        assert!(f.pool.worker_ready(0, generation, link, 9));
        let got = f.delivered();
        assert_eq!(f.name(&got[0].1), (0, 1));
        assert_eq!(f.done(0), Some((1, 1)));
        assert_eq!(f.done(0), Some((0, 2)));
    }

    /// Issue 20: four connections keep every worker busy with queued jobs behind; a
    /// fifth that holds no worker gets the next one that comes free, whatever its place
    /// in line, at each of its requests; and so does a job of it taken back from a
    /// worker before it ran.
    #[test]
    fn a_connection_holding_no_worker_gets_the_next_free_one() {
        let mut f = fixture(4, 5, &[], no_caps());
        for s in 1..=8 {
            for c in 0..4 {
                f.submit(c, s);
            }
        }
        let running = f.delivered();
        assert_eq!(running.len(), 4);
        for round in 0..4u32 {
            f.submit(4, 100 + round);
            // The flooders' workers come free in turn; the first one serves the newcomer.
            let slot = running[round as usize].0;
            assert_eq!(f.done(slot), Some((4, 100 + round)), "round {round}");
            // Its job ends; the worker goes back to the flooders.
            assert!(matches!(f.done(slot), Some((c, _)) if c < 4));
        }
        // Taken back from behind a busy worker: first again at the next free one.
        f.submit(4, 200);
        let gen = f.links[0].0;
        let job = f.pool.prefetch(0, gen).expect("the newcomer's job goes behind");
        assert_eq!(f.name(&job), (4, 200));
        f.pool.unprefetch_at(0, gen, 0);
        assert!(f.pool.requeue(job).is_ok());
        assert_eq!(f.done(1), Some((4, 200)));
    }

    /// A connection in line behind others, whose worker comes free meanwhile, moves up
    /// to the first class (it holds none now) without losing its later turn.
    #[test]
    fn a_connection_whose_worker_comes_free_moves_up() {
        let mut f = fixture(2, 3, &[], no_caps());
        f.submit(0, 1); // A runs
        f.submit(1, 1); // B runs
        f.submit(0, 2); // A waits, holding one: second class
        f.submit(1, 2); // B too, behind A
        f.submit(2, 1); // C holds none: first class
        let running = f.delivered();
        let slot_of = |conn: usize| running.iter().find(|(_, j)| f.name(j).0 == conn).unwrap().0;
        let (a, b) = (slot_of(0), slot_of(1));
        // B's worker ends: C first (it held none before B did); then B, which holds none
        // now, ahead of A, which still does.
        assert_eq!(f.done(b), Some((2, 1)));
        assert_eq!(f.done(b), Some((1, 2)));
        assert_eq!(f.done(a), Some((0, 2)));
        assert_eq!(f.done(a), None);
        assert_eq!(f.done(b), None);
        assert_eq!(f.pool.queue_depth(), 0);
    }

    /// Issue 20: a connection whose last request held its worker for `HEAVY` gets nothing
    /// written behind its requests, and its own are not written behind another's; it
    /// keeps its turn for the next free worker.
    #[test]
    fn nothing_is_prefetched_behind_or_for_a_heavy_connection() {
        let mut f = fixture(2, 2, &[], no_caps());
        f.submit(0, 1);
        let (a_slot, _) = f.delivered().pop().expect("A runs");
        std::thread::sleep(crate::pool::wait_queue::HEAVY + Duration::from_millis(10));
        assert_eq!(f.done(a_slot), None, "A's first held its worker past HEAVY");
        f.submit(0, 2); // A runs again, on an idle worker
        f.submit(1, 1); // B too
        let running = f.delivered();
        let slot_of = |conn: usize| running.iter().find(|(_, j)| f.name(j).0 == conn).unwrap().0;
        let (a, b) = (slot_of(0), slot_of(1));
        f.submit(0, 3); // A waits, first in line
        f.submit(1, 2); // B waits behind it
        assert!(
            f.pool.prefetch(a, f.links[a as usize].0).is_none(),
            "nothing behind A's request"
        );
        assert!(
            f.pool.prefetch(b, f.links[b as usize].0).is_none(),
            "A's request is not written behind B's"
        );
        assert_eq!(f.pool.queue_depth(), 2);
        // B's worker comes free: B, light and holding none now, goes first; A, heavy,
        // kept its place in the other class and is next.
        assert_eq!(f.done(b), Some((1, 2)));
        assert_eq!(f.done(a), Some((0, 3)));
        // A's second was short: A is light again, and what waits may go behind its third.
        f.submit(1, 3);
        let ahead = f
            .pool
            .prefetch(a, f.links[a as usize].0)
            .expect("B's third goes behind A's");
        assert_eq!(f.name(&ahead), (1, 3));
    }

    #[test]
    fn cancel_and_close_take_waiting_jobs() {
        let mut f = fixture(1, 2, &[], no_caps());
        f.submit(0, 1);
        for s in 2..=4 {
            f.submit(0, s);
        }
        f.submit(1, 1);
        f.delivered();
        assert_eq!(f.pool.take_waiting(f.conns[0].0.id, 3).map(|j| j.stream()), Some(3));
        assert_eq!(f.pool.take_waiting_conn(f.conns[0].0.id).len(), 2);
        assert_eq!(f.pool.queue_depth(), 1);
        let (view, _) = f.pool.view();
        assert_eq!(view.waiting_connections, 1);
        assert_eq!(f.done(0), Some((1, 1)));
        assert_eq!(f.done(0), None);
    }

    /// The byte bounds: the whole queue, and each connection's share; a single job
    /// larger than a bound is taken when nothing else waits there.
    #[test]
    fn queue_is_bounded_in_bytes() {
        let mut limits = no_caps();
        limits.bytes = 1000;
        limits.bytes_per_connection = 400;
        let mut f = fixture(1, 3, &[], limits);
        f.submit(0, 1); // runs
        f.delivered();
        assert!(f.pool.submit(f.job_sized(0, 2, 300)).is_ok());
        let e = f.pool.submit(f.job_sized(0, 3, 300)).err().map(|(_, e)| e);
        assert_eq!(e, Some(SubmitError::ConnectionQueueFull));
        assert!(f.pool.submit(f.job_sized(1, 1, 2000)).is_err(), "over the whole bound");
        assert!(f.pool.submit(f.job_sized(1, 2, 400)).is_ok());
        assert!(f.pool.submit(f.job_sized(2, 1, 300)).is_ok());
        let e = f.pool.submit(f.job_sized(2, 2, 1)).err().map(|(_, e)| e);
        assert_eq!(e, Some(SubmitError::QueueFull));
        assert_eq!(f.pool.view().0.queue_bytes, 1000);
        // Alone in an empty queue, a job larger than both bounds waits all the same.
        f.pool.take_waiting_conn(f.conns[0].0.id);
        f.pool.take_waiting_conn(f.conns[1].0.id);
        f.pool.take_waiting_conn(f.conns[2].0.id);
        let (out, rx) = outbox(4, 1 << 30);
        let shared = ClientShared::new(7, out, 4, 0, 1 << 30, Arc::new(Metrics::new()));
        f.conns.push((shared, rx));
        assert!(f.pool.submit(f.job_sized(3, 1, 5000)).is_ok());
        assert_eq!(f.pool.queue_depth(), 1);
    }

    /// The hold ends with the member it was on (the primary came back, no failover):
    /// slot tasks backing off after their workers failed to connect must wake, or writes
    /// wait out the back-off (up to respawn_backoff_max_ms, beyond queue_timeout_ms).
    #[test]
    fn end_of_hold_wakes_slots_backing_off() {
        let f = fixture(1, 1, &[], no_caps());
        let mut target = f.pool.target_changes();
        target.borrow_and_update();
        f.pool.hold("primary m is down".into());
        f.pool.set_target("m", settings("m"));
        assert!(
            target.has_changed().unwrap(),
            "slot tasks not woken at the end of the hold"
        );
        // Not on every call with nothing to end (the follower calls it on every wake-up).
        target.borrow_and_update();
        f.pool.set_target("m", settings("m"));
        assert!(!target.has_changed().unwrap());
        // And at the end of "every member is down".
        f.pool.set_unavailable("every member is down".into());
        f.pool.set_target("m", settings("m"));
        assert!(target.has_changed().unwrap(), "not woken after unavailable");
    }

    /// Every member is down: a job given back by a link whose worker vanished before it
    /// got it fails at once (BACKEND_UNAVAILABLE, not dispatched) like every waiting one,
    /// instead of waiting out its queue deadline behind the hold.
    #[test]
    fn requeue_while_unavailable_fails_at_once() {
        let mut f = fixture(1, 1, &[], no_caps());
        f.submit(0, 1);
        let (_, job) = f.delivered().pop().expect("delivered");
        f.pool.set_unavailable("every member is down".into());
        f.pool.link_lost(0, f.links[0].0, "test", true);
        let e = f.pool.requeue(job).err().map(|(_, e)| e);
        assert_eq!(e, Some(SubmitError::Unavailable));
        assert_eq!(f.pool.queue_depth(), 0);
    }

    /// A re-target that falls between `begin_spawn` and `set_pid` (the fork) finds the
    /// slot without a pid, so it sends no kill; the process it is about to get was
    /// started for the old member and must be killed when its pid is known, not left to
    /// connect to the old member for up to register + connect timeout.
    #[test]
    fn retarget_during_spawn_kills_the_new_process() {
        let f = fixture(1, 0, &[], no_caps());
        let (kill, mut kill_rx) = mpsc::unbounded_channel();
        f.pool.add_slot(7, kill);
        let Spawn::Go(generation) = f.pool.begin_spawn(7) else {
            panic!("spawn")
        };
        f.pool.set_target("n", settings("n"));
        assert!(kill_rx.try_recv().is_err(), "no process to kill yet");
        f.pool.set_pid(7, generation, 4242);
        assert!(kill_rx.try_recv().is_ok(), "stale process not killed");
        // A process of the current target is left alone.
        let Spawn::Go(generation) = f.pool.begin_spawn(7) else {
            panic!("respawn")
        };
        f.pool.set_pid(7, generation, 4243);
        assert!(kill_rx.try_recv().is_err());
    }

    // Following the primary: paths a review found right, kept as regression tests.

    /// A hold ended by `set_target` with the same member hands the waiting jobs to the
    /// workers that went idle during it.
    #[test]
    fn the_end_of_a_hold_dispatches_what_waited() {
        let mut f = fixture(2, 1, &[], no_caps());
        f.submit(0, 1);
        let (busy, _) = f.delivered().pop().expect("delivered");
        f.pool.hold("switch in progress".into());
        for s in 2..=4 {
            f.submit(0, s);
        }
        assert_eq!(f.done(busy), None, "no dispatch during the hold");
        assert!(f.delivered().is_empty());
        assert_eq!((f.pool.queue_depth(), f.pool.idle_count()), (3, 2));
        f.pool.set_target("m", settings("m"));
        assert_eq!(f.delivered().len(), 2);
        assert_eq!(f.pool.queue_depth(), 1);
    }

    /// A new member: the idle worker is told to quit at once, the busy one after its
    /// response, and a worker spawned for the old member that registers late is told
    /// to quit and gets no job.
    #[test]
    fn a_new_target_retires_old_workers() {
        let mut f = fixture(2, 1, &[], no_caps());
        f.submit(0, 1);
        let (busy, _) = f.delivered().pop().expect("delivered");
        let (kill, _kill_rx) = mpsc::unbounded_channel();
        f.pool.add_slot(9, kill);
        let Spawn::Go(late) = f.pool.begin_spawn(9) else {
            panic!("spawn")
        };
        let idle_quit = CancellationToken::new();
        // (Re-register the idle worker with a quit token the test can see.)
        let idle = 1 - busy;
        f.pool.kill(idle, f.links[idle as usize].0, "test");
        let Spawn::Go(generation) = f.pool.begin_spawn(idle) else {
            panic!("respawn")
        };
        let (jobs, rx) = mpsc::channel(LINK_JOBS);
        f.links[idle as usize] = (generation, rx);
        let link = WorkerLink {
            jobs,
            quit: idle_quit.clone(),
        };
        assert!(f.pool.worker_ready(idle, generation, link, 1));

        f.pool.set_target("n", settings("n"));
        assert!(idle_quit.is_cancelled(), "idle worker not told to quit");
        assert!(matches!(
            f.pool.next_job(busy, f.links[busy as usize].0, true),
            Next::Quit
        ));
        let (jobs, mut late_rx) = mpsc::channel(LINK_JOBS);
        let late_quit = CancellationToken::new();
        let link = WorkerLink {
            jobs,
            quit: late_quit.clone(),
        };
        assert!(f.pool.worker_ready(9, late, link, 2));
        assert!(
            late_quit.is_cancelled(),
            "late worker of the old member not told to quit"
        );
        f.submit(0, 2);
        assert!(late_rx.try_recv().is_err());
        assert!(f.delivered().is_empty());
        assert_eq!(f.pool.queue_depth(), 1);
        let (view, _) = f.pool.view();
        assert_eq!((view.quitting, view.idle, view.busy), (3, 0, 0));
    }

    /// Unavailable: waiting requests fail at once and new ones are refused.
    #[test]
    fn unavailable_fails_waiting_and_new_requests() {
        let f = fixture(1, 1, &[], no_caps());
        f.submit(0, 1);
        f.submit(0, 2);
        f.submit(0, 3);
        assert_eq!(f.pool.queue_depth(), 2);
        f.pool.set_unavailable("every member is down".into());
        assert_eq!(f.pool.queue_depth(), 0);
        let e = f.pool.submit(f.job(0, 4)).err().map(|(_, e)| e);
        assert_eq!(e, Some(SubmitError::Unavailable));
        // A member is back, but not the primary: requests wait again.
        f.pool.hold("primary m is down".into());
        f.submit(0, 5);
        assert_eq!(f.pool.queue_depth(), 1);
    }

    /// Two groups share the gauges: each adds its own counts.
    #[test]
    fn gauges_add_up_over_groups() {
        let metrics = Arc::new(Metrics::new());
        let groups: Vec<_> = (0..2)
            .map(|g| Pool::with_base(g, 0, no_caps(), format!("c{g}"), metrics.clone()))
            .collect();
        for (g, pool) in groups.iter().enumerate() {
            pool.set_target("m", settings("m"));
            for index in pool.resize(2 + g) {
                assert!(pool.owns(index) && index / GROUP_SLOTS == g as u32);
                let (kill, _) = mpsc::unbounded_channel();
                pool.add_slot(index, kill);
            }
        }
        let starting = metrics.slot_state(SlotState::Starting.name());
        assert_eq!(starting.get(), 5);
        let (kill, _) = mpsc::unbounded_channel();
        let generation = groups[1].add_slot(GROUP_SLOTS, kill);
        let (jobs, _rx) = mpsc::channel(LINK_JOBS);
        let link = WorkerLink {
            jobs,
            quit: CancellationToken::new(),
        };
        assert!(groups[1].worker_ready(GROUP_SLOTS, generation, link, 1));
        assert_eq!(starting.get(), 4);
        assert_eq!(metrics.slot_state(SlotState::Idle.name()).get(), 1);
        groups[0].hold("h".into());
        let (out, _inbox) = outbox(4, 1 << 30);
        let shared = ClientShared::new(1, out, 4, 0, 1 << 30, metrics.clone());
        groups[0].open_conn(1, 0);
        let (guard, cancel) = shared.open(1).expect("stream");
        let received = Instant::now();
        let job = Job {
            guard,
            cancel,
            frame: Frame {
                kind: Kind::Request,
                flags: 0,
                stream: 1,
                payload: Bytes::from_static(b"x"),
            },
            timeout: None,
            received,
            queue_deadline: received + Duration::from_secs(60),
            attempts: 0,
            digest: None,
        };
        assert!(groups[0].submit(job).is_ok());
        assert_eq!(metrics.queue_depth.get(), 1);
        groups[1].shutdown();
        assert_eq!(
            metrics.queue_depth.get(),
            1,
            "another group's shutdown keeps this queue"
        );
        groups[0].shutdown();
        assert_eq!(metrics.queue_depth.get(), 0);
    }

    /// Jobs past their queue deadline fail (QUEUE_TIMEOUT), in every connection.
    #[tokio::test]
    async fn reaper_expires_jobs_of_every_connection() {
        let mut f = fixture(1, 3, &[], no_caps());
        f.submit(0, 1);
        f.delivered();
        let soon = Instant::now() + Duration::from_millis(20);
        for (conn, stream) in [(0, 2), (1, 1), (2, 1), (1, 2)] {
            let mut j = f.job(conn, stream);
            j.queue_deadline = soon;
            assert!(f.pool.submit(j).is_ok());
        }
        f.submit(2, 2); // a deadline a minute away
        let reaper = tokio::spawn(f.pool.clone().run_reaper());
        let t0 = Instant::now();
        while f.pool.queue_depth() > 1 {
            assert!(t0.elapsed() < Duration::from_secs(5), "jobs not expired");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        reaper.abort();
        assert_eq!(f.done(0), Some((2, 2)));
        // Each expired job got its ERROR QUEUE_TIMEOUT.
        for (conn, want) in [(0usize, 1usize), (1, 2), (2, 1)] {
            let rx = &mut f.conns[conn].1;
            let mut errors = 0;
            let t0 = Instant::now();
            while errors < want && t0.elapsed() < Duration::from_secs(5) {
                match rx.try_recv().map(|q| q.frame) {
                    // (Jobs the test drops itself end with INTERNAL.)
                    Some(fr) if fr.kind == Kind::Error => {
                        let body: osprey_protocol::ErrorBody = fr.body().expect("ERROR body");
                        errors += usize::from(body.code == ErrorCode::QueueTimeout);
                    }
                    Some(_) => {}
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            assert_eq!(errors, want, "connection {conn}");
        }
        assert!(!f.conns[0].0.closed.load(Ordering::Relaxed));
    }

    /// After kill -9 of the primary, each idle worker still holds a dead session: without
    /// this, the next requests would meet them one by one, each ending outcome-unknown.
    #[test]
    fn a_lost_session_retires_the_other_idle_sessions_of_its_member() {
        let mut f = fixture(3, 1, &[], no_caps());
        f.submit(0, 1);
        let (slot, _job) = f.delivered().pop().expect("delivered");
        f.pool.session_lost(slot, f.links[slot as usize].0);
        let (view, _) = f.pool.view();
        assert_eq!((view.idle, view.busy, view.quitting), (0, 1, 2), "{view:?}");
        // The next request waits for a fresh worker instead of meeting a dead session.
        f.submit(0, 2);
        assert!(f.delivered().is_empty());
        assert_eq!(f.pool.queue_depth(), 1);
    }

    /// A request in flight on a primary that failed over (killed or cut off) is never
    /// answered by it: its worker is killed so that the request ends now (WORKER_LOST),
    /// not at request_timeout.
    #[test]
    fn abandoning_a_member_kills_its_busy_workers_only() {
        let mut f = fixture(3, 1, &[], no_caps());
        f.submit(0, 1);
        assert_eq!(f.delivered().len(), 1);
        let kills = f.pool.metrics.worker_kills.get();
        f.pool.abandon_member("other");
        assert_eq!(f.pool.view().0.busy, 1, "another member's name abandons nothing");
        f.pool.abandon_member("m");
        let (view, _) = f.pool.view();
        assert_eq!((view.busy, view.idle, view.starting), (0, 2, 1), "{view:?}");
        assert_eq!(f.pool.metrics.worker_kills.get(), kills + 1);
    }
}

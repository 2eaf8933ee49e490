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
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use osprey_protocol::WorkerSettings;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pool::wait_queue::{Holder, QueueLimits, WaitQueue};
use crate::request::job::Job;
use crate::request::session::SessionGate;

mod assign;
mod slots;
mod target;
mod view;

pub use view::{PoolView, SlotState, SlotView};

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

/// What a slot task does next (see [`SlotGroup::begin_spawn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spawn {
    /// Start a process of this generation.
    Go(u64),
    /// The group has no target yet: wait for one ([`SlotGroup::target_changes`]).
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

/// One slot group: the write slots of a cluster, or the read slots of one of its
/// members (read/write split). The single owner of its slots, idle stack and queue.
pub struct SlotGroup {
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
    /// The cluster whose primary (write group) or member (read group) the workers serve.
    cluster: String,
    /// A read group: the member whose read slots these are.
    reads: Option<String>,
    /// A read group: where its waiting requests go when it stops serving (the cluster's
    /// write group), so that a read that never reached a worker moves on instead of
    /// failing.
    fallback: Mutex<Option<Arc<SlotGroup>>>,
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
    /// The shared `osprey_slots{state}` gauges, each looked up at its first change.
    state_gauges: [OnceLock<Gauge>; 4],
    published_depth: AtomicI64,
    /// The sessions that pin (or are on their way to pin) this group's workers.
    pub sessions: Arc<SessionGate>,
    /// The database server's version as its last ready worker saw it (`READY`), which
    /// the MySQL front end's greeting shows.
    pub server_version: Mutex<Option<String>>,
    /// Bumped whenever the group stops dispatching (a hold, or unavailable): a pinned
    /// worker's session ends rather than keep a switchover waiting.
    hold_tx: watch::Sender<u64>,
}

impl SlotGroup {
    pub fn new(target_size: usize, limits: QueueLimits, cluster: String, metrics: Arc<Metrics>) -> Arc<SlotGroup> {
        SlotGroup::with_base(0, target_size, limits, cluster, metrics)
    }

    /// Group number `group` (its slot ids start at `group * GROUP_SLOTS`).
    pub fn with_base(
        group: u32,
        target_size: usize,
        limits: QueueLimits,
        cluster: String,
        metrics: Arc<Metrics>,
    ) -> Arc<SlotGroup> {
        SlotGroup::build(group, target_size, limits, cluster, None, metrics)
    }

    /// Group number `group`: the read slots of `member` (empty until its follower sizes it).
    pub fn read_group(
        group: u32,
        limits: QueueLimits,
        cluster: String,
        member: String,
        metrics: Arc<Metrics>,
    ) -> Arc<SlotGroup> {
        SlotGroup::build(group, 0, limits, cluster, Some(member), metrics)
    }

    fn build(
        group: u32,
        target_size: usize,
        limits: QueueLimits,
        cluster: String,
        reads: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Arc<SlotGroup> {
        Arc::new(SlotGroup {
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
            state_gauges: Default::default(),
            published_depth: AtomicI64::new(0),
            sessions: Arc::default(),
            server_version: Mutex::default(),
            hold_tx: watch::channel(0).0,
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
    pub fn set_fallback(&self, fallback: Arc<SlotGroup>) {
        *self.fallback.lock().unwrap_or_else(|e| e.into_inner()) = Some(fallback);
    }

    pub fn fallback(&self) -> Option<Arc<SlotGroup>> {
        self.fallback.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests;

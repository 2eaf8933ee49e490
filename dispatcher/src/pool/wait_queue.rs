//! The requests waiting for a worker, served fairly: one FIFO per client connection,
//! connections grouped by the client token they authenticated with, and a worker that
//! becomes free takes the next job round-robin over tokens, then over that token's
//! connections. A connection (and a token) may also hold only so many workers at once:
//! its jobs past that cap wait in its queue until one of its own workers is free, so a
//! connection with a thousand slow streams cannot take the workers every other
//! connection needs.
//!
//! Turns come in two classes ([`Turns`]): a connection that holds no worker when it is
//! put in line, and whose last request held its worker for less than [`HEAVY`], is
//! served before every other (a token: one that holds no worker). Round-robin alone put
//! a newcomer behind each flooder in line: with four connections keeping every worker
//! busy with slow statements, it waited for four of them to come free (0.6-1.7 s), and a
//! request taken back from behind a slow one lost its place each time (issue 20). A
//! client with one short request at a time holds none when it asks, so it gets the next
//! free worker; connections that hold workers, or have just held one for long, share the
//! rest in turn.
//!
//! Everything the hot path does here is O(1): a job is appended to its connection's
//! queue, and taking one pops a ring entry or two. The wait queue lives inside the
//! slot group's lock (see `pool/group/`); it owns no workers, only the bookkeeping of who holds
//! how many.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use crate::request::job::Job;

/// Hashes connection ids. They come from the dispatcher's own counter (never from a
/// client), so a multiplicative hash is safe and much cheaper than SipHash on the path
/// of every request.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A request that held its worker this long makes its connection wait in the second
/// class next time, even when it holds no worker then: a connection of slow statements
/// that lost its last worker does not go ahead of one that asks for a moment.
pub const HEAVY: Duration = Duration::from_millis(50);

/// How long a request held its worker, as the rule of [`HEAVY`] judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// It never ran there (skipped, or taken back before the worker got to it): the
    /// connection's last judgement stands.
    NotRun,
    /// The worker's own measure of the request (END's `server_time_us`: the statement
    /// and its rows). What the dispatcher adds does not count: an END it read late
    /// because the machine stalled it, or the wait of a request written behind another
    /// on the same worker. Judged by the wall clock, one stall of a `SELECT 1` made its
    /// connection heavy, and its next request waited behind every flooder in turn.
    Ran(Duration),
    /// No measure from the worker (it was lost, a cancelled statement drained, a session
    /// ended): the time since the request became the worker's current one.
    SinceStart,
}

/// Keys waiting for their turn, in two FIFO classes: those that held no worker when they
/// were put in line, then the others. An owner is in each class at most once (its
/// [`InLine`] says where); an entry whose owner has nothing to serve any more is skipped
/// when it comes up.
struct Turns<K> {
    first: VecDeque<K>,
    rest: VecDeque<K>,
}

impl<K: Copy> Default for Turns<K> {
    fn default() -> Turns<K> {
        Turns {
            first: VecDeque::new(),
            rest: VecDeque::new(),
        }
    }
}

impl<K: Copy> Turns<K> {
    /// Puts `key` in line, in the `first` class or the other, unless `line` says it is
    /// there already; one for the first class joins it even when it waits in the other
    /// (its worker came free since). Returns whether it was added.
    fn push(&mut self, key: K, line: &mut InLine, first: bool) -> bool {
        if first && !line.first {
            line.first = true;
            self.first.push_back(key);
            true
        } else if !first && !line.first && !line.rest {
            line.rest = true;
            self.rest.push_back(key);
            true
        } else {
            false
        }
    }

    /// Puts `key` first in its class (moved there if it waits further back in it): a job
    /// taken back from a worker, through no fault of its owner, keeps the turn it had.
    /// O(keys in line) to find it: on the path of a lost worker or a taken-back request
    /// only.
    fn push_front(&mut self, key: K, line: &mut InLine, first: bool)
    where
        K: PartialEq,
    {
        let (class, there) = if first || line.first {
            (&mut self.first, &mut line.first)
        } else {
            (&mut self.rest, &mut line.rest)
        };
        if *there {
            if let Some(at) = class.iter().position(|k| *k == key) {
                class.remove(at);
            }
        }
        *there = true;
        class.push_front(key);
    }

    /// The next key; the caller clears the class it came from in its [`InLine`]. The
    /// second class is served only when the first is empty, so a key taken from it is
    /// never in the first one too.
    fn pop(&mut self) -> Option<(K, bool)> {
        if let Some(k) = self.first.pop_front() {
            return Some((k, true));
        }
        self.rest.pop_front().map(|k| (k, false))
    }

    fn is_empty(&self) -> bool {
        self.first.is_empty() && self.rest.is_empty()
    }

    fn len(&self) -> usize {
        self.first.len() + self.rest.len()
    }

    fn clear(&mut self) {
        self.first.clear();
        self.rest.clear();
    }

    fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.first.retain(&mut keep);
        self.rest.retain(&mut keep);
    }
}

/// Where an owner waits in its [`Turns`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct InLine {
    first: bool,
    rest: bool,
}

impl InLine {
    fn any(self) -> bool {
        self.first || self.rest
    }

    fn count(self) -> usize {
        usize::from(self.first) + usize::from(self.rest)
    }

    fn left(&mut self, first: bool) {
        if first {
            self.first = false;
        } else {
            self.rest = false;
        }
    }
}

/// Bounds and caps of the wait queue (`[pool]` keys in docs/CONFIG.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Jobs waiting, all connections together.
    pub capacity: usize,
    /// Bytes of REQUEST payload waiting, all connections together.
    pub bytes: usize,
    /// Bytes of REQUEST payload waiting, per connection.
    pub bytes_per_connection: usize,
    /// Workers one connection may hold at once: None = the default share of the pool
    /// ([`default_connection_cap`]); Some(0) = no cap.
    pub max_per_connection: Option<usize>,
    /// Workers the connections of one client token may hold together; 0 = no cap.
    pub max_per_token: usize,
}

impl QueueLimits {
    /// `capacity` jobs, generous byte bounds, no caps: for benchmarks and tests.
    pub fn uncapped(capacity: usize) -> QueueLimits {
        QueueLimits {
            capacity,
            bytes: usize::MAX,
            bytes_per_connection: usize::MAX,
            max_per_connection: Some(0),
            max_per_token: 0,
        }
    }
}

/// The default cap of one connection for a pool of `size`: three quarters of the pool,
/// rounded down, so that at least a quarter of it (and at least one worker from a size
/// of 2 up) stays for the other connections. A pool of one cannot keep a worker back.
pub fn default_connection_cap(size: usize) -> usize {
    size.saturating_sub(size.div_ceil(4)).max(1)
}

/// Who holds a busy worker: the connection (and its token) whose job it runs, since when
/// (since it was picked; for a job written behind another, since it became the worker's
/// current one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub conn: u64,
    pub tenant: u32,
    pub since: Instant,
}

/// Why a job could not join the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The whole queue is at `capacity` or `bytes`.
    Queue,
    /// The connection's own queue is at `bytes_per_connection`.
    Connection,
}

struct ConnQueue {
    tenant: u32,
    jobs: VecDeque<Job>,
    /// REQUEST payload bytes of `jobs`.
    bytes: usize,
    /// Workers running this connection's jobs.
    held: usize,
    /// Where it waits in its tenant's turns.
    line: InLine,
    /// Its last request that ran held a worker for [`HEAVY`] or longer ([`Held`]).
    heavy: bool,
}

impl ConnQueue {
    /// Whether it goes in line in the first class (see the module's doc).
    fn first_class(&self) -> bool {
        self.held == 0 && !self.heavy
    }

    fn new(tenant: u32) -> ConnQueue {
        ConnQueue {
            tenant,
            jobs: VecDeque::new(),
            bytes: 0,
            held: 0,
            line: InLine::default(),
            heavy: false,
        }
    }
}

#[derive(Default)]
struct Tenant {
    /// Connections that had a job to serve when they were put here, served in turn.
    /// An entry whose connection closed or has nothing to serve any more is skipped
    /// when it comes up ("stale").
    ring: Turns<u64>,
    /// Entries of `ring` whose connection closed; the ring is compacted when they are
    /// the larger part.
    closed: usize,
    held: usize,
    /// Where it waits in the queue's turns of tenants.
    line: InLine,
}

/// Figures for the admin view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueFigures {
    pub jobs: usize,
    pub bytes: usize,
    /// Connections with at least one job waiting.
    pub waiting_connections: usize,
    /// Of those, the connections that hold their cap of workers (their jobs wait for
    /// one of their own workers, not for any).
    pub capped_connections: usize,
    /// Jobs waiting in the longest connection queue.
    pub longest_connection_queue: usize,
    /// How long the job that has waited longest has waited so far (zero: none waits).
    pub longest_wait: Duration,
    /// The per-connection cap in force (0 = none).
    pub max_per_connection: usize,
}

pub struct WaitQueue {
    limits: QueueLimits,
    /// Per-connection cap in force (usize::MAX = none): derived from the pool size
    /// unless configured.
    conn_cap: usize,
    token_cap: usize,
    conns: IdMap<ConnQueue>,
    /// Indexed by tenant (the index of the client token in `auth.client_tokens`).
    tenants: Vec<Tenant>,
    /// Tenants with a connection to serve, in turn.
    ring: Turns<u32>,
    /// (queue deadline, connection) of waiting jobs, oldest first: the reaper's index.
    /// A job that left the queue otherwise leaves its entry behind until it is due or
    /// the index is rebuilt (it is bounded: see [`WaitQueue::push_back`]).
    timeline: VecDeque<(Instant, u64)>,
    jobs: usize,
    bytes: usize,
    waiting_conns: usize,
}

fn cap(n: usize) -> usize {
    if n == 0 {
        usize::MAX
    } else {
        n
    }
}

impl WaitQueue {
    pub fn new(limits: QueueLimits, pool_size: usize) -> WaitQueue {
        let mut q = WaitQueue {
            limits,
            conn_cap: usize::MAX,
            token_cap: usize::MAX,
            conns: IdMap::default(),
            // Tenant 0 always exists: connections never registered count as it.
            tenants: vec![Tenant::default()],
            ring: Turns::default(),
            timeline: VecDeque::new(),
            jobs: 0,
            bytes: 0,
            waiting_conns: 0,
        };
        q.set_limits(limits, pool_size);
        q
    }

    /// New bounds and caps, or a new pool size (the default cap follows it). Caps that
    /// grew let connections that were at their cap be served again.
    pub fn set_limits(&mut self, limits: QueueLimits, pool_size: usize) {
        self.limits = limits;
        self.conn_cap = match limits.max_per_connection {
            None => default_connection_cap(pool_size),
            Some(n) => cap(n),
        };
        self.token_cap = cap(limits.max_per_token);
        let ids: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.jobs.is_empty() && !c.line.any())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.ring_conn(id);
        }
        for t in 0..self.tenants.len() {
            self.ring_tenant(t as u32);
        }
    }

    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// A client connection authenticated with the token of index `tenant`. Until it
    /// closes ([`WaitQueue::take_conn`]) its jobs count against that token. A
    /// connection never registered counts as tenant 0.
    pub fn register(&mut self, conn: u64, tenant: u32) {
        self.tenant(tenant);
        self.conns.entry(conn).or_insert_with(|| ConnQueue::new(tenant)).tenant = tenant;
    }

    /// The tenant of a registered connection (0 if unknown).
    pub fn tenant_of(&self, conn: u64) -> u32 {
        self.conns.get(&conn).map_or(0, |c| c.tenant)
    }

    fn tenant(&mut self, tenant: u32) -> &mut Tenant {
        let i = tenant as usize;
        if self.tenants.len() <= i {
            self.tenants.resize_with(i + 1, Tenant::default);
        }
        &mut self.tenants[i]
    }

    fn conn(&mut self, conn: u64) -> &mut ConnQueue {
        self.conns.entry(conn).or_insert_with(|| ConnQueue::new(0))
    }

    /// The job of `conn` may go to an idle worker at once: nothing of its connection
    /// waits before it and neither the connection nor its token is at its cap. The
    /// holder to charge once a worker took it ([`WaitQueue::charge`]).
    pub fn may_run_now(&mut self, conn: u64) -> Option<Holder> {
        let (conn_cap, token_cap) = (self.conn_cap, self.token_cap);
        let c = self.conn(conn);
        if !c.jobs.is_empty() || c.held >= conn_cap {
            return None;
        }
        let tenant = c.tenant;
        (self.tenants[tenant as usize].held < token_cap).then(|| Holder {
            conn,
            tenant,
            since: Instant::now(),
        })
    }

    /// A worker took a job of `h`.
    pub fn charge(&mut self, h: Holder) {
        if let Some(c) = self.conns.get_mut(&h.conn) {
            c.held += 1;
        }
        self.tenant(h.tenant).held += 1;
    }

    /// A worker of `h` is free again (its job ended, or the worker is gone), having held
    /// it as `held` says. Returns whether that made a waiting job servable (an idle
    /// worker may then take it).
    pub fn release(&mut self, h: Holder, held: Held) -> bool {
        // A connection that closed meanwhile is forgotten; its token still counts.
        let t = self.tenant(h.tenant);
        t.held = t.held.saturating_sub(1);
        if let Some(c) = self.conns.get_mut(&h.conn) {
            c.held = c.held.saturating_sub(1);
            match held {
                Held::NotRun => {}
                Held::Ran(took) => c.heavy = took >= HEAVY,
                Held::SinceStart => c.heavy = h.since.elapsed() >= HEAVY,
            }
        }
        // Back in line if it waits, or in the first class if it holds no worker now.
        self.ring_conn(h.conn);
        self.ring_tenant(h.tenant);
        !self.ring.is_empty()
    }

    /// Appends a job to its connection's queue. Err: a bound would be passed (a single
    /// job larger than a byte bound is still taken when nothing else is waiting there).
    #[allow(clippy::result_large_err)]
    pub fn push_back(&mut self, job: Job) -> Result<(), (Job, Full)> {
        let size = job.frame.payload.len();
        if self.jobs >= self.limits.capacity || (self.bytes > 0 && self.bytes + size > self.limits.bytes) {
            return Err((job, Full::Queue));
        }
        let (id, deadline) = (job.conn(), job.queue_deadline);
        let (per_conn, conn_cap) = (self.limits.bytes_per_connection, self.conn_cap);
        let c = self.conn(id);
        if c.bytes > 0 && c.bytes + size > per_conn {
            return Err((job, Full::Connection));
        }
        let first = c.jobs.is_empty();
        c.jobs.push_back(job);
        c.bytes += size;
        // In line now that it has a job, unless it is there or capped.
        let ring = first && !c.line.any() && c.held < conn_cap;
        self.jobs += 1;
        self.bytes += size;
        self.waiting_conns += usize::from(first);
        if ring {
            self.ring_conn(id);
        }
        self.timeline.push_back((deadline, id));
        // Entries of jobs that were served meanwhile pile up at high rates: rebuild the
        // index when they outnumber the waiting jobs (amortised O(1) per push).
        if self.timeline.len() > 2 * self.jobs + 64 + self.conns.len() {
            self.rebuild_timeline();
        }
        Ok(())
    }

    /// Puts back a job that was admitted before (its worker vanished before it reached
    /// it): ahead of every job its connection queued after it, whatever the bounds.
    pub fn push_front(&mut self, job: Job) {
        let size = job.frame.payload.len();
        let (id, deadline) = (job.conn(), job.queue_deadline);
        let c = self.conn(id);
        // Deadline order is admission order (one queue_timeout for all): usually 0.
        let at = c.jobs.partition_point(|j| j.queue_deadline <= deadline);
        let first = c.jobs.is_empty();
        c.jobs.insert(at, job);
        c.bytes += size;
        self.jobs += 1;
        self.bytes += size;
        self.waiting_conns += usize::from(first);
        let at = self.timeline.partition_point(|(d, _)| *d <= deadline);
        self.timeline.insert(at, (deadline, id));
        // First in line, as it was when a worker took it.
        let conn_cap = self.conn_cap;
        let c = self.conn(id);
        if c.held < conn_cap {
            let (t, first) = (c.tenant, c.first_class());
            self.tenant(t);
            let Some(c) = self.conns.get_mut(&id) else { return };
            self.tenants[t as usize].ring.push_front(id, &mut c.line, first);
            self.ring_tenant(t);
        }
    }

    /// The next job to serve, round-robin over tokens, then over each token's
    /// connections, skipping those at their cap; its holder is charged.
    pub fn pick(&mut self) -> Option<(Job, Holder)> {
        self.pick_where(false)
    }

    /// [`WaitQueue::pick`] for a worker that is busy (prefetch): None when the connection
    /// whose turn it is was heavy lately and another connection has a job waiting; it
    /// keeps its turn. Its request may run long: written behind another, it could not be
    /// taken back once the worker had sent it to its database, and whoever comes next
    /// would wait for it (issue 20).
    pub fn pick_light(&mut self) -> Option<(Job, Holder)> {
        self.pick_where(true)
    }

    /// Whether the last request of `conn` that ran was heavy ([`Held`]).
    #[cfg(test)]
    pub fn is_heavy(&self, conn: u64) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.heavy)
    }

    /// Whether nothing may be written behind a request of `conn` now: its last request
    /// that ended held its worker for [`HEAVY`] or longer, and another connection has a
    /// job waiting (which would wait behind it). A connection alone in the queue may
    /// still pipeline its own requests.
    pub fn holds_back(&self, conn: u64) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.heavy && self.waiting_conns > usize::from(!c.jobs.is_empty()))
    }

    fn pick_where(&mut self, light_only: bool) -> Option<(Job, Holder)> {
        while let Some((t, tenant_first)) = self.ring.pop() {
            let tenant = &mut self.tenants[t as usize];
            tenant.line.left(tenant_first);
            if tenant.held >= self.token_cap {
                continue; // back in line when one of its workers is free
            }
            while let Some((id, first)) = tenant.ring.pop() {
                let Some(c) = self.conns.get_mut(&id) else {
                    tenant.closed = tenant.closed.saturating_sub(1);
                    continue;
                };
                c.line.left(first);
                if c.held >= self.conn_cap {
                    continue; // back in line when one of its workers is free
                }
                // A job that opens a session pins an idle worker; never one written behind
                // another's request (the link that takes it there would run it as a statement).
                let opens = c.jobs.front().is_some_and(|j| j.opens.is_some());
                if light_only && (opens || c.heavy && !c.jobs.is_empty() && self.waiting_conns > 1) {
                    // Not for a busy worker: it keeps its turn, and so does its tenant.
                    tenant.ring.push_front(id, &mut c.line, first);
                    self.ring.push_front(t, &mut tenant.line, tenant_first);
                    return None;
                }
                let Some(job) = c.jobs.pop_front() else { continue };
                let size = job.frame.payload.len();
                c.bytes -= size;
                c.held += 1;
                let more = !c.jobs.is_empty();
                if more && c.held < self.conn_cap {
                    // It holds a worker now: behind those that hold none.
                    tenant.ring.push(id, &mut c.line, false);
                }
                tenant.held += 1;
                self.jobs -= 1;
                self.bytes -= size;
                self.waiting_conns -= usize::from(!more);
                self.ring_tenant(t);
                let since = Instant::now();
                return Some((
                    job,
                    Holder {
                        conn: id,
                        tenant: t,
                        since,
                    },
                ));
            }
        }
        None
    }

    /// Undoes a [`WaitQueue::pick`] whose job could not be handed over.
    pub fn unpick(&mut self, job: Job, h: Holder) {
        self.release(h, Held::NotRun);
        self.push_front(job);
    }

    /// Takes the waiting job of `conn` on `stream` (cancelled).
    pub fn take(&mut self, conn: u64, stream: u32) -> Option<Job> {
        let c = self.conns.get_mut(&conn)?;
        let at = c.jobs.iter().position(|j| j.stream() == stream)?;
        let job = c.jobs.remove(at)?;
        let size = job.frame.payload.len();
        c.bytes -= size;
        self.jobs -= 1;
        self.bytes -= size;
        self.waiting_conns -= usize::from(c.jobs.is_empty());
        Some(job)
    }

    /// The connection closed: takes its waiting jobs and forgets it.
    pub fn take_conn(&mut self, conn: u64) -> Vec<Job> {
        let Some(c) = self.conns.remove(&conn) else {
            return Vec::new();
        };
        self.jobs -= c.jobs.len();
        self.bytes -= c.bytes;
        self.waiting_conns -= usize::from(!c.jobs.is_empty());
        if c.line.any() {
            let conns = &self.conns;
            let t = &mut self.tenants[c.tenant as usize];
            t.closed += c.line.count();
            if t.closed > 16 && 2 * t.closed > t.ring.len() {
                t.ring.retain(|id| conns.contains_key(id));
                t.closed = 0;
            }
        }
        c.jobs.into()
    }

    /// Takes the jobs whose queue deadline is `now` or earlier.
    pub fn expire(&mut self, now: Instant) -> Vec<Job> {
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = self.timeline.front() {
            if deadline > now {
                break;
            }
            self.timeline.pop_front();
            let Some(c) = self.conns.get_mut(&id) else { continue };
            // A connection's queue is in deadline order: what is due is at its front.
            let before = c.jobs.len();
            while c.jobs.front().is_some_and(|j| j.queue_deadline <= now) {
                let Some(job) = c.jobs.pop_front() else { break };
                c.bytes -= job.frame.payload.len();
                self.bytes -= job.frame.payload.len();
                expired.push(job);
            }
            self.jobs -= before - c.jobs.len();
            self.waiting_conns -= usize::from(before > 0 && c.jobs.is_empty());
        }
        expired
    }

    /// When the reaper must look next.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timeline.front().map(|(d, _)| *d)
    }

    /// Takes every waiting job (shutdown).
    pub fn drain(&mut self) -> Vec<Job> {
        let mut all = Vec::with_capacity(self.jobs);
        for c in self.conns.values_mut() {
            all.extend(c.jobs.drain(..));
            c.bytes = 0;
            c.line = InLine::default();
        }
        for t in &mut self.tenants {
            t.ring.clear();
            t.closed = 0;
            t.line = InLine::default();
        }
        self.ring.clear();
        self.timeline.clear();
        self.jobs = 0;
        self.bytes = 0;
        self.waiting_conns = 0;
        all
    }

    pub fn len(&self) -> usize {
        self.jobs
    }

    pub fn is_empty(&self) -> bool {
        self.jobs == 0
    }

    /// Whether a waiting job may be served now (not held back by a cap). May say yes
    /// for a ring entry that turns out stale: [`WaitQueue::pick`] then finds nothing.
    pub fn servable(&self) -> bool {
        !self.ring.is_empty()
    }

    pub fn figures(&self) -> QueueFigures {
        let waiting = self.conns.values().filter(|c| !c.jobs.is_empty());
        let (mut capped, mut longest, mut oldest) = (0, 0, None::<Instant>);
        for c in waiting {
            capped += usize::from(c.held >= self.conn_cap || self.tenants[c.tenant as usize].held >= self.token_cap);
            longest = longest.max(c.jobs.len());
            // A connection's queue is in admission order: its front waited longest.
            if let Some(j) = c.jobs.front() {
                oldest = Some(oldest.map_or(j.received, |o| o.min(j.received)));
            }
        }
        QueueFigures {
            jobs: self.jobs,
            bytes: self.bytes,
            waiting_connections: self.waiting_conns,
            capped_connections: capped,
            longest_connection_queue: longest,
            longest_wait: oldest.map_or(Duration::ZERO, |o| o.elapsed()),
            max_per_connection: if self.conn_cap == usize::MAX { 0 } else { self.conn_cap },
        }
    }

    /// Puts `id` in its tenant's line if it has a job it may run now (in the first
    /// class if it holds no worker).
    fn ring_conn(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if c.jobs.is_empty() || c.held >= self.conn_cap {
            return;
        }
        let (t, first) = (c.tenant, c.first_class());
        let tenant = &mut self.tenants[t as usize];
        if tenant.ring.push(id, &mut c.line, first) {
            self.ring_tenant(t);
        }
    }

    /// Puts tenant `t` in line if it has connections to serve and is under its cap (in
    /// the first class if it holds no worker).
    fn ring_tenant(&mut self, t: u32) {
        self.tenant(t);
        let tenant = &mut self.tenants[t as usize];
        if tenant.ring.is_empty() || tenant.held >= self.token_cap {
            return;
        }
        let holds_none = tenant.held == 0;
        self.ring.push(t, &mut tenant.line, holds_none);
    }

    fn rebuild_timeline(&mut self) {
        let mut entries: Vec<(Instant, u64)> = Vec::with_capacity(self.jobs);
        for (id, c) in &self.conns {
            entries.extend(c.jobs.iter().map(|j| (j.queue_deadline, *id)));
        }
        entries.sort_unstable_by_key(|(d, _)| *d);
        // One entry per connection and deadline is enough (expire takes all that is due).
        entries.dedup();
        self.timeline = entries.into();
    }
}

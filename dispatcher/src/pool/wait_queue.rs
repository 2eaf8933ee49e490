//! The requests waiting for a worker, served fairly: one FIFO per client connection,
//! connections grouped by the client token they authenticated with, and a worker that
//! becomes free takes the next job round-robin over tokens, then over that token's
//! connections. A connection (and a token) may also hold only so many workers at once:
//! its jobs past that cap wait in its queue until one of its own workers is free, so a
//! connection with a thousand slow streams cannot take the workers every other
//! connection needs.
//!
//! Everything the hot path does here is O(1): a job is appended to its connection's
//! queue, and taking one pops a ring entry or two. The wait queue lives inside the
//! pool's lock (see `pool.rs`); it owns no workers, only the bookkeeping of who holds
//! how many.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

use crate::pool::job::Job;

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

/// Who holds a busy worker: the connection (and its token) whose job it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub conn: u64,
    pub tenant: u32,
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
    /// In its tenant's ring (at most once).
    in_ring: bool,
}

impl ConnQueue {
    fn new(tenant: u32) -> ConnQueue {
        ConnQueue {
            tenant,
            jobs: VecDeque::new(),
            bytes: 0,
            held: 0,
            in_ring: false,
        }
    }
}

#[derive(Default)]
struct Tenant {
    /// Connections that had a job to serve when they were put here, served in turn.
    /// An entry whose connection closed or has nothing to serve any more is skipped
    /// when it comes up ("stale").
    ring: VecDeque<u64>,
    /// Entries of `ring` whose connection closed; the ring is compacted when they are
    /// the larger part.
    closed: usize,
    held: usize,
    /// In the queue's ring of tenants (at most once).
    in_ring: bool,
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
    ring: VecDeque<u32>,
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
            ring: VecDeque::new(),
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
            .filter(|(_, c)| !c.jobs.is_empty() && !c.in_ring)
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
        (self.tenants[tenant as usize].held < token_cap).then_some(Holder { conn, tenant })
    }

    /// A worker took a job of `h`.
    pub fn charge(&mut self, h: Holder) {
        if let Some(c) = self.conns.get_mut(&h.conn) {
            c.held += 1;
        }
        self.tenant(h.tenant).held += 1;
    }

    /// A worker of `h` is free again (its job ended, or the worker is gone). Returns
    /// whether that made a waiting job servable (an idle worker may then take it).
    pub fn release(&mut self, h: Holder) -> bool {
        // A connection that closed meanwhile is forgotten; its token still counts.
        let t = self.tenant(h.tenant);
        t.held = t.held.saturating_sub(1);
        if let Some(c) = self.conns.get_mut(&h.conn) {
            c.held = c.held.saturating_sub(1);
            if !c.in_ring && !c.jobs.is_empty() && c.held < self.conn_cap {
                c.in_ring = true;
                self.tenants[h.tenant as usize].ring.push_back(h.conn);
            }
        }
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
        // Into its tenant's ring now that it has a job, unless it is there or capped.
        let ring = !c.in_ring && c.held < conn_cap;
        c.in_ring |= ring;
        let ring = ring.then_some(c.tenant);
        self.jobs += 1;
        self.bytes += size;
        self.waiting_conns += usize::from(first);
        if let Some(t) = ring {
            self.tenant(t).ring.push_back(id);
            self.ring_tenant(t);
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
        self.ring_conn(id);
    }

    /// The next job to serve, round-robin over tokens, then over each token's
    /// connections, skipping those at their cap; its holder is charged.
    pub fn pick(&mut self) -> Option<(Job, Holder)> {
        while let Some(t) = self.ring.pop_front() {
            let tenant = &mut self.tenants[t as usize];
            tenant.in_ring = false;
            if tenant.held >= self.token_cap {
                continue; // back in the ring when one of its workers is free
            }
            while let Some(id) = tenant.ring.pop_front() {
                let Some(c) = self.conns.get_mut(&id) else {
                    tenant.closed = tenant.closed.saturating_sub(1);
                    continue;
                };
                c.in_ring = false;
                if c.held >= self.conn_cap {
                    continue; // back in the ring when one of its workers is free
                }
                let Some(job) = c.jobs.pop_front() else { continue };
                let size = job.frame.payload.len();
                c.bytes -= size;
                c.held += 1;
                let more = !c.jobs.is_empty();
                if more && c.held < self.conn_cap {
                    c.in_ring = true;
                    tenant.ring.push_back(id);
                }
                tenant.held += 1;
                self.jobs -= 1;
                self.bytes -= size;
                self.waiting_conns -= usize::from(!more);
                self.ring_tenant(t);
                return Some((job, Holder { conn: id, tenant: t }));
            }
        }
        None
    }

    /// Undoes a [`WaitQueue::pick`] whose job could not be handed over.
    pub fn unpick(&mut self, job: Job, h: Holder) {
        self.release(h);
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
        if c.in_ring {
            let conns = &self.conns;
            let t = &mut self.tenants[c.tenant as usize];
            t.closed += 1;
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
            c.in_ring = false;
        }
        for t in &mut self.tenants {
            t.ring.clear();
            t.closed = 0;
            t.in_ring = false;
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
        let (mut capped, mut longest) = (0, 0);
        for c in waiting {
            capped += usize::from(c.held >= self.conn_cap || self.tenants[c.tenant as usize].held >= self.token_cap);
            longest = longest.max(c.jobs.len());
        }
        QueueFigures {
            jobs: self.jobs,
            bytes: self.bytes,
            waiting_connections: self.waiting_conns,
            capped_connections: capped,
            longest_connection_queue: longest,
            max_per_connection: if self.conn_cap == usize::MAX { 0 } else { self.conn_cap },
        }
    }

    /// Puts `id` in its tenant's ring if it has a job it may run now.
    fn ring_conn(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if c.in_ring || c.jobs.is_empty() || c.held >= self.conn_cap {
            return;
        }
        c.in_ring = true;
        let t = c.tenant;
        self.tenant(t).ring.push_back(id);
        self.ring_tenant(t);
    }

    /// Puts tenant `t` in the ring if it has connections to serve and is under its cap.
    fn ring_tenant(&mut self, t: u32) {
        let token_cap = self.token_cap;
        let tenant = self.tenant(t);
        if tenant.in_ring || tenant.ring.is_empty() || tenant.held >= token_cap {
            return;
        }
        tenant.in_ring = true;
        self.ring.push_back(t);
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

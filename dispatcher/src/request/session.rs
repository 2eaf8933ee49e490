//! Sessions (protocol 1.5): one worker pinned to one client stream until the session
//! ends, so that `BEGIN` … application logic … `COMMIT`, temporary tables, user variables
//! and locks work. A [`Session`] is what both sides see of one: admission, which opens it
//! and queues its statements (`admit/session.rs`), and the worker link that takes the
//! opening job and pins its worker (`pool/relay/pinned.rs`). A slot group's and a
//! connection's [`SessionGate`] cap how many sessions they hold.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// `[sessions]`: the bounds that keep sessions from taking the pool (docs/CONFIG.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// Workers of one slot group that sessions may pin at once; 0: half the group's slots
    /// (at least 1). The rest always serve single statements.
    pub max_per_group: usize,
    /// Sessions one client connection may have open (or opening) at once.
    pub max_per_connection: usize,
    /// Sessions of one tenant (a client token, a MySQL user) per group; 0: the group's
    /// cap less one place for each other tenant that holds or waits for one, at least 1.
    pub max_per_tenant: usize,
    /// Opens that may wait for a place under `max_per_group`, per group; more: SESSION_LIMIT at once.
    pub queue: usize,
    /// How long an open waits for a place and then a worker (a REQUEST's `timeout_ms` may
    /// ask for less); 0: `pool.queue_timeout_ms`.
    pub open_timeout_ms: u64,
    /// A session idle this long inside an open transaction is rolled back and ended
    /// (SESSION_ABORTED, reason idle_in_transaction); 0: never.
    pub idle_in_transaction_timeout_ms: u64,
    /// A session idle this long outside a transaction is ended; 0: never.
    pub idle_timeout_ms: u64,
    /// A session older than this is ended once its statement in flight has ended; 0: never.
    pub max_duration_ms: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            max_per_group: 0,
            max_per_connection: 8,
            max_per_tenant: 0,
            queue: 256,
            open_timeout_ms: 0,
            idle_in_transaction_timeout_ms: 30_000,
            idle_timeout_ms: 300_000,
            max_duration_ms: 3_600_000,
        }
    }
}

impl SessionsConfig {
    /// The pinned workers a group of `size` slots allows.
    pub fn cap(&self, size: usize) -> usize {
        match self.max_per_group {
            0 => (size / 2).max(1),
            n => n,
        }
    }

    /// The sessions one tenant may hold in a group whose cap is `cap`, while `others`
    /// other tenants hold or wait for places: so that one tenant cannot keep every place
    /// and the others' transactions out for as long as its sessions live. Alone, it may
    /// use them all.
    pub fn tenant_cap(&self, cap: usize, others: usize) -> usize {
        match self.max_per_tenant {
            0 => cap.saturating_sub(others).max(1),
            n => n,
        }
    }
}

/// Where a session's worker is, once pinned.
#[derive(Debug, Clone)]
pub struct PinnedTo {
    pub member: String,
    pub slot: u32,
    pub read_only: bool,
}

/// One session of a client connection: its statements' way to the pinned worker.
pub struct Session {
    /// The stream that opened it (the session's id on its connection).
    pub stream: u32,
    pub conn: u64,
    pub cluster: String,
    pub opened: Instant,
    pinned: Mutex<Option<PinnedTo>>,
    /// A transaction is open (the last statement's `END.in_transaction`).
    in_transaction: AtomicBool,
    /// Since when a transaction is open (for the admin view).
    transaction_since: Mutex<Option<Instant>>,
    /// Cancelled when an operator ends the session (`POST /sessions/kill`).
    pub killed: CancellationToken,
    /// How the session ended, once it has: what became of its transaction, for the
    /// statements refused after (`None`: none was open).
    ended: Mutex<Option<Option<osprey_protocol::TransactionOutcome>>>,
}

impl Session {
    pub fn new(conn: u64, stream: u32, cluster: String) -> Arc<Session> {
        Arc::new(Session {
            stream,
            conn,
            cluster,
            opened: Instant::now(),
            pinned: Mutex::new(None),
            in_transaction: AtomicBool::new(false),
            transaction_since: Mutex::new(None),
            killed: CancellationToken::new(),
            ended: Mutex::new(None),
        })
    }

    pub fn set_pinned(&self, to: PinnedTo) {
        *self.pinned.lock().unwrap_or_else(|e| e.into_inner()) = Some(to);
    }

    /// The pinned worker's member and slot (`None`: not pinned yet).
    pub fn pinned(&self) -> Option<PinnedTo> {
        self.pinned.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_in_transaction(&self, open: bool) {
        self.in_transaction.store(open, Ordering::Relaxed);
        let mut since = self.transaction_since.lock().unwrap_or_else(|e| e.into_inner());
        match (open, since.is_some()) {
            (true, false) => *since = Some(Instant::now()),
            (false, true) => *since = None,
            _ => {}
        }
    }

    /// How long the open transaction has been open (`None`: none is).
    pub fn transaction_age(&self) -> Option<Duration> {
        self.transaction_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed())
    }

    pub fn in_transaction(&self) -> bool {
        self.in_transaction.load(Ordering::Relaxed)
    }

    /// The session ended; `outcome`: what became of its transaction.
    pub fn set_ended(&self, outcome: Option<osprey_protocol::TransactionOutcome>) {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }

    /// What became of the transaction of a session that ended (`None`: not ended, or no
    /// transaction was open).
    pub fn ended_outcome(&self) -> Option<osprey_protocol::TransactionOutcome> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).flatten()
    }
}

/// Counts the sessions that hold (or wait for) one slot group's workers.
#[derive(Default)]
pub struct SessionGate {
    state: Mutex<GateState>,
    freed: Notify,
    /// The sessions pinned to the group's workers now (for the admin view).
    pinned: Mutex<Vec<Arc<Session>>>,
}

#[derive(Default)]
struct GateState {
    open: usize,
    waiting: usize,
    /// Places held by tenant (of opens that named one).
    by_tenant: std::collections::HashMap<u32, usize>,
    /// Opens waiting, by tenant.
    waiting_by_tenant: std::collections::HashMap<u32, usize>,
}

impl GateState {
    /// Tenants other than `me` that hold a place or wait for one.
    fn others(&self, me: u32) -> usize {
        let mut seen: Vec<u32> = self.by_tenant.keys().copied().filter(|t| *t != me).collect();
        seen.extend(self.waiting_by_tenant.keys().copied().filter(|t| *t != me));
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

fn dec(map: &mut std::collections::HashMap<u32, usize>, t: u32) {
    if let Some(n) = map.get_mut(&t) {
        *n -= 1;
        if *n == 0 {
            map.remove(&t);
        }
    }
}

/// A session's place under its group's cap; given back when dropped.
pub struct GatePermit {
    gate: Arc<SessionGate>,
    tenant: Option<u32>,
}

impl Drop for GatePermit {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.open = s.open.saturating_sub(1);
        if let Some(t) = self.tenant {
            dec(&mut s.by_tenant, t);
        }
        drop(s);
        self.gate.freed.notify_waiters();
    }
}

/// Whose open it is, and how many places that tenant may hold while a number of other
/// tenants hold or wait for places (read again at each try).
pub struct TenantShare<F: Fn(usize) -> usize> {
    pub tenant: u32,
    pub cap: F,
}

/// Why no place under the cap was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateError {
    /// `max_waiting` opens wait already.
    Full,
    /// No place within the wait.
    Timeout,
    /// No place within the wait, its tenant holding its share.
    TenantShare,
}

impl SessionGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions open (pinned, or on their way to a worker).
    pub fn open(&self) -> usize {
        self.lock().open
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Session>>> {
        self.pinned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session got one of the group's workers.
    pub fn pinned(&self, session: &Arc<Session>) {
        self.registry().push(session.clone());
    }

    /// That session ended.
    pub fn unpinned(&self, session: &Arc<Session>) {
        self.registry().retain(|s| !Arc::ptr_eq(s, session));
    }

    /// The places `tenant` may hold now, by `cap` (of the other tenants holding or
    /// waiting), for a refusal's message.
    pub fn share_of(&self, tenant: u32, cap: impl Fn(usize) -> usize) -> usize {
        cap(self.lock().others(tenant))
    }

    /// The sessions pinned now.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        self.registry().clone()
    }

    /// A place among `cap` sessions, waiting at most `wait` behind at most `max_waiting`
    /// others. `cap` is read again at each try: a resized group changes it. Cancel-safe:
    /// a wait dropped half-way (its client cancelled) leaves the count of waiters right.
    pub async fn enter(
        self: &Arc<Self>,
        cap: impl Fn() -> usize,
        max_waiting: usize,
        wait: Duration,
    ) -> Result<GatePermit, GateError> {
        self.enter_as(None::<TenantShare<fn(usize) -> usize>>, cap, max_waiting, wait)
            .await
    }

    /// [`SessionGate::enter`] for a tenant, which may hold at most its share of places.
    pub async fn enter_as<F: Fn(usize) -> usize>(
        self: &Arc<Self>,
        share: Option<TenantShare<F>>,
        cap: impl Fn() -> usize,
        max_waiting: usize,
        wait: Duration,
    ) -> Result<GatePermit, GateError> {
        /// Counts one waiter (of a tenant, if it named one) while it lives.
        struct Waiter<'a>(&'a SessionGate, Option<u32>);
        impl Drop for Waiter<'_> {
            fn drop(&mut self) {
                let mut s = self.0.lock();
                s.waiting = s.waiting.saturating_sub(1);
                if let Some(t) = self.1 {
                    dec(&mut s.waiting_by_tenant, t);
                }
                drop(s);
                // Its going may let another tenant's open take more.
                self.0.freed.notify_waiters();
            }
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut waiter = None;
        let mut held_by_share: bool;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut s = self.lock();
                let tenant = share.as_ref().map(|t| t.tenant);
                let tenant_full = share
                    .as_ref()
                    .is_some_and(|t| s.by_tenant.get(&t.tenant).copied().unwrap_or(0) >= (t.cap)(s.others(t.tenant)));
                let room = s.open < cap();
                // Said only when the group had a place: then it is the share that holds.
                held_by_share = tenant_full && room;
                if room && !tenant_full {
                    s.open += 1;
                    if let Some(t) = tenant {
                        *s.by_tenant.entry(t).or_default() += 1;
                    }
                    return Ok(GatePermit {
                        gate: self.clone(),
                        tenant,
                    });
                }
                if waiter.is_none() {
                    if s.waiting >= max_waiting {
                        return Err(GateError::Full);
                    }
                    s.waiting += 1;
                    if let Some(t) = tenant {
                        *s.waiting_by_tenant.entry(t).or_default() += 1;
                    }
                    waiter = Some(Waiter(self, tenant));
                }
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(if held_by_share {
                    GateError::TenantShare
                } else {
                    GateError::Timeout
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gate_caps_waits_and_lets_in_when_a_place_frees() {
        let gate = Arc::new(SessionGate::default());
        let a = gate.enter(|| 2, 1, Duration::ZERO).await.unwrap();
        let _b = gate.enter(|| 2, 1, Duration::ZERO).await.unwrap();
        assert_eq!(gate.open(), 2);
        // Full: one may wait, and times out.
        let started = Instant::now();
        assert_eq!(
            gate.enter(|| 2, 1, Duration::from_millis(50)).await.err(),
            Some(GateError::Timeout)
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
        // A waiter gets the place freed while it waits; a second waiter is refused at once.
        let g = gate.clone();
        let waiter = tokio::spawn(async move { g.enter(|| 2, 1, Duration::from_secs(5)).await.is_ok() });
        while gate.lock().waiting == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            gate.enter(|| 2, 1, Duration::from_secs(5)).await.err(),
            Some(GateError::Full)
        );
        drop(a);
        assert!(waiter.await.unwrap());
        // The waiter's permit went with its task: b is left.
        assert_eq!(gate.open(), 1);
    }

    #[tokio::test]
    async fn a_tenant_holds_at_most_its_share_and_others_still_get_in() {
        let gate = Arc::new(SessionGate::default());
        // The derived share: the cap (3) less one place per other tenant holding or waiting.
        let share = |tenant| {
            Some(TenantShare {
                tenant,
                cap: |others: usize| 3usize.saturating_sub(others).max(1),
            })
        };
        // Alone, tenant 1 may take every place.
        let a1 = gate.enter_as(share(1), || 3, 8, Duration::ZERO).await.unwrap();
        let a2 = gate.enter_as(share(1), || 3, 8, Duration::ZERO).await.unwrap();
        let _a3 = gate.enter_as(share(1), || 3, 8, Duration::ZERO).await.unwrap();
        // Tenant 2 waits for a place; tenant 1's next open waits too. When one of tenant
        // 1's ends, tenant 2 gets it: tenant 1 may hold only 3 - 1 = 2 while 2 waits.
        let g = gate.clone();
        let b = tokio::spawn(async move { g.enter_as(share(2), || 3, 8, Duration::from_secs(5)).await });
        while !gate.lock().waiting_by_tenant.contains_key(&2) {
            tokio::task::yield_now().await;
        }
        let g = gate.clone();
        let a4 = tokio::spawn(async move { g.enter_as(share(1), || 3, 8, Duration::from_millis(300)).await.err() });
        while !gate.lock().waiting_by_tenant.contains_key(&1) {
            tokio::task::yield_now().await;
        }
        drop(a1);
        let _b = b.await.unwrap().expect("the other tenant got the freed place");
        assert_eq!(a4.await.unwrap(), Some(GateError::Timeout), "the group is full again");
        assert_eq!(gate.lock().by_tenant.get(&1), Some(&2));
        // A place frees while tenant 2 holds one: tenant 1, at its share of 2, waits.
        drop(a2);
        let _a5 = gate.enter_as(share(1), || 3, 8, Duration::ZERO).await.unwrap();
        assert_eq!(
            gate.enter_as(share(1), || 3, 8, Duration::from_millis(20)).await.err(),
            Some(GateError::Timeout),
            "the group is full"
        );
    }

    #[tokio::test]
    async fn a_wait_dropped_half_way_leaves_no_waiter_behind() {
        let gate = Arc::new(SessionGate::default());
        let _a = gate.enter(|| 1, 1, Duration::ZERO).await.unwrap();
        for _ in 0..3 {
            // The client cancels while it waits: the wait is dropped.
            let waited =
                tokio::time::timeout(Duration::from_millis(10), gate.enter(|| 1, 1, Duration::from_secs(5))).await;
            assert!(waited.is_err());
            assert_eq!(gate.lock().waiting, 0);
        }
        // So another may still wait (max_waiting 1), rather than being refused at once.
        assert_eq!(
            gate.enter(|| 1, 1, Duration::from_millis(20)).await.err(),
            Some(GateError::Timeout)
        );
    }
}

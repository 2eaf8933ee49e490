//! Who holds the admin port's connections, and who gives one up when it is full.
//!
//! Issue 20: two processes holding silent admin connections (and reconnecting when cut)
//! let 2 of 40 operator `/status` requests in over 40 s: a new connection over the cap
//! was closed at accept, so whoever reconnected fastest held the port. Now a new
//! connection takes the place of the oldest held connection that has not presented the
//! admin token (one that has sent nothing before one that has sent part of a request),
//! and each source address may hold only its share of the cap
//! (`admin.max_connections_per_address`; over it, the new connection takes the place of
//! that address's oldest). A new connection whose bytes are not there yet (it looks
//! silent) may only take the place of a silent one; with none, it is closed. A
//! connection that has presented the valid token is never evicted. So a silent flood
//! cannot push out a connection whose request has come, and an operator's request, whose
//! bytes are usually waiting by the time it is accepted, always finds a place.
//!
//! A live feed (`/ui/events`, the operations page) presents the token too but never ends:
//! sixteen open tabs would hold an address's share for good and lock its operator's
//! `osprey status` out. A feed is therefore not trusted: any newcomer may take the place of
//! the oldest feed, after the connections it may evict anyway (a newcomer whose bytes were
//! not there yet at accept is not always silent: an operator's request under load can be
//! late by a few microseconds), and the page's `EventSource` reconnects on its own.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How far a connection has got: it only moves up.
const SILENT: u8 = 0;
const SENT: u8 = 1;
/// Serving a live feed (with the token): evictable by any newcomer, last.
const FEED: u8 = 2;
const TRUSTED: u8 = 3;

/// An evicted connection closes at its task's next turn; the accept loop waits at most
/// this for it (and then looks again) before it takes its place.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// What a held connection has shown of itself.
#[derive(Debug, Default)]
pub struct Standing(AtomicU8);

impl Standing {
    /// Bytes of a request came (or were waiting at accept).
    pub fn sent(&self) {
        let _ = self
            .0
            .compare_exchange(SILENT, SENT, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A request carried the valid admin token: never evicted from now on.
    pub fn trust(&self) {
        self.0.store(TRUSTED, Ordering::Relaxed);
    }

    /// The connection now serves a live feed, which never ends: it gives its place to a
    /// newcomer (even if it was trusted before: the feed holds it from now on).
    pub fn feed(&self) {
        self.0.store(FEED, Ordering::Relaxed);
    }

    fn rank(&self) -> u8 {
        self.0.load(Ordering::Relaxed)
    }
}

struct Entry {
    addr: IpAddr,
    standing: Arc<Standing>,
    evict: CancellationToken,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Held connections in accept order (the id grows).
    conns: BTreeMap<u64, Entry>,
    per_addr: HashMap<IpAddr, usize>,
}

/// The admin port's connection table (`admin.max_connections`,
/// `admin.max_connections_per_address`).
pub struct Admission {
    inner: Mutex<Inner>,
    released: Notify,
    max: usize,
    per_address: usize,
}

/// A place on the admin port, given up on drop.
pub struct Held {
    admission: Arc<Admission>,
    id: u64,
    pub standing: Arc<Standing>,
    /// Cancelled when the connection is evicted to make room for a new one.
    pub evicted: CancellationToken,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut inner = self.admission.lock();
        if let Some(e) = inner.conns.remove(&self.id) {
            if let Some(n) = inner.per_addr.get_mut(&e.addr) {
                *n -= 1;
                if *n == 0 {
                    inner.per_addr.remove(&e.addr);
                }
            }
        }
        drop(inner);
        self.admission.released.notify_waiters();
    }
}

/// The outcome of [`Admission::admit`].
pub enum Admitted {
    /// Held; `evicted` connections were closed to make room.
    Held { held: Held, evicted: usize },
    /// No connection in the way may give up its place to this one (each has presented the
    /// admin token, or has sent bytes while this one has not): the new one is closed.
    Full,
}

impl Admission {
    pub fn new(max: usize, per_address: usize) -> Arc<Admission> {
        Arc::new(Admission {
            inner: Mutex::new(Inner::default()),
            released: Notify::new(),
            max,
            per_address: per_address.clamp(1, max.max(1)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The table holds no invariant a panicking holder could break half-way.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.lock().conns.len()
    }

    /// A place for a new connection from `addr` (`sent`: its bytes were already waiting).
    /// When `addr` holds its share, its own oldest untrusted connection makes room; when
    /// the port is full, the oldest untrusted connection of the address holding the
    /// most does. Silent ones go before those that sent part of a request. Waits for the
    /// evicted connection to close, so that the cap holds for descriptors too.
    pub async fn admit(self: &Arc<Self>, addr: IpAddr, sent: bool) -> Admitted {
        let mut evicted = 0;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut inner = self.lock();
                let from_addr = inner.per_addr.get(&addr).copied().unwrap_or(0);
                let own_share_full = from_addr >= self.per_address;
                if !own_share_full && inner.conns.len() < self.max {
                    let id = inner.next_id;
                    inner.next_id += 1;
                    let standing = Arc::new(Standing::default());
                    if sent {
                        standing.sent();
                    }
                    let evict = CancellationToken::new();
                    inner.conns.insert(
                        id,
                        Entry {
                            addr,
                            standing: standing.clone(),
                            evict: evict.clone(),
                        },
                    );
                    *inner.per_addr.entry(addr).or_default() += 1;
                    return Admitted::Held {
                        held: Held {
                            admission: self.clone(),
                            id,
                            standing,
                            evicted: evict,
                        },
                        evicted,
                    };
                }
                let scope = if own_share_full { Some(addr) } else { None };
                match victim(&inner, scope, if sent { SENT } else { SILENT }) {
                    Victim::Found(id) => {
                        if let Some(e) = inner.conns.get(&id) {
                            e.evict.cancel();
                        }
                        evicted += 1;
                    }
                    // Already on its way out: wait for it.
                    Victim::Leaving => {}
                    Victim::None => return Admitted::Full,
                }
            }
            if tokio::time::timeout(EVICTION_WAIT, released).await.is_err() {
                return Admitted::Full;
            }
        }
    }
}

enum Victim {
    Found(u64),
    Leaving,
    None,
}

/// The connection to evict for a newcomer of standing `up_to`: within `scope` (one
/// address), else from the address holding the most. Silent before sent, oldest first;
/// never a trusted one, and never one that has shown more than the newcomer: a silent
/// newcomer cannot push out a connection whose request is on its way (with a share of
/// 2, a silent flood would otherwise evict the operator's connection before its head
/// was read, every time).
fn victim(inner: &Inner, scope: Option<IpAddr>, up_to: u8) -> Victim {
    let mut leaving = false;
    let mut best: Option<(u8, std::cmp::Reverse<usize>, u64)> = None;
    for (&id, e) in &inner.conns {
        if scope.is_some_and(|a| a != e.addr) {
            continue;
        }
        let rank = e.standing.rank();
        if rank == TRUSTED || (rank > up_to && rank != FEED) {
            continue;
        }
        if e.evict.is_cancelled() {
            leaving = true;
            continue;
        }
        let crowd = inner.per_addr.get(&e.addr).copied().unwrap_or(0);
        let key = (rank, std::cmp::Reverse(crowd), id);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    match best {
        Some((_, _, id)) => Victim::Found(id),
        None if leaving => Victim::Leaving,
        None => Victim::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        [127, 0, 0, last].into()
    }

    async fn held(a: &Arc<Admission>, addr: IpAddr, sent: bool) -> Held {
        match a.admit(addr, sent).await {
            Admitted::Held { held, .. } => held,
            Admitted::Full => panic!("refused"),
        }
    }

    /// Evicted connections close when told (as the connection task does).
    fn close_when_evicted(h: Held) {
        tokio::spawn(async move {
            h.evicted.cancelled().await;
            drop(h);
        });
    }

    #[tokio::test]
    async fn a_full_port_evicts_the_oldest_silent_untrusted_connection() {
        let a = Admission::new(4, 4);
        let trusted = held(&a, ip(1), true).await;
        trusted.standing.trust();
        let partial = held(&a, ip(1), true).await;
        let old_silent = held(&a, ip(1), false).await;
        let new_silent = held(&a, ip(1), false).await;
        let (old_ev, partial_ev, new_ev, trusted_ev) = (
            old_silent.evicted.clone(),
            partial.evicted.clone(),
            new_silent.evicted.clone(),
            trusted.evicted.clone(),
        );
        close_when_evicted(old_silent);
        close_when_evicted(new_silent);
        close_when_evicted(partial);
        let _a = held(&a, ip(1), false).await;
        assert!(old_ev.is_cancelled() && !new_ev.is_cancelled() && !partial_ev.is_cancelled());
        let _b = held(&a, ip(1), false).await;
        assert!(new_ev.is_cancelled() && !partial_ev.is_cancelled());
        assert_eq!(a.held(), 4);
        // With no silent one left, the partial one goes; the trusted one never.
        drop((_a, _b));
        let _c = held(&a, ip(1), true).await;
        let _d = held(&a, ip(1), true).await;
        let _e = held(&a, ip(1), true).await;
        assert!(partial_ev.is_cancelled() && !trusted_ev.is_cancelled());
    }

    #[tokio::test]
    async fn a_silent_newcomer_cannot_evict_a_connection_that_sent() {
        let a = Admission::new(2, 2);
        let sent = held(&a, ip(1), true).await;
        let silent = held(&a, ip(1), false).await;
        let silent_ev = silent.evicted.clone();
        close_when_evicted(silent);
        let newer = held(&a, ip(1), false).await;
        assert!(silent_ev.is_cancelled());
        // Now `sent` and a silent newer one: a silent newcomer takes the silent one's place
        // only; with none silent left, it is refused.
        newer.standing.sent();
        assert!(matches!(a.admit(ip(1), false).await, Admitted::Full));
        assert!(!sent.evicted.is_cancelled() && !newer.evicted.is_cancelled());
    }

    #[tokio::test]
    async fn a_feed_gives_way_to_any_newcomer_but_last() {
        let a = Admission::new(3, 3);
        let feed1 = held(&a, ip(1), true).await;
        feed1.standing.trust();
        feed1.standing.feed();
        let feed2 = held(&a, ip(1), true).await;
        feed2.standing.feed();
        let partial = held(&a, ip(1), true).await;
        let (ev1, ev2, evp) = (feed1.evicted.clone(), feed2.evicted.clone(), partial.evicted.clone());
        close_when_evicted(feed1);
        close_when_evicted(feed2);
        close_when_evicted(partial);
        // A request (an operator's `osprey status`): the partial one goes first.
        let op = held(&a, ip(1), true).await;
        assert!(evp.is_cancelled() && !ev1.is_cancelled());
        op.standing.trust();
        // One whose bytes were not there yet at accept: it may not evict a request on its
        // way, but it takes the oldest feed's place.
        let _late = held(&a, ip(1), false).await;
        assert!(ev1.is_cancelled() && !ev2.is_cancelled());
        assert!(!op.evicted.is_cancelled());
    }

    #[tokio::test]
    async fn trusted_connections_are_never_evicted() {
        let a = Admission::new(2, 2);
        let t1 = held(&a, ip(1), false).await;
        t1.standing.trust();
        let t2 = held(&a, ip(1), false).await;
        t2.standing.trust();
        assert!(matches!(a.admit(ip(1), true).await, Admitted::Full));
        assert!(!t1.evicted.is_cancelled() && !t2.evicted.is_cancelled());
    }

    #[tokio::test]
    async fn an_address_over_its_share_evicts_its_own() {
        let a = Admission::new(8, 2);
        let other = held(&a, ip(2), false).await;
        let mine1 = held(&a, ip(1), false).await;
        let mine2 = held(&a, ip(1), false).await;
        let (other_ev, mine1_ev) = (other.evicted.clone(), mine1.evicted.clone());
        close_when_evicted(mine1);
        let _mine3 = held(&a, ip(1), false).await;
        assert!(mine1_ev.is_cancelled(), "the address's own oldest made room");
        assert!(!other_ev.is_cancelled(), "another address's older connection stays");
        assert_eq!(a.held(), 3);
        drop(mine2);
        assert_eq!(a.held(), 2);
    }

    #[tokio::test]
    async fn a_full_port_evicts_from_the_most_crowded_address() {
        let a = Admission::new(3, 3);
        let lone = held(&a, ip(2), false).await;
        let c1 = held(&a, ip(1), false).await;
        let c2 = held(&a, ip(1), false).await;
        let (lone_ev, c1_ev) = (lone.evicted.clone(), c1.evicted.clone());
        close_when_evicted(c1);
        let _new = held(&a, ip(3), false).await;
        assert!(c1_ev.is_cancelled() && !lone_ev.is_cancelled());
        drop(c2);
    }
}

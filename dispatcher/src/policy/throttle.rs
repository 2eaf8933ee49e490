//! Per-member throttle: a token bucket at `max_qps` with `burst` tokens, refilled
//! continuously (tokens = min(burst, tokens + elapsed × rate), computed from the clock at
//! every look, so timer lateness never changes the long-run rate).
//!
//! A request routed to a member takes a token at once when one is there and nobody is
//! waiting (FIFO: a newcomer never overtakes a waiter). Otherwise it joins that member's
//! queue, bounded by `queue_capacity` **in count**: a waiter is a few dozen bytes (a
//! oneshot and an id — the request itself stays with its connection), so a count bounds
//! the memory. A full queue rejects at once; a waiter gives up after `wait`. One
//! dispenser task per member with waiters hands out tokens in order as they accrue and
//! ends when the queue is empty. Members without `max_qps` are not throttled and cost one
//! map lookup. Members never share a bucket, so a throttled member slows no other.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio::sync::oneshot;

/// Why a request got no token: maps to `ERROR THROTTLED` (dispatched = false, retryable).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Throttled {
    #[error("member {member} is at its max_qps ({max_qps}/s) and its throttle queue is full ({capacity} waiting)")]
    QueueFull {
        member: String,
        max_qps: f64,
        capacity: usize,
    },
    #[error("member {member} is at its max_qps ({max_qps}/s): no token within {waited_ms} ms")]
    Timeout {
        member: String,
        max_qps: f64,
        waited_ms: u64,
    },
}

impl Throttled {
    pub fn code(&self) -> osprey_protocol::ErrorCode {
        osprey_protocol::ErrorCode::Throttled
    }
}

/// The throttle's own settings (`[throttle]`); live-changeable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleSettings {
    /// How long a request may wait for a token.
    pub wait: Duration,
    /// Waiters per member; one more is rejected at once.
    pub queue_capacity: usize,
}

impl Default for ThrottleSettings {
    fn default() -> Self {
        ThrottleSettings {
            wait: Duration::from_millis(100),
            queue_capacity: 1024,
        }
    }
}

/// One member's limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub max_qps: f64,
    /// Tokens the bucket holds at most (≥ 1). Absent in the config: `max(1, max_qps / 10)`
    /// (a tenth of a second's worth).
    pub burst: f64,
}

impl Limit {
    pub fn new(max_qps: f64, burst: Option<f64>) -> Limit {
        Limit {
            max_qps,
            burst: burst.unwrap_or(max_qps / 10.0).max(1.0),
        }
    }
}

/// A member's throttle, as `GET /throttle` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberThrottle {
    pub member: String,
    pub max_qps: f64,
    pub burst: f64,
    pub tokens: f64,
    pub waiting: usize,
    /// Requests that got a token (at once or after waiting).
    pub accepted: u64,
    /// Requests that had to wait (and got a token).
    pub waited: u64,
    /// Total time those waited, ms.
    pub waited_ms: f64,
    pub rejected_full: u64,
    pub rejected_timeout: u64,
}

/// One member's counters: handles into the [`ThrottleMetrics`] families.
struct Counters {
    accepted: Counter,
    waited: Counter,
    waited_ns: Counter,
    rejected_full: Counter,
    rejected_timeout: Counter,
    waiting: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabel {
    pub member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabel {
    pub member: String,
    pub reason: &'static str,
}

/// The throttle's prometheus metrics, per member.
#[derive(Default, Clone)]
pub struct ThrottleMetrics {
    pub accepted: Family<MemberLabel, Counter>,
    pub waited: Family<MemberLabel, Counter>,
    pub waited_ns: Family<MemberLabel, Counter>,
    pub rejected: Family<RejectLabel, Counter>,
    pub waiting: Family<MemberLabel, Gauge>,
    pub max_qps: Family<MemberLabel, Gauge<f64, AtomicU64>>,
}

impl ThrottleMetrics {
    fn counters(&self, member: &str) -> Counters {
        let m = MemberLabel {
            member: member.to_string(),
        };
        let r = |reason| RejectLabel {
            member: member.to_string(),
            reason,
        };
        // One statement each: `get_or_create` returns a read guard, and a second call on
        // the same family in the same statement would wait for a write lock behind it.
        let rejected_full = self.rejected.get_or_create(&r("queue_full")).clone();
        let rejected_timeout = self.rejected.get_or_create(&r("timeout")).clone();
        let accepted = self.accepted.get_or_create(&m).clone();
        let waited = self.waited.get_or_create(&m).clone();
        let waited_ns = self.waited_ns.get_or_create(&m).clone();
        let waiting = self.waiting.get_or_create(&m).clone();
        Counters {
            accepted,
            waited,
            waited_ns,
            rejected_full,
            rejected_timeout,
            waiting,
        }
    }

    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "throttle_accepted",
            "Requests that got a throttle token, by member",
            self.accepted.clone(),
        );
        registry.register(
            "throttle_waited",
            "Requests that waited for a throttle token, by member",
            self.waited.clone(),
        );
        registry.register(
            "throttle_waited_nanoseconds",
            "Total time requests waited for a throttle token",
            self.waited_ns.clone(),
        );
        registry.register(
            "throttle_rejected",
            "Requests refused with THROTTLED, by member and reason",
            self.rejected.clone(),
        );
        registry.register(
            "throttle_waiting",
            "Requests waiting for a throttle token, by member",
            self.waiting.clone(),
        );
        registry.register("throttle_max_qps", "Throttle rate, by member", self.max_qps.clone());
    }
}

struct Waiter {
    id: u64,
    tx: oneshot::Sender<()>,
}

struct State {
    limit: Limit,
    tokens: f64,
    last: Instant,
    queue: VecDeque<Waiter>,
    next_id: u64,
    dispenser: bool,
}

impl State {
    /// Accrues tokens up to `burst` — plus one per waiter: the cap bounds what an idle
    /// member saves up, and must not eat the tokens that accrued for waiters while the
    /// dispenser's timer was late (that would make the rate depend on timer lateness).
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        let cap = self.limit.burst + self.queue.len() as f64;
        self.tokens = (self.tokens + dt * self.limit.max_qps).min(cap);
        self.last = now;
    }
}

struct Bucket {
    member: String,
    state: Mutex<State>,
    counters: Counters,
    /// Wakes the dispenser early: the limit changed.
    wake: tokio::sync::Notify,
}

/// The throttles of all members. Shared (`Arc`) by the request path and the admin API.
pub struct Throttle {
    buckets: RwLock<HashMap<String, Arc<Bucket>>>,
    settings: RwLock<ThrottleSettings>,
    pub metrics: ThrottleMetrics,
}

impl Throttle {
    pub fn new(settings: ThrottleSettings) -> Throttle {
        Throttle {
            buckets: RwLock::new(HashMap::new()),
            settings: RwLock::new(settings),
            metrics: ThrottleMetrics::default(),
        }
    }

    pub fn settings(&self) -> ThrottleSettings {
        *self.settings.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Live change of the wait and the queue capacity (waiters already queued keep theirs).
    pub fn set_settings(&self, settings: ThrottleSettings) {
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = settings;
    }

    /// Sets (or, with `None`, removes) `member`'s limit, live. A new bucket starts full; a
    /// changed one keeps its tokens (capped at the new burst), its queue and its counters.
    /// Removing the limit lets its waiters through at once.
    pub fn set_limit(&self, member: &str, limit: Option<Limit>) {
        let mut buckets = self.buckets.write().unwrap_or_else(|e| e.into_inner());
        match (limit, buckets.get(member)) {
            (Some(l), Some(b)) => {
                let mut s = b.state.lock().unwrap_or_else(|e| e.into_inner());
                s.refill(Instant::now());
                s.limit = l;
                s.tokens = s.tokens.min(l.burst);
                b.wake.notify_one();
            }
            (Some(l), None) => {
                buckets.insert(
                    member.to_string(),
                    Arc::new(Bucket {
                        member: member.to_string(),
                        state: Mutex::new(State {
                            limit: l,
                            tokens: l.burst,
                            last: Instant::now(),
                            queue: VecDeque::new(),
                            next_id: 0,
                            dispenser: false,
                        }),
                        counters: self.metrics.counters(member),
                        wake: tokio::sync::Notify::new(),
                    }),
                );
            }
            (None, _) => {
                if let Some(b) = buckets.remove(member) {
                    let mut s = b.state.lock().unwrap_or_else(|e| e.into_inner());
                    for w in s.queue.drain(..) {
                        let _ = w.tx.send(());
                    }
                    b.counters.waiting.set(0);
                }
            }
        }
        let label = MemberLabel {
            member: member.to_string(),
        };
        self.metrics
            .max_qps
            .get_or_create(&label)
            .set(limit.map_or(0.0, |l| l.max_qps));
        tracing::info!(
            member,
            max_qps = limit.map(|l| l.max_qps),
            burst = limit.map(|l| l.burst),
            "throttle set"
        );
    }

    /// Makes `limits` the whole set (SIGHUP): members in it get their limit, throttled
    /// members not in it are no longer throttled.
    pub fn replace_limits(&self, limits: impl IntoIterator<Item = (String, Limit)>) {
        let limits: HashMap<String, Limit> = limits.into_iter().collect();
        let gone: Vec<String> = {
            let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
            buckets.keys().filter(|m| !limits.contains_key(*m)).cloned().collect()
        };
        for m in gone {
            self.set_limit(&m, None);
        }
        for (m, l) in limits {
            let same = self
                .buckets
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&m)
                .is_some_and(|b| b.state.lock().unwrap_or_else(|e| e.into_inner()).limit == l);
            if !same {
                self.set_limit(&m, Some(l));
            }
        }
    }

    /// Whether any member has a limit: without one the request path need not even name
    /// the member a request goes to.
    pub fn any_limit(&self) -> bool {
        !self.buckets.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// The non-waiting half of [`Throttle::acquire`]: `true` when `member` has no limit or
    /// a token was taken at once (nobody waiting); `false` when the request would have to
    /// queue (or be refused): then call `acquire`, off the caller's loop.
    pub fn try_acquire(&self, member: &str) -> bool {
        let bucket = match self.buckets.read().unwrap_or_else(|e| e.into_inner()).get(member) {
            None => return true,
            Some(b) => b.clone(),
        };
        let mut s = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
        s.refill(Instant::now());
        if s.queue.is_empty() && s.tokens >= 1.0 {
            s.tokens -= 1.0;
            bucket.counters.accepted.inc();
            return true;
        }
        false
    }

    /// Takes a token for a request routed to `member`, waiting in its queue if needed.
    /// Cancel-safe: dropping the future gives the place (and any token not yet handed) up.
    pub async fn acquire(&self, member: &str) -> Result<(), Throttled> {
        let bucket = match self.buckets.read().unwrap_or_else(|e| e.into_inner()).get(member) {
            None => return Ok(()),
            Some(b) => b.clone(),
        };
        let settings = self.settings();
        let start = Instant::now();
        let (id, mut rx) = {
            let mut s = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
            s.refill(start);
            if s.queue.is_empty() && s.tokens >= 1.0 {
                s.tokens -= 1.0;
                bucket.counters.accepted.inc();
                return Ok(());
            }
            if s.queue.len() >= settings.queue_capacity {
                bucket.counters.rejected_full.inc();
                return Err(Throttled::QueueFull {
                    member: member.to_string(),
                    max_qps: s.limit.max_qps,
                    capacity: settings.queue_capacity,
                });
            }
            let (tx, rx) = oneshot::channel();
            let id = s.next_id;
            s.next_id += 1;
            s.queue.push_back(Waiter { id, tx });
            bucket.counters.waiting.set(s.queue.len() as i64);
            if !s.dispenser {
                s.dispenser = true;
                tokio::spawn(dispense(bucket.clone()));
            }
            (id, rx)
        };
        let mut guard = LeaveQueue {
            bucket: &bucket,
            id,
            armed: true,
        };
        let granted = match tokio::time::timeout(settings.wait, &mut rx).await {
            Ok(r) => r.is_ok(),
            Err(_) => {
                // Timed out — unless the dispenser handed us a token meanwhile.
                let mut s = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(pos) = s.queue.iter().position(|w| w.id == id) {
                    s.queue.remove(pos);
                    bucket.counters.waiting.set(s.queue.len() as i64);
                    false
                } else {
                    drop(s);
                    rx.try_recv().is_ok()
                }
            }
        };
        guard.armed = false;
        if granted {
            let c = &bucket.counters;
            c.accepted.inc();
            c.waited.inc();
            c.waited_ns.inc_by(start.elapsed().as_nanos() as u64);
            Ok(())
        } else {
            bucket.counters.rejected_timeout.inc();
            let s = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
            Err(Throttled::Timeout {
                member: member.to_string(),
                max_qps: s.limit.max_qps,
                waited_ms: settings.wait.as_millis() as u64,
            })
        }
    }

    /// Every throttled member's state.
    pub fn status(&self) -> Vec<MemberThrottle> {
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<MemberThrottle> = buckets
            .values()
            .map(|b| {
                let mut s = b.state.lock().unwrap_or_else(|e| e.into_inner());
                s.refill(Instant::now());
                let c = &b.counters;
                MemberThrottle {
                    member: b.member.clone(),
                    max_qps: s.limit.max_qps,
                    burst: s.limit.burst,
                    tokens: s.tokens,
                    waiting: s.queue.len(),
                    accepted: c.accepted.get(),
                    waited: c.waited.get(),
                    waited_ms: c.waited_ns.get() as f64 / 1e6,
                    rejected_full: c.rejected_full.get(),
                    rejected_timeout: c.rejected_timeout.get(),
                }
            })
            .collect();
        list.sort_by(|a, b| a.member.cmp(&b.member));
        list
    }
}

/// Removes a cancelled waiter (its future dropped) from the queue.
struct LeaveQueue<'a> {
    bucket: &'a Bucket,
    id: u64,
    armed: bool,
}

impl Drop for LeaveQueue<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.bucket.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pos) = s.queue.iter().position(|w| w.id == self.id) {
                s.queue.remove(pos);
                self.bucket.counters.waiting.set(s.queue.len() as i64);
            }
        }
    }
}

/// Hands out tokens to the member's waiters in order as they accrue; ends when none wait.
async fn dispense(bucket: Arc<Bucket>) {
    loop {
        let sleep_for = {
            let mut s = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
            s.refill(Instant::now());
            while s.tokens >= 1.0 {
                let Some(w) = s.queue.pop_front() else { break };
                // A waiter that gave up (receiver gone) does not use the token.
                if w.tx.send(()).is_ok() {
                    s.tokens -= 1.0;
                }
            }
            bucket.counters.waiting.set(s.queue.len() as i64);
            if s.queue.is_empty() {
                s.dispenser = false;
                return;
            }
            let rate = s.limit.max_qps.max(1e-3);
            Duration::from_secs_f64(((1.0 - s.tokens) / rate).max(0.0))
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep_for.max(Duration::from_micros(100))) => {}
            _ = bucket.wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request path's fast path: no limit or a token at hand → `true` (a token
    /// taken); no token, or someone already waiting (FIFO) → `false`, nothing taken.
    #[tokio::test]
    async fn try_acquire_takes_only_a_token_at_hand() {
        let t = Arc::new(Throttle::new(ThrottleSettings {
            wait: Duration::from_secs(5),
            queue_capacity: 8,
        }));
        assert!(!t.any_limit());
        assert!(t.try_acquire("free"));
        t.set_limit("m", Some(Limit::new(1.0, Some(2.0))));
        assert!(t.any_limit());
        assert!(t.try_acquire("m") && t.try_acquire("m"));
        assert!(!t.try_acquire("m"), "the bucket is empty");
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move { t.acquire("m").await })
        };
        while t.status()[0].waiting == 0 {
            tokio::task::yield_now().await;
        }
        // Even once a token accrues, the waiter gets it first.
        t.set_limit("m", Some(Limit::new(1000.0, Some(1.0))));
        waiter.await.unwrap().unwrap();
        assert_eq!(t.status()[0].accepted, 3);
        t.set_limit("m", None);
        assert!(!t.any_limit());
    }

    /// Offers 4× `max_qps` for `secs` (one request every 1/(4·qps) s, each its own task)
    /// and measures the accepted rate over the steady part (after the first second, which
    /// drains the burst). Returns (accepted rate, rejected count).
    async fn offer(qps: f64, secs: u64) -> (f64, u64, Vec<MemberThrottle>) {
        let t = Arc::new(Throttle::new(ThrottleSettings {
            wait: Duration::from_millis(100),
            queue_capacity: 1024,
        }));
        t.set_limit("m", Some(Limit::new(qps, Some(1.0))));
        let period = Duration::from_secs_f64(1.0 / (4.0 * qps));
        let accepted = Arc::new(AtomicU64::new(0));
        let stop = Instant::now() + Duration::from_secs(secs);
        let gen = {
            let (t, accepted) = (t.clone(), accepted.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while Instant::now() < stop {
                    tick.tick().await;
                    let (t, accepted) = (t.clone(), accepted.clone());
                    tokio::spawn(async move {
                        if t.acquire("m").await.is_ok() {
                            accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    });
                }
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (a0, t0) = (accepted.load(std::sync::atomic::Ordering::Relaxed), Instant::now());
        tokio::time::sleep(Duration::from_secs(secs - 2)).await;
        let (a1, t1) = (accepted.load(std::sync::atomic::Ordering::Relaxed), Instant::now());
        gen.await.unwrap();
        let rate = (a1 - a0) as f64 / (t1 - t0).as_secs_f64();
        let st = t.status();
        let rejected = st[0].rejected_full + st[0].rejected_timeout;
        (rate, rejected, st)
    }

    /// In the shared test run: never more than the limit lets through (the property that
    /// protects the database). Less can happen when the loaded machine cannot offer 4×.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn accepted_rate_never_exceeds_max_qps_at_4x_offered() {
        for qps in [100.0, 1000.0] {
            let (rate, rejected, st) = offer(qps, 4).await;
            let err = (rate - qps) / qps * 100.0;
            eprintln!("max_qps {qps}: accepted {rate:.1}/s ({err:+.2} %), rejected {rejected}, status {st:?}");
            assert!(err <= 2.0, "max_qps {qps}: accepted {rate:.1}/s ({err:+.2} %)");
        }
    }

    /// The accuracy figure of docs/BENCHMARKS.md (±2 % at 4× offered), on a quiet machine:
    /// `cargo test -p osprey-dispatcher --lib throttle -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn accepted_rate_is_max_qps_within_2_percent_at_4x_offered() {
        for qps in [100.0, 1000.0] {
            let (rate, rejected, st) = offer(qps, 6).await;
            let err = (rate - qps) / qps * 100.0;
            eprintln!("max_qps {qps}: accepted {rate:.1}/s ({err:+.2} %), rejected {rejected}, status {st:?}");
            assert!(err.abs() <= 2.0, "max_qps {qps}: accepted {rate:.1}/s ({err:+.2} %)");
            assert!(rejected > 0, "4× the limit must be refused in part");
        }
    }

    /// 5000 qps offered 4× is 20 000 tasks a second: too heavy for the shared test run
    /// (`cargo test -p osprey-dispatcher --lib throttle -- --ignored` to measure).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn accepted_rate_at_5000_qps() {
        let (rate, _, _) = offer(5000.0, 6).await;
        let err = (rate - 5000.0) / 5000.0 * 100.0;
        eprintln!("max_qps 5000: accepted {rate:.1}/s ({err:+.2} %)");
        assert!(err.abs() <= 2.0, "max_qps 5000: accepted {rate:.1}/s ({err:+.2} %)");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn below_the_limit_no_request_waits() {
        let t = Arc::new(Throttle::new(ThrottleSettings::default()));
        t.set_limit("m", Some(Limit::new(100.0, Some(10.0))));
        let mut tick = tokio::time::interval(Duration::from_millis(20)); // 50/s
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for _ in 0..100 {
            tick.tick().await;
            t.acquire("m").await.unwrap();
        }
        let st = &t.status()[0];
        assert_eq!(
            (st.accepted, st.waited, st.rejected_full + st.rejected_timeout),
            (100, 0, 0)
        );
    }

    #[tokio::test]
    async fn wait_then_pass_in_fifo_order() {
        let t = Arc::new(Throttle::new(ThrottleSettings {
            wait: Duration::from_secs(2),
            queue_capacity: 10,
        }));
        t.set_limit("m", Some(Limit::new(20.0, Some(1.0))));
        t.acquire("m").await.unwrap(); // the one token
        let order = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for n in 0..5 {
            let (t2, order) = (t.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                t2.acquire("m").await.unwrap();
                order.lock().unwrap().push(n);
            }));
            // Queue them in a known order.
            while t.status()[0].waiting < n + 1 {
                tokio::task::yield_now().await;
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        // 5 tokens at 20/s: ~250 ms.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        let st = &t.status()[0];
        assert_eq!((st.accepted, st.waited), (6, 5));
        assert!(st.waited_ms > 0.0);
    }

    #[tokio::test]
    async fn a_full_queue_rejects_at_once_and_a_wait_times_out() {
        let t = Arc::new(Throttle::new(ThrottleSettings {
            wait: Duration::from_millis(200),
            queue_capacity: 2,
        }));
        t.set_limit("m", Some(Limit::new(0.5, Some(1.0))));
        t.acquire("m").await.unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move { t.acquire("m").await })
            })
            .collect();
        while t.status()[0].waiting < 2 {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        let err = t.acquire("m").await.unwrap_err();
        // At once: not after the 200 ms wait (the margin is for a busy machine's scheduling).
        assert!(start.elapsed() < Duration::from_millis(50), "{:?}", start.elapsed());
        assert!(matches!(err, Throttled::QueueFull { .. }), "{err}");
        assert_eq!(err.code(), osprey_protocol::ErrorCode::Throttled);
        for w in waiters {
            assert!(matches!(w.await.unwrap(), Err(Throttled::Timeout { .. })));
        }
        let st = &t.status()[0];
        assert_eq!((st.rejected_full, st.rejected_timeout, st.waiting), (1, 2, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_throttled_member_does_not_slow_another() {
        let t = Arc::new(Throttle::new(ThrottleSettings {
            wait: Duration::from_secs(1),
            queue_capacity: 1000,
        }));
        t.set_limit("slow", Some(Limit::new(10.0, Some(1.0))));
        t.set_limit("fast", Some(Limit::new(100_000.0, None)));
        // Fill the slow member's queue.
        let hogs: Vec<_> = (0..500)
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move { t.acquire("slow").await })
            })
            .collect();
        let start = Instant::now();
        for _ in 0..1000 {
            t.acquire("fast").await.unwrap();
            t.acquire("unlimited").await.unwrap();
        }
        let took = start.elapsed();
        assert!(took < Duration::from_millis(200), "{took:?}");
        let fast = t.status().into_iter().find(|s| s.member == "fast").unwrap();
        assert_eq!(fast.waited, 0);
        for h in hogs {
            let _ = h.await;
        }
    }

    #[tokio::test]
    async fn live_rate_change_and_removal() {
        let t = Arc::new(Throttle::new(ThrottleSettings {
            wait: Duration::from_secs(5),
            queue_capacity: 10,
        }));
        t.set_limit("m", Some(Limit::new(0.1, Some(1.0))));
        t.acquire("m").await.unwrap();
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move { t.acquire("m").await })
        };
        while t.status()[0].waiting < 1 {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        t.set_limit("m", Some(Limit::new(1000.0, None)));
        waiter.await.unwrap().unwrap();
        assert!(start.elapsed() < Duration::from_millis(100), "{:?}", start.elapsed());
        assert_eq!(t.status()[0].max_qps, 1000.0);
        // Removed: no throttle at all.
        t.set_limit("m", None);
        assert!(t.status().is_empty());
        t.acquire("m").await.unwrap();
    }

    #[tokio::test]
    async fn replace_limits_sets_changes_and_removes() {
        let t = Throttle::new(ThrottleSettings::default());
        t.set_limit("a", Some(Limit::new(10.0, None)));
        t.set_limit("b", Some(Limit::new(10.0, None)));
        t.acquire("a").await.unwrap();
        t.replace_limits([
            ("a".to_string(), Limit::new(10.0, None)),
            ("c".to_string(), Limit::new(5.0, None)),
        ]);
        let st = t.status();
        let names: Vec<&str> = st.iter().map(|s| s.member.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(st[0].accepted, 1, "an unchanged member keeps its bucket");
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let t = Arc::new(Throttle::new(ThrottleSettings {
            wait: Duration::from_secs(5),
            queue_capacity: 1,
        }));
        t.set_limit("m", Some(Limit::new(0.1, Some(1.0))));
        t.acquire("m").await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(20), t.acquire("m")).await;
        assert!(r.is_err());
        assert_eq!(t.status()[0].waiting, 0, "the dropped waiter left");
        // Its place is free again.
        let r = tokio::time::timeout(Duration::from_millis(20), t.acquire("m")).await;
        assert!(r.is_err(), "queued (not rejected as full)");
    }
}

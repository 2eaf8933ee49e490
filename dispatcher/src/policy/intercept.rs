//! Slow-SQL interception: statements known to be slow are stopped before they reach a
//! worker.
//!
//! - **Check** ([`Intercept::check`], every request): one relaxed load of the bit
//!   `hash & (2^20 - 1)` of a 2^20-bit bitmap (128 KiB of `AtomicU64`), no lock. Only on a
//!   set bit is the exact set of blocked digests (a small map behind an `RwLock`) read, so a
//!   digest that merely shares a bit with a blocked one is never refused.
//! - **Accounting** ([`Intercept::record`], every END): the digest's statistics (a bounded,
//!   sharded table for `GET /digests`), and, for an execution over `slow_threshold_ms`, its
//!   time in the slow table. `slow_count` slow executions within `slow_window_s` block the
//!   digest (for `block_ttl_s`, 0 = until unblocked) — if its kind may be blocked (`kinds`).
//! - **Bounded memory.** The slow table holds at most `slow_table_capacity` digests, each
//!   with at most `slow_count` timestamps. A new slow digest in a full table takes the place
//!   of the entry whose latest slow execution is oldest (expired ones first): a digest that
//!   keeps being slow keeps fresh timestamps and stays; one evicted starts again from zero,
//!   which only delays its block. The statistics table holds at most `stats_capacity`
//!   digests in 16 shards; a new digest in a full shard replaces the one with the fewest
//!   executions (ties: least recently seen), so the frequent ones stay — counts of a digest
//!   that was evicted and came back restart from zero. Finding that entry scans the shard
//!   (256 entries by default) under its lock, only when a new digest arrives in a full one. The blocked set is as large as what
//!   was blocked; automatic blocks need `slow_count` slow runs each, so it stays small.
//! - Times come in as arguments (`*_at` variants) so that tests need no sleeps.

use std::collections::VecDeque;

// foldhash: these are looked up on every request (SipHash was ~4 % of the dispatcher).
use foldhash::{HashMap, HashMapExt};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use osprey_sql::{digest_id, Digest};
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

/// Bits of the bitmap: 2^20 (128 KiB).
pub const BITMAP_BITS: u64 = 1 << 20;
const SHARDS: usize = 16;
/// Digest text kept per statistics entry and block (the full text is in the slow log).
const TEXT_KEEP: usize = 1024;

/// The bitmap index of a digest hash.
pub fn bitmap_index(hash: u64) -> u64 {
    hash & (BITMAP_BITS - 1)
}

/// What a statement does, as far as blocking cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatementKind {
    Read,
    Write,
}

impl StatementKind {
    /// A first-word guess, for callers without the router's classifier: `SELECT` (without
    /// `INTO`/`FOR UPDATE`), `SHOW`, `DESC[RIBE]`, `EXPLAIN`, `WITH … SELECT` are reads.
    pub fn guess(digest: &Digest) -> StatementKind {
        let t = &digest.text;
        let first = t.split([' ', '(']).next().unwrap_or("");
        let read = match first {
            "SELECT" | "WITH" => {
                !(t.contains(" INTO ")
                    || t.contains(" FOR UPDATE")
                    || t.starts_with("WITH")
                        && (t.contains("UPDATE ") || t.contains("DELETE ") || t.contains("INSERT ")))
            }
            "SHOW" | "DESC" | "DESCRIBE" | "EXPLAIN" => true,
            _ => false,
        };
        if read {
            StatementKind::Read
        } else {
            StatementKind::Write
        }
    }
}

/// Which statement kinds slow accounting may block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockKinds {
    /// Every statement (as the design it comes from does).
    #[default]
    All,
    /// Reads only: a slow write is counted and logged, never blocked.
    Reads,
}

impl BlockKinds {
    pub fn allows(self, kind: StatementKind) -> bool {
        self == BlockKinds::All || kind == StatementKind::Read
    }
}

/// The interception settings (`[intercept]`, see `docs/CONFIG.md`); live-changeable with
/// [`Intercept::set_config`].
#[derive(Debug, Clone, PartialEq)]
pub struct InterceptSettings {
    pub enabled: bool,
    pub slow_threshold: Duration,
    pub slow_count: u32,
    pub slow_window: Duration,
    /// `None`: automatic blocks last until unblocked.
    pub block_ttl: Option<Duration>,
    pub kinds: BlockKinds,
    pub slow_table_capacity: usize,
    pub stats_capacity: usize,
}

impl Default for InterceptSettings {
    fn default() -> Self {
        InterceptSettings {
            enabled: true,
            slow_threshold: Duration::from_secs(1),
            slow_count: 3,
            slow_window: Duration::from_secs(60),
            block_ttl: Some(Duration::from_secs(600)),
            kinds: BlockKinds::All,
            slow_table_capacity: 1024,
            stats_capacity: 4096,
        }
    }
}

/// Why a digest is blocked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "by", rename_all = "lowercase")]
pub enum BlockReason {
    /// `count` executions over the threshold within `window_s`.
    Slow { count: u32, window_s: u64 },
    /// An operator blocked it.
    Manual,
}

/// A request refused because its digest is blocked: maps to `ERROR SQL_BLOCKED`
/// (dispatched = false, not retryable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("statement digest {id} is blocked ({}){}; unblock it with `osprey digests unblock {id}` (admin: POST /digests/{id}/unblock)",
    match reason { BlockReason::Slow { count, window_s } => format!("{count} executions over the slow threshold within {window_s} s"), BlockReason::Manual => "blocked by an operator".into() },
    match remaining_s { Some(s) => format!(", for {s} s more"), None => String::new() })]
pub struct Blocked {
    pub hash: u64,
    /// The digest id: 16 hex digits.
    pub id: String,
    pub reason: BlockReason,
    /// Seconds until the block expires; `None`: until unblocked.
    pub remaining_s: Option<u64>,
}

impl Blocked {
    pub fn code(&self) -> osprey_protocol::ErrorCode {
        osprey_protocol::ErrorCode::SqlBlocked
    }
}

/// One blocked digest, as listed by `GET /digests/blocked`.
#[derive(Debug, Clone, Serialize)]
pub struct BlockedDigest {
    pub id: String,
    pub text: String,
    pub reason: BlockReason,
    pub kind: Option<StatementKind>,
    /// Unix seconds.
    pub since: u64,
    /// Seconds until it expires; `None`: until unblocked.
    pub remaining_s: Option<u64>,
    /// Requests refused since it was blocked.
    pub rejected: u64,
}

/// One row of `GET /digests`.
#[derive(Debug, Clone, Serialize)]
pub struct DigestStat {
    pub id: String,
    pub text: String,
    pub kind: StatementKind,
    pub count: u64,
    pub total_ms: f64,
    pub max_ms: f64,
    /// Executions over the slow threshold (since the entry was created).
    pub slow: u64,
    /// `ok`, `counting` (slow executions within the window, not yet blocked) or `blocked`.
    pub state: &'static str,
    /// Unix seconds.
    pub last_seen: u64,
}

/// Sort order of [`Intercept::top`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopBy {
    #[default]
    Count,
    Time,
    Max,
}

/// What `record` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Not over the threshold (or interception off).
    Fast,
    /// Over the threshold; counted.
    Slow,
    /// Over the threshold, and this execution blocked the digest.
    SlowAndBlocked,
}

/// Counters for metrics and the status view (prometheus counters: registered by
/// [`crate::policy::Policy::register_metrics`]).
#[derive(Debug, Default)]
pub struct InterceptCounters {
    /// Requests refused with SQL_BLOCKED.
    pub blocked_requests: Counter,
    /// Blocks set (automatic and manual).
    pub blocks_set: Counter,
    /// Executions over the slow threshold.
    pub slow_executions: Counter,
    /// Bitmap hits that the exact set cleared (a shared bit, or an expired block).
    pub bitmap_false_hits: Counter,
}

struct BlockEntry {
    text: String,
    reason: BlockReason,
    kind: Option<StatementKind>,
    since: SystemTime,
    until: Option<Instant>,
    rejected: AtomicU64,
}

struct SlowEntry {
    times: VecDeque<Instant>,
}

struct Stat {
    text: String,
    kind: StatementKind,
    count: u64,
    total: Duration,
    max: Duration,
    slow: u64,
    last_seen: Instant,
    last_seen_wall: SystemTime,
}

/// The interception stage. Shared (`Arc`) between the request path and the admin API.
pub struct Intercept {
    bitmap: Box<[AtomicU64]>,
    enabled: AtomicBool,
    /// `slow_threshold` in µs and `stats_capacity`, read by every `record` without a lock.
    threshold_us: AtomicU64,
    stats_capacity: AtomicUsize,
    settings: RwLock<InterceptSettings>,
    blocked: RwLock<HashMap<u64, BlockEntry>>,
    slow: Mutex<HashMap<u64, SlowEntry>>,
    stats: Vec<Mutex<HashMap<u64, Stat>>>,
    pub counters: InterceptCounters,
}

fn unix_s(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn keep(text: &str) -> String {
    if text.len() <= TEXT_KEEP {
        return text.to_string();
    }
    let mut end = TEXT_KEEP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn remaining(until: Option<Instant>, now: Instant) -> Option<u64> {
    until.map(|u| u.saturating_duration_since(now).as_secs_f64().ceil() as u64)
}

impl Intercept {
    pub fn new(settings: InterceptSettings) -> Intercept {
        Intercept {
            bitmap: (0..BITMAP_BITS / 64).map(|_| AtomicU64::new(0)).collect(),
            enabled: AtomicBool::new(settings.enabled),
            threshold_us: AtomicU64::new(settings.slow_threshold.as_micros() as u64),
            stats_capacity: AtomicUsize::new(settings.stats_capacity),
            settings: RwLock::new(settings),
            blocked: RwLock::new(HashMap::new()),
            slow: Mutex::new(HashMap::new()),
            stats: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            counters: InterceptCounters::default(),
        }
    }

    pub fn settings(&self) -> InterceptSettings {
        self.settings.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Live change. Blocks already set stay (an operator unblocks them), except automatic
    /// blocks of a kind the new `kinds` no longer allows, which are lifted.
    pub fn set_config(&self, settings: InterceptSettings) {
        self.enabled.store(settings.enabled, Ordering::Relaxed);
        self.threshold_us
            .store(settings.slow_threshold.as_micros() as u64, Ordering::Relaxed);
        self.stats_capacity.store(settings.stats_capacity, Ordering::Relaxed);
        let kinds = settings.kinds;
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = settings;
        let lift: Vec<u64> = {
            let blocked = self.blocked.read().unwrap_or_else(|e| e.into_inner());
            blocked
                .iter()
                .filter(|(_, b)| {
                    matches!(b.reason, BlockReason::Slow { .. }) && b.kind.is_some_and(|k| !kinds.allows(k))
                })
                .map(|(h, _)| *h)
                .collect()
        };
        for h in lift {
            self.unblock(h);
        }
    }

    /// Whether an execution of `server_time` counts as slow (one relaxed load): the END
    /// path copies the statement for the slow log only then.
    pub fn is_slow(&self, server_time: Duration) -> bool {
        self.enabled() && server_time.as_micros() as u64 >= self.threshold_us.load(Ordering::Relaxed)
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    #[inline]
    fn bit_is_set(&self, hash: u64) -> bool {
        let bit = bitmap_index(hash);
        self.bitmap[(bit / 64) as usize].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0
    }

    /// The request path's check, before routing: `Err` means refuse with SQL_BLOCKED.
    #[inline]
    pub fn check(&self, digest: &Digest) -> Result<(), Blocked> {
        if !self.enabled() || !self.bit_is_set(digest.hash) {
            return Ok(());
        }
        self.check_slow(digest.hash, Instant::now())
    }

    /// [`Intercept::check`] at a given time (tests).
    pub fn check_at(&self, digest: &Digest, now: Instant) -> Result<(), Blocked> {
        if !self.enabled() || !self.bit_is_set(digest.hash) {
            return Ok(());
        }
        self.check_slow(digest.hash, now)
    }

    /// The bit is set: ask the exact set.
    #[cold]
    fn check_slow(&self, hash: u64, now: Instant) -> Result<(), Blocked> {
        let expired = {
            let blocked = self.blocked.read().unwrap_or_else(|e| e.into_inner());
            match blocked.get(&hash) {
                None => {
                    self.counters.bitmap_false_hits.inc();
                    return Ok(());
                }
                Some(b) if b.until.is_some_and(|u| u <= now) => true,
                Some(b) => {
                    b.rejected.fetch_add(1, Ordering::Relaxed);
                    self.counters.blocked_requests.inc();
                    return Err(Blocked {
                        hash,
                        id: digest_id(hash),
                        reason: b.reason.clone(),
                        remaining_s: remaining(b.until, now),
                    });
                }
            }
        };
        if expired {
            self.counters.bitmap_false_hits.inc();
            self.expire(hash, now);
        }
        Ok(())
    }

    /// Lifts `hash`'s block if it has expired by `now`.
    fn expire(&self, hash: u64, now: Instant) {
        let mut blocked = self.blocked.write().unwrap_or_else(|e| e.into_inner());
        if blocked.get(&hash).is_some_and(|b| b.until.is_some_and(|u| u <= now)) {
            blocked.remove(&hash);
            self.clear_bit_unless_shared(&blocked, hash);
            tracing::info!(digest = %digest_id(hash), "block expired");
        }
    }

    /// Clears `hash`'s bit unless another blocked digest uses it. Called with the write lock.
    fn clear_bit_unless_shared(&self, blocked: &HashMap<u64, BlockEntry>, hash: u64) {
        let index = bitmap_index(hash);
        if !blocked.keys().any(|h| bitmap_index(*h) == index) {
            self.bitmap[(index / 64) as usize].fetch_and(!(1 << (index % 64)), Ordering::Relaxed);
        }
    }

    fn set_block(&self, hash: u64, entry: BlockEntry) {
        let mut blocked = self.blocked.write().unwrap_or_else(|e| e.into_inner());
        // The exact set first, then the bit: a check that sees the bit finds the entry.
        blocked.insert(hash, entry);
        let index = bitmap_index(hash);
        self.bitmap[(index / 64) as usize].fetch_or(1 << (index % 64), Ordering::Release);
        self.counters.blocks_set.inc();
    }

    /// Accounts one finished execution (from its END): statistics always, slow accounting
    /// if `server_time` is over the threshold. Takes a shard lock; never waits for I/O.
    pub fn record(&self, digest: &Digest, kind: StatementKind, server_time: Duration) -> Recorded {
        self.record_at(digest, kind, server_time, Instant::now())
    }

    /// [`Intercept::record`] at a given time (tests).
    pub fn record_at(&self, digest: &Digest, kind: StatementKind, server_time: Duration, now: Instant) -> Recorded {
        if !self.enabled() {
            return Recorded::Fast;
        }
        let slow = server_time.as_micros() as u64 >= self.threshold_us.load(Ordering::Relaxed);
        self.update_stats(digest, kind, server_time, slow, now);
        if !slow {
            return Recorded::Fast;
        }
        self.counters.slow_executions.inc();
        let s = self.settings();
        let reached = {
            let mut table = self.slow.lock().unwrap_or_else(|e| e.into_inner());
            if !table.contains_key(&digest.hash) && table.len() >= s.slow_table_capacity.max(1) {
                evict_oldest(&mut table, now, s.slow_window);
            }
            let entry = table
                .entry(digest.hash)
                .or_insert_with(|| SlowEntry { times: VecDeque::new() });
            while entry
                .times
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) > s.slow_window)
            {
                entry.times.pop_front();
            }
            entry.times.push_back(now);
            while entry.times.len() > s.slow_count.max(1) as usize {
                entry.times.pop_front();
            }
            entry.times.len() >= s.slow_count.max(1) as usize
        };
        if !reached || !s.kinds.allows(kind) {
            return Recorded::Slow;
        }
        if self
            .blocked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&digest.hash)
        {
            return Recorded::Slow;
        }
        self.set_block(
            digest.hash,
            BlockEntry {
                text: keep(&digest.text),
                reason: BlockReason::Slow {
                    count: s.slow_count,
                    window_s: s.slow_window.as_secs(),
                },
                kind: Some(kind),
                since: SystemTime::now(),
                until: s.block_ttl.map(|ttl| now + ttl),
                rejected: AtomicU64::new(0),
            },
        );
        self.slow.lock().unwrap_or_else(|e| e.into_inner()).remove(&digest.hash);
        tracing::warn!(digest = %digest.id(), text = %keep(&digest.text), count = s.slow_count,
            window_s = s.slow_window.as_secs(), "slow statement blocked");
        Recorded::SlowAndBlocked
    }

    fn update_stats(&self, digest: &Digest, kind: StatementKind, time: Duration, slow: bool, now: Instant) {
        let capacity = (self.stats_capacity.load(Ordering::Relaxed) / SHARDS).max(1);
        let mut shard = self.stats[(digest.hash >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !shard.contains_key(&digest.hash) && shard.len() >= capacity {
            let victim = shard
                .iter()
                .min_by_key(|(_, s)| (s.count, s.last_seen))
                .map(|(h, _)| *h);
            if let Some(v) = victim {
                shard.remove(&v);
            }
        }
        let stat = shard.entry(digest.hash).or_insert_with(|| Stat {
            text: keep(&digest.text),
            kind,
            count: 0,
            total: Duration::ZERO,
            max: Duration::ZERO,
            slow: 0,
            last_seen: now,
            last_seen_wall: SystemTime::now(),
        });
        stat.count += 1;
        stat.total += time;
        stat.max = stat.max.max(time);
        stat.slow += u64::from(slow);
        stat.last_seen = now;
        stat.last_seen_wall = SystemTime::now();
    }

    /// Blocks `digest` by hand, for `ttl` (`None`: until unblocked). Replaces an existing
    /// block of it.
    pub fn block(&self, digest: &Digest, ttl: Option<Duration>) {
        self.block_hash(digest.hash, Some(&digest.text), ttl)
    }

    /// Blocks by id (the text is taken from the statistics if known).
    pub fn block_hash(&self, hash: u64, text: Option<&str>, ttl: Option<Duration>) {
        let text = match text {
            Some(t) => keep(t),
            None => self.stats[(hash >> 60) as usize % SHARDS]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&hash)
                .map(|s| s.text.clone())
                .unwrap_or_default(),
        };
        self.set_block(
            hash,
            BlockEntry {
                text,
                reason: BlockReason::Manual,
                kind: None,
                since: SystemTime::now(),
                until: ttl.map(|t| Instant::now() + t),
                rejected: AtomicU64::new(0),
            },
        );
        tracing::warn!(digest = %digest_id(hash), "statement blocked by an operator");
    }

    /// Lifts a block; its slow count starts again from zero. `false`: it was not blocked.
    pub fn unblock(&self, hash: u64) -> bool {
        let removed = {
            let mut blocked = self.blocked.write().unwrap_or_else(|e| e.into_inner());
            let removed = blocked.remove(&hash).is_some();
            if removed {
                self.clear_bit_unless_shared(&blocked, hash);
            }
            removed
        };
        self.slow.lock().unwrap_or_else(|e| e.into_inner()).remove(&hash);
        if removed {
            tracing::info!(digest = %digest_id(hash), "statement unblocked");
        }
        removed
    }

    /// The blocked digests (expired ones are dropped first).
    pub fn blocked(&self) -> Vec<BlockedDigest> {
        let now = Instant::now();
        let expired: Vec<u64> = {
            let blocked = self.blocked.read().unwrap_or_else(|e| e.into_inner());
            blocked
                .iter()
                .filter(|(_, b)| b.until.is_some_and(|u| u <= now))
                .map(|(h, _)| *h)
                .collect()
        };
        for h in expired {
            self.expire(h, now);
        }
        let blocked = self.blocked.read().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<BlockedDigest> = blocked
            .iter()
            .map(|(h, b)| BlockedDigest {
                id: digest_id(*h),
                text: b.text.clone(),
                reason: b.reason.clone(),
                kind: b.kind,
                since: unix_s(b.since),
                remaining_s: remaining(b.until, now),
                rejected: b.rejected.load(Ordering::Relaxed),
            })
            .collect();
        list.sort_by_key(|b| std::cmp::Reverse(b.since));
        list
    }

    /// Whether `hash` is blocked now.
    pub fn is_blocked(&self, hash: u64) -> bool {
        let now = Instant::now();
        self.blocked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
            .is_some_and(|b| b.until.is_none_or(|u| u > now))
    }

    /// The top `limit` digests by `by`, with their state.
    pub fn top(&self, by: TopBy, limit: usize) -> Vec<DigestStat> {
        let now = Instant::now();
        let window = self.settings().slow_window;
        let counting: std::collections::HashSet<u64> = self
            .slow
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, e)| {
                e.times
                    .back()
                    .is_some_and(|t| now.saturating_duration_since(*t) <= window)
            })
            .map(|(h, _)| *h)
            .collect();
        let mut rows = Vec::new();
        for shard in &self.stats {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            rows.extend(shard.iter().map(|(h, s)| {
                (
                    *h,
                    s.count,
                    s.total,
                    s.max,
                    s.text.clone(),
                    s.kind,
                    s.slow,
                    s.last_seen_wall,
                )
            }));
        }
        match by {
            TopBy::Count => rows.sort_by_key(|r| std::cmp::Reverse(r.1)),
            TopBy::Time => rows.sort_by_key(|r| std::cmp::Reverse(r.2)),
            TopBy::Max => rows.sort_by_key(|r| std::cmp::Reverse(r.3)),
        }
        rows.truncate(limit);
        rows.into_iter()
            .map(|(h, count, total, max, text, kind, slow, last)| DigestStat {
                id: digest_id(h),
                text,
                kind,
                count,
                total_ms: total.as_secs_f64() * 1e3,
                max_ms: max.as_secs_f64() * 1e3,
                slow,
                state: if self.is_blocked(h) {
                    "blocked"
                } else if counting.contains(&h) {
                    "counting"
                } else {
                    "ok"
                },
                last_seen: unix_s(last),
            })
            .collect()
    }

    /// Whether the digest ran over the slow threshold within the slow window (it is in
    /// the slow table): a worker writes nothing behind such a statement (prefetch).
    pub fn ran_slow_lately(&self, hash: u64) -> bool {
        if !self.enabled() {
            return false;
        }
        let last = self
            .slow
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
            .and_then(|e| e.times.back().copied());
        last.is_some_and(|t| Instant::now().saturating_duration_since(t) <= self.settings().slow_window)
    }

    /// Entries in the slow table (for tests and the status view).
    pub fn slow_table_len(&self) -> usize {
        self.slow.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Makes room in a full slow table: drops the expired entries, or else the one whose
/// latest slow execution is oldest.
fn evict_oldest(table: &mut HashMap<u64, SlowEntry>, now: Instant, window: Duration) {
    let before = table.len();
    table.retain(|_, e| {
        e.times
            .back()
            .is_some_and(|t| now.saturating_duration_since(*t) <= window)
    });
    if table.len() < before {
        return;
    }
    if let Some(victim) = table
        .iter()
        .min_by_key(|(_, e)| e.times.back().copied())
        .map(|(h, _)| *h)
    {
        table.remove(&victim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use osprey_sql::digest;

    fn settings() -> InterceptSettings {
        InterceptSettings {
            slow_threshold: Duration::from_millis(200),
            slow_count: 3,
            slow_window: Duration::from_secs(60),
            block_ttl: Some(Duration::from_secs(30)),
            ..InterceptSettings::default()
        }
    }

    const SLOW: Duration = Duration::from_millis(300);

    #[test]
    fn three_slow_runs_block_the_fourth_and_only_it() {
        let i = Intercept::new(settings());
        let t0 = Instant::now();
        let slow = digest("SELECT SLEEP(0.3), 1");
        let other = digest("SELECT * FROM t WHERE id = 1");
        for n in 0..2 {
            assert_eq!(
                i.record_at(&slow, StatementKind::Read, SLOW, t0 + Duration::from_secs(n)),
                Recorded::Slow
            );
            assert!(i.check_at(&slow, t0).is_ok());
        }
        assert_eq!(
            i.record_at(&slow, StatementKind::Read, SLOW, t0 + Duration::from_secs(2)),
            Recorded::SlowAndBlocked
        );
        // Another literal, the same digest.
        let again = digest("SELECT SLEEP(0.3), 'x'");
        let err = i.check_at(&again, t0 + Duration::from_secs(3)).unwrap_err();
        assert_eq!(err.id, slow.id());
        let msg = err.to_string();
        assert!(
            msg.contains(&slow.id()) && msg.contains("osprey digests unblock"),
            "{msg}"
        );
        assert!(i.check_at(&other, t0).is_ok());
        assert_eq!(i.counters.blocked_requests.get(), 1);
        // Unblock → runs; the count starts again.
        assert!(i.unblock(slow.hash));
        assert!(i.check_at(&again, t0 + Duration::from_secs(4)).is_ok());
        assert_eq!(
            i.record_at(&slow, StatementKind::Read, SLOW, t0 + Duration::from_secs(5)),
            Recorded::Slow
        );
    }

    #[test]
    fn fast_runs_and_runs_outside_the_window_do_not_block() {
        let i = Intercept::new(settings());
        let t0 = Instant::now();
        let d = digest("SELECT SLEEP(0.3)");
        for n in 0..10 {
            i.record_at(
                &d,
                StatementKind::Read,
                Duration::from_millis(199),
                t0 + Duration::from_secs(n),
            );
        }
        assert!(i.check_at(&d, t0).is_ok());
        // Three slow ones, but 61 s apart: never three within the window.
        for n in 0..3 {
            assert_eq!(
                i.record_at(&d, StatementKind::Read, SLOW, t0 + Duration::from_secs(61 * n)),
                Recorded::Slow
            );
        }
        assert!(i.check_at(&d, t0 + Duration::from_secs(200)).is_ok());
    }

    #[test]
    fn blocks_expire_after_the_ttl() {
        let i = Intercept::new(settings());
        let t0 = Instant::now();
        let d = digest("SELECT SLEEP(0.3)");
        for n in 0..3 {
            i.record_at(&d, StatementKind::Read, SLOW, t0 + Duration::from_secs(n));
        }
        let err = i.check_at(&d, t0 + Duration::from_secs(10)).unwrap_err();
        assert!(err.remaining_s.is_some_and(|s| s > 0 && s <= 30));
        assert!(i.check_at(&d, t0 + Duration::from_secs(2 + 30)).is_ok(), "expired");
        // Expiry removed it and cleared its bit.
        assert!(!i.bit_is_set(d.hash));
        assert!(i.blocked().is_empty());
    }

    #[test]
    fn ttl_zero_means_until_unblocked() {
        let i = Intercept::new(InterceptSettings {
            block_ttl: None,
            ..settings()
        });
        let t0 = Instant::now();
        let d = digest("SELECT SLEEP(0.3)");
        for n in 0..3 {
            i.record_at(&d, StatementKind::Read, SLOW, t0 + Duration::from_secs(n));
        }
        let err = i.check_at(&d, t0 + Duration::from_secs(100_000)).unwrap_err();
        assert_eq!(err.remaining_s, None);
    }

    /// Two digests that share a bitmap bit (found by search): blocking one never blocks the other.
    #[test]
    fn a_shared_bit_never_blocks_an_innocent_statement() {
        let mut seen: HashMap<u64, Digest> = HashMap::new();
        let (guilty, innocent) = (0u64..)
            .find_map(|n| {
                let d = digest(&format!("SELECT c{n} FROM t WHERE id = 1"));
                match seen.get(&bitmap_index(d.hash)) {
                    Some(other) if other.hash != d.hash => Some((other.clone(), d)),
                    _ => {
                        seen.insert(bitmap_index(d.hash), d);
                        None
                    }
                }
            })
            .unwrap();
        assert_eq!(bitmap_index(guilty.hash), bitmap_index(innocent.hash));
        assert_ne!(guilty.hash, innocent.hash);
        eprintln!(
            "collision after {} digests: {:?} / {:?} at bit {}",
            seen.len() + 1,
            guilty.text,
            innocent.text,
            bitmap_index(guilty.hash)
        );
        let i = Intercept::new(settings());
        i.block(&guilty, None);
        assert!(i.check(&guilty).is_err());
        assert!(i.bit_is_set(innocent.hash), "the bit is shared");
        assert!(i.check(&innocent).is_ok(), "the exact set clears the innocent one");
        assert_eq!(i.counters.bitmap_false_hits.get(), 1);
        // Both blocked, then one unblocked: the shared bit stays for the other.
        i.block(&innocent, None);
        assert!(i.unblock(guilty.hash));
        assert!(i.bit_is_set(innocent.hash));
        assert!(i.check(&innocent).is_err());
        assert!(i.check(&guilty).is_ok());
        assert!(i.unblock(innocent.hash));
        assert!(!i.bit_is_set(innocent.hash));
    }

    #[test]
    fn kinds_reads_never_blocks_a_write_and_a_live_change_lifts_such_blocks() {
        let i = Intercept::new(InterceptSettings {
            kinds: BlockKinds::Reads,
            ..settings()
        });
        let t0 = Instant::now();
        let w = digest("UPDATE t SET a = SLEEP(1) WHERE id = 1");
        assert_eq!(StatementKind::guess(&w), StatementKind::Write);
        for n in 0..5 {
            assert_eq!(
                i.record_at(&w, StatementKind::Write, SLOW, t0 + Duration::from_secs(n)),
                Recorded::Slow
            );
        }
        assert!(i.check_at(&w, t0).is_ok());
        i.set_config(settings()); // kinds = all
                                  // It was counted all along: the next slow run blocks it.
        assert_eq!(
            i.record_at(&w, StatementKind::Write, SLOW, t0 + Duration::from_secs(6)),
            Recorded::SlowAndBlocked
        );
        assert!(i.check_at(&w, t0 + Duration::from_secs(9)).is_err());
        i.set_config(InterceptSettings {
            kinds: BlockKinds::Reads,
            ..settings()
        });
        assert!(i.check_at(&w, t0 + Duration::from_secs(9)).is_ok());
    }

    #[test]
    fn disabled_checks_nothing_and_live_threshold_change_applies() {
        let i = Intercept::new(settings());
        let d = digest("SELECT 1");
        i.block(&d, None);
        assert!(i.check(&d).is_err());
        i.set_config(InterceptSettings {
            enabled: false,
            ..settings()
        });
        assert!(i.check(&d).is_ok());
        i.set_config(InterceptSettings {
            slow_threshold: Duration::from_millis(50),
            ..settings()
        });
        assert!(i.check(&d).is_err(), "manual blocks survive a config change");
        let e = digest("SELECT 2");
        assert_eq!(
            i.record(&e, StatementKind::Read, Duration::from_millis(60)),
            Recorded::Slow
        );
    }

    #[test]
    fn slow_table_is_bounded_and_keeps_the_recently_slow() {
        let i = Intercept::new(InterceptSettings {
            slow_table_capacity: 8,
            ..settings()
        });
        let t0 = Instant::now();
        let hot = digest("SELECT SLEEP(1) FROM hot");
        i.record_at(&hot, StatementKind::Read, SLOW, t0);
        for n in 0..100u64 {
            let d = digest(&format!("SELECT SLEEP(1) FROM t{n}"));
            let now = t0 + Duration::from_millis(10 * n + 5);
            i.record_at(&d, StatementKind::Read, SLOW, now);
            if n % 5 == 0 {
                i.record_at(&hot, StatementKind::Read, SLOW, now);
            }
            assert!(i.slow_table_len() <= 8);
        }
        // `hot` stayed: its third slow run blocked it despite 100 other slow digests.
        assert!(i.is_blocked(hot.hash));
    }

    #[test]
    fn stats_table_is_bounded_and_keeps_the_frequent() {
        let i = Intercept::new(InterceptSettings {
            stats_capacity: 64,
            ..settings()
        });
        let busy = digest("SELECT * FROM busy WHERE id = 1");
        for n in 0..5000u64 {
            i.record(&busy, StatementKind::Read, Duration::from_micros(100));
            i.record(
                &digest(&format!("SELECT c{n} FROM t")),
                StatementKind::Read,
                Duration::from_micros(100),
            );
        }
        let top = i.top(TopBy::Count, 1000);
        assert!(top.len() <= 64, "{}", top.len());
        assert_eq!(top[0].id, busy.id());
        assert_eq!(top[0].count, 5000);
        assert_eq!(top[0].state, "ok");
    }

    #[test]
    fn top_shows_state_and_blocked_lists_blocks() {
        let i = Intercept::new(settings());
        let t0 = Instant::now();
        let d = digest("SELECT SLEEP(0.3)");
        i.record_at(&d, StatementKind::Read, SLOW, t0);
        assert_eq!(i.top(TopBy::Time, 10)[0].state, "counting");
        i.record_at(&d, StatementKind::Read, SLOW, t0);
        i.record_at(&d, StatementKind::Read, SLOW, t0);
        let top = i.top(TopBy::Max, 10);
        assert_eq!(top[0].state, "blocked");
        assert_eq!(top[0].count, 3);
        assert!((top[0].max_ms - 300.0).abs() < 1e-6);
        let b = i.blocked();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].id, d.id());
        assert_eq!(b[0].reason, BlockReason::Slow { count: 3, window_s: 60 });
        serde_json::to_string(&b).unwrap();
        serde_json::to_string(&top).unwrap();
    }

    /// The request path's check stays lock-free and cheap with blocks present.
    #[test]
    fn check_of_an_unblocked_digest_takes_no_lock() {
        let i = Intercept::new(settings());
        for n in 0..100 {
            i.block(&digest(&format!("SELECT {n} FROM blocked_{n}")), None);
        }
        let d = digest("SELECT * FROM t WHERE id = 1");
        if i.bit_is_set(d.hash) {
            return; // 100 / 2^20 chance; the collision test covers that path
        }
        // Hold the write lock: a check that needed it would hang.
        let _guard = i.blocked.write().unwrap();
        assert!(i.check(&d).is_ok());
    }
}

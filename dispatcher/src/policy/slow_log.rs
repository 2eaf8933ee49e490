//! The slow log: every slow execution goes, off the request path, into a table on the
//! cluster's current primary, for later tuning.
//!
//! [`SlowLog::submit`] is a `try_send` on a channel bounded in count (`channel_capacity`)
//! and in bytes (`channel_bytes`, the entries' text): it never waits; an entry that does
//! not fit is dropped and counted. One writer task takes entries in batches of up to
//! `batch_rows` and inserts each batch with one multi-row `INSERT` on its own connection
//! (never a worker's) to the target the `watch` channel names — the lead's topology
//! provider sends the primary's address on every change of primary, `None` while there
//! is none. The writer creates the schema and the table if missing (on each new
//! connection). Connecting and every statement have a timeout (`timeout`), so a target
//! that is down or blackholed costs the writer time, never the request path: meanwhile
//! entries wait in the channel (bounded) and beyond it are dropped. A batch whose insert
//! fails is dropped (counted); the writer reconnects after `retry` (or at once when the
//! target changes).
//!
//! The rows replicate like any write on the primary, so after a failover the new primary
//! has the table (or the writer creates it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::backend_conn::{ConnectError, Connector, Tls};

/// Where the slow log goes: the cluster's current primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowLogTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    /// The cluster's TLS settings, as the workers use them.
    pub tls: Tls,
}

/// The slow log's settings (`[intercept]` `slow_log_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct SlowLogSettings {
    /// Schema and table (plain identifiers: letters, digits, `_`, `$`; checked by the config).
    pub schema: String,
    pub table: String,
    pub channel_capacity: usize,
    pub channel_bytes: usize,
    pub batch_rows: usize,
    /// Bytes of the statement kept as its sample.
    pub sample_bytes: usize,
    /// Timeout of the connect and of each statement.
    pub timeout: Duration,
    /// Wait before reconnecting after a failure.
    pub retry: Duration,
}

impl Default for SlowLogSettings {
    fn default() -> Self {
        SlowLogSettings {
            schema: "osprey".into(),
            table: "slow_log".into(),
            channel_capacity: 10_000,
            channel_bytes: 16 * 1024 * 1024,
            batch_rows: 100,
            sample_bytes: 1024,
            timeout: Duration::from_secs(2),
            retry: Duration::from_secs(1),
        }
    }
}

/// Whether `name` is a plain identifier we may put between backquotes unescaped.
pub fn valid_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'$')
}

/// One slow execution.
#[derive(Debug, Clone)]
pub struct SlowEntry {
    pub digest: u64,
    pub digest_text: String,
    /// The statement as sent (truncated to `sample_bytes` by [`SlowLog::submit`]).
    pub sample: String,
    pub duration: Duration,
    pub rows: u64,
    pub member: String,
    pub at: SystemTime,
    /// Who sent it (connection id, peer address or token name: the caller's choice).
    pub client: String,
}

impl SlowEntry {
    fn bytes(&self) -> usize {
        self.digest_text.len() + self.sample.len() + self.member.len() + self.client.len() + 64
    }
}

/// Counters of the slow log (prometheus counters, registered by
/// [`crate::policy::Policy::register_metrics`]).
#[derive(Debug, Default)]
pub struct SlowLogCounters {
    pub submitted: Counter,
    /// Dropped at submit: the channel was full (count or bytes).
    pub dropped_full: Counter,
    /// Dropped by the writer: their insert failed.
    pub dropped_failed: Counter,
    pub written: Counter,
    pub write_errors: Counter,
    pub connects: Counter,
}

/// [`SlowLogCounters`] as numbers, for the status view.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SlowLogStatus {
    pub submitted: u64,
    pub dropped_full: u64,
    pub dropped_failed: u64,
    pub written: u64,
    pub write_errors: u64,
    pub connects: u64,
    pub queued: usize,
}

/// Slow executions the operations page shows, newest first, and how much of each
/// statement's text.
const LATEST: usize = 20;
const LATEST_SAMPLE: usize = 200;

/// One of the latest slow executions, as the operations page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LatestEntry {
    /// When it ended, ms since the Unix epoch.
    pub at_ms: u64,
    /// The digest's id (16 hex digits).
    pub digest: String,
    /// The statement's text as sent, cut at 200 bytes.
    pub sample: String,
    pub duration_ms: f64,
    pub rows: u64,
    pub member: String,
}

/// The request path's handle: cheap to clone.
#[derive(Clone)]
pub struct SlowLog {
    tx: mpsc::Sender<SlowEntry>,
    /// The latest [`LATEST`] slow executions (each submitted one, written or not).
    latest: Arc<std::sync::Mutex<std::collections::VecDeque<LatestEntry>>>,
    queued_bytes: Arc<AtomicUsize>,
    channel_bytes: usize,
    sample_bytes: usize,
    pub counters: Arc<SlowLogCounters>,
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

impl SlowLog {
    /// Starts the writer task. It ends when every [`SlowLog`] handle is dropped (after
    /// writing what is queued, within its timeouts).
    pub fn spawn(
        settings: SlowLogSettings,
        target: watch::Receiver<Option<SlowLogTarget>>,
    ) -> (SlowLog, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(settings.channel_capacity.max(1));
        let log = SlowLog {
            tx,
            latest: Arc::default(),
            queued_bytes: Arc::new(AtomicUsize::new(0)),
            channel_bytes: settings.channel_bytes,
            sample_bytes: settings.sample_bytes,
            counters: Arc::new(SlowLogCounters::default()),
        };
        let writer = Writer {
            settings,
            target,
            rx,
            queued_bytes: log.queued_bytes.clone(),
            counters: log.counters.clone(),
            conn: None,
        };
        let span = tracing::info_span!("slow_log", schema = %writer.settings.schema, table = %writer.settings.table);
        let handle = tokio::spawn(tracing::Instrument::instrument(writer.run(), span));
        (log, handle)
    }

    /// Queues an entry for the writer; never waits. `false`: dropped (channel full).
    pub fn submit(&self, mut entry: SlowEntry) -> bool {
        self.counters.submitted.inc();
        truncate(&mut entry.sample, self.sample_bytes);
        truncate(&mut entry.digest_text, 64 * 1024);
        self.remember(&entry);
        let size = entry.bytes();
        if self.queued_bytes.fetch_add(size, Ordering::Relaxed) + size > self.channel_bytes {
            self.queued_bytes.fetch_sub(size, Ordering::Relaxed);
            self.counters.dropped_full.inc();
            return false;
        }
        match self.tx.try_send(entry) {
            Ok(()) => true,
            Err(_) => {
                self.queued_bytes.fetch_sub(size, Ordering::Relaxed);
                self.counters.dropped_full.inc();
                false
            }
        }
    }

    pub fn status(&self) -> SlowLogStatus {
        let c = &self.counters;
        SlowLogStatus {
            submitted: c.submitted.get(),
            dropped_full: c.dropped_full.get(),
            dropped_failed: c.dropped_failed.get(),
            written: c.written.get(),
            write_errors: c.write_errors.get(),
            connects: c.connects.get(),
            queued: self.queued(),
        }
    }

    /// The latest slow executions, newest first.
    pub fn latest(&self) -> Vec<LatestEntry> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn remember(&self, entry: &SlowEntry) {
        let mut sample = entry.sample.clone();
        truncate(&mut sample, LATEST_SAMPLE);
        let latest = LatestEntry {
            at_ms: entry
                .at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            digest: osprey_sql::digest_id(entry.digest),
            sample,
            duration_ms: entry.duration.as_secs_f64() * 1000.0,
            rows: entry.rows,
            member: entry.member.clone(),
        };
        let mut l = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        l.push_front(latest);
        l.truncate(LATEST);
    }

    /// Entries queued and not yet taken by the writer.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("no primary to write the slow log to")]
    NoTarget,
    #[error("slow-log database timed out after {0:?}")]
    Timeout(Duration),
    #[error("slow-log database: {0}")]
    Mysql(#[from] mysql_async::Error),
}

struct Writer {
    settings: SlowLogSettings,
    target: watch::Receiver<Option<SlowLogTarget>>,
    rx: mpsc::Receiver<SlowEntry>,
    queued_bytes: Arc<AtomicUsize>,
    counters: Arc<SlowLogCounters>,
    conn: Option<(SlowLogTarget, Conn)>,
}

impl Writer {
    async fn run(mut self) {
        let mut batch = Vec::with_capacity(self.settings.batch_rows);
        loop {
            if batch.is_empty() {
                match self.rx.recv().await {
                    Some(e) => batch.push(e),
                    None => return,
                }
            }
            while batch.len() < self.settings.batch_rows.max(1) {
                match self.rx.try_recv() {
                    Ok(e) => batch.push(e),
                    Err(_) => break,
                }
            }
            match self.write(&batch).await {
                Ok(()) => {
                    self.taken(&batch);
                    self.counters.written.inc_by(batch.len() as u64);
                    batch.clear();
                }
                Err(WriteError::NoTarget) => {
                    // Keep the batch; wait for a primary (entries behind it stay queued, bounded).
                    if self.target.changed().await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, rows = batch.len(), "slow log: batch dropped");
                    self.counters.write_errors.inc();
                    self.counters.dropped_failed.inc_by(batch.len() as u64);
                    self.taken(&batch);
                    batch.clear();
                    if let Some((_, conn)) = self.conn.take() {
                        // Do not wait for a polite close on a connection that just failed.
                        drop(conn);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(self.settings.retry) => {}
                        _ = self.target.changed() => {}
                    }
                }
            }
        }
    }

    fn taken(&self, batch: &[SlowEntry]) {
        let bytes: usize = batch.iter().map(SlowEntry::bytes).sum();
        self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    async fn timed<T>(
        timeout: Duration,
        f: impl std::future::Future<Output = Result<T, mysql_async::Error>>,
    ) -> Result<T, WriteError> {
        match tokio::time::timeout(timeout, f).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(WriteError::Timeout(timeout)),
        }
    }

    async fn connection(&mut self) -> Result<&mut Conn, WriteError> {
        let target = self.target.borrow_and_update().clone().ok_or(WriteError::NoTarget)?;
        if self.conn.as_ref().is_some_and(|(t, _)| *t != target) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let timeout = self.settings.timeout;
            let connector = Connector::new(&target.host, target.port, &target.user, &target.password, &target.tls);
            let mut conn = connector.connect(timeout).await.map_err(|e| match e {
                ConnectError::Timeout(after) => WriteError::Timeout(after),
                ConnectError::Mysql(e) => WriteError::Mysql(e),
            })?;
            self.counters.connects.inc();
            let (schema, table) = (&self.settings.schema, &self.settings.table);
            Self::timed(
                timeout,
                conn.query_drop(format!("CREATE SCHEMA IF NOT EXISTS `{schema}`")),
            )
            .await?;
            Self::timed(
                timeout,
                conn.query_drop(format!(
                    "CREATE TABLE IF NOT EXISTS `{schema}`.`{table}` (
                       id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
                       logged_at TIMESTAMP(6) NOT NULL,
                       digest CHAR(16) NOT NULL COMMENT 'digest id: XXH3-64 of digest_text, hex',
                       digest_text TEXT NOT NULL,
                       sample TEXT NOT NULL COMMENT 'the statement, truncated',
                       duration_us BIGINT UNSIGNED NOT NULL,
                       rows_count BIGINT UNSIGNED NOT NULL,
                       member VARCHAR(255) NOT NULL,
                       client VARCHAR(255) NOT NULL,
                       KEY digest (digest),
                       KEY logged_at (logged_at)
                     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT='Osprey slow log'"
                )),
            )
            .await?;
            tracing::info!(host = %target.host, port = target.port, "slow log: connected");
            self.conn = Some((target, conn));
        }
        match self.conn.as_mut() {
            Some((_, c)) => Ok(c),
            None => Err(WriteError::NoTarget),
        }
    }

    async fn write(&mut self, batch: &[SlowEntry]) -> Result<(), WriteError> {
        let timeout = self.settings.timeout;
        let sql = format!(
            "INSERT INTO `{}`.`{}` (logged_at, digest, digest_text, sample, duration_us, rows_count, member, client) VALUES {}",
            self.settings.schema,
            self.settings.table,
            vec!["(FROM_UNIXTIME(?), ?, ?, ?, ?, ?, ?, ?)"; batch.len()].join(", ")
        );
        let mut params: Vec<Value> = Vec::with_capacity(batch.len() * 8);
        for e in batch {
            let at = e.at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            params.push(Value::Bytes(
                format!("{}.{:06}", at.as_secs(), at.subsec_micros()).into_bytes(),
            ));
            params.push(Value::Bytes(osprey_sql::digest_id(e.digest).into_bytes()));
            params.push(Value::Bytes(e.digest_text.clone().into_bytes()));
            params.push(Value::Bytes(e.sample.clone().into_bytes()));
            params.push(Value::UInt(e.duration.as_micros() as u64));
            params.push(Value::UInt(e.rows));
            params.push(Value::Bytes(e.member.clone().into_bytes()));
            params.push(Value::Bytes(e.client.clone().into_bytes()));
        }
        let conn = self.connection().await?;
        Self::timed(timeout, conn.exec_drop(sql, params)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use osprey_sandbox::Sandbox;

    fn entry(sql: &str, n: u64) -> SlowEntry {
        let d = osprey_sql::digest(sql);
        SlowEntry {
            digest: d.hash,
            digest_text: d.text,
            sample: sql.to_string(),
            duration: Duration::from_millis(300 + n),
            rows: n,
            member: "db1".into(),
            at: SystemTime::now(),
            client: format!("conn-{n}"),
        }
    }

    async fn count_rows(conn: &mut Conn, digest: &str) -> u64 {
        conn.exec_first::<u64, _, _>("SELECT COUNT(*) FROM osprey.slow_log WHERE digest = ?", (digest,))
            .await
            .unwrap_or(None)
            .unwrap_or(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_arrive_on_the_primary_with_the_right_digest() {
        let sb = Sandbox::start(0).await.unwrap();
        let p = sb.primary();
        let (_tx, rx) = watch::channel(Some(SlowLogTarget {
            host: p.host().into(),
            port: p.port(),
            user: p.user().into(),
            password: p.password().into(),
            tls: Default::default(),
        }));
        let (log, _writer) = SlowLog::spawn(SlowLogSettings::default(), rx);
        let sql = "SELECT SLEEP(0.3), 'a long literal that is sampled'";
        let d = osprey_sql::digest(sql);
        for n in 0..250 {
            assert!(log.submit(entry(sql, n)));
        }
        let mut conn = p.conn().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while count_rows(&mut conn, &d.id()).await < 250 {
            assert!(Instant::now() < deadline, "rows did not arrive: {:?}", log.status());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (text, sample, us, rows, member, client): (String, String, u64, u64, String, String) = conn
            .exec_first(
                "SELECT digest_text, sample, duration_us, rows_count, member, client FROM osprey.slow_log WHERE digest = ? ORDER BY id LIMIT 1",
                (d.id(),),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(text, d.text);
        assert_eq!(sample, sql);
        assert_eq!(
            (us, rows, member.as_str(), client.as_str()),
            (300_000, 0, "db1", "conn-0")
        );
        assert_eq!(log.counters.written.get(), 250);
        assert!(log.counters.connects.get() == 1, "batched on one connection");
    }

    /// A target that accepts TCP and never answers (a blackholed database): `submit` stays
    /// non-blocking, the overflow is dropped and counted, and once the target moves to a
    /// live server the log flows again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blackholed_target_slows_no_submit() {
        let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hole_port = hole.local_addr().unwrap().port();
        let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
        {
            let held = held.clone();
            tokio::spawn(async move {
                while let Ok((s, _)) = hole.accept().await {
                    held.lock().await.push(s); // keep it open, never answer
                }
            });
        }
        let (tx, rx) = watch::channel(Some(SlowLogTarget {
            host: "127.0.0.1".into(),
            port: hole_port,
            user: "root".into(),
            password: String::new(),
            tls: Default::default(),
        }));
        let settings = SlowLogSettings {
            channel_capacity: 1000,
            timeout: Duration::from_millis(500),
            ..SlowLogSettings::default()
        };
        let (log, _writer) = SlowLog::spawn(settings, rx);
        let sql = "SELECT * FROM big WHERE a LIKE '%x%'";
        let mut times = Vec::new();
        let start = Instant::now();
        let n = 20_000u64;
        for i in 0..n {
            let e = entry(sql, i);
            let t = Instant::now();
            log.submit(e);
            times.push(t.elapsed());
            if i % 1000 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let total = start.elapsed();
        times.sort();
        let (p99, worst) = (times[times.len() * 99 / 100], times[times.len() - 1]);
        let dropped = log.counters.dropped_full.get();
        eprintln!(
            "blackholed: {n} submits in {total:?} ({:?} each), p99 {p99:?}, worst {worst:?}, dropped {dropped}, queued {}",
            total / n as u32,
            log.queued()
        );
        // Waiting for the writer would take its 500 ms timeout; shared cores alone can
        // cost a few ms once in a while.
        assert!(p99 < Duration::from_millis(1), "p99 submit {p99:?}");
        assert!(worst < Duration::from_millis(250), "worst submit {worst:?}");
        assert!(dropped >= n - 1000 - 100, "overflow dropped: {dropped}");
        assert!(!held.lock().await.is_empty(), "the writer did reach the blackhole");
        // Move the target to a live primary: the log flows again.
        let sb = Sandbox::start(0).await.unwrap();
        let p = sb.primary();
        tx.send(Some(SlowLogTarget {
            host: p.host().into(),
            port: p.port(),
            user: p.user().into(),
            password: p.password().into(),
            tls: Default::default(),
        }))
        .unwrap();
        let d = osprey_sql::digest("SELECT 'after the switch'");
        let deadline = Instant::now() + Duration::from_secs(20);
        // The 1000 queued entries drain into the new primary first.
        while !log.submit(entry("SELECT 'after the switch'", 1)) {
            assert!(
                Instant::now() < deadline,
                "the channel did not drain: {:?}",
                log.status()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut conn = p.conn().await.unwrap();
        while count_rows(&mut conn, &d.id()).await < 1 {
            assert!(Instant::now() < deadline, "no row after the switch: {:?}", log.status());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn the_byte_bound_drops_too() {
        let (_tx, rx) = watch::channel(None);
        let (log, _writer) = SlowLog::spawn(
            SlowLogSettings {
                channel_bytes: 10_000,
                ..SlowLogSettings::default()
            },
            rx,
        );
        let big = format!("SELECT '{}'", "x".repeat(900));
        let accepted = (0..100).filter(|n| log.submit(entry(&big, *n))).count();
        // ~1 KiB each (sample capped at 1024 bytes) against 10 000 bytes.
        assert!((5..=10).contains(&accepted), "{accepted}");
        assert_eq!(log.counters.dropped_full.get(), 100 - accepted as u64);
    }

    #[test]
    fn identifiers_are_checked() {
        assert!(valid_identifier("osprey_1"));
        assert!(!valid_identifier("a`b"));
        assert!(!valid_identifier(""));
        assert!(!valid_identifier(&"x".repeat(65)));
    }
}

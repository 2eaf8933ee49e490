//! One monitor task per member: a probe round every `interval_ms`, fed into the
//! [`Accumulator`], published as a [`MemberHealth`] after every round.
//!
//! Factors of a round, each with its own timeout:
//! - `connect`: a raw TCP connect to the member's port (the listener answers), closed at once;
//! - `ping`: `COM_PING` on the monitor's own persistent session (reconnected when lost), so
//!   a hung server (it accepts TCP in the kernel's backlog but answers nothing) fails here;
//! - `business`: the configured `business_sql`, on the same session, after the ping.
//!
//! `connect` runs beside `ping`+`business`. A round is also bounded by its interval, so
//! the schedule holds whatever hangs: a factor whose own timeout is longer than what is
//! left of the interval gets only what is left. Ticks missed while a round ran (only
//! possible when the runtime is starved) are skipped, never bunched up.
//!
//! Passive reports from the pool are taken between rounds (a report that comes during a
//! round waits for its end, at most one interval).
//!
//! The monitor's session is TCP with the cluster's TLS settings (`ssl_mode`; the `connect`
//! factor stays a raw TCP connect), with the monitor credentials.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::Accumulator;
use crate::backend_conn::{ConnectError, Connector, Tls};
use crate::cluster::config::HealthConfig;
use crate::cluster::view::{FactorResult, HealthState, MemberHealth};
use crate::metrics::{FactorLabel, MemberLabel, Metrics};

/// The member a monitor probes, and the account it logs in with.
#[derive(Debug, Clone)]
pub struct MonitorTarget {
    pub cluster: String,
    pub member: String,
    pub host: String,
    pub port: u16,
    /// The cluster's monitor credentials ([`crate::cluster::ClusterConfig::monitor_credentials`]).
    pub user: String,
    pub password: String,
    /// The cluster's TLS settings ([`crate::cluster::ClusterConfig::tls`]).
    pub tls: Tls,
}

/// How the rest of the dispatcher reads a member's health and reports what workers saw.
#[derive(Debug, Clone)]
pub struct MonitorHandle {
    health: watch::Receiver<MemberHealth>,
    passive: mpsc::Sender<String>,
}

/// Passive reports waiting for the monitor; more are dropped, which loses nothing because
/// the accumulator counts at most one per interval anyway.
const PASSIVE_QUEUE: usize = 8;

impl MonitorHandle {
    /// The member's health, updated after every round.
    pub fn health(&self) -> watch::Receiver<MemberHealth> {
        self.health.clone()
    }

    /// A worker failed to connect to the member or lost its session. Never waits: called
    /// from the pool's hot paths.
    pub fn passive_failure(&self, why: &str) {
        // Full (the monitor is mid-round and has reports queued) or closed (shut down):
        // either way there is nothing this report would add.
        let _ = self.passive.try_send(why.to_owned());
    }
}

/// Starts the member's monitor; it runs until `shutdown`. SIGHUP's new health settings
/// come through `cfg` and apply from the next round.
pub fn spawn_monitor(
    target: MonitorTarget,
    cfg: watch::Receiver<HealthConfig>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> MonitorHandle {
    let (health_tx, health_rx) = watch::channel(MemberHealth::default());
    let (passive_tx, passive_rx) = mpsc::channel(PASSIVE_QUEUE);
    let span = tracing::info_span!("monitor", cluster = %target.cluster, member = %target.member);
    let monitor = Monitor::new(target, cfg, metrics, health_tx);
    tokio::spawn(monitor.run(passive_rx, shutdown).instrument(span));
    MonitorHandle {
        health: health_rx,
        passive: passive_tx,
    }
}

/// The last result of each factor, in the order the admin API shows them.
#[derive(Default)]
struct Factors {
    connect: Option<FactorResult>,
    ping: Option<FactorResult>,
    business: Option<FactorResult>,
    passive: Option<FactorResult>,
}

impl Factors {
    fn list(&self) -> Vec<FactorResult> {
        [&self.connect, &self.ping, &self.business, &self.passive]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }
}

struct Monitor {
    target: MonitorTarget,
    connector: Connector,
    cfg_rx: watch::Receiver<HealthConfig>,
    cfg: HealthConfig,
    acc: Accumulator,
    /// The monitor's own session for `ping` and `business`; `None` until (re)connected.
    conn: Option<Conn>,
    factors: Factors,
    rounds: u64,
    failed_rounds: u64,
    since: Option<SystemTime>,
    metrics: Arc<Metrics>,
    member_label: MemberLabel,
    health_tx: watch::Sender<MemberHealth>,
    /// This round hit a shortage of our own (no file descriptor, no buffer): it says
    /// nothing about the member and is not counted either way.
    local_trouble: bool,
}

impl Monitor {
    fn new(
        target: MonitorTarget,
        mut cfg_rx: watch::Receiver<HealthConfig>,
        metrics: Arc<Metrics>,
        health_tx: watch::Sender<MemberHealth>,
    ) -> Monitor {
        let connector = Connector::new(&target.host, target.port, &target.user, &target.password, &target.tls);
        let cfg = cfg_rx.borrow_and_update().clone();
        let member_label = MemberLabel {
            cluster: target.cluster.clone(),
            member: target.member.clone(),
        };
        Monitor {
            acc: Accumulator::new(&cfg),
            target,
            connector,
            cfg_rx,
            cfg,
            conn: None,
            factors: Factors::default(),
            rounds: 0,
            failed_rounds: 0,
            since: None,
            metrics,
            member_label,
            health_tx,
            local_trouble: false,
        }
    }

    async fn run(mut self, mut passive_rx: mpsc::Receiver<String>, shutdown: CancellationToken) {
        info!(host = %self.target.host, port = self.target.port, interval_ms = self.cfg.interval_ms, "monitor started");
        let mut ticker = ticker(&self.cfg, Instant::now());
        let mut cfg_open = true;
        let mut passive_open = true;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                changed = self.cfg_rx.changed(), if cfg_open => match changed {
                    Ok(()) => {
                        let old_interval = self.cfg.interval_ms;
                        self.cfg = self.cfg_rx.borrow_and_update().clone();
                        self.acc.set_config(&self.cfg);
                        if self.cfg.interval_ms != old_interval {
                            ticker = ticker_after(&self.cfg);
                        }
                        info!(interval_ms = self.cfg.interval_ms, window_ms = self.cfg.window_ms,
                            fail_threshold = self.cfg.fail_threshold, "health settings applied");
                        self.publish();
                    }
                    // The config's owner is gone: keep the last settings.
                    Err(_) => cfg_open = false,
                },
                why = passive_rx.recv(), if passive_open => match why {
                    Some(why) => self.passive(&why),
                    None => passive_open = false,
                },
                _ = ticker.tick() => {
                    let ok = tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        ok = self.round() => ok,
                    };
                    self.finish_round(ok);
                }
            }
        }
        self.close_conn();
        // A member that is no longer monitored should not linger in the metrics as up or down.
        self.metrics.member_up.remove(&self.member_label);
        info!("monitor stopped");
    }

    /// One round of every factor. Returns whether all passed.
    async fn round(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.interval_ms);
        let connect_budget = budget(self.cfg.connect_timeout(), deadline);
        // Its own copy: the session probe borrows the monitor mutably beside it.
        let host = self.target.host.clone();
        let connect = probe_connect(&host, self.target.port, connect_budget);
        self.local_trouble = false;
        let (connect, (ping, business)) = tokio::join!(connect, self.probe_session(deadline));
        if connect.error.as_deref().is_some_and(|e| e.starts_with(LOCAL)) {
            self.local_trouble = true;
        }
        // `ping` and `business` count their own failures (a business statement not run
        // because the ping failed is not one).
        if !connect.ok && !self.local_trouble {
            self.count_failure("connect");
        }
        let mut ok = true;
        for result in [Some(&connect), Some(&ping), business.as_ref()].into_iter().flatten() {
            if !result.ok {
                ok = false;
                debug!(factor = result.factor, error = ?result.error, "probe failed");
            }
        }
        self.factors.connect = Some(connect);
        self.factors.ping = Some(ping);
        self.factors.business = business;
        ok
    }

    /// `ping`, then `business` (when configured) on the monitor's session.
    async fn probe_session(&mut self, deadline: Instant) -> (FactorResult, Option<FactorResult>) {
        let ping = self.probe_ping(deadline).await;
        let Some(sql) = self.cfg.business_sql.clone() else {
            return (ping, None);
        };
        let business = match (&ping.ok, self.conn.as_mut()) {
            (true, Some(conn)) => {
                let limit = budget(self.cfg.business_timeout(), deadline);
                let started = Instant::now();
                match tokio::time::timeout(limit, conn.query_drop(sql.as_str())).await {
                    Ok(Ok(())) => success("business", started),
                    Ok(Err(e)) => {
                        let fatal = e.is_fatal();
                        if fatal {
                            self.close_conn();
                        }
                        self.count_failure("business");
                        failure("business", started, e.to_string())
                    }
                    Err(_) => {
                        // The statement may still run on the server; only closing the
                        // session ends it and leaves the next round a clean one.
                        self.close_conn();
                        self.count_failure("business");
                        timed_out("business", limit)
                    }
                }
            }
            // Not counted as a business failure: the ping's failure already says it all.
            _ => FactorResult {
                factor: "business",
                ok: false,
                latency_ms: 0.0,
                error: Some("not run: no session (ping failed)".into()),
                at: SystemTime::now(),
            },
        };
        (ping, Some(business))
    }

    async fn probe_ping(&mut self, deadline: Instant) -> FactorResult {
        let started = Instant::now();
        let conn = match self.conn.as_mut() {
            Some(conn) => conn,
            None => {
                let limit = budget(self.cfg.connect_timeout(), deadline);
                match self.connector.connect(limit).await {
                    Ok(conn) => {
                        debug!(id = conn.id(), "monitor session connected");
                        self.conn.insert(conn)
                    }
                    Err(ConnectError::Mysql(e)) => {
                        if let mysql_async::Error::Io(mysql_async::IoError::Io(io)) = &e {
                            if is_local_shortage(io) {
                                self.local_trouble = true;
                                return failure("ping", started, format!("{LOCAL}connect: {e}"));
                            }
                        }
                        self.count_failure("ping");
                        return failure("ping", started, format!("connect: {e}"));
                    }
                    Err(ConnectError::Timeout(_)) => {
                        self.count_failure("ping");
                        return failure("ping", started, format!("connect timed out after {limit:?}"));
                    }
                }
            }
        };
        let limit = budget(self.cfg.ping_timeout(), deadline);
        let ping_started = Instant::now();
        match tokio::time::timeout(limit, conn.ping()).await {
            Ok(Ok(())) => success("ping", started),
            Ok(Err(e)) => {
                if e.is_fatal() {
                    self.close_conn();
                }
                self.count_failure("ping");
                failure("ping", started, e.to_string())
            }
            Err(_) => {
                // A ping without its answer leaves the session out of step.
                self.close_conn();
                self.count_failure("ping");
                let mut r = timed_out("ping", limit);
                r.latency_ms = ms(ping_started.duration_since(started) + limit);
                r
            }
        }
    }

    fn finish_round(&mut self, ok: bool) {
        if !ok && self.local_trouble {
            debug!("probe round inconclusive: this process is short of file descriptors or buffers");
            self.publish();
            return;
        }
        self.rounds += 1;
        if !ok {
            self.failed_rounds += 1;
        }
        self.metrics.probe_rounds.get_or_create(&self.member_label).inc();
        let before = self.acc.state();
        if self.acc.record(Instant::now().into_std(), ok) {
            self.state_changed(before);
        }
        self.publish();
    }

    fn passive(&mut self, why: &str) {
        if !self.cfg.passive {
            return;
        }
        let now = Instant::now().into_std();
        if !self.acc.passive_due(now) {
            // Within the interval of the last one: already counted.
            return;
        }
        let before = self.acc.state();
        let changed = self.acc.record_passive_failure(now);
        self.count_failure("passive");
        self.factors.passive = Some(FactorResult {
            factor: "passive",
            ok: false,
            latency_ms: 0.0,
            error: Some(why.to_owned()),
            at: SystemTime::now(),
        });
        debug!(why, "passive failure");
        if changed {
            self.state_changed(before);
        }
        self.publish();
    }

    fn state_changed(&mut self, before: HealthState) {
        let after = self.acc.state();
        self.since = Some(SystemTime::now());
        let up = if after.is_up() { 1 } else { 0 };
        self.metrics.member_up.get_or_create(&self.member_label).set(up);
        let failures = self.acc.failures_in_window(Instant::now().into_std());
        if after == HealthState::Down {
            warn!(from = ?before, failures, "member down");
        } else {
            info!(from = ?before, to = ?after, failures, "member health changed");
        }
    }

    fn publish(&self) {
        let health = MemberHealth {
            state: self.acc.state(),
            failures_in_window: self.acc.failures_in_window(Instant::now().into_std()),
            consecutive_successes: self.acc.consecutive_successes(),
            fail_threshold: self.cfg.fail_threshold,
            window_ms: self.cfg.window_ms,
            factors: self.factors.list(),
            rounds: self.rounds,
            failed_rounds: self.failed_rounds,
            since: self.since,
        };
        self.health_tx.send_replace(health);
    }

    fn count_failure(&self, factor: &'static str) {
        let label = FactorLabel {
            cluster: self.member_label.cluster.clone(),
            member: self.member_label.member.clone(),
            factor,
        };
        self.metrics.probe_failures.get_or_create(&label).inc();
    }

    /// Drops the session without waiting on it. Plain `drop` would have the driver spawn
    /// a clean-up that drains the pending reply first, which against a hung server waits
    /// as long as TCP does; `disconnect` marks it closed at once and is bounded here.
    fn close_conn(&mut self) {
        if let Some(conn) = self.conn.take() {
            let limit = self.cfg.connect_timeout();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(limit, conn.disconnect()).await;
            });
        }
    }
}

fn ticker(cfg: &HealthConfig, start: Instant) -> tokio::time::Interval {
    let mut t = tokio::time::interval_at(start, Duration::from_millis(cfg.interval_ms.max(1)));
    t.set_missed_tick_behavior(MissedTickBehavior::Skip);
    t
}

/// A new schedule after an interval change: the next round one new interval from now.
fn ticker_after(cfg: &HealthConfig) -> tokio::time::Interval {
    ticker(cfg, Instant::now() + Duration::from_millis(cfg.interval_ms.max(1)))
}

/// A factor's own timeout, cut to what is left of the round.
fn budget(timeout: Duration, deadline: Instant) -> Duration {
    timeout.min(deadline.saturating_duration_since(Instant::now()))
}

/// Caveat: the server counts a connection closed before its handshake as a connection
/// error of the client host, and blocks the host after `max_connect_errors` of them
/// without a successful login in between. That count is kept only for hosts that passed
/// name resolution: loopback and servers with `skip_name_resolve` are not affected.
async fn probe_connect(host: &str, port: u16, limit: Duration) -> FactorResult {
    let started = Instant::now();
    match tokio::time::timeout(limit, TcpStream::connect((host, port))).await {
        // Closed at once: the listener answered, which is all this factor asks.
        Ok(Ok(stream)) => {
            drop(stream);
            success("connect", started)
        }
        Ok(Err(e)) if is_local_shortage(&e) => failure("connect", started, format!("{LOCAL}{e}")),
        Ok(Err(e)) => failure("connect", started, e.to_string()),
        Err(_) => timed_out("connect", limit),
    }
}

/// Prefix of a factor error that is our own shortage, not the member's failure.
const LOCAL: &str = "local: ";

/// Errors that come from this process or host running out of something (descriptors,
/// buffers, memory), not from the member: counting them would mark a healthy member
/// down when the dispatcher is the one in trouble (seen: EMFILE under a connection flood).
fn is_local_shortage(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn success(factor: &'static str, started: Instant) -> FactorResult {
    FactorResult {
        factor,
        ok: true,
        latency_ms: ms(started.elapsed()),
        error: None,
        at: SystemTime::now(),
    }
}

fn failure(factor: &'static str, started: Instant, error: String) -> FactorResult {
    FactorResult {
        factor,
        ok: false,
        latency_ms: ms(started.elapsed()),
        error: Some(error),
        at: SystemTime::now(),
    }
}

fn timed_out(factor: &'static str, limit: Duration) -> FactorResult {
    FactorResult {
        factor,
        ok: false,
        latency_ms: ms(limit),
        error: Some(format!("timed out after {} ms", limit.as_millis())),
        at: SystemTime::now(),
    }
}

#[cfg(test)]
#[path = "monitor_tests.rs"]
mod tests;

//! The delay probe's task: one round per period, the primary written and every replica
//! read side by side, then the view published.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::{mpsc, watch};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::view::{judge, DelayRow, DelayView, HeartbeatView, PrimaryAck, ProbeStatus, Reading};
use super::TABLE;
use crate::cluster::replication::{connect, ReplError};
use crate::cluster::{ClusterConfig, ClusterView, DelaySettings, Role};
use crate::metrics::{DelayErrorLabel, MemberLabel, Metrics};

/// MariaDB: "table doesn't exist" (the heartbeat table has not reached this replica yet).
const ER_NO_SUCH_TABLE: u16 = 1146;

pub(super) struct Probe {
    cfg_rx: watch::Receiver<Arc<ClusterConfig>>,
    topology: watch::Receiver<ClusterView>,
    source: String,
    metrics: Arc<Metrics>,
    view_tx: watch::Sender<DelayView>,
    settings: DelaySettings,
    members: Vec<Member>,
    hb: Heartbeat,
    rounds: u64,
}

/// One configured member's probe session and last reading.
struct Member {
    name: String,
    /// `host:port`.
    addr: String,
    conn: Option<Conn>,
    /// This session, on the primary, has the table and has loaded the row's value.
    prepared: bool,
    status: ProbeStatus,
    message: Option<String>,
    /// The last successful read.
    ok_at: Option<Instant>,
    last_active: Option<u64>,
    logic_timestamp: Option<u64>,
    lag_periods: Option<u64>,
    wall_delay_ms: Option<i64>,
    gtid_applied: Option<String>,
}

/// The writer's state: it outlives any one primary, so that the value only grows.
#[derive(Default)]
struct Heartbeat {
    member: Option<String>,
    /// The next value to write.
    next: u64,
    acked: Option<u64>,
    acked_at: Option<Instant>,
    status: ProbeStatus,
    message: Option<String>,
    last_active: Option<u64>,
    connection_id: Option<u32>,
}

/// What one member does this round.
enum Job {
    Write { next: u64 },
    Read { acked: Option<u64> },
    Idle(String),
}

/// What a write left for the writer's state (reads update their member themselves).
enum Outcome {
    Wrote(u64),
    WriteFailed {
        tried: u64,
        status: ProbeStatus,
        message: String,
    },
    Done,
}

/// What every member's call of a round shares.
struct RoundCtx {
    cluster: Arc<ClusterConfig>,
    database: String,
    source: String,
    budget: Duration,
    metrics: Arc<Metrics>,
}

/// A failed call: `Timeout` when the budget ran out (the session is dropped).
enum Fail {
    Timeout,
    Init(String),
    Error(String),
}

impl Probe {
    pub(super) fn new(
        mut cfg_rx: watch::Receiver<Arc<ClusterConfig>>,
        topology: watch::Receiver<ClusterView>,
        source: String,
        metrics: Arc<Metrics>,
        view_tx: watch::Sender<DelayView>,
    ) -> Probe {
        let cluster = cfg_rx.borrow_and_update().clone();
        let settings = cluster.delay().unwrap_or(DelaySettings {
            period_ms: 1_000,
            threshold_ms: 1_000,
            database: "osprey".into(),
        });
        let members = cluster
            .members
            .iter()
            .map(|m| Member {
                name: m.name.clone(),
                addr: format!("{}:{}", m.host, m.port),
                conn: None,
                prepared: false,
                status: ProbeStatus::Init,
                message: None,
                ok_at: None,
                last_active: None,
                logic_timestamp: None,
                lag_periods: None,
                wall_delay_ms: None,
                gtid_applied: None,
            })
            .collect();
        Probe {
            cfg_rx,
            topology,
            source,
            metrics,
            view_tx,
            settings,
            members,
            hb: Heartbeat {
                next: 1,
                ..Default::default()
            },
            rounds: 0,
        }
    }

    pub(super) async fn run(mut self, mut resets: mpsc::Receiver<String>, shutdown: CancellationToken) {
        info!(source = %self.source, period_ms = self.settings.period_ms, threshold_ms = self.settings.threshold_ms,
            database = %self.settings.database, "delay probe started");
        let mut tick = ticker(self.settings.period_ms);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(member) = resets.recv() => {
                    self.reset(&member);
                    self.publish();
                }
                _ = tick.tick() => {
                    let period = self.settings.period_ms;
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        () = self.round() => {}
                    }
                    self.publish();
                    if self.settings.period_ms != period {
                        tick = ticker(self.settings.period_ms);
                    }
                }
            }
        }
        let limit = Duration::from_millis(self.settings.period_ms);
        for m in &mut self.members {
            close(m.conn.take(), limit);
            self.metrics.delay.delay_ms.remove(&label(&self.view_tx, &m.name));
            self.metrics.delay.ineligible.remove(&label(&self.view_tx, &m.name));
        }
        info!("delay probe stopped");
    }

    /// One round: the primary written and the replicas read, side by side.
    async fn round(&mut self) {
        let cluster = self.cfg_rx.borrow_and_update().clone();
        if let Some(s) = cluster.delay() {
            if s != self.settings {
                info!(period_ms = s.period_ms, threshold_ms = s.threshold_ms, database = %s.database, "delay settings applied");
                if s.database != self.settings.database {
                    self.members.iter_mut().for_each(|m| m.prepared = false);
                }
                self.settings = s;
            }
        }
        let topology = self.topology.borrow_and_update().clone();
        self.rounds += 1;
        let ctx = RoundCtx {
            database: self.settings.database.clone(),
            source: self.source.clone(),
            // A round never outlasts its period, so rounds never queue up behind a hung member.
            budget: Duration::from_millis((self.settings.period_ms * 4 / 5).max(1)),
            metrics: self.metrics.clone(),
            cluster,
        };
        self.hb.member = topology.primary.clone();
        if let Some(p) = &topology.primary {
            if !self.members.iter().any(|m| &m.name == p) {
                self.hb.status = ProbeStatus::Error;
                self.hb.message = Some(format!("primary {p} is not a configured member"));
            }
        } else {
            self.hb.status = ProbeStatus::Init;
            self.hb.message = Some("the cluster has no primary now: no heartbeat written".into());
        }
        let (acked, next) = (self.hb.acked, self.hb.next);
        let jobs: Vec<Job> = self
            .members
            .iter()
            .map(|m| {
                let role = topology.member(&m.name).map(|v| v.role).unwrap_or_default();
                if topology.primary.as_deref() == Some(m.name.as_str()) {
                    Job::Write { next }
                } else if role == Role::Replica {
                    Job::Read { acked }
                } else {
                    Job::Idle(format!("not probed: role {}", role.name()))
                }
            })
            .collect();
        let calls = self.members.iter_mut().zip(jobs).map(|(m, job)| {
            let span = tracing::debug_span!("probe", member = %m.name);
            probe(m, job, &ctx).instrument(span)
        });
        let outcomes = futures::future::join_all(calls).await;
        for outcome in outcomes {
            match outcome {
                Outcome::Wrote(ts) => {
                    self.hb.acked = Some(ts);
                    self.hb.acked_at = Some(Instant::now());
                    self.hb.next = ts + 1;
                    self.hb.status = ProbeStatus::Ok;
                    self.hb.message = None;
                    self.hb.last_active = Some(unix_ms());
                }
                Outcome::WriteFailed { tried, status, message } => {
                    // The write may have committed without our seeing it: never reuse a value.
                    self.hb.next = self.hb.next.max(tried + 1);
                    if self.hb.status != status || self.hb.message.as_deref() != Some(&message) {
                        warn!(member = ?self.hb.member, ?status, %message, "heartbeat write failed");
                    }
                    self.hb.status = status;
                    self.hb.message = Some(message);
                }
                Outcome::Done => {}
            }
        }
        self.hb.connection_id = self
            .hb
            .member
            .as_ref()
            .and_then(|p| self.members.iter().find(|m| &m.name == p))
            .and_then(|m| m.conn.as_ref().map(|c| c.id()));
    }

    /// Closes `member`'s session: the next round opens a new one.
    fn reset(&mut self, member: &str) {
        let limit = Duration::from_millis(self.settings.period_ms);
        if let Some(m) = self.members.iter_mut().find(|m| m.name == member) {
            info!(member, "probe session reset");
            close(m.conn.take(), limit);
            m.prepared = false;
            if self.hb.member.as_deref() == Some(member) {
                self.hb.connection_id = None;
            }
        }
    }

    fn publish(&self) {
        let now = Instant::now();
        let (period, threshold) = (self.settings.period_ms, self.settings.threshold_ms);
        let primary = PrimaryAck { at: self.hb.acked_at };
        let cluster = self.view_tx.borrow().cluster.clone();
        let mut replicas = Vec::with_capacity(self.members.len());
        for m in &self.members {
            let metric = MemberLabel {
                cluster: cluster.clone(),
                member: m.name.clone(),
            };
            if self.hb.member.as_deref() == Some(m.name.as_str()) {
                self.metrics.delay.delay_ms.remove(&metric);
                self.metrics.delay.ineligible.remove(&metric);
                continue;
            }
            let reading = Reading {
                at: m.ok_at,
                lag_periods: m.lag_periods,
            };
            let v = judge(m.status, reading, primary, period, threshold, now);
            match v.delay_ms {
                Some(d) => {
                    self.metrics.delay.delay_ms.get_or_create(&metric).set(d as i64);
                }
                None => {
                    self.metrics.delay.delay_ms.remove(&metric);
                }
            }
            self.metrics
                .delay
                .ineligible
                .get_or_create(&metric)
                .set(i64::from(!v.eligible));
            replicas.push(DelayRow {
                cluster: cluster.clone(),
                name: m.name.clone(),
                host: m.addr.clone(),
                delay_ms: v.delay_ms,
                wall_delay_ms: m.wall_delay_ms,
                status: m.status,
                message: m.message.clone().or(v.why),
                last_active: m.last_active,
                connection_id: m.conn.as_ref().map(|c| c.id()),
                logic_timestamp: m.logic_timestamp,
                gtid_applied: m.gtid_applied.clone(),
                eligible: v.eligible,
                fresh_until: v.fresh_until,
            });
        }
        let primary_addr = self
            .hb
            .member
            .as_ref()
            .and_then(|p| self.members.iter().find(|m| &m.name == p))
            .map(|m| m.addr.clone());
        self.view_tx.send_modify(|view| {
            view.period_ms = period;
            view.threshold_ms = threshold;
            view.database = self.settings.database.clone();
            view.rounds = self.rounds;
            view.replicas = replicas;
            view.primary = HeartbeatView {
                name: self.hb.member.clone(),
                host: primary_addr,
                status: self.hb.status,
                message: self.hb.message.clone(),
                logic_timestamp: self.hb.acked,
                last_active: self.hb.last_active,
                connection_id: self.hb.connection_id,
            };
        });
    }
}

/// One member's call of the round, bounded by the round's budget.
async fn probe(m: &mut Member, job: Job, ctx: &RoundCtx) -> Outcome {
    let deadline = Instant::now() + ctx.budget;
    match job {
        Job::Idle(why) => {
            close(m.conn.take(), ctx.budget);
            m.prepared = false;
            m.status = ProbeStatus::Init;
            m.message = Some(why);
            m.lag_periods = None;
            Outcome::Done
        }
        Job::Read { acked } => {
            m.prepared = false;
            let r = match tokio::time::timeout_at(deadline.into(), read(m, ctx)).await {
                Ok(r) => r,
                Err(_) => Err(Fail::Timeout),
            };
            match r {
                Ok((ts, wall, gtid)) => {
                    m.ok_at = Some(Instant::now());
                    m.last_active = Some(unix_ms());
                    m.logic_timestamp = ts;
                    m.wall_delay_ms = wall.map(|us| us / 1000);
                    m.gtid_applied = gtid;
                    m.lag_periods = match (acked, ts) {
                        (Some(a), Some(t)) => Some(a.saturating_sub(t)),
                        _ => None,
                    };
                    let (status, message) = match (ts, acked) {
                        (None, _) => (
                            ProbeStatus::Init,
                            Some("no heartbeat row of this dispatcher replicated yet".to_owned()),
                        ),
                        (Some(_), None) => (
                            ProbeStatus::Init,
                            Some("no heartbeat write acknowledged by the primary yet".to_owned()),
                        ),
                        (Some(_), Some(_)) => (ProbeStatus::Ok, None),
                    };
                    m.status = status;
                    m.message = message;
                }
                Err(fail) => {
                    m.lag_periods = None;
                    (m.status, m.message) = failed(m, fail, ctx);
                }
            }
            Outcome::Done
        }
        Job::Write { next } => {
            let mut tried = next;
            let r = match tokio::time::timeout_at(deadline.into(), write(m, ctx, &mut tried)).await {
                Ok(r) => r,
                Err(_) => Err(Fail::Timeout),
            };
            match r {
                Ok(ts) => Outcome::Wrote(ts),
                Err(fail) => {
                    let (status, message) = failed(m, fail, ctx);
                    Outcome::WriteFailed {
                        tried,
                        status,
                        message: message.unwrap_or_default(),
                    }
                }
            }
        }
    }
}

/// Status and message of a failed call; counts it and drops a session that is out of step.
fn failed(m: &mut Member, fail: Fail, ctx: &RoundCtx) -> (ProbeStatus, Option<String>) {
    let (status, message) = match fail {
        Fail::Timeout => {
            // The reply may still come: only a new session is in step again.
            close(m.conn.take(), ctx.budget);
            m.prepared = false;
            (
                ProbeStatus::Timeout,
                format!("no answer within {} ms", ctx.budget.as_millis()),
            )
        }
        Fail::Init(why) => return (ProbeStatus::Init, Some(why)),
        Fail::Error(e) => (ProbeStatus::Error, e),
    };
    let kind = if status == ProbeStatus::Timeout {
        "timeout"
    } else {
        "error"
    };
    let label = DelayErrorLabel {
        cluster: ctx.cluster.name.clone(),
        member: m.name.clone(),
        kind,
    };
    ctx.metrics.delay.probe_errors.get_or_create(&label).inc();
    debug!(%message, kind, "probe failed");
    (status, Some(message))
}

/// The member's session, opened when there is none.
async fn session<'m>(m: &'m mut Member, ctx: &RoundCtx) -> Result<&'m mut Conn, Fail> {
    if m.conn.is_none() {
        let Some(member) = ctx.cluster.member(&m.name) else {
            return Err(Fail::Error(format!("{} is not a configured member", m.name)));
        };
        let conn = connect(&ctx.cluster, member, ctx.budget).await.map_err(|e| match e {
            ReplError::Timeout { .. } => Fail::Timeout,
            e => Fail::Error(format!("connect: {e}")),
        })?;
        debug!(id = conn.id(), "probe session connected");
        m.conn = Some(conn);
    }
    m.conn.as_mut().ok_or_else(|| Fail::Error("no session".into()))
}

/// A failed statement: a driver or network error leaves no usable session.
fn statement_failed(m: &mut Member, e: mysql_async::Error, what: &str) -> Fail {
    if let mysql_async::Error::Server(s) = &e {
        if s.code == ER_NO_SUCH_TABLE {
            return Fail::Init(format!("the heartbeat table is not there yet: {}", s.message));
        }
    }
    if e.is_fatal() {
        close(m.conn.take(), Duration::from_secs(1));
        m.prepared = false;
    }
    Fail::Error(format!("{what}: {e}"))
}

/// `(logic_timestamp, wall delay in µs, gtid_slave_pos)`, NULLs where the row is missing.
type HeartbeatRead = (Option<u64>, Option<i64>, Option<String>);

/// This dispatcher's heartbeat row on a replica, with its applied GTID position, in one
/// statement: `(logic_timestamp, wall delay in µs, gtid_slave_pos)`. The LEFT JOIN gives a
/// row (with NULLs) before ours has arrived.
async fn read(m: &mut Member, ctx: &RoundCtx) -> Result<HeartbeatRead, Fail> {
    let sql = format!(
        "SELECT h.logic_timestamp, TIMESTAMPDIFF(MICROSECOND, h.real_timestamp, UTC_TIMESTAMP(6)), \
         @@global.gtid_slave_pos FROM (SELECT 1) AS one LEFT JOIN `{}`.`{TABLE}` AS h ON h.source = ?",
        ctx.database
    );
    let conn = session(m, ctx).await?;
    let r: Result<Option<HeartbeatRead>, _> = conn.exec_first(sql, (ctx.source.as_str(),)).await;
    match r {
        Ok(row) => Ok(row.unwrap_or((None, None, None))),
        Err(e) => Err(statement_failed(m, e, "read")),
    }
}

/// Writes `*next` (raised first to the row's value + 1 on a new session) into our row on
/// the primary; returns the value the primary acknowledged.
async fn write(m: &mut Member, ctx: &RoundCtx, next: &mut u64) -> Result<u64, Fail> {
    let db = &ctx.database;
    if !m.prepared {
        let conn = session(m, ctx).await?;
        match prepare(conn, ctx).await {
            Ok(current) => {
                *next = (*next).max(current.map_or(1, |c| c + 1));
                m.prepared = true;
            }
            Err(PrepareFail::ReadOnly) => {
                return Err(Fail::Error(
                    "the primary is read-only and has no heartbeat table: not created".into(),
                ))
            }
            Err(PrepareFail::Mysql(e)) => return Err(statement_failed(m, e, "prepare")),
        }
    }
    // The guard, not the server, keeps this off a read-only member: the monitor account
    // may bypass read_only, and a heartbeat on a demoted primary would diverge its history.
    // `SET GLOBAL read_only = 1` waits for statements in flight, so none slips past it.
    let sql = format!(
        "REPLACE INTO `{db}`.`{TABLE}` (source, real_timestamp, logic_timestamp) \
         SELECT ?, UTC_TIMESTAMP(6), ? FROM DUAL WHERE @@global.read_only = 0"
    );
    let conn = session(m, ctx).await?;
    match conn.exec_drop(sql, (ctx.source.as_str(), *next)).await {
        Ok(()) if conn.affected_rows() > 0 => Ok(*next),
        Ok(()) => Err(Fail::Error("the primary is read-only: heartbeat not written".into())),
        Err(e) => Err(statement_failed(m, e, "write")),
    }
}

enum PrepareFail {
    ReadOnly,
    Mysql(mysql_async::Error),
}

/// On a new primary session: the database and table (created only where missing, and
/// only on a writable server: `CREATE ... IF NOT EXISTS` is binlogged even when it changes
/// nothing), then the row's current value.
async fn prepare(conn: &mut Conn, ctx: &RoundCtx) -> Result<Option<u64>, PrepareFail> {
    let db = &ctx.database;
    let (read_only, exists): (i64, i64) = conn
        .exec_first(
            "SELECT @@global.read_only, (SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?)",
            (db.as_str(), TABLE),
        )
        .await
        .map_err(PrepareFail::Mysql)?
        .unwrap_or((1, 0));
    if exists == 0 {
        if read_only != 0 {
            return Err(PrepareFail::ReadOnly);
        }
        info!(database = %db, table = TABLE, "creating the heartbeat table");
        conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS `{db}`"))
            .await
            .map_err(PrepareFail::Mysql)?;
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS `{db}`.`{TABLE}` (\
             source VARCHAR(255) NOT NULL PRIMARY KEY, \
             real_timestamp DATETIME(6) NOT NULL, \
             logic_timestamp BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
        ))
        .await
        .map_err(PrepareFail::Mysql)?;
    }
    conn.exec_first(
        format!("SELECT logic_timestamp FROM `{db}`.`{TABLE}` WHERE source = ?"),
        (ctx.source.as_str(),),
    )
    .await
    .map_err(PrepareFail::Mysql)
}

/// Drops a session without waiting on it: a plain drop would drain its pending reply,
/// which against a hung server lasts as long as TCP does.
fn close(conn: Option<Conn>, limit: Duration) {
    if let Some(conn) = conn {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(limit, conn.disconnect()).await;
        });
    }
}

fn ticker(period_ms: u64) -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_millis(period_ms.max(1)));
    // A round late because the runtime was starved is skipped, never bunched up.
    t.set_missed_tick_behavior(MissedTickBehavior::Skip);
    t
}

fn label(view: &watch::Sender<DelayView>, member: &str) -> MemberLabel {
    MemberLabel {
        cluster: view.borrow().cluster.clone(),
        member: member.to_owned(),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

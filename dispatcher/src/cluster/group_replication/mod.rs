//! Topology `group_replication`: MySQL Group Replication elects its primary; Osprey follows
//! it and never promotes anything.
//!
//! **Untested against a live group.** MySQL cannot be installed on the machines this was
//! built on (Debian ships MariaDB only, and MariaDB has no Group Replication), so the
//! decision ([`decide::decide`]) is tested on hand-made `replication_group_members` rows,
//! and the polling loop against real MariaDB servers that serve a table with the same
//! columns in place of `performance_schema.replication_group_members`. Nothing here has
//! seen a real group elect or expel a member: run it against one before relying on it.
//!
//! Every `health.interval_ms` each member is asked, on its own connection (monitor account,
//! TCP, timeouts below the interval), for
//! `SELECT MEMBER_HOST, MEMBER_PORT, MEMBER_STATE, MEMBER_ROLE FROM
//! performance_schema.replication_group_members`. Every member that answers is a report;
//! [`decide`] believes the majority view and names the `ONLINE` `PRIMARY`. A member not
//! `ONLINE` takes no requests (`detached`, with its state). A change of primary bumps the
//! epoch and is logged as a `followed` switch event. A switchover command is refused: the
//! group elects (`group_replication_set_as_primary()` is for the group's own tooling).

pub mod decide;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::config::ClusterConfig;
use crate::cluster::events::EventLog;
use crate::cluster::follow::{round_timeouts, MemberConn, Move, Publisher};
use crate::cluster::view::{
    ClusterStatus, ClusterView, Command, HealthState, MemberHealth, MemberView, ProviderHandle, Role,
};
use crate::metrics::Metrics;
use decide::{GroupDecision, Report, MEMBERS_SQL};

/// Starts the provider task of one `group_replication` cluster.
pub fn spawn_group_replication(
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    health: Vec<(String, watch::Receiver<MemberHealth>)>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> ProviderHandle {
    spawn_with_sql(cfg, health, events, metrics, shutdown, MEMBERS_SQL)
}

/// The provider, reading the group's members with `sql` (tests point it at a table that
/// holds the same columns on a MariaDB server).
fn spawn_with_sql(
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    health: Vec<(String, watch::Receiver<MemberHealth>)>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    sql: &'static str,
) -> ProviderHandle {
    let cluster = cfg.borrow().clone();
    let initial = ClusterView::starting(&cluster, "group_replication");
    let (view_tx, view_rx) = watch::channel(initial);
    let (cmd_tx, cmd_rx) = mpsc::channel(8);
    let span = tracing::info_span!("group_replication", cluster = %cluster.name);
    let provider = Provider {
        cfg,
        health: health.into_iter().collect(),
        conns: HashMap::new(),
        last_seen: HashMap::new(),
        sql,
        publisher: Publisher::new(view_tx, events, metrics.group_primary.clone()),
    };
    tokio::spawn(provider.run(cmd_rx, shutdown).instrument(span));
    ProviderHandle {
        view: view_rx,
        commands: cmd_tx,
    }
}

struct Provider {
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    health: HashMap<String, watch::Receiver<MemberHealth>>,
    conns: HashMap<String, MemberConn>,
    last_seen: HashMap<String, SystemTime>,
    sql: &'static str,
    publisher: Publisher,
}

impl Provider {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, shutdown: CancellationToken) {
        let mut interval_ms = self.cfg.borrow().health.interval_ms;
        let mut ticker = make_ticker(interval_ms, false);
        tracing::info!(interval_ms, "group replication provider started");
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(Command::Switchover { to, reply }) = commands.recv() => {
                    tracing::warn!(target_member = ?to, "switchover refused: the group elects its primary");
                    let _ = reply.send(Err(
                        "topology group_replication: the group elects its primary; Osprey only follows it \
                         (use group_replication_set_as_primary() on the group)".to_owned(),
                    ));
                }
                _ = ticker.tick() => {
                    self.round().await;
                    let now_ms = self.cfg.borrow().health.interval_ms;
                    if now_ms != interval_ms {
                        interval_ms = now_ms;
                        ticker = make_ticker(interval_ms, true);
                    }
                }
            }
        }
        tracing::info!("group replication provider stopped");
    }

    async fn round(&mut self) {
        let cluster = self.cfg.borrow().clone();
        let (connect_timeout, query_timeout) = round_timeouts(&cluster);
        let seen_at = Instant::now();
        let started = SystemTime::now();
        self.conns.retain(|name, _| cluster.member(name).is_some());
        let probes = cluster.members.iter().map(|m| {
            let mut conn = self
                .conns
                .remove(&m.name)
                .unwrap_or_else(|| MemberConn::new(&cluster, m));
            let span = tracing::debug_span!("probe", member = %m.name);
            let sql = self.sql;
            async move {
                let result = conn.rows(sql, connect_timeout, query_timeout).await;
                (m.name.clone(), conn, result)
            }
            .instrument(span)
        });
        let mut reports = Vec::with_capacity(cluster.members.len());
        for (name, conn, result) in futures::future::join_all(probes).await {
            self.conns.insert(name.clone(), conn);
            if result.is_ok() {
                self.last_seen.insert(name.clone(), SystemTime::now());
            }
            reports.push(Report {
                reporter: name,
                rows: result.map(|rows| decide::parse_rows(&rows)).map_err(|e| e.to_string()),
            });
        }
        let current = self.publisher.current().primary;
        let decision = decide::decide(&cluster.members, &reports, current.as_deref());
        let detail = (decision.primary != current).then(|| match (&current, &decision.primary) {
            (Some(old), Some(new)) => format!("the group's PRIMARY moved from {old} to {new}"),
            (Some(old), None) => format!(
                "{old} is no longer the group's ONLINE PRIMARY: {}",
                decision.problem.clone().unwrap_or_default()
            ),
            (None, Some(new)) => format!("{new} is the group's ONLINE PRIMARY"),
            (None, None) => String::new(),
        });
        let view = self.view(&cluster, &decision);
        let steps = [("poll", Instant::now(), true, detail.clone())];
        self.publisher.publish(
            view,
            Some(Move {
                kind: "followed",
                detail,
                seen_at,
                started,
                steps: &steps,
            }),
        );
    }

    fn view(&self, cluster: &ClusterConfig, d: &GroupDecision) -> ClusterView {
        let members = cluster
            .members
            .iter()
            .map(|m| {
                let s = d.members.iter().find(|s| s.name == m.name);
                let down = self
                    .health
                    .get(&m.name)
                    .is_some_and(|h| h.borrow().state == HealthState::Down);
                let role = match s {
                    _ if d.primary.as_deref() == Some(m.name.as_str()) => Role::Primary,
                    Some(s) if s.serves => Role::Replica,
                    _ => Role::Detached,
                };
                let mut reason = s.and_then(|s| s.reason.clone());
                if down && reason.is_none() {
                    // The group says ONLINE; Osprey's own path to it is failing.
                    reason = Some("ONLINE in the group, but health: down from here".into());
                }
                MemberView {
                    name: m.name.clone(),
                    addr: format!("{}:{}", m.host, m.port),
                    role,
                    reason,
                    state: s.and_then(|s| s.state.clone()),
                    last_seen: self.last_seen.get(&m.name).copied(),
                    ..Default::default()
                }
            })
            .collect();
        let status = match (&d.primary, &d.problem) {
            (Some(_), _) => ClusterStatus::Ok,
            (None, Some(p)) => ClusterStatus::NoPrimary(p.clone()),
            (None, None) => ClusterStatus::NoPrimary("the group has no ONLINE PRIMARY".into()),
        };
        ClusterView {
            name: cluster.name.clone(),
            topology: "group_replication",
            primary: d.primary.clone(),
            status,
            members,
            ..Default::default()
        }
    }
}

fn make_ticker(interval_ms: u64, from_now: bool) -> tokio::time::Interval {
    let period = Duration::from_millis(interval_ms.max(1));
    let start = tokio::time::Instant::now() + if from_now { period } else { Duration::ZERO };
    let mut t = tokio::time::interval_at(start, period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod loop_tests;

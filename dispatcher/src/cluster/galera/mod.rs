//! Topology `galera`: every Synced node of a Galera cluster can write; Osprey sends the
//! writes to one of them, to avoid certification conflicts between nodes, follows the
//! membership the nodes report, and never changes the cluster itself.
//!
//! Every `health.interval_ms` the provider asks each member, on its own connection
//! (monitor account, TCP, timeouts below the interval), for `wsrep_cluster_status`,
//! `wsrep_local_state(_comment)`, `wsrep_local_index`, `wsrep_cluster_size` and
//! `wsrep_ready`. The rules that pick the writer are in [`decide`]. When the writer refuses
//! or drops the connection, leaves the Primary component or stops being Synced, the first
//! round that sees it moves `ClusterView.primary` (so within one interval of the event plus
//! that round's timeout), bumps the epoch and logs a `followed` switch event. Probes that
//! time out move it at the `fail_threshold`-th in a row (the node may just be slow; see
//! [`decide`]). A member's monitor saying Down takes it out too, but the provider does not
//! wait for the monitor's window.

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
    ClusterStatus, ClusterView, Command, MemberHealth, MemberView, ProviderHandle, Role, SwitchEvent,
};
use crate::metrics::Metrics;
use decide::{Candidate, NodeStatus, STATUS_SQL};

/// Starts the provider task of one `galera` cluster. `health` holds each member's monitor
/// output by member name (a member without one is judged by the provider's probes alone).
pub fn spawn_galera(
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    health: Vec<(String, watch::Receiver<MemberHealth>)>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> ProviderHandle {
    let cluster = cfg.borrow().clone();
    let initial = ClusterView::starting(&cluster, "galera");
    let (view_tx, view_rx) = watch::channel(initial);
    let (cmd_tx, cmd_rx) = mpsc::channel(8);
    let span = tracing::info_span!("galera", cluster = %cluster.name);
    let provider = Provider {
        cfg,
        health: health.into_iter().collect(),
        conns: HashMap::new(),
        streaks: HashMap::new(),
        timeouts: HashMap::new(),
        answers: HashMap::new(),
        last: Vec::new(),
        last_seen: HashMap::new(),
        pinned: false,
        publisher: Publisher::new(view_tx, events, metrics.galera_writer.clone()),
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
    /// Rounds in a row each member was electable (eligible and on time).
    streaks: HashMap<String, u32>,
    /// Probes in a row that timed out, per member.
    timeouts: HashMap<String, u32>,
    /// Each member's last answer, while nothing but timeouts followed it.
    answers: HashMap<String, NodeStatus>,
    /// The last round's candidates (switchover commands decide on them).
    last: Vec<Candidate>,
    last_seen: HashMap<String, SystemTime>,
    /// The writer was chosen by a switchover: no failback by priority while it is eligible.
    pinned: bool,
    publisher: Publisher,
}

impl Provider {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, shutdown: CancellationToken) {
        let mut interval_ms = self.cfg.borrow().health.interval_ms;
        let mut ticker = ticker(interval_ms);
        tracing::info!(interval_ms, "galera provider started");
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(cmd) = commands.recv() => self.command(cmd),
                _ = ticker.tick() => {
                    self.round().await;
                    // SIGHUP may have changed the interval; the next tick follows it.
                    let now_ms = self.cfg.borrow().health.interval_ms;
                    if now_ms != interval_ms {
                        interval_ms = now_ms;
                        ticker = ticker_from_now(interval_ms);
                    }
                }
            }
        }
        tracing::info!("galera provider stopped");
    }

    /// One probe of every member, then the decision.
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
            async move {
                let result = conn.rows(STATUS_SQL, connect_timeout, query_timeout).await;
                (m.name.clone(), conn, result)
            }
            .instrument(span)
        });
        let results = futures::future::join_all(probes).await;
        let mut candidates = Vec::with_capacity(results.len());
        for (order, (name, conn, result)) in results.into_iter().enumerate() {
            self.conns.insert(name.clone(), conn);
            let member = &cluster.members[order];
            let timeouts = self.timeouts.entry(name.clone()).or_insert(0);
            *timeouts = match &result {
                Err(e) if e.is_timeout() => timeouts.saturating_add(1),
                _ => 0,
            };
            let probe = match result {
                Ok(rows) => {
                    self.last_seen.insert(name.clone(), SystemTime::now());
                    let status = NodeStatus::from_rows(&rows);
                    self.answers.insert(name.clone(), status.clone());
                    Ok(status)
                }
                Err(e) => {
                    if !e.is_timeout() {
                        self.answers.remove(&name);
                    }
                    Err(e.to_string())
                }
            };
            let (probe, late) =
                decide::through_timeout(probe, *timeouts, cluster.health.fail_threshold, self.answers.get(&name));
            if let Some(why) = &late {
                tracing::warn!(member = %name, "{why}");
            }
            let health = self.health.get(&name).map(|rx| rx.borrow().clone());
            let mut c = Candidate::new(&name, member.priority, order, probe, health.as_ref());
            c.late = late;
            let streak = self.streaks.entry(name.clone()).or_insert(0);
            // A late round is no answer: the failback streak starts again.
            *streak = if c.electable() { streak.saturating_add(1) } else { 0 };
            c.eligible_streak = *streak;
            candidates.push(c);
        }
        self.streaks.retain(|name, _| cluster.member(name).is_some());
        self.timeouts.retain(|name, _| cluster.member(name).is_some());
        self.answers.retain(|name, _| cluster.member(name).is_some());

        let current = self.publisher.current().primary;
        let failback_after = cluster.health.recover_successes;
        let next = decide::choose(current.as_deref(), self.pinned, &candidates, failback_after);
        let detail = move_detail(current.as_deref(), next.as_deref(), &candidates);
        if next != current {
            self.pinned = false;
        }
        let view = self.view(&cluster, next, &candidates);
        let steps = [("probe", Instant::now(), true, detail.clone())];
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
        self.last = candidates;
    }

    fn view(&self, cluster: &ClusterConfig, primary: Option<String>, candidates: &[Candidate]) -> ClusterView {
        let members = cluster
            .members
            .iter()
            .zip(candidates)
            .map(|(m, c)| {
                let status = c.probe.as_ref().ok();
                let role = if primary.as_deref() == Some(m.name.as_str()) {
                    Role::Primary
                } else if c.eligible() {
                    Role::Replica
                } else {
                    Role::Detached
                };
                let reason = c.note();
                MemberView {
                    name: m.name.clone(),
                    addr: format!("{}:{}", m.host, m.port),
                    role,
                    reason,
                    state: status.map(|s| s.local_state_comment.clone()).filter(|s| !s.is_empty()),
                    local_index: status.and_then(|s| s.local_index),
                    last_seen: self.last_seen.get(&m.name).copied(),
                    ..Default::default()
                }
            })
            .collect();
        let status = match &primary {
            Some(_) => ClusterStatus::Ok,
            None => ClusterStatus::NoPrimary(format!(
                "no Synced node in a Primary component: {}",
                candidates
                    .iter()
                    .map(|c| format!("{}: {}", c.name, c.note().unwrap_or_else(|| "eligible".into())))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        };
        ClusterView {
            name: cluster.name.clone(),
            topology: "galera",
            primary,
            status,
            members,
            ..Default::default()
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Switchover { to, reply } => {
                let result = self.switchover(to.as_deref());
                if let Err(e) = &result {
                    tracing::warn!(target_member = ?to, error = %e, "switchover refused");
                }
                let _ = reply.send(result);
            }
        }
    }

    /// Moves the writes to `to` (or the next eligible node) on the last round's facts. No
    /// server is changed: any Synced node can write, so this only re-targets the slots.
    fn switchover(&mut self, to: Option<&str>) -> Result<SwitchEvent, String> {
        let seen_at = Instant::now();
        let started = SystemTime::now();
        let current = self.publisher.current();
        let cluster = self.cfg.borrow().clone();
        if self.last.is_empty() {
            return Err("no probe round has finished yet; try again in a moment".into());
        }
        let target = match to {
            Some(name) => {
                let c = self
                    .last
                    .iter()
                    .find(|c| c.name == name)
                    .ok_or_else(|| format!("{name} is not a member of cluster {}", cluster.name))?;
                // The writer already (late or not): nothing to move, said below.
                let writer = current.primary.as_deref() == Some(name);
                if let Some(why) = if writer { c.reason() } else { c.note() } {
                    return Err(format!("{name} cannot take the writes: {why}"));
                }
                c.name.clone()
            }
            None => decide::best(&self.last, current.primary.as_deref())
                .map(|c| c.name.clone())
                .ok_or_else(|| "no other Synced node in a Primary component".to_owned())?,
        };
        if current.primary.as_deref() == Some(target.as_str()) {
            return Ok(SwitchEvent {
                cluster: cluster.name.clone(),
                kind: "switchover",
                old_primary: current.primary.clone(),
                new_primary: current.primary.clone(),
                started,
                duration_ms: 0.0,
                ok: true,
                steps: Vec::new(),
                detail: Some(format!("{target} is already the writer")),
            });
        }
        let view = self.view(&cluster, Some(target.clone()), &self.last);
        let detail = Some(format!("writes moved to {target} by switchover"));
        let steps = [("check", Instant::now(), true, Some(format!("{target} is Synced")))];
        let event = self.publisher.publish(
            view,
            Some(Move {
                kind: "switchover",
                detail,
                seen_at,
                started,
                steps: &steps,
            }),
        );
        self.pinned = true;
        event.ok_or_else(|| "the view did not change".to_owned())
    }
}

/// Why the writer moved (for the switch log), or `None` when it did not.
fn move_detail(current: Option<&str>, next: Option<&str>, candidates: &[Candidate]) -> Option<String> {
    if current == next {
        return None;
    }
    let old = current.and_then(|c| candidates.iter().find(|x| x.name == c));
    Some(match (old, next) {
        (Some(old), Some(next)) => match old.reason() {
            Some(why) => format!("{} left ({why}); writes follow to {next}", old.name),
            None => format!("{next} has a lower priority and is Synced again; writes go back to it"),
        },
        (Some(old), None) => format!(
            "{} left ({}); no other Synced node",
            old.name,
            old.reason().unwrap_or_default()
        ),
        (None, Some(next)) => format!("{next} is Synced; writes go to it"),
        (None, None) => return None,
    })
}

fn ticker(interval_ms: u64) -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_millis(interval_ms.max(1)));
    // A late round is not made up for with a burst of rounds.
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

fn ticker_from_now(interval_ms: u64) -> tokio::time::Interval {
    let period = Duration::from_millis(interval_ms.max(1));
    let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod live_tests;

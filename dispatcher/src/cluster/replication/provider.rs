//! The provider task: one per `replication` cluster. Every `health.interval_ms` it observes
//! every member, takes part in the failover lock, derives the topology, repairs and fences
//! (lock holder only), fails over when the primary is down, and publishes a [`ClusterView`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use mysql_async::Conn;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::elect::{self, derive, Derived, Facts};
use super::facts::{observe, MemberFacts};
use super::lock::{lock_name, MajorityLock};
use super::{connect, fault_point, steps, ReplError};
use crate::admin::metrics::{ClusterKindLabel, ClusterStateLabel, MemberRoleLabel, Metrics};
use crate::cluster::events::EventLog;
use crate::cluster::{
    ClusterConfig, ClusterStatus, ClusterView, Command, HealthState, MemberHealth, MemberView, ProviderHandle, Role,
    SemiSync, SwitchEvent, SwitchStep,
};

/// Starts the provider of one `replication` cluster.
pub fn spawn_replication(
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    health: Vec<(String, watch::Receiver<MemberHealth>)>,
    writes_in_flight: watch::Receiver<usize>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> ProviderHandle {
    let cluster = cfg.borrow().clone();
    let initial = ClusterView {
        name: cluster.name.clone(),
        topology: "replication",
        members: cluster
            .members
            .iter()
            .map(|m| MemberView {
                name: m.name.clone(),
                addr: format!("{}:{}", m.host, m.port),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let (view_tx, view_rx) = watch::channel(initial);
    let (cmd_tx, cmd_rx) = mpsc::channel(8);
    let span = tracing::info_span!("replication", cluster = %cluster.name);
    let provider = Provider {
        cfg,
        health: health.into_iter().collect(),
        writes: writes_in_flight,
        events,
        metrics,
        shutdown,
        view: view_tx,
        conns: BTreeMap::new(),
        errors: BTreeMap::new(),
        last_seen: BTreeMap::new(),
        progress: BTreeMap::new(),
        lock: MajorityLock::default(),
        lock_held: false,
        primary: None,
        replaced: BTreeSet::new(),
        reasons: BTreeMap::new(),
        status: ClusterStatus::Starting,
        semi_sync: None,
        last_switch: None,
        epoch: 0,
        published_primary: None,
        published_semi_sync: None,
        facts: Facts::new(),
    };
    tokio::spawn(provider.run(cmd_rx).instrument(span));
    ProviderHandle {
        view: view_rx,
        commands: cmd_tx,
    }
}

/// When a replica's heartbeat count or received position last changed.
struct Progress {
    key: (u64, String),
    changed: Instant,
}

struct Provider {
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    health: BTreeMap<String, watch::Receiver<MemberHealth>>,
    writes: watch::Receiver<usize>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    view: watch::Sender<ClusterView>,
    /// The observation connection of each member that answered last round.
    conns: BTreeMap<String, Conn>,
    errors: BTreeMap<String, String>,
    last_seen: BTreeMap<String, SystemTime>,
    progress: BTreeMap<String, Progress>,
    lock: MajorityLock,
    lock_held: bool,
    primary: Option<String>,
    /// Former primaries a switch replaced: read-only until rejoined, never primary again
    /// without a switch.
    replaced: BTreeSet<String>,
    /// Why a member is detached (e.g. diverged history).
    reasons: BTreeMap<String, String>,
    status: ClusterStatus,
    semi_sync: Option<SemiSync>,
    last_switch: Option<Instant>,
    epoch: u64,
    published_primary: Option<String>,
    published_semi_sync: Option<SemiSync>,
    facts: Facts,
}

/// The steps of one switch, timed from its start.
struct Recorder {
    t0: Instant,
    started: SystemTime,
    steps: Vec<SwitchStep>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            t0: Instant::now(),
            started: SystemTime::now(),
            steps: Vec::new(),
        }
    }

    fn step(&mut self, step: &'static str, ok: bool, detail: Option<String>) {
        self.step_at(step, self.t0.elapsed(), ok, detail);
    }

    /// A step that ended at `at` (steps that ran side by side).
    fn step_at(&mut self, step: &'static str, at: Duration, ok: bool, detail: Option<String>) {
        self.steps.push(SwitchStep {
            step,
            at_ms: at.as_secs_f64() * 1000.0,
            ok,
            detail,
        });
        if ok {
            fault_point(step);
        }
    }

    fn finish(
        self,
        cluster: &str,
        kind: &'static str,
        old: Option<&str>,
        new: Option<&str>,
        ok: bool,
        detail: Option<String>,
    ) -> SwitchEvent {
        SwitchEvent {
            cluster: cluster.to_owned(),
            kind,
            old_primary: old.map(str::to_owned),
            new_primary: new.map(str::to_owned),
            started: self.started,
            duration_ms: self.t0.elapsed().as_secs_f64() * 1000.0,
            ok,
            steps: self.steps,
            detail,
        }
    }
}

impl Provider {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut interval_ms = self.cfg.borrow().health.interval_ms;
        let mut tick = ticker(interval_ms);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = tick.tick() => self.round().await,
                Some(cmd) = commands.recv() => match cmd {
                    Command::Switchover { to, reply } => {
                        let r = self.switchover(to).await;
                        let _ = reply.send(r);
                    }
                },
                Ok(()) = self.cfg.changed() => {
                    let now = self.cfg.borrow().health.interval_ms;
                    if now != interval_ms {
                        interval_ms = now;
                        tick = ticker(now);
                    }
                }
            }
        }
        self.lock.release().await;
    }

    fn cluster(&self) -> Arc<ClusterConfig> {
        self.cfg.borrow().clone()
    }

    fn health_of(&self, member: &str) -> HealthState {
        self.health.get(member).map(|h| h.borrow().state).unwrap_or_default()
    }

    fn health_map(&self) -> BTreeMap<String, HealthState> {
        self.health.iter().map(|(n, h)| (n.clone(), h.borrow().state)).collect()
    }

    /// Observes every member on its own connection, in parallel.
    async fn observe_all(&mut self, cluster: &ClusterConfig) {
        let connect_timeout = cluster.health.connect_timeout();
        let query_timeout = Duration::from_millis(cluster.health.interval_ms).max(Duration::from_millis(200));
        let mut conns = std::mem::take(&mut self.conns);
        let jobs = cluster.members.iter().map(|m| {
            let conn = conns.remove(&m.name);
            async move {
                let r = async {
                    let mut conn = match conn {
                        Some(c) => c,
                        None => connect(cluster, m, connect_timeout).await?,
                    };
                    match tokio::time::timeout(query_timeout, observe(&mut conn, &m.name, cluster)).await {
                        Ok(Ok(f)) => Ok((f, conn)),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(ReplError::Timeout {
                            member: m.name.clone(),
                            what: "observing".into(),
                            after: query_timeout,
                        }),
                    }
                }
                .await;
                (m.name.clone(), r)
            }
        });
        let results = futures::future::join_all(jobs).await;
        self.facts.clear();
        for (name, r) in results {
            match r {
                Ok((f, conn)) => {
                    self.conns.insert(name.clone(), conn);
                    self.errors.remove(&name);
                    self.last_seen.insert(name.clone(), SystemTime::now());
                    if let Some(s) = &f.slave {
                        let key = (s.received_heartbeats, s.gtid_io_pos.clone());
                        match self.progress.get_mut(&name) {
                            Some(p) if p.key == key => {}
                            Some(p) => {
                                p.key = key;
                                p.changed = Instant::now();
                            }
                            None => {
                                self.progress.insert(
                                    name.clone(),
                                    Progress {
                                        key,
                                        changed: Instant::now(),
                                    },
                                );
                            }
                        }
                    } else {
                        self.progress.remove(&name);
                    }
                    self.facts.insert(name, f);
                }
                Err(e) => {
                    tracing::debug!(member = %name, error = %e, "member did not answer");
                    self.errors.insert(name, e.to_string());
                }
            }
        }
    }

    async fn round(&mut self) {
        let cluster = self.cluster();
        self.observe_all(&cluster).await;
        self.lock_held = self.lock.round(&cluster, cluster.health.connect_timeout()).await;
        let derived = derive(&self.facts, self.primary.as_deref(), &self.replaced);
        if self.lock_held {
            self.maintain(&cluster, &derived).await;
        }
        self.adopt(&cluster, derived.primary.clone());
        if let Some(p) = self.primary.clone() {
            if let Some(f) = self.facts.get(&p) {
                self.semi_sync = Some(semi_sync_of(f));
                self.status = ClusterStatus::Ok;
            } else if self.health_of(&p) == HealthState::Down {
                self.primary_down(&cluster, &p).await;
            } else {
                // Not answering us, not (yet) down by its monitor: keep it.
                self.status = ClusterStatus::Ok;
            }
        } else {
            self.status = ClusterStatus::NoPrimary(if self.facts.is_empty() {
                "no member answers".into()
            } else {
                "no writable member and none that the replicas follow".into()
            });
        }
        self.publish(&cluster);
    }

    /// Takes the primary the servers name, logging a change made by somebody else.
    fn adopt(&mut self, cluster: &ClusterConfig, derived: Option<String>) {
        let Some(new) = derived else { return };
        if self.primary.as_deref() == Some(new.as_str()) {
            return;
        }
        let old = self.primary.replace(new.clone());
        if let Some(old) = old {
            self.replaced.insert(old.clone());
            let ev = Recorder::new().finish(&cluster.name, "followed", Some(&old), Some(&new), true, None);
            self.count(&cluster.name, "followed");
            self.events.push(ev);
        } else {
            tracing::info!(primary = %new, "topology derived from the servers");
        }
        self.replaced.remove(&new);
    }

    /// Lock holder only: two writers, a stopped switch, returning members.
    async fn maintain(&mut self, cluster: &ClusterConfig, d: &Derived) {
        let lock = lock_name(&cluster.name);
        let timeout = cluster.health.connect_timeout() + Duration::from_secs(2);
        for x in &d.extra_writers {
            let mut rec = Recorder::new();
            let r = on_member(cluster, x, timeout, |c| steps::fence(c, x, cluster, &lock)).await;
            let ok = r.is_ok();
            rec.step(
                "fence",
                ok,
                Some(
                    r.as_ref()
                        .map(|n| format!("{n} connections killed"))
                        .unwrap_or_else(|e| e.to_string()),
                ),
            );
            if ok && d.primary.as_deref() != Some(x.as_str()) {
                self.replaced.insert(x.clone());
                if let Some(f) = self.facts.get_mut(x) {
                    f.read_only = true;
                }
            }
            let ev = rec.finish(
                &cluster.name,
                "fence",
                Some(x),
                d.primary.as_deref(),
                ok,
                Some(format!("{x} was writable beside the primary")),
            );
            self.count(&cluster.name, "fence");
            self.events.push(ev);
        }
        let Some(primary) = d.primary.clone() else { return };
        if let Some(p) = &d.reopen {
            if self.health_of(p) != HealthState::Down {
                let mut rec = Recorder::new();
                let r = on_member(cluster, p, timeout, |c| steps::reopen(c, p)).await;
                rec.step("reopen", r.is_ok(), r.as_ref().err().map(ToString::to_string));
                let ev = rec.finish(
                    &cluster.name,
                    "repair",
                    Some(p),
                    Some(p),
                    r.is_ok(),
                    Some("the primary was left read-only".into()),
                );
                self.count(&cluster.name, "repair");
                self.events.push(ev);
            }
        }
        let Some(pcfg) = cluster.member(&primary).cloned() else {
            return;
        };
        let semi = self.facts.get(&primary).is_some_and(|f| f.semi_sync_master_enabled);
        if d.undetached {
            let mut rec = Recorder::new();
            let r = on_member(cluster, &primary, timeout, |c| steps::detach(c, &primary)).await;
            rec.step("detach", r.is_ok(), r.as_ref().err().map(ToString::to_string));
            let ev = rec.finish(
                &cluster.name,
                "repair",
                None,
                Some(&primary),
                r.is_ok(),
                Some(format!("{primary} was promoted but still had replication configured")),
            );
            self.count(&cluster.name, "repair");
            self.events.push(ev);
        }
        if !self.facts.contains_key(&primary) {
            return;
        }
        for s in &d.strays {
            let mut rec = Recorder::new();
            let r = on_member(cluster, s, timeout, |c| {
                steps::repoint(c, s, &pcfg, cluster, false, semi)
            })
            .await;
            rec.step("repoint", r.is_ok(), r.as_ref().err().map(ToString::to_string));
            let ev = rec.finish(
                &cluster.name,
                "repair",
                None,
                Some(&primary),
                r.is_ok(),
                Some(format!("{s} still pointed at a replaced or dead member")),
            );
            self.count(&cluster.name, "repair");
            self.events.push(ev);
        }
        if !cluster.failover.auto_rejoin {
            return;
        }
        let pstate = self.facts[&primary].binlog_state();
        let candidates: Vec<(String, MemberFacts)> = self
            .facts
            .iter()
            .filter(|(n, f)| **n != primary && f.read_only && !f.is_replica() && !d.extra_writers.contains(n))
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect();
        for (x, f) in candidates {
            if !pstate.contains_history(&f.binlog_pos()) {
                let why = format!(
                    "diverged: its gtid_binlog_pos {} is not in {primary}'s history; not rejoined",
                    f.gtid_binlog_pos
                );
                if self.reasons.get(&x) != Some(&why) {
                    tracing::warn!(member = %x, "{why}");
                }
                self.reasons.insert(x, why);
                continue;
            }
            let mut rec = Recorder::new();
            let r = on_member(cluster, &x, timeout, |c| {
                steps::repoint(c, &x, &pcfg, cluster, true, semi)
            })
            .await;
            rec.step("repoint", r.is_ok(), r.as_ref().err().map(ToString::to_string));
            if r.is_ok() {
                self.reasons.remove(&x);
            }
            let ev = rec.finish(
                &cluster.name,
                "rejoin",
                Some(&x),
                Some(&primary),
                r.is_ok(),
                Some(format!("{x} rejoined as a replica of {primary}")),
            );
            self.count(&cluster.name, "rejoin");
            self.events.push(ev);
        }
    }

    /// The primary is down by its monitor and does not answer us.
    async fn primary_down(&mut self, cluster: &ClusterConfig, old: &str) {
        if !self.lock_held {
            self.status = ClusterStatus::NoPrimary(format!(
                "primary {old} down; waiting for the failover lock holder ({})",
                self.lock.detail
            ));
            return;
        }
        if !cluster.failover.auto {
            self.status = ClusterStatus::NoPrimary(format!("primary {old} down; failover.auto = false"));
            return;
        }
        if let Some(t) = self.last_switch {
            let cooldown = Duration::from_secs(cluster.failover.cooldown_s);
            if t.elapsed() < cooldown {
                self.status = ClusterStatus::NoPrimary(format!(
                    "primary {old} down; cooldown, {} s left",
                    (cooldown - t.elapsed()).as_secs()
                ));
                return;
            }
        }
        self.failover(cluster, old).await;
    }

    async fn failover(&mut self, cluster: &ClusterConfig, old: &str) {
        let mut rec = Recorder::new();
        let interval = Duration::from_millis(cluster.health.interval_ms);
        if cluster.failover.verify {
            let receiving: Vec<String> = self
                .facts
                .iter()
                .filter(|(n, f)| {
                    f.replicates_from.as_deref() == Some(old)
                        && elect::is_receiving(
                            f,
                            self.progress.get(*n).map(|p| p.changed.elapsed()),
                            elect::receive_window(f, interval),
                        )
                })
                .map(|(n, _)| n.clone())
                .collect();
            if !receiving.is_empty() {
                self.status = ClusterStatus::Unreachable(format!(
                    "{old} is down to this dispatcher but {} still receive from it: no promotion",
                    receiving.join(", ")
                ));
                return;
            }
        }
        rec.step("verify", true, None);
        let new = match elect::elect(cluster, &self.facts, &self.health_map(), Some(old), false) {
            Ok(n) => n,
            Err(why) => {
                self.status = ClusterStatus::NoPrimary(format!("primary {old} down; {why}"));
                return;
            }
        };
        let f = &self.facts[&new];
        let detail = format!(
            "received {}, applied {}",
            f.slave.as_ref().map(|s| s.gtid_io_pos.as_str()).unwrap_or(""),
            f.gtid_slave_pos
        );
        rec.step("elect", true, Some(detail));
        tracing::warn!(old, new = %new, "failover");
        self.status = ClusterStatus::Switching(format!("failover: {old} -> {new}"));
        self.publish(cluster);

        let catchup = Duration::from_millis(cluster.failover.catchup_timeout_ms);
        let target = self.facts[&new]
            .slave
            .as_ref()
            .map(|s| s.gtid_io_pos.clone())
            .unwrap_or_default();
        let budget = catchup + cluster.health.connect_timeout();
        let r = on_member(cluster, &new, budget, |c| steps::catch_up(c, &new, &target, catchup)).await;
        if let Err(e) = r {
            // Promoting now would drop what it received and did not apply (possibly
            // acknowledged commits): try again next round instead.
            rec.step("catch_up", false, Some(e.to_string()));
            self.status = ClusterStatus::NoPrimary(format!("failover to {new} stopped: {e}; retrying"));
            let ev = rec.finish(
                &cluster.name,
                "failover",
                Some(old),
                Some(&new),
                false,
                Some(e.to_string()),
            );
            self.count(&cluster.name, "failover_failed");
            self.events.push(ev);
            return;
        }
        rec.step("catch_up", true, Some(target.clone()));
        let semi = !matches!(self.semi_sync, Some(SemiSync::Off) | None);
        let r = on_member(
            cluster,
            &new,
            cluster.health.connect_timeout() + Duration::from_secs(5),
            |c| steps::promote(c, &new),
        )
        .await;
        if let Err(e) = r {
            rec.step("promote", false, Some(e.to_string()));
            self.status = ClusterStatus::NoPrimary(format!("promoting {new} failed: {e}; retrying"));
            let ev = rec.finish(
                &cluster.name,
                "failover",
                Some(old),
                Some(&new),
                false,
                Some(e.to_string()),
            );
            self.count(&cluster.name, "failover_failed");
            self.events.push(ev);
            return;
        }
        rec.step("promote", true, None);
        self.set_primary(Some(new.clone()));
        self.replaced.insert(old.to_owned());
        self.status = ClusterStatus::Ok;
        if let Some(f) = self.facts.get_mut(&new) {
            f.read_only = false;
            f.slave = None;
            f.replicates_from = None;
        }
        self.publish(cluster);
        rec.step("publish", true, None);

        let others: Vec<String> = self.facts.keys().filter(|n| **n != new && *n != old).cloned().collect();
        self.settle(cluster, &mut rec, &new, &others, &[], semi).await;

        let lock = lock_name(&cluster.name);
        let r = on_member(
            cluster,
            old,
            cluster.health.connect_timeout() + Duration::from_secs(2),
            |c| steps::fence(c, old, cluster, &lock),
        )
        .await;
        rec.step(
            "fence",
            r.is_ok(),
            Some(match &r {
                Ok(n) => format!("read-only, {n} connections killed"),
                Err(e) => format!("not reachable ({e}); fenced on sight when it returns"),
            }),
        );
        let ev = rec.finish(&cluster.name, "failover", Some(old), Some(&new), true, None);
        self.finish_switch(cluster, ev);
    }

    /// After publishing `new`: re-points `others` at it while its own replication is reset
    /// (both may take 2 s each against a hung old primary, so side by side), then turns
    /// semi-sync on. Steps `repoint`, `detach` (, `semi_sync`).
    async fn settle(
        &self,
        cluster: &ClusterConfig,
        rec: &mut Recorder,
        new: &str,
        others: &[String],
        was_primary: &[&str],
        semi: bool,
    ) {
        let t0 = rec.t0;
        let timeout = cluster.health.connect_timeout() + Duration::from_secs(5);
        let repoint = async {
            let r = self.repoint_all(cluster, others, new, was_primary).await;
            (r, t0.elapsed())
        };
        let detach = async {
            let r = on_member(cluster, new, timeout, |c| steps::detach(c, new)).await;
            (r, t0.elapsed())
        };
        let ((rp, rp_at), (dt, dt_at)) = tokio::join!(repoint, detach);
        let mut done = vec![
            ("repoint", rp_at, rp.iter().all(|(_, r)| r.is_ok()), Some(describe(&rp))),
            ("detach", dt_at, dt.is_ok(), dt.err().map(|e| e.to_string())),
        ];
        done.sort_by_key(|d| d.1);
        for (step, at, ok, detail) in done {
            rec.step_at(step, at, ok, detail);
        }
        if semi {
            let r = on_member(cluster, new, timeout, |c| steps::semi_sync_master(c, new)).await;
            rec.step("semi_sync", r.is_ok(), r.err().map(|e| e.to_string()));
        }
    }

    /// Re-points `members` at `to` in parallel; `was_primary` ones start from their binlog.
    async fn repoint_all(
        &self,
        cluster: &ClusterConfig,
        members: &[String],
        to: &str,
        was_primary: &[&str],
    ) -> Vec<(String, Result<(), ReplError>)> {
        let Some(to_cfg) = cluster.member(to) else {
            return Vec::new();
        };
        let timeout = cluster.health.connect_timeout() + Duration::from_secs(5);
        let semi = !matches!(self.semi_sync, Some(SemiSync::Off) | None);
        let jobs = members.iter().map(|m| {
            let wp = was_primary.contains(&m.as_str());
            async move {
                let r = on_member(cluster, m, timeout, |c| steps::repoint(c, m, to_cfg, cluster, wp, semi)).await;
                (m.clone(), r)
            }
        });
        futures::future::join_all(jobs).await
    }

    /// Logs a successful switch, starts the cooldown and the ops hook.
    fn finish_switch(&mut self, cluster: &ClusterConfig, ev: SwitchEvent) {
        let (kind, old, new) = (
            ev.kind,
            ev.old_primary.clone().unwrap_or_default(),
            ev.new_primary.clone().unwrap_or_default(),
        );
        let (old, new) = (old.as_str(), new.as_str());
        self.last_switch = Some(Instant::now());
        self.metrics.failover_duration.observe(ev.duration_ms / 1000.0);
        self.count(&cluster.name, kind);
        self.events.push(ev);
        if let Some(cmd) = &cluster.failover.on_switch {
            let addr = |n: &str| {
                cluster
                    .member(n)
                    .map(|m| format!("{}:{}", m.host, m.port))
                    .unwrap_or_default()
            };
            let env = [
                ("OSPREY_CLUSTER", cluster.name.clone()),
                ("OSPREY_OLD_PRIMARY", old.to_owned()),
                ("OSPREY_NEW_PRIMARY", new.to_owned()),
                ("OSPREY_OLD_ADDR", addr(old)),
                ("OSPREY_NEW_ADDR", addr(new)),
            ];
            let timeout = Duration::from_millis(cluster.failover.on_switch_timeout_ms);
            tokio::spawn(run_hook(cmd.clone(), env, timeout).in_current_span());
        }
    }

    fn set_primary(&mut self, p: Option<String>) {
        self.primary = p;
    }

    async fn switchover(&mut self, to: Option<String>) -> Result<SwitchEvent, String> {
        let cluster = self.cluster();
        if !self.lock_held {
            return Err(format!(
                "this dispatcher does not hold the failover lock ({})",
                self.lock.detail
            ));
        }
        self.observe_all(&cluster).await;
        let old = self.primary.clone().ok_or("no primary to switch from")?;
        if self.facts.get(&old).is_none_or(|f| f.read_only) {
            return Err(format!("the primary {old} does not answer or is not writable"));
        }
        let target = match to {
            Some(t) => {
                let f = self
                    .facts
                    .get(&t)
                    .ok_or_else(|| format!("{t} does not answer or is not a member"))?;
                if t == old {
                    return Err(format!("{t} is the primary already"));
                }
                if f.replicates_from.as_deref() != Some(old.as_str())
                    || !f.slave.as_ref().is_some_and(|s| s.sql_running)
                {
                    return Err(format!("{t} does not replicate from {old}"));
                }
                t
            }
            None => elect::elect(&cluster, &self.facts, &self.health_map(), Some(&old), false)?,
        };
        let mut rec = Recorder::new();
        let deadline = Instant::now() + Duration::from_millis(cluster.failover.switchover_timeout_ms);
        tracing::warn!(old = %old, new = %target, "switchover");
        // No primary: the write slot group stops dispatching, new requests wait.
        self.set_primary(None);
        self.status = ClusterStatus::Switching(format!("switchover: {old} -> {target}"));
        self.publish(&cluster);

        let drained = wait_zero(&mut self.writes, deadline).await;
        rec.step(
            "drain",
            drained,
            (!drained).then(|| "writes still in flight".to_owned()),
        );
        if !drained {
            return Err(self
                .rollback(
                    &cluster,
                    rec,
                    &old,
                    &target,
                    false,
                    "writes still in flight at the timeout".into(),
                )
                .await);
        }
        let lock = lock_name(&cluster.name);
        let budget = deadline.saturating_duration_since(Instant::now());
        let demote = on_member(&cluster, &old, budget, |c| steps::demote(c, &old, &cluster, &lock)).await;
        let pos = match demote {
            Ok(p) => p,
            Err(e) => {
                rec.step("demote", false, Some(e.to_string()));
                return Err(self
                    .rollback(&cluster, rec, &old, &target, true, format!("demoting {old}: {e}"))
                    .await);
            }
        };
        rec.step("demote", true, Some(pos.clone()));
        let budget = deadline.saturating_duration_since(Instant::now());
        let r = on_member(&cluster, &target, budget + Duration::from_millis(500), |c| {
            steps::catch_up(c, &target, &pos, budget)
        })
        .await;
        if let Err(e) = r {
            rec.step("catch_up", false, Some(e.to_string()));
            return Err(self
                .rollback(
                    &cluster,
                    rec,
                    &old,
                    &target,
                    true,
                    format!("{target} did not catch up: {e}"),
                )
                .await);
        }
        rec.step("catch_up", true, None);
        let semi = self.facts.get(&old).is_some_and(|f| f.semi_sync_master_enabled);
        let r = on_member(
            &cluster,
            &target,
            cluster.health.connect_timeout() + Duration::from_secs(5),
            |c| steps::promote(c, &target),
        )
        .await;
        if let Err(e) = r {
            rec.step("promote", false, Some(e.to_string()));
            // It may have stopped replicating already: make it a replica of the old one again.
            let _ = self
                .repoint_all(&cluster, std::slice::from_ref(&target), &old, &[])
                .await;
            return Err(self
                .rollback(&cluster, rec, &old, &target, true, format!("promoting {target}: {e}"))
                .await);
        }
        rec.step("promote", true, None);
        self.set_primary(Some(target.clone()));
        self.status = ClusterStatus::Ok;
        self.publish(&cluster);
        rec.step("publish", true, None);
        let others: Vec<String> = self.facts.keys().filter(|n| **n != target).cloned().collect();
        self.settle(&cluster, &mut rec, &target, &others, &[old.as_str()], semi)
            .await;
        let ev = rec.finish(&cluster.name, "switchover", Some(&old), Some(&target), true, None);
        self.finish_switch(&cluster, ev.clone());
        Ok(ev)
    }

    /// Undoes a switchover that stopped midway: the old primary writable again and
    /// published. Returns the reason, and logs the failed switch.
    async fn rollback(
        &mut self,
        cluster: &ClusterConfig,
        mut rec: Recorder,
        old: &str,
        target: &str,
        reopen: bool,
        why: String,
    ) -> String {
        if reopen {
            let r = on_member(
                cluster,
                old,
                cluster.health.connect_timeout() + Duration::from_secs(2),
                |c| steps::reopen(c, old),
            )
            .await;
            rec.step("rollback", r.is_ok(), r.err().map(|e| e.to_string()));
        }
        self.set_primary(Some(old.to_owned()));
        self.status = ClusterStatus::Ok;
        self.publish(cluster);
        let ev = rec.finish(
            &cluster.name,
            "switchover",
            Some(old),
            Some(target),
            false,
            Some(why.clone()),
        );
        self.count(&cluster.name, "switchover_failed");
        self.events.push(ev);
        why
    }

    fn count(&self, cluster: &str, kind: &str) {
        self.metrics
            .failovers
            .get_or_create(&ClusterKindLabel {
                cluster: cluster.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }

    fn role_of(&self, name: &str) -> (Role, Option<String>) {
        let primary = self.primary.as_deref();
        match self.facts.get(name) {
            Some(_) if Some(name) == primary => (
                Role::Primary,
                (self.semi_sync == Some(SemiSync::FellBack)).then(|| {
                    "semi-sync fell back to asynchronous: a failover now may lose acknowledged commits".into()
                }),
            ),
            Some(f) if f.replicates_from.is_some() && f.replicates_from.as_deref() == primary => (Role::Replica, None),
            Some(_) if self.reasons.contains_key(name) => (Role::Detached, self.reasons.get(name).cloned()),
            Some(_) if self.replaced.contains(name) => (
                Role::Fenced,
                Some(format!(
                    "replaced by {}; read-only until rejoined",
                    primary.unwrap_or("?")
                )),
            ),
            Some(f) => match &f.replicates_from {
                Some(m) => (
                    Role::Detached,
                    Some(format!("replicates from {m}, not from the primary")),
                ),
                None if f.slave.is_some() => (
                    Role::Detached,
                    Some("replicates from a server outside the cluster".into()),
                ),
                None => (Role::Detached, Some("read-only and replicates from nobody".into())),
            },
            None => {
                let err = self.errors.get(name).cloned().unwrap_or_else(|| "not seen yet".into());
                if self.replaced.contains(name) {
                    (Role::Fenced, Some(format!("replaced; unreachable: {err}")))
                } else if Some(name) == primary {
                    (Role::Primary, Some(format!("unreachable: {err}")))
                } else {
                    (Role::Unknown, Some(err))
                }
            }
        }
    }

    fn publish(&mut self, cluster: &ClusterConfig) {
        let members: Vec<MemberView> = cluster
            .members
            .iter()
            .map(|m| {
                let (role, reason) = self.role_of(&m.name);
                let f = self.facts.get(&m.name);
                let s = f.and_then(|f| f.slave.as_ref());
                MemberView {
                    name: m.name.clone(),
                    addr: format!("{}:{}", m.host, m.port),
                    role,
                    reason,
                    read_only: f.map(|f| f.read_only),
                    gtid_received: s.map(|s| s.gtid_io_pos.clone()),
                    gtid_applied: f.map(|f| f.gtid_slave_pos.clone()),
                    gtid_binlog: f.map(|f| f.gtid_binlog_pos.clone()),
                    replicates_from: f.and_then(|f| f.replicates_from.clone()),
                    io_running: s.map(|s| s.io_running()),
                    sql_running: s.map(|s| s.sql_running),
                    state: s.map(|s| {
                        if s.last_io_error.is_empty() {
                            format!("io {}", s.io_state)
                        } else {
                            format!("io {}: {}", s.io_state, s.last_io_error)
                        }
                    }),
                    local_index: None,
                    maintenance: false,
                    last_seen: self.last_seen.get(&m.name).copied(),
                }
            })
            .collect();
        // Write slots target the primary only while it serves: down, unreachable or in a
        // switch, there is none and requests wait.
        let primary = if self.status == ClusterStatus::Ok {
            self.primary.clone()
        } else {
            None
        };
        if primary != self.published_primary {
            self.published_primary = primary.clone();
            self.epoch += 1;
        }
        if self.semi_sync != self.published_semi_sync {
            if self.semi_sync == Some(SemiSync::FellBack) {
                tracing::warn!("semi-sync fell back to asynchronous: a failover now may lose acknowledged commits");
            }
            self.published_semi_sync = self.semi_sync;
        }
        let status = self.status.clone();
        for mv in &members {
            for r in ["primary", "replica", "fenced", "detached", "unknown"] {
                self.metrics
                    .member_role
                    .get_or_create(&MemberRoleLabel {
                        cluster: cluster.name.clone(),
                        member: mv.name.clone(),
                        role: r.to_owned(),
                    })
                    .set(i64::from(role_name(mv.role) == r));
            }
        }
        if let Some(ss) = self.semi_sync {
            for s in ["on", "fell_back", "off"] {
                self.metrics
                    .semi_sync
                    .get_or_create(&ClusterStateLabel {
                        cluster: cluster.name.clone(),
                        state: s.to_owned(),
                    })
                    .set(i64::from(semi_name(ss) == s));
            }
        }
        let view = ClusterView {
            name: cluster.name.clone(),
            topology: "replication",
            primary,
            status,
            members,
            semi_sync: self.semi_sync,
            lock_held: self.lock_held,
            lock_detail: Some(self.lock.detail.clone()),
            epoch: self.epoch,
        };
        self.view.send_if_modified(|v| {
            if *v == view {
                false
            } else {
                *v = view;
                true
            }
        });
    }
}

fn ticker(ms: u64) -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_millis(ms.max(10)));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// Runs `f` on a fresh monitor connection to `member`, bounded by `timeout` overall.
async fn on_member<T, F, Fut>(cluster: &ClusterConfig, member: &str, timeout: Duration, f: F) -> Result<T, ReplError>
where
    F: FnOnce(Conn) -> Fut,
    Fut: std::future::Future<Output = Result<T, ReplError>>,
{
    let m = cluster
        .member(member)
        .ok_or_else(|| ReplError::Unexpected(member.to_owned(), "not a member of the cluster".into()))?;
    let work = async {
        let conn = connect(cluster, m, timeout).await?;
        f(conn).await
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ReplError::Timeout {
            member: member.to_owned(),
            what: "the step".into(),
            after: timeout,
        }),
    }
}

fn semi_sync_of(f: &MemberFacts) -> SemiSync {
    match (f.semi_sync_master_enabled, f.semi_sync_master_on) {
        (false, _) => SemiSync::Off,
        (true, true) => SemiSync::On,
        (true, false) => SemiSync::FellBack,
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Primary => "primary",
        Role::Replica => "replica",
        Role::Fenced => "fenced",
        Role::Detached => "detached",
        Role::Unknown => "unknown",
    }
}

fn semi_name(s: SemiSync) -> &'static str {
    match s {
        SemiSync::On => "on",
        SemiSync::FellBack => "fell_back",
        SemiSync::Off => "off",
    }
}

fn describe(results: &[(String, Result<(), ReplError>)]) -> String {
    results
        .iter()
        .map(|(m, r)| match r {
            Ok(()) => format!("{m}: ok"),
            Err(e) => format!("{m}: {e}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

async fn wait_zero(w: &mut watch::Receiver<usize>, deadline: Instant) -> bool {
    let wait = w.wait_for(|n| *n == 0);
    matches!(tokio::time::timeout_at(deadline.into(), wait).await, Ok(Ok(_)))
}

async fn run_hook(cmd: String, env: [(&'static str, String); 5], timeout: Duration) {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "on_switch could not start");
            return;
        }
    };
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(st)) if st.success() => tracing::info!("on_switch done"),
        Ok(Ok(st)) => tracing::warn!(status = %st, "on_switch failed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "on_switch: wait failed"),
        Err(_) => {
            let _ = child.kill().await;
            tracing::warn!(?timeout, "on_switch killed at its timeout");
        }
    }
}

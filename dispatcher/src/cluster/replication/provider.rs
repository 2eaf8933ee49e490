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

use super::elect::{self, derive, Facts, Progress};
use super::facts::{observe, MemberFacts};
use super::lock::MajorityLock;
use super::record::Recorder;
use super::{connect, ReplError};
use crate::cluster::events::EventLog;
use crate::cluster::{
    ClusterConfig, ClusterStatus, ClusterView, Command, HealthState, MemberHealth, MemberView, ProviderHandle, Role,
    SemiSync,
};
use crate::metrics::{ClusterKindLabel, ClusterStateLabel, MemberRoleLabel, Metrics};

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
    let initial = ClusterView::starting(&cluster, "replication");
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

pub(super) struct Provider {
    pub(super) cfg: watch::Receiver<Arc<ClusterConfig>>,
    pub(super) health: BTreeMap<String, watch::Receiver<MemberHealth>>,
    pub(super) writes: watch::Receiver<usize>,
    pub(super) events: Arc<EventLog>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: CancellationToken,
    pub(super) view: watch::Sender<ClusterView>,
    /// The observation connection of each member that answered last round.
    pub(super) conns: BTreeMap<String, Conn>,
    pub(super) errors: BTreeMap<String, String>,
    pub(super) last_seen: BTreeMap<String, SystemTime>,
    pub(super) progress: BTreeMap<String, Progress>,
    pub(super) lock: MajorityLock,
    pub(super) lock_held: bool,
    pub(super) primary: Option<String>,
    /// Former primaries a switch replaced: read-only until rejoined, never primary again
    /// without a switch.
    pub(super) replaced: BTreeSet<String>,
    /// Why a member is detached (e.g. diverged history).
    pub(super) reasons: BTreeMap<String, String>,
    pub(super) status: ClusterStatus,
    pub(super) semi_sync: Option<SemiSync>,
    pub(super) last_switch: Option<Instant>,
    pub(super) epoch: u64,
    pub(super) published_primary: Option<String>,
    pub(super) published_semi_sync: Option<SemiSync>,
    pub(super) facts: Facts,
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

    pub(super) fn cluster(&self) -> Arc<ClusterConfig> {
        self.cfg.borrow().clone()
    }

    pub(super) fn health_of(&self, member: &str) -> HealthState {
        self.health.get(member).map(|h| h.borrow().state).unwrap_or_default()
    }

    pub(super) fn health_map(&self) -> BTreeMap<String, HealthState> {
        self.health.iter().map(|(n, h)| (n.clone(), h.borrow().state)).collect()
    }

    /// Observes every member on its own connection, in parallel.
    pub(super) async fn observe_all(&mut self, cluster: &ClusterConfig) {
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
                        let now = Instant::now();
                        let hb = elect::heartbeat(&f);
                        match self.progress.get_mut(&name) {
                            Some(p) => p.observe(s.received_heartbeats, &s.gtid_io_pos, hb, now),
                            None => {
                                let p = Progress::new(s.received_heartbeats, &s.gtid_io_pos, now);
                                self.progress.insert(name.clone(), p);
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
        if let Some(p) = &self.primary {
            // Rejoined: a replica of the primary again, no longer a replaced member.
            let p = p.clone();
            self.replaced.retain(|m| {
                self.facts
                    .get(m)
                    .is_none_or(|f| f.replicates_from.as_deref() != Some(p.as_str()))
            });
        }
        if let Some(p) = self.primary.clone() {
            if let Some(f) = self.facts.get(&p) {
                self.semi_sync = Some(semi_sync_of(f));
                self.status = if f.read_only {
                    // Nobody is writable and the replicas follow it: a switchover (ours
                    // crashed, or another dispatcher's) between demote and promote. Writes
                    // sent now would fail; they wait until someone is writable.
                    ClusterStatus::NoPrimary(format!(
                        "{p} is read-only (a switchover is running or stopped half way)"
                    ))
                } else {
                    ClusterStatus::Ok
                };
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
    pub(super) fn adopt(&mut self, cluster: &ClusterConfig, derived: Option<String>) {
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

    pub(super) fn set_primary(&mut self, p: Option<String>) {
        self.primary = p;
    }

    pub(super) fn count(&self, cluster: &str, kind: &str) {
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

    pub(super) fn publish(&mut self, cluster: &ClusterConfig) {
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
                    .set(i64::from(mv.role.name() == r));
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

pub(super) fn semi_sync_of(f: &MemberFacts) -> SemiSync {
    match (f.semi_sync_master_enabled, f.semi_sync_master_on) {
        (false, _) => SemiSync::Off,
        (true, true) => SemiSync::On,
        (true, false) => SemiSync::FellBack,
    }
}

fn semi_name(s: SemiSync) -> &'static str {
    match s {
        SemiSync::On => "on",
        SemiSync::FellBack => "fell_back",
        SemiSync::Off => "off",
    }
}

//! One cluster at run time: its members' monitors, its topology provider, and the
//! task that keeps the write slots pointed at the provider's primary.
//!
//! The follower decides, from the provider's view, the members' health and ops'
//! maintenance marks, what the write slots do:
//! - the primary is up and not in maintenance: slots target it (a change of primary
//!   re-targets them: idle workers quit at once, busy ones after their response);
//! - the primary is down, a switch is running, or the primary is in maintenance:
//!   slots hold — requests wait in the queue (bounded by `queue_timeout_ms`), so the
//!   application sees latency, not errors, for what never reached the dead primary;
//! - every member is down: requests fail at once (`BACKEND_UNAVAILABLE`, not
//!   dispatched) until one comes back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use osprey_protocol::WorkerSettings;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{info, Instrument};

use crate::cluster::config::{worker_settings, ClusterConfig};
use crate::cluster::delay::DelayView;
use crate::cluster::events::EventLog;
use crate::cluster::reads::{ReadGate, ReadPoolReport, Reads};
use crate::cluster::view::{
    ClusterStatus, ClusterView, Command, HealthState, MemberHealth, ProviderHandle, SwitchEvent,
};
use crate::pool::PoolConfig;
use crate::pool::{PoolView, SlotGroup};

/// A cluster's parts, as the admin API and SIGHUP reach them.
pub struct ClusterRuntime {
    pub name: String,
    config: watch::Sender<Arc<ClusterConfig>>,
    pool_config: PoolConfig,
    /// Member name and its monitor's output, in configuration order.
    pub health: Vec<(String, watch::Receiver<MemberHealth>)>,
    pub provider: ProviderHandle,
    pub pool: Arc<SlotGroup>,
    /// The read/write split's read side (`read_split`), `None` when off.
    pub reads: Option<Arc<Reads>>,
    replica_size: usize,
    /// The delay probe's verdicts for the read side (`None`: delay detection off).
    read_gate: watch::Sender<Option<ReadGate>>,
    maintenance: Mutex<BTreeSet<String>>,
    /// Wakes the follower (maintenance changed).
    changed: Notify,
    /// Whether health decides where writes go. Off for a single `[backend]`: its health
    /// is shown, but requests keep going to it (and wait or fail on it) as they always
    /// did; there is nowhere else to send them.
    follow_health: bool,
    /// The replica-delay probe, when the cluster enables it (set once, at start).
    pub delay: std::sync::OnceLock<crate::cluster::delay::DelayHandle>,
}

/// `GET /cluster`: one cluster.
#[derive(Debug, Serialize)]
pub struct ClusterReport {
    #[serde(flatten)]
    pub view: ClusterView,
    /// Each member's health, by member name.
    pub health: Vec<MemberHealthReport>,
    /// The write slots.
    pub write_pool: PoolView,
    /// Each member's read slots (`read_split`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_pools: Vec<ReadPoolReport>,
}

#[derive(Debug, Serialize)]
pub struct MemberHealthReport {
    pub member: String,
    #[serde(flatten)]
    pub health: MemberHealth,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster {0} has no member {1}")]
    NoSuchMember(String, String),
    #[error("the cluster's topology provider is not running")]
    ProviderGone,
    #[error("{0}")]
    Refused(String),
}

impl ClusterRuntime {
    /// Starts the follower of `provider` for `pool`; `health` are the members' monitors.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        config: watch::Sender<Arc<ClusterConfig>>,
        pool_config: PoolConfig,
        health: Vec<(String, watch::Receiver<MemberHealth>)>,
        provider: ProviderHandle,
        pool: Arc<SlotGroup>,
        reads: Option<(Arc<Reads>, usize)>,
        follow_health: bool,
        shutdown: CancellationToken,
    ) -> Arc<ClusterRuntime> {
        let name = config.borrow().name.clone();
        let (reads, replica_size) = match reads {
            Some((r, n)) => (Some(r), n),
            None => (None, 0),
        };
        let rt = Arc::new(ClusterRuntime {
            name,
            config,
            pool_config,
            health,
            provider,
            pool,
            reads,
            replica_size,
            read_gate: watch::channel(None).0,
            maintenance: Mutex::new(BTreeSet::new()),
            changed: Notify::new(),
            follow_health,
            delay: std::sync::OnceLock::new(),
        });
        let span = tracing::info_span!("cluster", cluster = %rt.name);
        tokio::spawn(rt.clone().follow(shutdown).instrument(span));
        rt
    }

    /// The cluster's settings; a SIGHUP sends new ones ([`ClusterRuntime::reconfigure`]).
    pub fn config(&self) -> watch::Receiver<Arc<ClusterConfig>> {
        self.config.subscribe()
    }

    pub fn reconfigure(&self, config: Arc<ClusterConfig>) {
        self.config.send_replace(config);
        self.changed.notify_one();
    }

    /// The delay probe's latest verdicts, for the read side.
    pub fn set_read_gate(&self, gate: ReadGate) {
        self.read_gate.send_replace(Some(gate));
    }

    /// Keeps the write slots on the provider's primary and the read slots on the
    /// replicas, for as long as the dispatcher runs.
    async fn follow(self: Arc<Self>, shutdown: CancellationToken) {
        let mut view = self.provider.view.clone();
        let mut health: Vec<watch::Receiver<MemberHealth>> = self.health.iter().map(|(_, h)| h.clone()).collect();
        let mut gate = self.read_gate.subscribe();
        let mut last = String::new();
        loop {
            let snapshot = view.borrow_and_update().clone();
            let decision = self.decide(&snapshot, &mut health);
            let text = format!("{decision:?}");
            if text != last {
                info!(decision = %text, "write slots");
                last = text;
            }
            match decision {
                Decision::Target(member, settings) => {
                    if let Some(old) = self.pool.target_member().filter(|old| *old != member) {
                        if self.health_of(&old) == Some(HealthState::Down) {
                            self.pool.abandon_member(&old);
                        }
                    }
                    self.pool.set_target(&member, *settings)
                }
                Decision::Hold(why) => self.pool.hold(why),
                Decision::Unavailable(why) => self.pool.set_unavailable(why),
            }
            if let Some(reads) = &self.reads {
                let states: BTreeMap<String, HealthState> =
                    self.health.iter().map(|(n, h)| (n.clone(), h.borrow().state)).collect();
                let maintenance = self.maintenance.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let config = self.config.borrow().clone();
                let g = gate.borrow_and_update().clone();
                reads.update(
                    &config,
                    &self.pool_config,
                    self.replica_size,
                    &snapshot,
                    &states,
                    &maintenance,
                    g.as_ref(),
                );
            }
            tokio::select! {
                r = view.changed() => if r.is_err() { return },
                Ok(()) = gate.changed() => {}
                _ = any_changed(&mut health) => {}
                _ = self.changed.notified() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    fn decide(&self, view: &ClusterView, health: &mut [watch::Receiver<MemberHealth>]) -> Decision {
        let states: Vec<(String, HealthState)> = self
            .health
            .iter()
            .zip(health.iter_mut())
            .map(|((name, _), h)| (name.clone(), h.borrow_and_update().state))
            .collect();
        let state_of = |m: &str| states.iter().find(|(n, _)| n == m).map(|(_, s)| *s);
        let config = self.config.borrow().clone();
        let all_down = self.follow_health && !states.is_empty() && states.iter().all(|(_, s)| *s == HealthState::Down);
        if all_down {
            return Decision::Unavailable(format!(
                "every member is down ({})",
                states.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        let Some(primary) = &view.primary else {
            return Decision::Hold(match &view.status {
                ClusterStatus::Starting => "finding the primary".into(),
                ClusterStatus::Switching(s) => format!("switch in progress: {s}"),
                ClusterStatus::Unreachable(s) => format!("primary unreachable: {s}"),
                ClusterStatus::NoPrimary(s) => format!("no primary: {s}"),
                ClusterStatus::Ok => "no primary".into(),
            });
        };
        if self.in_maintenance(primary) {
            return Decision::Hold(format!("primary {primary} is in maintenance"));
        }
        if self.follow_health && state_of(primary) == Some(HealthState::Down) {
            return Decision::Hold(format!("primary {primary} is down"));
        }
        match config.member(primary) {
            Some(m) => Decision::Target(
                primary.clone(),
                Box::new(worker_settings(&config, m, &self.pool_config)),
            ),
            None => Decision::Hold(format!("primary {primary} is not a configured member")),
        }
    }

    fn health_of(&self, member: &str) -> Option<HealthState> {
        self.health
            .iter()
            .find(|(n, _)| n == member)
            .map(|(_, h)| h.borrow().state)
    }

    pub fn in_maintenance(&self, member: &str) -> bool {
        self.maintenance
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(member)
    }

    /// Maintenance (like ProxySQL's OFFLINE_SOFT): the member takes no new requests;
    /// those in flight finish. On the primary, writes wait until it ends or a switchover
    /// moves the primary.
    pub fn set_maintenance(&self, member: &str, on: bool) -> Result<(), ClusterError> {
        if self.config.borrow().member(member).is_none() {
            return Err(ClusterError::NoSuchMember(self.name.clone(), member.into()));
        }
        let mut m = self.maintenance.lock().unwrap_or_else(|e| e.into_inner());
        if on {
            m.insert(member.to_owned());
        } else {
            m.remove(member);
        }
        drop(m);
        info!(member, on, "maintenance");
        self.changed.notify_one();
        Ok(())
    }

    /// Planned switchover to `to` (absent: the provider elects one).
    pub async fn switchover(&self, to: Option<String>) -> Result<SwitchEvent, ClusterError> {
        let (reply, rx) = oneshot::channel();
        self.provider
            .commands
            .send(Command::Switchover { to, reply })
            .await
            .map_err(|_| ClusterError::ProviderGone)?;
        rx.await
            .map_err(|_| ClusterError::ProviderGone)?
            .map_err(ClusterError::Refused)
    }

    pub fn report(&self) -> ClusterReport {
        let mut view = self.provider.view.borrow().clone();
        for m in &mut view.members {
            m.maintenance = self.in_maintenance(&m.name);
        }
        let (write_pool, _) = self.pool.view();
        ClusterReport {
            read_pools: self.reads.as_ref().map(|r| r.report()).unwrap_or_default(),
            view,
            health: self
                .health
                .iter()
                .map(|(member, h)| MemberHealthReport {
                    member: member.clone(),
                    health: h.borrow().clone(),
                })
                .collect(),
            write_pool,
        }
    }
}

/// Resolves when any of `health` changes (never, for none).
async fn any_changed(health: &mut [watch::Receiver<MemberHealth>]) {
    if health.is_empty() {
        return std::future::pending().await;
    }
    let (changed, _, _) = futures::future::select_all(health.iter_mut().map(|h| Box::pin(h.changed()))).await;
    if changed.is_err() {
        // A monitor ended (only at shutdown): its watch would resolve at once forever.
        std::future::pending::<()>().await;
    }
}

enum Decision {
    Target(String, Box<WorkerSettings>),
    Hold(String),
    Unavailable(String),
}

/// The follower logs decisions: the settings hold the member's password, so a target
/// shows as its member and address only.
impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decision::Target(member, s) => f
                .debug_tuple("Target")
                .field(member)
                .field(&format_args!("{}:{}", s.backend.host, s.backend.port))
                .finish(),
            Decision::Hold(why) => f.debug_tuple("Hold").field(why).finish(),
            Decision::Unavailable(why) => f.debug_tuple("Unavailable").field(why).finish(),
        }
    }
}

/// The provider of a cluster whose one member is the primary by configuration
/// (`[backend]`): nothing to discover and no one to promote. It publishes the member
/// as primary and refuses switchovers.
pub fn spawn_static(config: &ClusterConfig, events: Arc<EventLog>, shutdown: CancellationToken) -> ProviderHandle {
    let _ = events;
    let member = config.members[0].clone();
    let view = ClusterView {
        name: config.name.clone(),
        topology: "single",
        primary: Some(member.name.clone()),
        status: ClusterStatus::Ok,
        members: vec![crate::cluster::view::MemberView {
            name: member.name.clone(),
            addr: format!("{}:{}", member.host, member.port),
            role: crate::cluster::view::Role::Primary,
            ..Default::default()
        }],
        semi_sync: None,
        lock_held: true,
        lock_detail: Some("single member: no failover".into()),
        epoch: 1,
    };
    let (view_tx, view_rx) = watch::channel(view);
    let (commands, mut rx) = mpsc::channel::<Command>(8);
    tokio::spawn(async move {
        // Keeps the view alive, and answers commands, until shutdown.
        let _view_tx = view_tx;
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(Command::Switchover { reply, .. }) => {
                        let _ = reply.send(Err("a single [backend] has no replica to switch to".into()));
                    }
                    None => return,
                },
                _ = shutdown.cancelled() => return,
            }
        }
    });
    ProviderHandle {
        view: view_rx,
        commands,
    }
}

/// Feeds `rt`'s read side from its delay probe: on every published view, and every
/// period besides, so that a measurement that stops being fresh takes its replica out
/// even when the probe publishes nothing new.
pub async fn follow_delay(rt: Arc<ClusterRuntime>, mut view: watch::Receiver<DelayView>, shutdown: CancellationToken) {
    let period = Duration::from_millis(view.borrow().period_ms.max(100));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        let gate = ReadGate::from_delay(&view.borrow_and_update());
        let key = format!("{:?}", (&gate.delay, &gate.applied));
        if last.as_ref() != Some(&key) {
            rt.set_read_gate(gate);
            last = Some(key);
        }
        tokio::select! {
            r = view.changed() => if r.is_err() { break },
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
    }
    // The probe is gone (it cannot be, short of a bug): no verdict stays "ok" forever.
    let mut gate = ReadGate::default();
    for r in &view.borrow().replicas {
        gate.delay
            .insert(r.name.clone(), Err("the delay probe stopped".to_owned()));
    }
    rt.set_read_gate(gate);
}

#[cfg(test)]
mod tests {
    use super::*;
    use osprey_protocol::Backend;

    /// The follower logs every new decision at info level: never the database password.
    #[test]
    fn a_logged_decision_shows_no_password() {
        let settings = WorkerSettings {
            backend: Backend {
                name: "db1".into(),
                host: "10.0.0.1".into(),
                port: 3306,
                user: "app".into(),
                password: "s3cret-pw".into(),
                database: None,
            },
            max_requests: 0,
            max_age_ms: 0,
            batch_rows: 1,
            batch_bytes: 1,
            connect_timeout_ms: 1,
            session_reset: Default::default(),
            backend_tls: None,
        };
        let text = format!("{:?}", Decision::Target("db1".into(), Box::new(settings)));
        assert!(!text.contains("s3cret-pw"), "{text}");
        assert!(text.contains("db1") && text.contains("10.0.0.1:3306"), "{text}");
    }
}

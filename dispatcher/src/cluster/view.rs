//! The values the cluster's parts hand each other, and the admin API shows:
//! a member's health (from its monitor), the cluster's view of who is primary (from
//! the topology provider), the switch log, and the commands ops send.
//!
//! Ownership: a member's [`MemberHealth`] is written only by its monitor task (a
//! `watch` channel); a cluster's [`ClusterView`] only by its topology provider task
//! (`replication`, `galera` or `group_replication`); everybody else reads them.

use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::oneshot;

/// The accumulator's verdict on a member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// No round finished yet.
    #[default]
    Unknown,
    /// No failure within the window.
    Up,
    /// Some failures within the window, fewer than `fail_threshold`.
    Suspect,
    /// `fail_threshold` failures within the window; stays down until
    /// `recover_successes` consecutive successful rounds.
    Down,
}

impl HealthState {
    /// Up or suspect: the member serves.
    pub fn is_up(self) -> bool {
        matches!(self, HealthState::Up | HealthState::Suspect)
    }
}

/// The last result of one probe factor (`connect`, `ping`, `business`, `passive`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FactorResult {
    pub factor: &'static str,
    pub ok: bool,
    /// How long it took (its timeout when it timed out).
    pub latency_ms: f64,
    /// Why it failed.
    pub error: Option<String>,
    #[serde(with = "unix_ms")]
    pub at: SystemTime,
}

/// One member's health, as its monitor last published it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemberHealth {
    pub state: HealthState,
    /// Failed rounds (and passive failures) within the window now.
    pub failures_in_window: u32,
    /// Successful rounds in a row.
    pub consecutive_successes: u32,
    pub fail_threshold: u32,
    pub window_ms: u64,
    /// The last result of each factor.
    pub factors: Vec<FactorResult>,
    pub rounds: u64,
    pub failed_rounds: u64,
    /// When `state` last changed.
    #[serde(with = "unix_ms_opt")]
    pub since: Option<SystemTime>,
}

/// A member's role as the topology provider sees it from the servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Not yet seen, or unreachable since start.
    #[default]
    Unknown,
    /// The writer: write slots target it.
    Primary,
    /// Replicates from the primary (or, galera/group: a member that is not the writer).
    Replica,
    /// Was primary, was replaced: read-only, outside every slot group until rejoined.
    Fenced,
    /// Reachable but neither: e.g. a replica of nobody, a diverged history, a galera
    /// node not Synced, a group member not ONLINE. `MemberView::reason` says why.
    Detached,
}

impl Role {
    /// As shown in the admin API and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Role::Unknown => "unknown",
            Role::Primary => "primary",
            Role::Replica => "replica",
            Role::Fenced => "fenced",
            Role::Detached => "detached",
        }
    }
}

/// Semi-synchronous replication on the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SemiSync {
    /// Not enabled on the primary.
    Off,
    /// Enabled and on: an acknowledged commit is on a replica.
    On,
    /// Enabled but fallen back to asynchronous (no replica acked in time): a failover
    /// now may lose acknowledged commits.
    FellBack,
}

/// What the provider knows of one member.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemberView {
    pub name: String,
    pub addr: String,
    pub role: Role,
    /// Why the member is `detached`/`fenced`, or why it is not electable.
    pub reason: Option<String>,
    pub read_only: Option<bool>,
    /// Replication: received (`Gtid_IO_Pos`), applied (`gtid_slave_pos`) and own binary
    /// log (`gtid_binlog_pos`) positions; which member it replicates from.
    pub gtid_received: Option<String>,
    pub gtid_applied: Option<String>,
    pub gtid_binlog: Option<String>,
    pub replicates_from: Option<String>,
    pub io_running: Option<bool>,
    pub sql_running: Option<bool>,
    /// Galera: `wsrep_local_state_comment`, `wsrep_local_index`; group: member state.
    pub state: Option<String>,
    pub local_index: Option<u32>,
    /// Ops put the member in maintenance: no new requests, in-flight ones finish.
    pub maintenance: bool,
    #[serde(with = "unix_ms_opt")]
    pub last_seen: Option<SystemTime>,
}

/// Why the cluster has no primary, or what the failover is doing.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status", content = "detail")]
pub enum ClusterStatus {
    #[default]
    Starting,
    /// A primary serves writes.
    Ok,
    /// A switch is in progress (writes wait).
    Switching(String),
    /// The primary is down to us but the replicas still receive from it: only our path
    /// to it is broken; no promotion.
    Unreachable(String),
    /// No primary and no failover possible now (no electable replica, cooldown, no lock,
    /// `auto = false`): the detail says which.
    NoPrimary(String),
}

/// The cluster as its provider last published it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClusterView {
    pub name: String,
    pub topology: &'static str,
    /// The member write slots target; `None` while there is none (requests wait, bounded
    /// by `queue_timeout_ms`, or fail at once when the cluster is `no_primary`).
    pub primary: Option<String>,
    pub status: ClusterStatus,
    pub members: Vec<MemberView>,
    pub semi_sync: Option<SemiSync>,
    /// Whether this dispatcher holds the failover lock (it alone may change the topology).
    pub lock_held: bool,
    pub lock_detail: Option<String>,
    /// Bumped on every change of `primary`.
    pub epoch: u64,
}

impl ClusterView {
    /// What a provider publishes before its first round: the configured members, no
    /// primary yet (writes wait), status `starting`.
    pub fn starting(cluster: &crate::cluster::ClusterConfig, topology: &'static str) -> ClusterView {
        ClusterView {
            name: cluster.name.clone(),
            topology,
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
        }
    }

    pub fn member(&self, name: &str) -> Option<&MemberView> {
        self.members.iter().find(|m| m.name == name)
    }
}

/// One step of a switch, with when it ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchStep {
    pub step: &'static str,
    /// Milliseconds since the switch began.
    pub at_ms: f64,
    pub ok: bool,
    pub detail: Option<String>,
}

/// A failover, switchover, or a primary change seen from the servers (another
/// dispatcher's switch, or the backend's own election).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchEvent {
    pub cluster: String,
    /// `failover`, `switchover`, `followed` (seen, not made), `repair` (finished a
    /// switch a crashed dispatcher left half done), `fence`, `rejoin`.
    pub kind: &'static str,
    pub old_primary: Option<String>,
    pub new_primary: Option<String>,
    #[serde(with = "unix_ms")]
    pub started: SystemTime,
    pub duration_ms: f64,
    pub ok: bool,
    pub steps: Vec<SwitchStep>,
    pub detail: Option<String>,
}

/// Commands ops send a cluster's provider (admin API / CLI).
#[derive(Debug)]
pub enum Command {
    /// Planned switchover to `to` (absent: the provider elects one).
    Switchover {
        to: Option<String>,
        reply: oneshot::Sender<Result<SwitchEvent, String>>,
    },
}

mod unix_ms {
    use std::time::{SystemTime, UNIX_EPOCH};
    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0))
    }
}

mod unix_ms_opt {
    use std::time::SystemTime;
    pub fn serialize<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::unix_ms::serialize(t, s),
            None => s.serialize_none(),
        }
    }
}

/// How the cluster's manager reaches a running topology provider.
#[derive(Debug, Clone)]
pub struct ProviderHandle {
    pub view: tokio::sync::watch::Receiver<ClusterView>,
    pub commands: tokio::sync::mpsc::Sender<Command>,
}

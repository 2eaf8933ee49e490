//! `GET /status`: the process, every slot group and slot, the clusters in one line each,
//! the client connections, the stream counters and the file-descriptor plan.

use serde::{Deserialize, Serialize};

use crate::slots::{PoolView, SlotView};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub draining: bool,
    /// The first cluster's write slots.
    pub pool: PoolView,
    /// Every slot of every group.
    pub slots: Vec<SlotView>,
    /// Every slot group: each cluster's write slots and each member's read slots (`role`).
    pub groups: Vec<PoolView>,
    pub clusters: Vec<ClusterSummary>,
    pub clients: Clients,
    pub streams: Streams,
    pub fds: Fds,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fds {
    /// The soft RLIMIT_NOFILE the dispatcher runs with.
    pub limit: usize,
    /// Descriptors kept out of the client cap for workers, respawns and the admin port.
    pub reserve: usize,
    pub max_client_connections: usize,
    /// Descriptors open now.
    pub open: Option<usize>,
    pub admin_connections: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Clients {
    /// SDK connections.
    pub connections: i64,
    pub open_streams: i64,
    /// MySQL protocol connections (logged in), and of those pinned to a session now.
    #[serde(default)]
    pub mysql_connections: i64,
    #[serde(default)]
    pub mysql_pinned: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Streams {
    pub opened: u64,
    pub closed: u64,
}

/// One line per cluster in `/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterSummary {
    pub name: String,
    pub topology: String,
    pub primary: Option<String>,
    pub status: ClusterStatus,
    pub epoch: u64,
}

/// Why the cluster has no primary, or what the failover is doing: the JSON of the
/// dispatcher's `cluster::ClusterStatus` (which its providers keep), spelled the same
/// (`{"status":"ok"}`, `{"status":"no_primary","detail":"…"}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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

//! A slot group and its slots, as `/status` shows them (`pool`, `groups`, `slots`), and as
//! `/cluster` shows a cluster's write and read slots.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Process spawned (or about to be); not registered and ready yet.
    Starting,
    Idle,
    Busy,
    /// QUIT_NOW sent; waiting for the process to exit.
    Quitting,
}

impl SlotState {
    /// As in `/status` and the `osprey_slots{state}` label.
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Starting => "starting",
            SlotState::Idle => "idle",
            SlotState::Busy => "busy",
            SlotState::Quitting => "quitting",
        }
    }
}

/// What a slot group serves: `write` (the primary's slots) or `read` (a replica's read
/// slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupRole {
    Write,
    Read,
}

impl GroupRole {
    /// As in `/status` and the `role` label of the metrics.
    pub fn name(self) -> &'static str {
        match self {
            GroupRole::Write => "write",
            GroupRole::Read => "read",
        }
    }
}

/// Public view of one slot, for the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotView {
    pub slot: u32,
    pub pid: Option<u32>,
    pub state: SlotState,
    pub requests: u64,
    pub age_s: f64,
    pub backend: String,
    pub cluster: String,
    pub db_connection_id: Option<u32>,
    pub retiring: bool,
    /// Requests written to the worker and not ended: the one it runs and those behind it
    /// (prefetch, `pool.pipeline_depth`).
    pub pipeline: usize,
}

/// Group-wide figures, for the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolView {
    /// `write` (the primary's slots) or `read` (a replica's read slots).
    pub role: GroupRole,
    pub cluster: String,
    /// The member the workers serve (`null` before the cluster names one).
    pub member: Option<String>,
    /// Why requests wait instead of being dispatched, if they do.
    pub hold: Option<String>,
    /// Why requests fail at once, if they do.
    pub unavailable: Option<String>,
    pub size: usize,
    pub slots: usize,
    pub idle: usize,
    pub busy: usize,
    pub starting: usize,
    pub quitting: usize,
    pub queue_depth: usize,
    pub queue_capacity: usize,
    /// Bytes of REQUEST payload waiting, and their bound.
    pub queue_bytes: usize,
    pub queue_bytes_capacity: usize,
    /// Client connections with at least one request waiting.
    pub waiting_connections: usize,
    /// Of those, connections whose requests wait because they hold their cap of
    /// workers (`pool.max_per_connection` / `pool.max_per_token`).
    pub capped_connections: usize,
    /// Requests waiting in the longest connection queue.
    pub longest_connection_queue: usize,
    /// How long the request waiting longest has waited so far, in ms (0: none waits).
    pub longest_wait_ms: u64,
    /// Workers one connection may hold at once (0 = no cap).
    pub max_per_connection: usize,
    pub respawns: u64,
    pub recycles: u64,
    pub fatal_exits: u64,
    /// Workers pinned to sessions now (protocol 1.5), and their cap (`sessions.max_per_group`).
    #[serde(default)]
    pub sessions: usize,
    #[serde(default)]
    pub max_sessions: usize,
    /// Of those, sessions with a transaction open, and the oldest such transaction's age.
    #[serde(default)]
    pub sessions_in_transaction: usize,
    #[serde(default)]
    pub longest_transaction_ms: u64,
}

/// One session in `GET /sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// The client connection and the id of the stream that opened the session on it
    /// (`POST /sessions/kill` takes both).
    pub conn: u64,
    pub session: u32,
    pub cluster: String,
    pub member: String,
    pub slot: u32,
    pub read_only: bool,
    pub age_ms: u64,
    pub in_transaction: bool,
    /// How long the open transaction has been open (0: none is).
    pub transaction_ms: u64,
    /// Who holds it (absent from a dispatcher that does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<SessionClient>,
}

/// The client connection that holds a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionClient {
    /// `sdk` or `mysql`.
    pub protocol: String,
    /// The MySQL user, or the SDK client's token index and name.
    pub user: String,
    /// Its address, `ip:port`.
    #[serde(default)]
    pub peer: Option<String>,
    /// MySQL connection attributes (`_client_name`, `program_name`, …) as name, value.
    #[serde(default)]
    pub attrs: Vec<(String, String)>,
    /// Why a MySQL client stays pinned beyond its transaction (a user variable, a
    /// temporary table, …), as `osprey_mysql_pinned_total` counts it.
    #[serde(default)]
    pub pinned_by: Option<String>,
    /// How long the connection has been open, ms.
    pub connected_ms: u64,
}

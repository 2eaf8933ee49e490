//! The `[pool]` section of the config file (docs/CONFIG.md): owned here, where the slot
//! groups, the supervisor and the relay read it; `crate::config` embeds it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Number of worker slots (fixed mode).
    pub size: usize,
    /// Read slots per replica of a cluster with `read_split` (docs/ROUTING.md). Absent:
    /// `size`. A member's read slots exist while it is a replica; the primary has none.
    pub replica_size: Option<usize>,
    /// Elastic mode: when both `min` and `max` are set, the pool starts at `min`
    /// (or `size` if larger), grows by one slot per second while requests wait in the
    /// queue, and retires one idle slot per `shrink_after_s` of continuous idleness.
    pub min: Option<usize>,
    pub max: Option<usize>,
    pub shrink_after_s: u64,
    /// A worker asks to retire after this many requests (0 = never).
    pub max_requests: u64,
    /// A worker asks to retire after this many seconds (0 = never).
    pub max_age_s: u64,
    /// Requests waiting for a worker; one more is rejected with QUEUE_FULL.
    pub queue_capacity: usize,
    /// Bytes of REQUEST payload waiting for a worker, all connections together; a
    /// request that would pass it is rejected with QUEUE_FULL.
    pub queue_bytes: usize,
    /// The same per client connection (QUEUE_FULL for that connection only).
    pub queue_bytes_per_connection: usize,
    /// Workers one client connection may hold at once; its further requests wait in
    /// its queue. Absent: three quarters of the pool size, rounded down (at least 1);
    /// 0 = no cap.
    pub max_per_connection: Option<usize>,
    /// Workers the connections of one client token may hold together; 0 = no cap.
    pub max_per_token: usize,
    /// A request waiting longer than this for a worker fails with QUEUE_TIMEOUT.
    pub queue_timeout_ms: u64,
    /// A spawned worker must register and open its database session within this time.
    pub register_timeout_ms: u64,
    /// Back-off before respawning a slot whose worker crashed quickly; doubles up to the max.
    pub respawn_backoff_min_ms: u64,
    pub respawn_backoff_max_ms: u64,
    /// Path of the `osprey-worker` binary. Default: next to the dispatcher's binary.
    pub worker_binary: Option<PathBuf>,
    /// Rows per ROWS frame, and bytes per ROWS frame, whichever is reached first.
    pub batch_rows: u32,
    pub batch_bytes: u32,
    /// Worker log filter (RUST_LOG syntax) passed to worker processes.
    pub worker_log: String,
    /// Requests a worker link may have written to its worker at once (prefetch,
    /// docs/OPERATIONS.md "Pipelining"): while requests wait, the next ones go to a busy
    /// worker's socket, so that it finds them there when it finishes. 1 = one at a time.
    pub pipeline_depth: usize,
    /// Nothing is added behind a request that has run this long, and requests written
    /// behind it are taken back (re-queued, never run) once it has: one slow statement
    /// cannot hold fast ones for longer than this.
    pub pipeline_hold_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 4,
            replica_size: None,
            min: None,
            max: None,
            shrink_after_s: 60,
            max_requests: 10_000,
            max_age_s: 3600,
            queue_capacity: 4096,
            queue_bytes: 64 * 1024 * 1024,
            queue_bytes_per_connection: 16 * 1024 * 1024,
            max_per_connection: None,
            max_per_token: 0,
            queue_timeout_ms: 5_000,
            register_timeout_ms: 10_000,
            respawn_backoff_min_ms: 100,
            respawn_backoff_max_ms: 10_000,
            worker_binary: None,
            batch_rows: 512,
            batch_bytes: 256 * 1024,
            worker_log: "warn".into(),
            pipeline_depth: 8,
            pipeline_hold_ms: 5,
        }
    }
}

//! What the worker side of the dispatcher (the supervisor, the worker links and their
//! relays) takes from the process: the slot groups, the settings it runs by, the
//! counters it adds to and the shutdown signals. The process state above it (`Ctx`:
//! clients, tokens, clusters) builds one and hands it down; nothing here reaches up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::pool::{PoolConfig, SlotGroup, GROUP_SLOTS};
use crate::request::session::SessionsConfig;

/// The bounds a worker link runs by (from `timeouts.*` and `limits.*`).
#[derive(Debug, Clone, Copy)]
pub struct LinkBounds {
    /// PING to a worker this often.
    pub keepalive_interval: Duration,
    /// A worker silent this long, or not reading a write this long, is given up.
    pub keepalive_timeout: Duration,
    /// A request's own bound (a REQUEST may ask for less).
    pub request_timeout: Duration,
    /// A client that returns no flow-control credit this long loses its stream.
    pub client_write_timeout: Duration,
    /// A cancelled statement is answered after this long; the worker drains it.
    pub cancel_grace: Duration,
    /// The largest frame payload either side may send.
    pub max_payload: usize,
}

pub struct WorkerEnv {
    /// Every slot group, group `g` owning slot ids `g * GROUP_SLOTS ..`.
    pub groups: Vec<Arc<SlotGroup>>,
    pub pool: PoolConfig,
    pub bounds: LinkBounds,
    /// `[sessions]`: a pinned worker's idle and duration bounds.
    pub sessions: SessionsConfig,
    /// Per-boot secret a worker must present; handed to workers on stdin.
    pub secret: String,
    pub metrics: Arc<Metrics>,
    /// Whether a statement ran slow lately (a relay does not pipeline behind one).
    pub policy: Arc<Policy>,
    /// SIGTERM: no respawn; in-flight requests finish.
    pub draining: CancellationToken,
    /// The drain deadline passed (or a second signal): fail what is left.
    pub abort: CancellationToken,
    /// Connection ids: workers and clients draw from one counter, so an id names one
    /// connection in the logs whichever side it is.
    conn_ids: AtomicU64,
}

impl WorkerEnv {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        groups: Vec<Arc<SlotGroup>>,
        pool: PoolConfig,
        bounds: LinkBounds,
        sessions: SessionsConfig,
        secret: String,
        metrics: Arc<Metrics>,
        policy: Arc<Policy>,
        draining: CancellationToken,
        abort: CancellationToken,
    ) -> WorkerEnv {
        WorkerEnv {
            groups,
            pool,
            bounds,
            sessions,
            secret,
            metrics,
            policy,
            draining,
            abort,
            conn_ids: AtomicU64::new(1),
        }
    }

    /// The group slot id `index` belongs to.
    pub fn group_of_slot(&self, index: u32) -> Option<&Arc<SlotGroup>> {
        self.groups.get((index / GROUP_SLOTS) as usize)
    }

    pub fn next_conn_id(&self) -> u64 {
        self.conn_ids.fetch_add(1, Ordering::Relaxed)
    }
}

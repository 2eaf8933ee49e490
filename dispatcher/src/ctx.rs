//! Process-wide state shared by the listeners, connections and the supervisor.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::cluster::events::EventLog;
use crate::cluster::ClusterRuntime;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::pool::env::{LinkBounds, WorkerEnv};
use crate::pool::SlotGroup;
use crate::secrets::constant_time_eq;

pub struct Ctx {
    /// Who is connected (the operators' views).
    pub clients: Arc<crate::request::clients::Directory>,
    pub config: Config,
    /// The first cluster's write slots (the default of a REQUEST without `cluster`).
    pub pool: Arc<SlotGroup>,
    /// Every slot group, group `g` owning slot ids `g * GROUP_SLOTS ..`.
    pub groups: Vec<Arc<SlotGroup>>,
    /// The clusters, in configuration order (cluster `i` owns group `i`).
    pub clusters: Vec<Arc<ClusterRuntime>>,
    /// Switches of every cluster (`GET /cluster/events`).
    pub events: Arc<EventLog>,
    pub metrics: Arc<Metrics>,
    /// Slow-SQL interception, the slow log and the per-member throttle (one for all
    /// clusters; throttle buckets are keyed `cluster/member`).
    pub policy: Arc<Policy>,
    pub client_tokens: Vec<String>,
    pub admin_token: String,
    /// SIGTERM: stop accepting, GOAWAY every client, let in-flight requests finish.
    pub draining: CancellationToken,
    /// The drain deadline passed (or a second signal): fail what is left.
    pub abort: CancellationToken,
    pub started: Instant,
    /// Client connections reading their HELLO at once (`limits.max_pending_handshakes`):
    /// with the small frame limit before HELLO, a global bound on what unauthenticated
    /// connections can make us buffer.
    pub handshakes: Arc<Semaphore>,
    /// Bytes of REQUEST payload all open client streams may hold (`limits.max_request_bytes`).
    pub request_bytes: Arc<Semaphore>,
    /// What the supervisor, the worker links and their relays see of all this.
    pub workers: Arc<WorkerEnv>,
}

impl Ctx {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: Config,
        groups: Vec<Arc<SlotGroup>>,
        clusters: Vec<Arc<ClusterRuntime>>,
        events: Arc<EventLog>,
        metrics: Arc<Metrics>,
        policy: Arc<Policy>,
        client_tokens: Vec<String>,
        admin_token: String,
        secret: String,
    ) -> Ctx {
        let handshakes = Arc::new(Semaphore::new(config.limits.max_pending_handshakes));
        let request_bytes = Arc::new(Semaphore::new(
            config.limits.max_request_bytes.clamp(1, u32::MAX as usize),
        ));
        let draining = CancellationToken::new();
        let abort = CancellationToken::new();
        let bounds = LinkBounds {
            keepalive_interval: Duration::from_millis(config.timeouts.keepalive_interval_ms),
            keepalive_timeout: Duration::from_millis(config.timeouts.keepalive_timeout_ms),
            request_timeout: Duration::from_millis(config.timeouts.request_timeout_ms),
            client_write_timeout: Duration::from_millis(config.limits.client_write_timeout_ms),
            cancel_grace: Duration::from_millis(config.timeouts.cancel_grace_ms),
            max_payload: config.limits.max_payload,
        };
        let workers = Arc::new(WorkerEnv::new(
            groups.clone(),
            config.pool.clone(),
            bounds,
            config.sessions.clone(),
            secret,
            metrics.clone(),
            policy.clone(),
            draining.clone(),
            abort.clone(),
        ));
        Ctx {
            clients: Arc::default(),
            workers,
            handshakes,
            request_bytes,
            config,
            pool: groups.first().expect("at least one slot group").clone(),
            groups,
            clusters,
            events,
            metrics,
            policy,
            client_tokens,
            admin_token,
            draining,
            abort,
            started: Instant::now(),
        }
    }

    /// The write slots of `cluster` (absent: the first cluster's).
    pub fn cluster(&self, name: Option<&str>) -> Option<&Arc<ClusterRuntime>> {
        match name {
            None => self.clusters.first(),
            Some(name) => self.clusters.iter().find(|c| c.name == name),
        }
    }

    pub fn group_for(&self, cluster: Option<&str>) -> Option<&Arc<SlotGroup>> {
        match cluster {
            None => self.groups.first(),
            Some(name) => self.groups.iter().find(|g| g.cluster() == name),
        }
    }

    /// The group slot id `index` belongs to.
    pub fn group_of_slot(&self, index: u32) -> Option<&Arc<SlotGroup>> {
        self.workers.group_of_slot(index)
    }

    /// The throttle bucket of `member` of `cluster`: two clusters never share one.
    pub fn throttle_key(cluster: &str, member: &str) -> String {
        format!("{cluster}/{member}")
    }

    pub fn next_conn_id(&self) -> u64 {
        self.workers.next_conn_id()
    }

    pub fn queue_timeout(&self) -> Duration {
        Duration::from_millis(self.config.pool.queue_timeout_ms)
    }

    pub fn keepalive_interval(&self) -> Duration {
        self.workers.bounds.keepalive_interval
    }

    pub fn keepalive_timeout(&self) -> Duration {
        self.workers.bounds.keepalive_timeout
    }

    pub fn client_write_timeout(&self) -> Duration {
        self.workers.bounds.client_write_timeout
    }

    pub fn client_token_ok(&self, token: Option<&str>) -> bool {
        self.client_token_index(token).is_some()
    }

    /// The index of `token` in `auth.client_tokens`: the tenant its connections'
    /// requests count against (fairness and `pool.max_per_token`).
    pub fn client_token_index(&self, token: Option<&str>) -> Option<u32> {
        let token = token?;
        // Check every token, without an early exit, so timing does not tell which matched.
        self.client_tokens.iter().enumerate().fold(None, |found, (i, t)| {
            let hit = constant_time_eq(t.as_bytes(), token.as_bytes());
            found.or(hit.then_some(i as u32))
        })
    }
}

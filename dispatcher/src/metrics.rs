//! Prometheus metrics (`prometheus-client`: typed, OpenMetrics text output).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Names of the series in [`Metrics::traffic`]'s own registry.
const TRAFFIC_REQUESTS: &str = "requests";
const TRAFFIC_LATENCY: &str = "latency";
const TRAFFIC_GROUP_REQUESTS: &str = "group_requests";
const TRAFFIC_GROUP_LATENCY: &str = "group_latency";

/// [`Metrics::traffic`]: requests by outcome and the latency histogram, cumulative; the
/// same per slot group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrafficCounts {
    /// `(outcome, requests)`.
    pub outcomes: Vec<(String, u64)>,
    /// `(upper bound in seconds, requests at or under it)`, ascending, `+Inf` last.
    pub latency: Vec<(f64, u64)>,
    /// Per slot group (cluster, role, member): its outcomes and latency, as above.
    pub groups: std::collections::BTreeMap<(String, String, String), TrafficCounts>,
}

impl TrafficCounts {
    /// Reads the text exposition of the traffic registry (nothing else is in it).
    fn parse(text: &str) -> TrafficCounts {
        let mut out = TrafficCounts::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let label = |name: &str| {
                let start = series.find(&format!("{name}=\""))? + name.len() + 2;
                let len = series[start..].find('"')?;
                Some(series[start..start + len].to_owned())
            };
            let group = || Some((label("cluster")?, label("role")?, label("member")?));
            if series.starts_with(&format!("{TRAFFIC_GROUP_REQUESTS}_total{{")) {
                if let (Some(g), Some(outcome)) = (group(), label("outcome")) {
                    out.groups.entry(g).or_default().outcomes.push((outcome, value as u64));
                }
            } else if series.starts_with(&format!("{TRAFFIC_GROUP_LATENCY}_bucket{{")) {
                if let (Some(g), Some(le)) = (group(), label("le").and_then(|le| le.parse::<f64>().ok())) {
                    out.groups.entry(g).or_default().latency.push((le, value as u64));
                }
            } else if series.starts_with(&format!("{TRAFFIC_REQUESTS}_total{{")) {
                if let Some(outcome) = label("outcome") {
                    out.outcomes.push((outcome, value as u64));
                }
            } else if series.starts_with(&format!("{TRAFFIC_LATENCY}_bucket{{")) {
                if let Some(le) = label("le").and_then(|le| le.parse::<f64>().ok()) {
                    out.latency.push((le, value as u64));
                }
            }
        }
        out.outcomes.sort();
        out.latency.sort_by(|a, b| a.0.total_cmp(&b.0));
        for g in out.groups.values_mut() {
            g.outcomes.sort();
            g.latency.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        out
    }
}

/// A slot group's requests by outcome (`osprey_group_requests_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupOutcomeLabel {
    pub cluster: String,
    pub role: &'static str,
    pub member: String,
    pub outcome: &'static str,
}

/// The outcomes the per-group series count, and the ones nearly every request that
/// reached a worker ends with (`osprey_requests_total{outcome}`: looked up once).
const RELAYED_OUTCOMES: [&str; 4] = ["ok", "error", "cancelled", "slow_consumer"];

/// 50 µs .. ~52 s: the request latency buckets, overall and per group.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

/// One worker's share of its group's traffic series, looked up once (a worker serves one
/// member in one role all its life): what the relay counts at each request's end.
#[derive(Clone)]
pub struct GroupTraffic {
    outcomes: [(&'static str, Counter); 4],
    latency: Histogram,
}

impl GroupTraffic {
    pub fn of(metrics: &Metrics, cluster: &str, role: &'static str, member: &str) -> GroupTraffic {
        let counter = |outcome| {
            let label = GroupOutcomeLabel {
                cluster: cluster.to_owned(),
                role,
                member: member.to_owned(),
                outcome,
            };
            (outcome, metrics.group_requests.get_or_create(&label).clone())
        };
        let label = GroupLabel {
            cluster: cluster.to_owned(),
            role,
            member: member.to_owned(),
        };
        GroupTraffic {
            outcomes: RELAYED_OUTCOMES.map(counter),
            latency: metrics.group_latency.get_or_create(&label).clone(),
        }
    }

    /// A request ended with `outcome` (one of the four above) after `seconds`.
    pub fn ended(&self, outcome: &'static str, seconds: f64) {
        if let Some((_, c)) = self.outcomes.iter().find(|(o, _)| *o == outcome) {
            c.inc();
        }
        self.latency.observe(seconds);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// One cluster member.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabel {
    pub cluster: String,
    pub member: String,
}

/// One worker slot (indexes are unique across the slot groups).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotLabel {
    pub cluster: String,
    /// `write` or `read`, as the slot group's role in `/status`.
    pub role: &'static str,
    pub member: String,
    pub slot: u32,
}

/// One slot group: the write slots of a cluster or the read slots of one member.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub cluster: String,
    /// `write` or `read`, as the slot group's role in `/status`.
    pub role: &'static str,
    /// The member its workers serve (empty before the cluster names one).
    pub member: String,
}

/// One probe factor of one member (`connect`, `ping`, `business`, `passive`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FactorLabel {
    pub cluster: String,
    pub member: String,
    pub factor: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterKindLabel {
    pub cluster: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberRoleLabel {
    pub cluster: String,
    pub member: String,
    pub role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterStateLabel {
    pub cluster: String,
    pub state: String,
}

pub struct Metrics {
    pub registry: Registry,
    /// Held while `/metrics` sets the per-slot series and encodes.
    scrape: std::sync::Mutex<()>,
    /// `requests` and `latency` again (the same counters), alone: what the operations
    /// page's traffic chart reads ([`Metrics::traffic`]) without encoding everything.
    traffic: Registry,
    /// Galera: 1 for the node writes go to, 0 for the other members.
    pub galera_writer: Family<MemberLabel, Gauge>,
    /// Group Replication: 1 for the group's PRIMARY that writes go to, 0 for the others.
    pub group_primary: Family<MemberLabel, Gauge>,
    pub requests: Family<OutcomeLabel, Counter>,
    /// `requests`' series of [`RELAYED_OUTCOMES`], each looked up once: a lookup in
    /// `requests` hashes its label, and every request ends with one.
    relayed_outcomes: [(&'static str, std::sync::OnceLock<Counter>); 4],
    pub latency: Histogram,
    /// The same per slot group (cluster, role, member): where requests went.
    pub group_requests: Family<GroupOutcomeLabel, Counter>,
    pub group_latency: Family<GroupLabel, Histogram, fn() -> Histogram>,
    pub queue_wait: Histogram,
    pub queue_depth: Gauge,
    /// Per slot group, how long the request that has waited longest for a worker has
    /// waited so far. Set when `/metrics` is read ([`Metrics::encode_with_slots`]).
    pub queue_longest_wait: Family<GroupLabel, Gauge<f64, AtomicU64>>,
    pub slots: Family<StateLabel, Gauge>,
    pub respawns: Counter,
    pub recycles: Counter,
    pub fatal_exits: Counter,
    pub worker_kills: Counter,
    pub cancel_overruns: Counter,
    pub bytes_to_clients: Counter,
    pub bytes_from_clients: Counter,
    pub client_connections: Gauge,
    pub streams_opened: Counter,
    pub streams_closed: Counter,
    pub streams_open: Gauge,
    pub admin_connections: Gauge,
    pub admin_rejected: Counter,
    pub admin_evicted: Counter,
    pub client_rejected: Counter,
    pub accept_errors: Family<ListenerLabel, Counter>,
    /// Connections refused on a TLS client port before HELLO, by reason.
    pub tls_refused: Family<ReasonLabel, Counter>,
    /// 1 while the member is up or suspect, 0 while down or not yet probed.
    pub member_up: Family<MemberLabel, Gauge>,
    pub probe_failures: Family<FactorLabel, Counter>,
    pub probe_rounds: Family<MemberLabel, Counter>,
    /// Switches by cluster and kind (failover, switchover, followed, repair, fence, rejoin).
    pub failovers: Family<ClusterKindLabel, Counter>,
    /// Failover and switchover durations, first step to last.
    pub failover_duration: Histogram,
    /// 1 for each member's current role, 0 for the others.
    pub member_role: Family<MemberRoleLabel, Gauge>,
    /// 1 for the primary's semi-sync state (on, fell_back, off), 0 for the others.
    pub semi_sync: Family<ClusterStateLabel, Gauge>,
    /// The read/write split.
    pub reads: ReadMetrics,
    /// Replica-delay detection (`cluster::delay`).
    pub delay: DelayMetrics,
    /// Requests written to workers ahead of time (`pool.pipeline_depth`).
    pub pipeline: PipelineMetrics,
    pub sessions: SessionMetrics,
    pub mysql: MysqlMetrics,
}

/// Sessions (pinned workers, protocol 1.5).
pub struct SessionMetrics {
    /// Sessions that got a worker.
    pub opened: Counter,
    /// Sessions holding a worker now.
    pub open: Gauge,
    /// Sessions ended, by why (`closed` by the client; the rest aborted).
    ended: Family<ReasonLabel, Counter>,
}

impl SessionMetrics {
    pub fn ended(&self, reason: &'static str) {
        self.ended.get_or_create(&ReasonLabel { reason }).inc();
    }
}

fn register_session_metrics(registry: &mut Registry) -> SessionMetrics {
    let opened = Counter::default();
    registry.register("sessions_opened", "Sessions that got a pinned worker", opened.clone());
    let open = Gauge::default();
    registry.register("sessions_open", "Sessions holding a pinned worker now", open.clone());
    let ended = Family::<ReasonLabel, Counter>::default();
    registry.register(
        "sessions_ended",
        "Sessions ended, by reason (closed by the client, or why aborted)",
        ended.clone(),
    );
    SessionMetrics { opened, open, ended }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    pub command: &'static str,
}

/// The MySQL front end.
pub struct MysqlMetrics {
    /// MySQL client connections open now.
    pub connections: Gauge,
    commands: Family<CommandLabel, Counter>,
    /// Clients pinned beyond their transaction, by why (user variable, temporary table, …).
    pinned: Family<ReasonLabel, Counter>,
    /// Logins refused (wrong password, unknown user).
    pub auth_failures: Counter,
    /// Sessions the front end opened (transactions, pinned state).
    pub sessions_opened: Counter,
}

impl MysqlMetrics {
    pub fn command(&self, code: u8) {
        let command = match code {
            0x01 => "quit",
            0x02 => "init_db",
            0x03 => "query",
            0x04 => "field_list",
            0x09 => "statistics",
            0x0E => "ping",
            0x11 => "change_user",
            0x16 => "stmt_prepare",
            0x17 => "stmt_execute",
            0x18 => "stmt_send_long_data",
            0x19 => "stmt_close",
            0x1A => "stmt_reset",
            0x1B => "set_option",
            0x1F => "reset_connection",
            _ => "other",
        };
        self.commands.get_or_create(&CommandLabel { command }).inc();
    }

    pub fn pinned(&self, reason: &'static str) {
        self.pinned.get_or_create(&ReasonLabel { reason }).inc();
    }
}

fn register_mysql_metrics(registry: &mut Registry) -> MysqlMetrics {
    let connections = Gauge::default();
    registry.register(
        "mysql_connections",
        "MySQL client connections open now",
        connections.clone(),
    );
    let commands = Family::<CommandLabel, Counter>::default();
    registry.register(
        "mysql_commands",
        "MySQL commands received, by command",
        commands.clone(),
    );
    let pinned = Family::<ReasonLabel, Counter>::default();
    registry.register(
        "mysql_pinned",
        "MySQL clients pinned to one database session beyond a transaction, by why",
        pinned.clone(),
    );
    let auth_failures = Counter::default();
    registry.register("mysql_auth_failures", "MySQL logins refused", auth_failures.clone());
    let sessions_opened = Counter::default();
    registry.register(
        "mysql_sessions_opened",
        "Sessions the MySQL front end opened (transactions, pinned state)",
        sessions_opened.clone(),
    );
    MysqlMetrics {
        connections,
        commands,
        pinned,
        auth_failures,
        sessions_opened,
    }
}

/// Prefetch: how deep the workers' pipelines run, and what was taken back.
pub struct PipelineMetrics {
    /// Requests written to a worker behind the one it runs, now (all slots).
    pub ahead: Gauge,
    /// For each request written to a worker: how many it then had (itself included).
    pub depth: Histogram,
    /// Requests written to a busy worker (behind another).
    pub prefetched: Counter,
    /// Of those, requests taken back before they ran and queued again.
    pub reclaimed: Counter,
    /// Requests a pipelining worker sent to its database behind an unanswered one (STARTED).
    pub started: Counter,
    /// Requests written to each slot's worker and not ended, the one it runs included. Set
    /// from the slot groups when `/metrics` is read ([`Metrics::encode_with_slots`]).
    pub slot_depth: Family<SlotLabel, Gauge>,
}

fn register_pipeline_metrics(registry: &mut Registry) -> PipelineMetrics {
    let ahead = Gauge::default();
    registry.register(
        "pipeline_ahead",
        "Requests written to workers behind the one each runs (prefetch)",
        ahead.clone(),
    );
    let depth = Histogram::new([1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]);
    registry.register(
        "pipeline_depth",
        "Requests a worker had written to it when one more was, itself included",
        depth.clone(),
    );
    let prefetched = Counter::default();
    registry.register(
        "pipeline_prefetched",
        "Requests written to a busy worker, behind the one it runs",
        prefetched.clone(),
    );
    let reclaimed = Counter::default();
    registry.register(
        "pipeline_reclaimed",
        "Prefetched requests taken back before they ran (slow statement ahead, retarget) and queued again",
        reclaimed.clone(),
    );
    let started = Counter::default();
    registry.register(
        "pipeline_started",
        "Requests a worker sent to its database behind an unanswered one (MySQL protocol pipelining, STARTED)",
        started.clone(),
    );
    let slot_depth = Family::<SlotLabel, Gauge>::default();
    registry.register(
        "pipeline_slot_depth",
        "Requests written to one slot's worker and not ended, the one it runs included (as `pipeline` in /status)",
        slot_depth.clone(),
    );
    PipelineMetrics {
        ahead,
        depth,
        prefetched,
        reclaimed,
        started,
        slot_depth,
    }
}

/// Why a read went to the primary instead of a replica.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabel {
    pub cluster: String,
    pub reason: &'static str,
}

/// The read/write split's counters.
pub struct ReadMetrics {
    /// Reads sent to a replica's read slots, by member.
    pub by_member: Family<MemberLabel, Counter>,
    /// Reads that went to the primary (or failed, `read_fallback = "error"`) for want of
    /// an eligible replica: `no_replica`, `causal` (no replica known to have the
    /// caller's writes), `replica_lost` (its replica stopped serving while it waited).
    pub fallbacks: Family<FallbackLabel, Counter>,
    /// 1 while the member's read slots serve reads, 0 while they do not.
    pub eligible: Family<MemberLabel, Gauge>,
    /// The classifier's decisions, by route and reason (`osprey_sql::classify::REASONS`).
    pub decisions: Family<RouteLabel, Counter>,
}

/// One classifier decision: `route` is `replica` or `primary`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub cluster: String,
    pub route: &'static str,
    pub why: &'static str,
}

fn register_read_metrics(registry: &mut Registry) -> ReadMetrics {
    let by_member = Family::<MemberLabel, Counter>::default();
    registry.register("reads", "Reads routed to a replica, by member", by_member.clone());
    let fallbacks = Family::<FallbackLabel, Counter>::default();
    registry.register(
        "read_fallbacks",
        "Reads sent to the primary (or refused) for want of an eligible replica, by reason",
        fallbacks.clone(),
    );
    let eligible = Family::<MemberLabel, Gauge>::default();
    registry.register(
        "read_eligible",
        "1 while the member's read slots serve reads (replica, up, not lagging, not in maintenance)",
        eligible.clone(),
    );
    let decisions = Family::<RouteLabel, Counter>::default();
    registry.register(
        "route_decisions",
        "Read/write split: the classifier's decisions by route (replica, primary) and reason",
        decisions.clone(),
    );
    ReadMetrics {
        by_member,
        fallbacks,
        eligible,
        decisions,
    }
}

/// The gauges and counters of the delay probe.
pub struct DelayMetrics {
    /// The replica's logical delay in ms; no series while it is unknown.
    pub delay_ms: Family<MemberLabel, Gauge>,
    /// 1 while the replica is out of the read pool by the delay probe's verdict (delay over
    /// the threshold, unknown, or its probe failing), 0 while eligible.
    pub ineligible: Family<MemberLabel, Gauge>,
    /// Failed probe calls by member and kind: `error`, `timeout` (replica reads and the
    /// primary's heartbeat writes alike).
    pub probe_errors: Family<DelayErrorLabel, Counter>,
}

/// One failed delay-probe call: `kind` is `error` or `timeout`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DelayErrorLabel {
    pub cluster: String,
    pub member: String,
    pub kind: &'static str,
}

fn register_delay_metrics(registry: &mut Registry) -> DelayMetrics {
    let m = DelayMetrics {
        delay_ms: Family::default(),
        ineligible: Family::default(),
        probe_errors: Family::default(),
    };
    registry.register(
        "replica_delay_ms",
        "Replica delay by the heartbeat's logical timestamp, in ms (absent while unknown)",
        m.delay_ms.clone(),
    );
    registry.register(
        "replica_delay_ineligible",
        "1 while the replica is out of the read pool by the delay probe (over threshold, unknown, failing)",
        m.ineligible.clone(),
    );
    registry.register(
        "delay_probe_errors",
        "Failed delay-probe calls (replica reads, primary heartbeat writes) by member and kind (error, timeout)",
        m.probe_errors.clone(),
    );
    m
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("osprey");
        let (galera_writer, group_primary) = register_writer_gauges(&mut registry);
        let reads = register_read_metrics(&mut registry);
        let requests = Family::<OutcomeLabel, Counter>::default();
        let latency = latency_histogram();
        let group_requests = Family::<GroupOutcomeLabel, Counter>::default();
        let group_latency = Family::<GroupLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let queue_wait = Histogram::new(exponential_buckets(0.000_01, 2.0, 21));
        let queue_depth = Gauge::default();
        let queue_longest_wait = Family::<GroupLabel, Gauge<f64, AtomicU64>>::default();
        let slots = Family::<StateLabel, Gauge>::default();
        let respawns = Counter::default();
        let recycles = Counter::default();
        let fatal_exits = Counter::default();
        let worker_kills = Counter::default();
        let cancel_overruns = Counter::default();
        let bytes_to_clients = Counter::default();
        let bytes_from_clients = Counter::default();
        let client_connections = Gauge::default();
        let streams_opened = Counter::default();
        let streams_closed = Counter::default();
        let streams_open = Gauge::default();
        let admin_connections = Gauge::default();
        let admin_rejected = Counter::default();
        let admin_evicted = Counter::default();
        let client_rejected = Counter::default();
        let accept_errors = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "requests",
            "Requests by outcome (ok, database_error, error code...)",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Request latency from REQUEST to END",
            latency.clone(),
        );
        registry.register(
            "group_requests",
            "Requests by the slot group that served them (cluster, role write/read, member) and outcome (ok, error, cancelled, slow_consumer)",
            group_requests.clone(),
        );
        registry.register(
            "group_request_duration_seconds",
            "Request latency from REQUEST to END, by the slot group that served it",
            group_latency.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time requests waited for an idle worker",
            queue_wait.clone(),
        );
        registry.register("queue_depth", "Requests waiting for a worker", queue_depth.clone());
        registry.register(
            "queue_longest_wait_seconds",
            "Per slot group, how long the request waiting longest for a worker has waited so far (a starved connection shows here before its QUEUE_TIMEOUT)",
            queue_longest_wait.clone(),
        );
        registry.register("slots", "Worker slots by state", slots.clone());
        registry.register(
            "worker_respawns",
            "Worker processes started to refill a slot",
            respawns.clone(),
        );
        registry.register(
            "worker_recycles",
            "Workers retired by max_requests/max_age",
            recycles.clone(),
        );
        registry.register(
            "worker_fatal_exits",
            "Workers that exited after a fatal database error",
            fatal_exits.clone(),
        );
        registry.register(
            "worker_kills",
            "Workers killed by the dispatcher (timeouts, lost links)",
            worker_kills.clone(),
        );
        registry.register(
            "cancel_overruns",
            "Cancelled statements still running at cancel_grace_ms (stream answered, worker kept until they ended)",
            cancel_overruns.clone(),
        );
        registry.register(
            "bytes_to_clients",
            "Payload bytes relayed to clients",
            bytes_to_clients.clone(),
        );
        registry.register(
            "bytes_from_clients",
            "Payload bytes received from clients",
            bytes_from_clients.clone(),
        );
        registry.register(
            "client_connections",
            "Open client connections",
            client_connections.clone(),
        );
        registry.register("streams_opened", "Client streams opened", streams_opened.clone());
        registry.register(
            "streams_closed",
            "Client streams closed with a terminal frame",
            streams_closed.clone(),
        );
        registry.register("streams_open", "Client streams open now", streams_open.clone());
        registry.register(
            "admin_connections",
            "Open admin HTTP connections",
            admin_connections.clone(),
        );
        registry.register(
            "admin_connections_rejected",
            "Admin connections closed at accept because no connection in the way (admin.max_connections, or \
             its address's admin.max_connections_per_address) could make room: each had presented the admin token, \
             or had sent bytes while the new one had not",
            admin_rejected.clone(),
        );
        registry.register(
            "admin_connections_evicted",
            "Admin connections that had not presented the admin token, closed to make room for a new one",
            admin_evicted.clone(),
        );
        registry.register(
            "client_connections_rejected",
            "Client connections closed at accept because max_client_connections were open",
            client_rejected.clone(),
        );
        registry.register(
            "accept_errors",
            "Failed accept() calls by listener (EMFILE and the like)",
            accept_errors.clone(),
        );
        let tls_refused = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "client_tls_refused",
            "Connections refused on the TLS client port (plaintext, handshake, timeout)",
            tls_refused.clone(),
        );
        let member_up = Family::<MemberLabel, Gauge>::default();
        registry.register(
            "member_up",
            "1 while the cluster member is up or suspect, 0 while down or not yet probed",
            member_up.clone(),
        );
        let probe_failures = Family::<FactorLabel, Counter>::default();
        registry.register(
            "probe_failures",
            "Failed health probes by member and factor (connect, ping, business, passive)",
            probe_failures.clone(),
        );
        let probe_rounds = Family::<MemberLabel, Counter>::default();
        registry.register("probe_rounds", "Health probe rounds by member", probe_rounds.clone());
        let failovers = Family::<ClusterKindLabel, Counter>::default();
        registry.register(
            "failovers",
            "Cluster switches by kind (failover, switchover, followed, repair, fence, rejoin)",
            failovers.clone(),
        );
        // 10 ms .. ~82 s.
        let failover_duration = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "failover_duration_seconds",
            "Duration of failovers and switchovers, first step to last",
            failover_duration.clone(),
        );
        let member_role = Family::<MemberRoleLabel, Gauge>::default();
        registry.register(
            "member_role",
            "1 for the member's current role (primary, replica, fenced, detached, unknown)",
            member_role.clone(),
        );
        let semi_sync = Family::<ClusterStateLabel, Gauge>::default();
        registry.register(
            "semi_sync",
            "1 for the primary's semi-sync state (on, fell_back, off)",
            semi_sync.clone(),
        );
        let delay = register_delay_metrics(&mut registry);
        let pipeline = register_pipeline_metrics(&mut registry);
        let sessions = register_session_metrics(&mut registry);
        let mysql = register_mysql_metrics(&mut registry);
        let mut traffic = Registry::default();
        traffic.register(TRAFFIC_REQUESTS, "", requests.clone());
        traffic.register(TRAFFIC_LATENCY, "", latency.clone());
        traffic.register(TRAFFIC_GROUP_REQUESTS, "", group_requests.clone());
        traffic.register(TRAFFIC_GROUP_LATENCY, "", group_latency.clone());
        Metrics {
            registry,
            scrape: std::sync::Mutex::new(()),
            traffic,
            pipeline,
            sessions,
            mysql,
            reads,
            delay,
            failovers,
            failover_duration,
            member_role,
            semi_sync,
            requests,
            relayed_outcomes: RELAYED_OUTCOMES.map(|o| (o, std::sync::OnceLock::new())),
            latency,
            group_requests,
            group_latency,
            queue_wait,
            queue_depth,
            queue_longest_wait,
            slots,
            respawns,
            recycles,
            fatal_exits,
            worker_kills,
            cancel_overruns,
            bytes_to_clients,
            bytes_from_clients,
            client_connections,
            streams_opened,
            streams_closed,
            streams_open,
            admin_connections,
            admin_rejected,
            admin_evicted,
            client_rejected,
            accept_errors,
            tls_refused,
            member_up,
            probe_failures,
            probe_rounds,
            galera_writer,
            group_primary,
        }
    }

    pub fn tls_refused(&self, reason: &'static str) {
        self.tls_refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The `osprey_slots{state}` gauge of one slot state (`SlotState::name`).
    pub fn slot_state(&self, state: &'static str) -> Gauge {
        self.slots.get_or_create(&StateLabel { state }).clone()
    }

    pub fn accept_error(&self, listener: &'static str) {
        self.accept_errors.get_or_create(&ListenerLabel { listener }).inc();
    }

    pub fn outcome(&self, outcome: &'static str) {
        let series = || self.requests.get_or_create(&OutcomeLabel { outcome }).clone();
        match self.relayed_outcomes.iter().find(|(o, _)| *o == outcome) {
            Some((_, c)) => c.get_or_init(series).inc(),
            None => series().inc(),
        };
    }

    /// The request counters by outcome and the latency histogram's buckets, as they are
    /// now (cumulative since start), for the operations page.
    pub fn traffic(&self) -> TrafficCounts {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.traffic);
        TrafficCounts::parse(&text)
    }

    /// OpenMetrics text exposition. The per-slot series are as the last
    /// [`Metrics::encode_with_slots`] (the `/metrics` handler) set them.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// [`Metrics::encode`] with the per-slot series set to `slots` first: `(label, depth)`
    /// of every slot now, so that a slot gone since the last read has no series left; and
    /// likewise the per-group series to `groups`: `(label, longest wait in seconds)`. The
    /// lock keeps two reads from mixing their slots.
    pub fn encode_with_slots(
        &self,
        slots: impl IntoIterator<Item = (SlotLabel, usize)>,
        groups: impl IntoIterator<Item = (GroupLabel, f64)>,
    ) -> String {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        let family = &self.pipeline.slot_depth;
        family.clear();
        for (label, depth) in slots {
            family.get_or_create(&label).set(depth as i64);
        }
        let family = &self.queue_longest_wait;
        family.clear();
        for (label, wait) in groups {
            family.get_or_create(&label).set(wait);
        }
        self.encode()
    }
}

/// The gauges of the providers that follow the backend's own writer (galera,
/// group_replication).
fn register_writer_gauges(registry: &mut Registry) -> (Family<MemberLabel, Gauge>, Family<MemberLabel, Gauge>) {
    let galera_writer = Family::<MemberLabel, Gauge>::default();
    registry.register(
        "galera_writer",
        "Galera: 1 for the Synced node that writes go to, 0 for the other members",
        galera_writer.clone(),
    );
    let group_primary = Family::<MemberLabel, Gauge>::default();
    registry.register(
        "group_primary",
        "Group Replication: 1 for the ONLINE PRIMARY that writes go to, 0 for the other members",
        group_primary.clone(),
    );
    (galera_writer, group_primary)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outcomes looked up once and the others count in the same series, and a series
    /// appears at its first request, as before the cache.
    #[test]
    fn outcomes_cached_or_not_count_in_one_series() {
        let m = Metrics::new();
        assert!(!m.encode().contains("outcome=\"ok\""));
        for _ in 0..3 {
            m.outcome("ok");
        }
        m.outcome("cancelled");
        m.outcome("QUEUE_FULL");
        m.outcome("QUEUE_FULL");
        let get = |outcome| m.requests.get_or_create(&OutcomeLabel { outcome }).get();
        assert_eq!((get("ok"), get("cancelled"), get("QUEUE_FULL")), (3, 1, 2));
        let text = m.encode();
        assert!(text.contains("osprey_requests_total{outcome=\"ok\"} 3"), "{text}");
        assert!(!text.contains("outcome=\"slow_consumer\""), "{text}");
    }

    fn slot(slot: u32, role: &'static str) -> SlotLabel {
        SlotLabel {
            cluster: "c".into(),
            role,
            member: "m1".into(),
            slot,
        }
    }

    /// The page's traffic reading sees what `/metrics` counts: outcomes and every bucket.
    #[test]
    fn traffic_reads_the_request_counters_and_latency_buckets() {
        let m = Metrics::new();
        assert_eq!(m.traffic().outcomes, Vec::<(String, u64)>::new());
        for _ in 0..3 {
            m.outcome("ok");
        }
        m.outcome("SQL_BLOCKED");
        m.latency.observe(0.000_01);
        m.latency.observe(0.003);
        m.latency.observe(1000.0);
        let t = m.traffic();
        assert_eq!(t.outcomes, [("SQL_BLOCKED".to_owned(), 1), ("ok".to_owned(), 3)]);
        assert_eq!(t.latency.len(), 22, "21 bounds and +Inf: {:?}", t.latency);
        assert_eq!(t.latency[0], (0.000_05, 1));
        assert_eq!(t.latency[20].1, 2, "under ~52 s: {:?}", t.latency);
        assert_eq!(t.latency[21], (f64::INFINITY, 3));
    }

    #[test]
    fn per_slot_depth_series_follow_the_slots_of_each_read() {
        let m = Metrics::new();
        let text = m.encode_with_slots([(slot(0, "write"), 3), (slot(1024, "read"), 0)], []);
        let series = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("osprey_pipeline_slot_depth{"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let mut got = series(&text);
        got.sort();
        assert_eq!(
            got,
            [
                r#"osprey_pipeline_slot_depth{cluster="c",role="read",member="m1",slot="1024"} 0"#,
                r#"osprey_pipeline_slot_depth{cluster="c",role="write",member="m1",slot="0"} 3"#,
            ]
        );
        // Slot 1024 is gone (a resize, a replica removed): so is its series.
        let text = m.encode_with_slots([(slot(0, "write"), 1)], []);
        assert_eq!(
            series(&text),
            [r#"osprey_pipeline_slot_depth{cluster="c",role="write",member="m1",slot="0"} 1"#]
        );
    }
}

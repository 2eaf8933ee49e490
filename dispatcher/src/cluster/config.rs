//! `[[cluster]]`: the clusters a dispatcher fronts, their members, health model and
//! failover settings (see `docs/CONFIG.md`). Parsed as part of the dispatcher's `Config` (`config.rs`).

use std::path::PathBuf;

use osprey_protocol::{Backend, BackendTls, SessionReset, SslMode, WorkerSettings};
use serde::{Deserialize, Serialize};

use crate::backend_conn::{Connector, Tls};
use crate::pool::PoolConfig;

/// Who decides which member is the primary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// MariaDB/MySQL GTID replication (semi-sync where configured): Osprey detects a
    /// dead primary and promotes a replica itself.
    #[default]
    Replication,
    /// MySQL Group Replication elects; Osprey follows the group's PRIMARY.
    GroupReplication,
    /// Galera: every Synced node can write; Osprey writes to one.
    Galera,
}

/// Where a read goes when no replica may serve it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadFallback {
    #[default]
    Primary,
    Error,
}

/// One `[[cluster]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub name: String,
    #[serde(default)]
    pub topology: Topology,
    /// The application account the workers log in with.
    pub user: String,
    #[serde(default)]
    pub password: String,
    #[serde(default)]
    pub database: Option<String>,
    /// The account of the monitor, the failover and the delay probe (needs `READ_ONLY
    /// ADMIN` — on MariaDB 10.11 `SUPER` no longer includes it, and without it
    /// `SET GLOBAL read_only` fails with 1227 —, `REPLICATION SLAVE ADMIN`,
    /// `CONNECTION ADMIN`, `PROCESS`). Absent: the application account, which should not
    /// have READ_ONLY ADMIN (it would write through a fence).
    #[serde(default)]
    pub monitor_user: Option<String>,
    #[serde(default)]
    pub monitor_password: Option<String>,
    /// The account replicas use to connect to a (new) primary when the failover
    /// re-points them (`CHANGE MASTER TO ... master_user`). Absent: kept as it is on
    /// each replica (MariaDB keeps the credentials across `CHANGE MASTER TO` that does
    /// not name them).
    #[serde(default)]
    pub replication_user: Option<String>,
    #[serde(default)]
    pub replication_password: Option<String>,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default)]
    pub session_reset: SessionReset,
    #[serde(default)]
    pub ssl_mode: SslMode,
    #[serde(default)]
    pub ssl_ca: Option<PathBuf>,
    #[serde(default)]
    pub ssl_server_name: Option<String>,
    /// Read/write split (docs/ROUTING.md): reads go to the replicas' read slots
    /// (`pool.replica_size` each), everything else to the primary.
    #[serde(default)]
    pub read_split: bool,
    /// A read with no eligible replica: `"primary"` runs it there, `"error"` fails it
    /// (`BACKEND_UNAVAILABLE`, not dispatched).
    #[serde(default)]
    pub read_fallback: ReadFallback,
    #[serde(default, rename = "member")]
    pub members: Vec<MemberConfig>,
    #[serde(default)]
    pub health: HealthConfig,
    #[serde(default)]
    pub failover: FailoverConfig,
    /// Replica-delay detection (`cluster::delay`): a heartbeat written on the primary every
    /// `delay_period_ms`, read back from each replica. All three, or none (off).
    #[serde(default)]
    pub delay_period_ms: Option<u64>,
    /// A replica whose delay is over this leaves the read pool.
    #[serde(default)]
    pub delay_threshold_ms: Option<u64>,
    /// The database that holds the heartbeat table (created on the primary if missing).
    #[serde(default)]
    pub delay_database: Option<String>,
}

/// The delay settings of a cluster that has them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelaySettings {
    pub period_ms: u64,
    pub threshold_ms: u64,
    pub database: String,
}

/// The shortest heartbeat period: every round costs a write on the primary, replicated.
pub const MIN_DELAY_PERIOD_MS: u64 = 100;

/// One `[[cluster.member]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub name: String,
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// Never elected primary by a failover (a switchover may still name it).
    #[serde(default)]
    pub no_promotion: bool,
    /// Galera: writes go to the Synced node with the lowest priority, then the lowest
    /// `wsrep_local_index`; the writer keeps them while it stays Synced, except that a node
    /// with a strictly lower priority takes them back after `health.recover_successes`
    /// Synced rounds (equal priorities never move writes back). Replication: breaks ties in
    /// the election (lower first).
    #[serde(default)]
    pub priority: u32,
    /// Where the other members' replication threads reach this member, when that is not
    /// `host:port` (e.g. Osprey reaches it through a proxy). Used by `CHANGE MASTER TO`.
    #[serde(default)]
    pub replication_host: Option<String>,
    #[serde(default)]
    pub replication_port: Option<u16>,
    /// Throttle: requests routed to this member per second (token bucket). Absent: not
    /// throttled. Live-changeable (admin API, `osprey throttle set`, SIGHUP).
    #[serde(default)]
    pub max_qps: Option<u32>,
    /// Tokens the bucket holds at most (the burst above `max_qps` an idle member allows).
    /// Absent: `max(1, max_qps / 10)`.
    #[serde(default)]
    pub burst: Option<u32>,
}

impl MemberConfig {
    /// A member at `host:port` with every other setting at its default (as a
    /// `[[cluster.member]]` giving only these three).
    pub fn new(name: impl Into<String>, host: impl Into<String>, port: u16) -> MemberConfig {
        MemberConfig {
            name: name.into(),
            host: host.into(),
            port,
            no_promotion: false,
            priority: 0,
            replication_host: None,
            replication_port: None,
            max_qps: None,
            burst: None,
        }
    }

    /// The address replicas are pointed at when this member is primary.
    pub fn replication_addr(&self) -> (String, u16) {
        (
            self.replication_host.clone().unwrap_or_else(|| self.host.clone()),
            self.replication_port.unwrap_or(self.port),
        )
    }
}

/// `[cluster.health]`: the monitor's probes and the accumulator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// One probe round per member this often.
    pub interval_ms: u64,
    /// Outcomes are kept this long; `fail_threshold` failures within it mark the member down.
    pub window_ms: u64,
    pub fail_threshold: u32,
    /// Consecutive successful rounds that bring a down member back.
    pub recover_successes: u32,
    /// Timeouts of the factors. Absent: 80 % of `interval_ms`.
    pub connect_timeout_ms: Option<u64>,
    pub ping_timeout_ms: Option<u64>,
    /// A business statement run every round (e.g. `SELECT 1 FROM app.health`). Absent: none.
    pub business_sql: Option<String>,
    pub business_timeout_ms: Option<u64>,
    /// Workers that fail to connect or lose their session count as failures (at most one
    /// per interval).
    pub passive: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval_ms: 500,
            window_ms: 3_000,
            fail_threshold: 3,
            recover_successes: 3,
            connect_timeout_ms: None,
            ping_timeout_ms: None,
            business_sql: None,
            business_timeout_ms: None,
            passive: true,
        }
    }
}

impl HealthConfig {
    fn factor_default(&self) -> u64 {
        (self.interval_ms * 4 / 5).max(1)
    }
    pub fn connect_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.connect_timeout_ms.unwrap_or_else(|| self.factor_default()))
    }
    pub fn ping_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ping_timeout_ms.unwrap_or_else(|| self.factor_default()))
    }
    pub fn business_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.business_timeout_ms.unwrap_or_else(|| self.factor_default()))
    }
}

/// How the failover lock is had (several dispatchers, one decision).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LockMode {
    /// `GET_LOCK` held on a majority of the cluster's members.
    #[default]
    Majority,
    /// No lock: only for a dispatcher known to be alone (tests, single dispatcher).
    None,
}

/// `[cluster.failover]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailoverConfig {
    /// Promote a replica when the primary is down (topology `replication`).
    pub auto: bool,
    /// No automatic failover within this long of the last switch.
    pub cooldown_s: u64,
    /// Before promoting, check whether the replicas still receive from the primary.
    pub verify: bool,
    /// The elected replica gets this long to apply what it received.
    pub catchup_timeout_ms: u64,
    /// A planned switchover waits this long for the target to catch up (writes wait meanwhile).
    pub switchover_timeout_ms: u64,
    /// A member that returns after being replaced is made a replica of the new primary
    /// when its GTID history allows.
    pub auto_rejoin: bool,
    /// Command run (with `sh -c`) after a switch; `OSPREY_CLUSTER`, `OSPREY_OLD_PRIMARY`,
    /// `OSPREY_NEW_PRIMARY` (member names) and `OSPREY_OLD_ADDR`/`OSPREY_NEW_ADDR` in its environment.
    pub on_switch: Option<String>,
    pub on_switch_timeout_ms: u64,
    pub lock: LockMode,
    /// `MASTER_HEARTBEAT_PERIOD` given to replicas when they are (re)pointed; `verify` needs
    /// heartbeats to tell a silent primary from a dead one.
    pub replication_heartbeat_ms: u64,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig {
            auto: true,
            cooldown_s: 60,
            verify: true,
            catchup_timeout_ms: 5_000,
            switchover_timeout_ms: 10_000,
            auto_rejoin: true,
            on_switch: None,
            on_switch_timeout_ms: 10_000,
            lock: LockMode::Majority,
            replication_heartbeat_ms: 500,
        }
    }
}

fn default_port() -> u16 {
    3306
}
fn default_connect_timeout() -> u64 {
    5_000
}

impl ClusterConfig {
    pub fn member(&self, name: &str) -> Option<&MemberConfig> {
        self.members.iter().find(|m| m.name == name)
    }

    pub fn monitor_credentials(&self) -> (String, String) {
        (
            self.monitor_user.clone().unwrap_or_else(|| self.user.clone()),
            self.monitor_password.clone().unwrap_or_else(|| self.password.clone()),
        )
    }

    /// The cluster's TLS settings, for the dispatcher's own connections to its members
    /// (the workers get the same in their `BackendTls`, see `manager::worker_settings`).
    pub fn tls(&self) -> Tls {
        Tls {
            mode: self.ssl_mode,
            ca: self.ssl_ca.clone(),
            server_name: self.ssl_server_name.clone(),
        }
    }

    /// How the monitor, the topology providers, the failover and the delay probe reach
    /// `member`: the monitor account, the cluster's TLS.
    pub fn monitor_connector(&self, member: &MemberConfig) -> Connector {
        let (user, password) = self.monitor_credentials();
        Connector::new(&member.host, member.port, &user, &password, &self.tls())
    }

    /// `Some` when delay detection is on (all three settings given).
    pub fn delay(&self) -> Option<DelaySettings> {
        Some(DelaySettings {
            period_ms: self.delay_period_ms?,
            threshold_ms: self.delay_threshold_ms?,
            database: self.delay_database.clone()?,
        })
    }

    fn validate_delay(&self) -> Result<(), String> {
        let n = &self.name;
        let given = [
            ("delay_period_ms", self.delay_period_ms.is_some()),
            ("delay_threshold_ms", self.delay_threshold_ms.is_some()),
            ("delay_database", self.delay_database.is_some()),
        ];
        let missing: Vec<&str> = given.iter().filter(|(_, g)| !g).map(|(k, _)| *k).collect();
        if missing.len() == given.len() {
            return Ok(());
        }
        if !missing.is_empty() {
            return Err(format!(
                "cluster {n}: delay detection needs delay_period_ms, delay_threshold_ms and delay_database; missing: {}",
                missing.join(", ")
            ));
        }
        let Some(d) = self.delay() else { return Ok(()) };
        if d.period_ms < MIN_DELAY_PERIOD_MS {
            return Err(format!(
                "cluster {n}: delay_period_ms must be at least {MIN_DELAY_PERIOD_MS} (got {})",
                d.period_ms
            ));
        }
        // Spliced into SQL as an identifier: only what needs no quoting.
        let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
        if d.database.is_empty() || d.database.len() > 64 || !d.database.chars().all(ok_char) {
            return Err(format!(
                "cluster {n}: delay_database {:?} must be 1 to 64 of [A-Za-z0-9_$]",
                d.database
            ));
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), String> {
        self.validate_delay()?;
        let n = &self.name;
        if n.is_empty() {
            return Err("cluster.name must not be empty".into());
        }
        if self.members.is_empty() {
            return Err(format!("cluster {n}: at least one [[cluster.member]]"));
        }
        for (i, m) in self.members.iter().enumerate() {
            if m.name.is_empty() || m.host.is_empty() {
                return Err(format!("cluster {n}: member {i} needs a name and a host"));
            }
            if self.members[..i].iter().any(|o| o.name == m.name) {
                return Err(format!("cluster {n}: two members named {}", m.name));
            }
        }
        let h = &self.health;
        if h.interval_ms < 10 || h.window_ms < h.interval_ms || h.fail_threshold == 0 || h.recover_successes == 0 {
            return Err(format!(
                "cluster {n}: health needs interval_ms >= 10, window_ms >= interval_ms, fail_threshold and recover_successes >= 1"
            ));
        }
        // fail_threshold rounds that cannot fall within the window could never mark a member down.
        if u64::from(h.fail_threshold - 1) * h.interval_ms >= h.window_ms {
            return Err(format!(
                "cluster {n}: {} probes every {} ms cannot fall within window_ms ({})",
                h.fail_threshold, h.interval_ms, h.window_ms
            ));
        }
        if self.replication_user.is_some() != self.replication_password.is_some() {
            return Err(format!(
                "cluster {n}: replication_user and replication_password go together"
            ));
        }
        Ok(())
    }
}

/// What a worker serving `member` is told at registration.
pub fn worker_settings(cluster: &ClusterConfig, member: &MemberConfig, pool: &PoolConfig) -> WorkerSettings {
    WorkerSettings {
        backend: Backend {
            name: member.name.clone(),
            host: member.host.clone(),
            port: member.port,
            user: cluster.user.clone(),
            password: cluster.password.clone(),
            database: cluster.database.clone(),
        },
        max_requests: pool.max_requests,
        max_age_ms: pool.max_age_s * 1000,
        batch_rows: pool.batch_rows,
        batch_bytes: pool.batch_bytes,
        connect_timeout_ms: cluster.connect_timeout_ms,
        session_reset: cluster.session_reset,
        backend_tls: match cluster.ssl_mode {
            SslMode::Disabled => None,
            mode => Some(BackendTls {
                mode,
                ca_file: cluster.ssl_ca.as_ref().map(|p| p.display().to_string()),
                server_name: cluster.ssl_server_name.clone(),
            }),
        },
    }
}

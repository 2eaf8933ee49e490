//! Dispatcher configuration: one TOML file, every key optional with a documented
//! default (see `docs/CONFIG.md`). Durations are integers in milliseconds
//! (`*_ms`) or seconds (`*_s`) so that the file needs no duration syntax.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use osprey_protocol::{SessionReset, SslMode};
use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterConfig, FailoverConfig, HealthConfig, MemberConfig, Topology};
use crate::policy::{BlockKinds, InterceptSettings, Limit, SlowLogSettings, ThrottleSettings};
pub use crate::pool::config::PoolConfig;
use crate::pool::wait_queue::QueueLimits;
use crate::request::session::SessionsConfig;
pub use osprey_protocol::MAX_PIPELINE_DEPTH;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {source}")]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: Listen,
    pub auth: Auth,
    pub pool: PoolConfig,
    pub limits: Limits,
    pub timeouts: Timeouts,
    pub admin: Admin,
    /// Slow-SQL interception and the slow log. Absent: [`InterceptConfig::embedded`] when
    /// the dispatcher runs its own sandbox, else the production defaults
    /// ([`InterceptConfig::default`]); see [`Config::intercept_config`].
    pub intercept: Option<InterceptConfig>,
    /// The per-member throttle's wait and queue (the rates are on `[[cluster.member]]`).
    pub throttle: ThrottleConfig,
    /// Sessions (pinned workers): their caps and timeouts.
    pub sessions: SessionsConfig,
    /// The MySQL protocol front end.
    pub mysql: MysqlConfig,
    /// A single database, without failover: shorthand for one cluster of one member.
    /// With neither `[backend]` nor `[[cluster]]`, the dispatcher starts a local MariaDB
    /// sandbox (a primary and two replicas) and fronts it as cluster `sandbox`.
    pub backend: Option<Backend>,
    /// The clusters, in order; a REQUEST without `cluster` goes to the first.
    #[serde(rename = "cluster")]
    pub clusters: Vec<ClusterConfig>,
}

/// `[mysql]`: the MySQL protocol front end, for every MySQL client, driver and tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MysqlConfig {
    /// Where it listens (SO_REUSEPORT, as the client listener). Absent: off, except with
    /// the embedded default, which listens on 127.0.0.1:6033 with a generated user.
    pub listen: Option<SocketAddr>,
    /// MySQL connections at most; past it a new one gets ERR 1040 and is closed.
    pub max_connections: usize,
    /// A connection idle this long between commands is closed (MySQL's `wait_timeout`).
    pub idle_timeout_ms: u64,
    /// A packet whose header came must be complete within this (MySQL's `net_read_timeout`).
    pub read_timeout_ms: u64,
    /// Failed logins from one address within a minute before its next attempts are
    /// refused at once (ERR 1129-like, with 1045), for a minute.
    pub max_auth_failures_per_minute: u32,
    /// TLS offered on the MySQL port (a client upgrades with SSLRequest). Absent: none.
    pub tls: Option<ListenTls>,
    /// Refuse logins that did not upgrade to TLS (ERROR 3159), as MySQL's option.
    pub require_secure_transport: bool,
    /// Who may log in.
    pub users: Vec<MysqlUser>,
    /// Bytes that every MySQL connection's prepared statements (texts and definitions)
    /// and long data waiting for an EXECUTE may hold together: a budget of their own, so
    /// that statements kept for later never take what requests need now.
    pub max_statement_bytes: usize,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        MysqlConfig {
            listen: None,
            max_connections: 4096,
            idle_timeout_ms: 28_800_000,
            read_timeout_ms: 30_000,
            max_auth_failures_per_minute: 20,
            tls: None,
            require_secure_transport: false,
            users: Vec::new(),
            max_statement_bytes: 256 << 20,
        }
    }
}

/// `[[mysql.users]]`: a MySQL login. Passwords are never in the file: `osprey
/// mysql-password` prints the hashes. Databases always see the workers' own credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlUser {
    pub name: String,
    /// `mysql_native_password`: `*` + 40 hex digits (`SHA1(SHA1(password))`, what MySQL shows).
    #[serde(default)]
    pub native_hash: Option<String>,
    /// `caching_sha2_password` (fast path): 64 hex digits, `SHA256(SHA256(password))`.
    #[serde(default)]
    pub sha2_hash: Option<String>,
    /// The cluster its statements run on (absent: the first).
    #[serde(default)]
    pub cluster: Option<String>,
    /// The default database when the client names none at connect.
    #[serde(default)]
    pub schema: Option<String>,
    /// Connections of this user at most (absent: no cap of its own).
    #[serde(default)]
    pub max_connections: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listen {
    /// Client listener (TCP, bound with SO_REUSEPORT).
    pub client: SocketAddr,
    /// Admin HTTP listener.
    pub admin: SocketAddr,
    /// Directory for the worker socket and the local credentials file.
    /// Default: `$OSPREY_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/osprey`, else `/tmp/osprey-<uid>`.
    pub runtime_dir: Option<PathBuf>,
    /// TLS on the client listener. Absent: plain TCP.
    pub tls: Option<ListenTls>,
}

/// `[listen.tls]`: the client listener speaks TLS only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenTls {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf.
    pub key_file: PathBuf,
    /// PEM CA certificates that client certificates must chain to. Absent: clients
    /// present no certificate and the token alone authenticates them.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: `require` (a client without a valid certificate fails the
    /// TLS handshake) or `optional` (a client may present none; one it presents must be valid).
    #[serde(default)]
    pub client_auth: ClientAuth,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    #[default]
    Require,
    Optional,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            client: "127.0.0.1:7400".parse().expect("valid literal"),
            admin: "127.0.0.1:7401".parse().expect("valid literal"),
            runtime_dir: None,
            tls: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Auth {
    /// Tokens clients may present in HELLO. Empty: one is generated at start and
    /// written, with the admin token, to `<runtime_dir>/credentials` (mode 0600).
    pub client_tokens: Vec<String>,
    /// Bearer token for the admin API. Absent: generated as above.
    pub admin_token: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Concurrently open streams per client connection; one more fails alone with TOO_MANY_STREAMS.
    pub max_streams_per_connection: u32,
    /// Largest frame payload accepted, bytes.
    pub max_payload: usize,
    /// Client connections held at once; further ones are closed at accept. Absent: derived
    /// from the file-descriptor limit minus the reserve (see [`crate::fds`]).
    pub max_client_connections: Option<usize>,
    /// Frames queued towards one client before its streams wait (backpressure).
    pub client_write_queue: usize,
    /// Bytes (headers included) queued towards one client before its streams wait. A
    /// single larger frame still goes, alone, once the queue is empty.
    pub client_write_queue_bytes: usize,
    /// A client that does not take our bytes for this long is cut off (slow consumer).
    pub client_write_timeout_ms: u64,
    /// Client connections that may be reading their HELLO at once; others wait (nothing
    /// buffered) up to `handshake_timeout_ms` for their turn.
    pub max_pending_handshakes: usize,
    /// Bytes of REQUEST payload the open streams of one connection may hold; a REQUEST
    /// that does not fit fails alone with QUEUE_FULL (one larger than this goes alone).
    pub max_request_bytes_per_connection: usize,
    /// The same for all client connections together.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams_per_connection: 1024,
            max_payload: osprey_protocol::DEFAULT_MAX_PAYLOAD,
            max_client_connections: None,
            client_write_queue: 256,
            client_write_queue_bytes: 4 * 1024 * 1024,
            client_write_timeout_ms: 30_000,
            max_pending_handshakes: 1024,
            max_request_bytes_per_connection: 64 * 1024 * 1024,
            max_request_bytes: 1024 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    /// A request running on a worker longer than this kills the worker.
    pub request_timeout_ms: u64,
    /// PING on idle links this often.
    pub keepalive_interval_ms: u64,
    /// No frame at all from a peer for this long means it is dead.
    pub keepalive_timeout_ms: u64,
    /// On SIGTERM, in-flight requests get this long to finish.
    pub drain_timeout_ms: u64,
    /// After CANCEL, a worker gets this long to answer before it is killed.
    pub cancel_grace_ms: u64,
    /// A client must complete HELLO within this time.
    pub handshake_timeout_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            request_timeout_ms: 300_000,
            keepalive_interval_ms: 10_000,
            keepalive_timeout_ms: 30_000,
            drain_timeout_ms: 30_000,
            cancel_grace_ms: 2_000,
            handshake_timeout_ms: 5_000,
        }
    }
}

/// The admin HTTP server's own limits: it must never hold more than a few file
/// descriptors, whatever its peers do (see `docs/CONFIG.md`, `[admin]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Admin {
    /// Admin connections held at once. A further one takes the place of the oldest that
    /// has not presented the admin token (silent ones first); with none, it is closed.
    pub max_connections: usize,
    /// Admin connections one source address may hold at once (absent: a quarter of
    /// `max_connections`, at least 1); a further one from it takes the place of its
    /// oldest that has not presented the token.
    pub max_connections_per_address: Option<usize>,
    /// A new connection must send its first complete request head within this.
    pub first_head_timeout_ms: u64,
    /// A request head must be complete within this of the connection starting to wait for
    /// it (at accept, or after the previous response on a kept-alive connection).
    pub header_read_timeout_ms: u64,
    /// A connection on which no byte moves either way for this long, while no request is
    /// being handled, is closed (request-less, kept-alive, stalled body, unread response).
    pub idle_timeout_ms: u64,
    /// A request (reading its body included) not answered within this gets 503 and the
    /// connection is closed.
    pub request_timeout_ms: u64,
}

impl Admin {
    /// `max_connections_per_address`, or its default.
    pub fn per_address(&self) -> usize {
        self.max_connections_per_address
            .unwrap_or(self.max_connections / 4)
            .clamp(1, self.max_connections.max(1))
    }
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            max_connections: 64,
            max_connections_per_address: None,
            first_head_timeout_ms: 1_000,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 5_000,
            request_timeout_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    #[serde(default = "default_backend_name")]
    pub name: String,
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    pub user: String,
    #[serde(default)]
    pub password: String,
    #[serde(default)]
    pub database: Option<String>,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// `auto` (reset after requests whose text may leave session state) or `always`.
    #[serde(default)]
    pub session_reset: SessionReset,
    /// TLS from the workers to the database: `disabled`, `preferred`, `required`,
    /// `verify_ca` or `verify_identity` (see docs/CONFIG.md).
    #[serde(default)]
    pub ssl_mode: SslMode,
    /// PEM CA certificates the database's certificate must chain to (`verify_ca`,
    /// `verify_identity`). Absent: the built-in public roots (webpki-roots).
    #[serde(default)]
    pub ssl_ca: Option<PathBuf>,
    /// Name checked against the database's certificate under `verify_identity`.
    /// Absent: `host`.
    #[serde(default)]
    pub ssl_server_name: Option<String>,
    /// The member's throttle, as on `[[cluster.member]]` (absent: not throttled).
    #[serde(default)]
    pub max_qps: Option<u32>,
    #[serde(default)]
    pub burst: Option<u32>,
}

fn default_backend_name() -> String {
    "primary".into()
}
fn default_port() -> u16 {
    3306
}
fn default_connect_timeout() -> u64 {
    5_000
}

/// `[intercept]`: slow-SQL interception and the slow log (docs/CONFIG.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InterceptConfig {
    /// Digests are computed, checked against the blocked set and accounted.
    pub enabled: bool,
    /// An execution whose server time reaches this is slow.
    pub slow_threshold_ms: u64,
    /// This many slow executions of one digest within `slow_window_s` block it.
    pub slow_count: u32,
    pub slow_window_s: u64,
    /// Automatic blocks expire after this; 0 = until unblocked.
    pub block_ttl_s: u64,
    /// Which statements slow accounting may block: `all` or `reads`.
    pub kinds: BlockKinds,
    /// Digests with recent slow executions that are tracked (bounded; oldest evicted).
    pub slow_table_capacity: usize,
    /// Digests in the statistics of `GET /digests` (bounded; least executed evicted).
    pub stats_capacity: usize,
    /// Slow executions are written to `slow_log_schema.slow_log_table` on the primary.
    pub slow_log: bool,
    pub slow_log_schema: String,
    pub slow_log_table: String,
    /// Entries queued for the writer at most, in count and in bytes; beyond, dropped.
    pub slow_log_channel: usize,
    pub slow_log_channel_bytes: usize,
    /// Rows per INSERT.
    pub slow_log_batch_rows: usize,
    /// Bytes of the statement kept as its sample.
    pub slow_log_sample_bytes: usize,
    /// Timeout of the writer's connect and of each statement.
    pub slow_log_timeout_ms: u64,
}

impl Default for InterceptConfig {
    /// Production defaults: only a statement that is very slow, repeatedly, is blocked,
    /// and not for ever.
    fn default() -> Self {
        InterceptConfig {
            enabled: true,
            slow_threshold_ms: 10_000,
            slow_count: 5,
            slow_window_s: 60,
            block_ttl_s: 600,
            kinds: BlockKinds::All,
            slow_table_capacity: 1024,
            stats_capacity: 4096,
            slow_log: true,
            slow_log_schema: "osprey".into(),
            slow_log_table: "slow_log".into(),
            slow_log_channel: 10_000,
            slow_log_channel_bytes: 16 * 1024 * 1024,
            slow_log_batch_rows: 100,
            slow_log_sample_bytes: 1024,
            slow_log_timeout_ms: 2_000,
        }
    }
}

impl InterceptConfig {
    /// The embedded sandbox's: 1 s, 3 slow runs within 60 s, so that the README's tour can
    /// show a pattern being blocked and unblocked.
    pub fn embedded() -> Self {
        InterceptConfig {
            slow_threshold_ms: 1_000,
            slow_count: 3,
            slow_window_s: 60,
            block_ttl_s: 300,
            ..InterceptConfig::default()
        }
    }

    pub fn settings(&self) -> InterceptSettings {
        InterceptSettings {
            enabled: self.enabled,
            slow_threshold: Duration::from_millis(self.slow_threshold_ms),
            slow_count: self.slow_count,
            slow_window: Duration::from_secs(self.slow_window_s),
            block_ttl: (self.block_ttl_s > 0).then(|| Duration::from_secs(self.block_ttl_s)),
            kinds: self.kinds,
            slow_table_capacity: self.slow_table_capacity,
            stats_capacity: self.stats_capacity,
        }
    }

    /// The slow log's settings; `None` when it is off.
    pub fn slow_log_settings(&self) -> Option<SlowLogSettings> {
        (self.enabled && self.slow_log).then(|| SlowLogSettings {
            schema: self.slow_log_schema.clone(),
            table: self.slow_log_table.clone(),
            channel_capacity: self.slow_log_channel,
            channel_bytes: self.slow_log_channel_bytes,
            batch_rows: self.slow_log_batch_rows,
            sample_bytes: self.slow_log_sample_bytes,
            timeout: Duration::from_millis(self.slow_log_timeout_ms),
            retry: Duration::from_secs(1),
        })
    }

    fn validate(&self) -> Result<(), String> {
        if self.slow_count == 0 || self.slow_window_s == 0 {
            return Err("intercept.slow_count and slow_window_s must be at least 1".into());
        }
        if self.slow_table_capacity == 0 || self.stats_capacity < 16 {
            return Err("intercept.slow_table_capacity must be >= 1 and stats_capacity >= 16".into());
        }
        for (key, name) in [
            ("slow_log_schema", &self.slow_log_schema),
            ("slow_log_table", &self.slow_log_table),
        ] {
            if !crate::policy::slow_log::valid_identifier(name) {
                return Err(format!(
                    "intercept.{key} must be 1-64 letters, digits, `_` or `$` (got {name:?})"
                ));
            }
        }
        if self.slow_log_channel == 0 || self.slow_log_channel_bytes < 4096 {
            return Err("intercept.slow_log_channel must be >= 1 and slow_log_channel_bytes >= 4096".into());
        }
        if !(1..=1000).contains(&self.slow_log_batch_rows) || self.slow_log_sample_bytes > 65_536 {
            return Err("intercept.slow_log_batch_rows must be 1..=1000 and slow_log_sample_bytes <= 65536".into());
        }
        if self.slow_log_timeout_ms == 0 {
            return Err("intercept.slow_log_timeout_ms must be at least 1".into());
        }
        Ok(())
    }
}

/// `[throttle]`: how requests wait for a member's token (the rates: `max_qps`/`burst` on
/// `[[cluster.member]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ThrottleConfig {
    /// A request waits this long for a token, then fails with THROTTLED.
    pub wait_ms: u64,
    /// Requests waiting per member; one more fails at once with THROTTLED (0: no waiting).
    pub queue_capacity: usize,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            wait_ms: 100,
            queue_capacity: 1024,
        }
    }
}

impl ThrottleConfig {
    pub fn settings(&self) -> ThrottleSettings {
        ThrottleSettings {
            wait: Duration::from_millis(self.wait_ms),
            queue_capacity: self.queue_capacity,
        }
    }
}

impl Backend {
    /// `[backend]` as the one-member cluster it stands for: no replica to promote, so no
    /// failover; the health model still runs.
    pub fn as_cluster(&self) -> ClusterConfig {
        ClusterConfig {
            name: "default".into(),
            topology: Topology::Replication,
            user: self.user.clone(),
            password: self.password.clone(),
            database: self.database.clone(),
            monitor_user: None,
            monitor_password: None,
            replication_user: None,
            replication_password: None,
            connect_timeout_ms: self.connect_timeout_ms,
            session_reset: self.session_reset,
            ssl_mode: self.ssl_mode,
            ssl_ca: self.ssl_ca.clone(),
            ssl_server_name: self.ssl_server_name.clone(),
            read_split: false,
            read_fallback: Default::default(),
            members: vec![MemberConfig {
                max_qps: self.max_qps,
                burst: self.burst,
                ..MemberConfig::new(self.name.clone(), self.host.clone(), self.port)
            }],
            health: HealthConfig::default(),
            failover: FailoverConfig {
                auto: false,
                lock: crate::cluster::LockMode::None,
                ..FailoverConfig::default()
            },
            delay_period_ms: None,
            delay_threshold_ms: None,
            delay_database: None,
        }
    }
}

impl Config {
    /// Reads and validates a TOML file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    fn validate_mysql(&self) -> Result<(), String> {
        let m = &self.mysql;
        if m.max_statement_bytes < 4096 || m.max_statement_bytes > u32::MAX as usize {
            return Err("mysql.max_statement_bytes must be between 4 KiB and 4 GiB".into());
        }
        if m.max_connections == 0 || m.idle_timeout_ms == 0 || m.read_timeout_ms == 0 {
            return Err("mysql.max_connections, idle_timeout_ms and read_timeout_ms must be at least 1".into());
        }
        let embedded = self.backend.is_none() && self.clusters.is_empty();
        if m.require_secure_transport && m.tls.is_none() {
            return Err("mysql.require_secure_transport needs [mysql.tls]".into());
        }
        if m.listen.is_some() && m.users.is_empty() && !embedded {
            return Err(
                "mysql.listen needs at least one [[mysql.users]] (osprey mysql-password prints the hashes)".into(),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for u in &m.users {
            if u.name.is_empty() || u.name.len() > 80 || !seen.insert(u.name.as_str()) {
                return Err(format!(
                    "mysql.users: {:?}: names must be unique, 1 to 80 bytes",
                    u.name
                ));
            }
            if u.native_hash.is_none() && u.sha2_hash.is_none() {
                return Err(format!(
                    "mysql.users {:?}: give native_hash or sha2_hash (osprey mysql-password)",
                    u.name
                ));
            }
            if u.native_hash
                .as_deref()
                .is_some_and(|h| !osprey_protocol::mysql_auth::is_native_hash(h))
            {
                return Err(format!(
                    "mysql.users {:?}: native_hash is not '*' and 40 hex digits",
                    u.name
                ));
            }
            if u.sha2_hash
                .as_deref()
                .is_some_and(|h| !osprey_protocol::mysql_auth::is_sha2_hash(h))
            {
                return Err(format!("mysql.users {:?}: sha2_hash is not 64 hex digits", u.name));
            }
            if u.max_connections == Some(0) {
                return Err(format!("mysql.users {:?}: max_connections must be at least 1", u.name));
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if self.pool.size == 0 && self.pool.min.is_none() {
            return bad("pool.size must be at least 1");
        }
        let split = (self.backend.is_none() && self.clusters.is_empty()) || self.clusters.iter().any(|c| c.read_split);
        if split && !(1..=4096).contains(&self.replica_size()) {
            return bad("pool.replica_size (default pool.size) must be between 1 and 4096 with read_split on");
        }
        match (self.pool.min, self.pool.max) {
            (Some(min), Some(max)) if min == 0 || min > max => return bad("pool.min must be >= 1 and <= pool.max"),
            (Some(_), None) | (None, Some(_)) => return bad("pool.min and pool.max go together"),
            _ => {}
        }
        if self.sessions.max_per_connection == 0 {
            return bad("sessions.max_per_connection must be at least 1");
        }
        self.validate_mysql().map_err(ConfigError::Invalid)?;
        if self.limits.max_streams_per_connection == 0 {
            return bad("limits.max_streams_per_connection must be at least 1");
        }
        if self.limits.max_payload < 1024 || self.limits.max_payload > u32::MAX as usize {
            return bad("limits.max_payload must be between 1 KiB and 4 GiB");
        }
        if self.limits.max_pending_handshakes == 0 || self.limits.max_pending_handshakes > 1 << 20 {
            return bad("limits.max_pending_handshakes must be between 1 and 1048576");
        }
        let (conn, all) = (
            self.limits.max_request_bytes_per_connection,
            self.limits.max_request_bytes,
        );
        if conn < 4096 || all < conn || all > u32::MAX as usize {
            return bad("limits: 4 KiB <= max_request_bytes_per_connection <= max_request_bytes < 4 GiB");
        }
        if self.limits.client_write_queue == 0 {
            return bad("limits.client_write_queue must be at least 1");
        }
        if self.limits.client_write_queue_bytes < 4096 || self.limits.client_write_queue_bytes > u32::MAX as usize {
            return bad("limits.client_write_queue_bytes must be between 4 KiB and 4 GiB");
        }
        if self.timeouts.keepalive_timeout_ms <= self.timeouts.keepalive_interval_ms {
            return bad("timeouts.keepalive_timeout_ms must exceed keepalive_interval_ms");
        }
        if self.limits.max_client_connections == Some(0) {
            return bad("limits.max_client_connections must be at least 1 (or absent: derived from the file limit)");
        }
        if self.admin.max_connections == 0 || self.admin.max_connections > 4096 {
            return bad("admin.max_connections must be between 1 and 4096");
        }
        if self
            .admin
            .max_connections_per_address
            .is_some_and(|n| n == 0 || n > self.admin.max_connections)
        {
            return bad("admin.max_connections_per_address must be between 1 and admin.max_connections");
        }
        if self.admin.header_read_timeout_ms == 0
            || self.admin.idle_timeout_ms == 0
            || self.admin.request_timeout_ms == 0
            || self.admin.first_head_timeout_ms == 0
        {
            return bad(
                "admin.first_head_timeout_ms, header_read_timeout_ms, idle_timeout_ms and request_timeout_ms must be at \
                 least 1",
            );
        }
        if self.pool.queue_capacity == 0 || self.pool.queue_bytes == 0 || self.pool.queue_bytes_per_connection == 0 {
            return bad("pool.queue_capacity, pool.queue_bytes and pool.queue_bytes_per_connection must be at least 1");
        }
        if let Some(b) = &self.backend {
            let verifies = matches!(b.ssl_mode, SslMode::VerifyCa | SslMode::VerifyIdentity);
            if b.ssl_ca.is_some() && !verifies {
                return bad("backend.ssl_ca is only used with ssl_mode verify_ca or verify_identity");
            }
            // Without its own CA, verify_ca would take any certificate a public CA issued,
            // for any name: anyone can get one, so it would not stop a man in the middle.
            // (MySQL's client refuses VERIFY_CA without --ssl-ca too.)
            if b.ssl_mode == SslMode::VerifyCa && b.ssl_ca.is_none() {
                return bad(
                    "backend.ssl_mode verify_ca needs backend.ssl_ca (the CA the database's certificate must chain to)",
                );
            }
            if b.ssl_server_name.is_some() && b.ssl_mode != SslMode::VerifyIdentity {
                return bad("backend.ssl_server_name is only used with ssl_mode verify_identity");
            }
            if let Some(ca) = &b.ssl_ca {
                if let Err(e) = std::fs::File::open(ca) {
                    return Err(ConfigError::Invalid(format!("backend.ssl_ca {}: {e}", ca.display())));
                }
            }
        }
        if self.backend.is_some() && !self.clusters.is_empty() {
            return bad("[backend] and [[cluster]] do not go together: describe the backend as a cluster");
        }
        for (i, c) in self.clusters.iter().enumerate() {
            c.validate().map_err(ConfigError::Invalid)?;
            if self.clusters[..i].iter().any(|o| o.name == c.name) {
                return Err(ConfigError::Invalid(format!("two clusters named {}", c.name)));
            }
            let verifies = matches!(c.ssl_mode, SslMode::VerifyCa | SslMode::VerifyIdentity);
            if (c.ssl_ca.is_some() && !verifies) || (c.ssl_mode == SslMode::VerifyCa && c.ssl_ca.is_none()) {
                return Err(ConfigError::Invalid(format!(
                    "cluster {}: ssl_ca goes with ssl_mode verify_ca (where it is required) or verify_identity",
                    c.name
                )));
            }
        }
        if let Some(i) = &self.intercept {
            i.validate().map_err(ConfigError::Invalid)?;
        }
        for c in &self.clusters {
            for m in &c.members {
                if m.max_qps == Some(0) || m.burst == Some(0) || (m.burst.is_some() && m.max_qps.is_none()) {
                    return Err(ConfigError::Invalid(format!(
                        "cluster {} member {}: max_qps and burst must be at least 1, and burst goes with max_qps",
                        c.name, m.name
                    )));
                }
            }
        }
        if !(1..=MAX_PIPELINE_DEPTH).contains(&self.pool.pipeline_depth) {
            return bad(&format!(
                "pool.pipeline_depth must be between 1 and {MAX_PIPELINE_DEPTH}"
            ));
        }
        if self.pool.batch_rows == 0 || (self.pool.batch_bytes as usize) >= self.limits.max_payload {
            return bad("pool.batch_rows must be >= 1 and pool.batch_bytes below limits.max_payload");
        }
        Ok(())
    }

    /// The interception settings in force: `[intercept]` if given, else the embedded
    /// defaults when the dispatcher runs its own sandbox, else the production defaults.
    pub fn intercept_config(&self) -> InterceptConfig {
        match &self.intercept {
            Some(c) => c.clone(),
            None if self.backend.is_none() && self.clusters.is_empty() => InterceptConfig::embedded(),
            None => InterceptConfig::default(),
        }
    }

    /// Every throttled member: (cluster, member, limit); `[backend]` is cluster `default`.
    pub fn throttle_limits(&self) -> Vec<(String, String, Limit)> {
        let backend = self.backend.as_ref().map(Backend::as_cluster);
        backend
            .iter()
            .chain(&self.clusters)
            .flat_map(|c| {
                c.members.iter().filter_map(|m| {
                    m.max_qps.map(|q| {
                        (
                            c.name.clone(),
                            m.name.clone(),
                            Limit::new(q as f64, m.burst.map(|b| b as f64)),
                        )
                    })
                })
            })
            .collect()
    }

    /// The most slots this config can run at once (fixed size, or the elastic maximum,
    /// for each cluster's write slots, and the read slots). The file-descriptor reserve
    /// is sized for at least 64 write slots per cluster beside the read slots (`fds.rs`).
    pub fn max_pool_size(&self) -> usize {
        self.max_write_slots()
            .saturating_mul(self.slot_groups())
            .saturating_add(self.max_read_slots())
    }

    /// The most write slots of one cluster at once (fixed size, or the elastic maximum).
    pub fn max_write_slots(&self) -> usize {
        self.initial_pool_size().max(self.pool.max.unwrap_or(0))
    }

    /// Read slots per replica (`pool.replica_size`, default `pool.size`).
    pub fn replica_size(&self) -> usize {
        self.pool.replica_size.unwrap_or(self.pool.size)
    }

    /// The most read slots at once: every member but one primary of each cluster with
    /// `read_split` is a replica.
    pub fn max_read_slots(&self) -> usize {
        if self.backend.is_none() && self.clusters.is_empty() {
            // The embedded default: a sandbox primary and two replicas, split on.
            return self.replica_size().saturating_mul(2);
        }
        self.clusters
            .iter()
            .filter(|c| c.read_split)
            .map(|c| c.members.len().saturating_sub(1).saturating_mul(self.replica_size()))
            .fold(0, usize::saturating_add)
    }

    /// Slot groups the dispatcher runs: one per cluster (`[backend]` and the embedded
    /// default are one cluster).
    pub fn slot_groups(&self) -> usize {
        self.clusters.len().max(1)
    }

    /// The wait queue's bounds and caps.
    pub fn queue_limits(&self) -> QueueLimits {
        QueueLimits {
            capacity: self.pool.queue_capacity,
            bytes: self.pool.queue_bytes,
            bytes_per_connection: self.pool.queue_bytes_per_connection,
            max_per_connection: self.pool.max_per_connection,
            max_per_token: self.pool.max_per_token,
        }
    }

    /// The initial number of slots.
    pub fn initial_pool_size(&self) -> usize {
        match self.pool.min {
            Some(min) => min.max(self.pool.size.min(self.pool.max.unwrap_or(usize::MAX))),
            None => self.pool.size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c, Config::default());
        c.validate().unwrap();
    }

    #[test]
    fn unknown_key_is_an_error() {
        assert!(toml::from_str::<Config>("[pool]\nsise = 3\n").is_err());
    }

    #[test]
    fn session_reset_is_auto_unless_set() {
        let base = "[backend]\nhost = \"db\"\nuser = \"app\"\n";
        let c: Config = toml::from_str(base).unwrap();
        assert_eq!(c.backend.unwrap().session_reset, SessionReset::Auto);
        let c: Config = toml::from_str(&format!("{base}session_reset = \"always\"\n")).unwrap();
        assert_eq!(c.backend.unwrap().session_reset, SessionReset::Always);
        assert!(toml::from_str::<Config>(&format!("{base}session_reset = \"sometimes\"\n")).is_err());
    }

    #[test]
    fn fairness_keys_parse() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c.queue_limits().max_per_connection, None);
        let c: Config = toml::from_str("[pool]\nmax_per_connection = 0\nmax_per_token = 6\n").unwrap();
        assert_eq!(c.queue_limits().max_per_connection, Some(0));
        assert_eq!(c.queue_limits().max_per_token, 6);
        let c: Config = toml::from_str("[pool]\nqueue_bytes = 0\n").unwrap();
        assert!(c.validate().is_err());
    }

    #[test]
    fn tls_keys_parse_with_defaults() {
        let c: Config = toml::from_str("[listen.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n").unwrap();
        let tls = c.listen.tls.unwrap();
        assert_eq!(tls.client_auth, ClientAuth::Require);
        assert!(tls.client_ca_file.is_none());
        assert!(toml::from_str::<Config>("[listen.tls]\ncert_file = \"c.pem\"\n").is_err());
        let base = "[backend]\nhost = \"db\"\nuser = \"app\"\n";
        let c: Config = toml::from_str(base).unwrap();
        assert_eq!(c.backend.as_ref().unwrap().ssl_mode, SslMode::Disabled);
        let c: Config = toml::from_str(&format!("{base}ssl_mode = \"verify_identity\"\n")).unwrap();
        assert_eq!(c.backend.as_ref().unwrap().ssl_mode, SslMode::VerifyIdentity);
        let c: Config = toml::from_str(&format!("{base}ssl_mode = \"required\"\nssl_ca = \"/etc/hosts\"\n")).unwrap();
        assert!(c.validate().is_err(), "a CA that no mode uses is refused");
    }

    /// Review finding (backend TLS). `verify_ca` without `ssl_ca` trusted the public web
    /// roots and checked no name, so any publicly issued certificate passed.
    #[test]
    fn verify_ca_needs_its_own_ca() {
        let base = "[backend]\nhost = \"db\"\nuser = \"app\"\nssl_mode = \"verify_ca\"\n";
        let c: Config = toml::from_str(base).unwrap();
        assert!(
            c.validate().is_err(),
            "verify_ca with the public roots and no name check is refused"
        );
        let c: Config = toml::from_str(&format!("{base}ssl_ca = \"/etc/hosts\"\n")).unwrap();
        c.validate().unwrap();
        let c: Config =
            toml::from_str("[backend]\nhost = \"db\"\nuser = \"app\"\nssl_mode = \"verify_identity\"\n").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn elastic_bounds_are_checked() {
        let c: Config = toml::from_str("[pool]\nmin = 4\nmax = 2\n").unwrap();
        assert!(c.validate().is_err());
        let c: Config = toml::from_str("[pool]\nmin = 2\nmax = 8\nsize = 1\n").unwrap();
        assert_eq!(c.initial_pool_size(), 2);
    }

    #[test]
    fn clusters_parse_with_defaults() {
        let text = r#"
[[cluster]]
name = "main"
user = "app"
replication_user = "repl"
replication_password = "r"
[[cluster.member]]
name = "db1"
host = "10.0.0.1"
[[cluster.member]]
name = "db2"
host = "10.0.0.2"
port = 3307
no_promotion = true
[cluster.health]
interval_ms = 100

[[cluster]]
name = "galera"
topology = "galera"
user = "app"
[[cluster.member]]
name = "g1"
host = "10.0.1.1"
"#;
        let c: Config = toml::from_str(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.clusters.len(), 2);
        let main = &c.clusters[0];
        assert_eq!(main.topology, Topology::Replication);
        assert_eq!(main.members[1].port, 3307);
        assert!(main.members[1].no_promotion);
        assert_eq!(main.health.interval_ms, 100);
        assert_eq!(main.health.ping_timeout(), std::time::Duration::from_millis(80));
        assert!(main.failover.auto);
        assert_eq!(c.clusters[1].topology, Topology::Galera);
        let both = format!("{text}\n[backend]\nhost = \"db\"\nuser = \"app\"\n");
        let c: Config = toml::from_str(&both).unwrap();
        assert!(c.validate().is_err(), "[backend] beside [[cluster]] is refused");
    }

    #[test]
    fn intercept_and_throttle_parse_with_defaults() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(
            c.intercept_config(),
            InterceptConfig::embedded(),
            "the sandbox gets the tour's values"
        );
        assert_eq!(c.intercept_config().settings().slow_threshold, Duration::from_secs(1));
        assert_eq!(c.throttle.settings().wait, Duration::from_millis(100));
        let text = "[intercept]\nslow_threshold_ms = 200\nkinds = \"reads\"\nblock_ttl_s = 0\n\n[throttle]\nwait_ms = 50\nqueue_capacity = 8\n\n[[cluster]]\nname = \"m\"\nuser = \"a\"\n[[cluster.member]]\nname = \"x\"\nhost = \"h\"\nmax_qps = 500\n[[cluster.member]]\nname = \"y\"\nhost = \"h2\"\nmax_qps = 100\nburst = 20\n";
        let c: Config = toml::from_str(text).unwrap();
        c.validate().unwrap();
        let i = c.intercept_config();
        assert_eq!(
            (i.slow_threshold_ms, i.slow_count, i.kinds),
            (200, 5, BlockKinds::Reads)
        );
        assert_eq!(i.settings().block_ttl, None);
        assert_eq!(c.throttle.settings().queue_capacity, 8);
        let limits = c.throttle_limits();
        assert_eq!(limits.len(), 2);
        assert_eq!((limits[0].2.max_qps, limits[0].2.burst), (500.0, 50.0));
        assert_eq!((limits[1].2.max_qps, limits[1].2.burst), (100.0, 20.0));
        // With clusters and no [intercept]: production defaults.
        let c: Config = toml::from_str(&text.replace(
            "[intercept]\nslow_threshold_ms = 200\nkinds = \"reads\"\nblock_ttl_s = 0\n",
            "",
        ))
        .unwrap();
        assert_eq!(c.intercept_config(), InterceptConfig::default());
        for bad in [
            "[intercept]\nslow_log_table = \"a`b\"\n",
            "[intercept]\nslow_count = 0\n",
            "[intercept]\nslow_log_batch_rows = 0\n",
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
        let c: Config = toml::from_str(&text.replace("max_qps = 500", "max_qps = 0")).unwrap();
        assert!(c.validate().is_err());
        assert!(toml::from_str::<Config>("[intercept]\nkinds = \"writes\"\n").is_err());
    }

    #[test]
    fn a_window_too_short_for_the_threshold_is_refused() {
        let text = "[[cluster]]\nname = \"m\"\nuser = \"a\"\n[[cluster.member]]\nname = \"x\"\nhost = \"h\"\n[cluster.health]\ninterval_ms = 500\nwindow_ms = 1000\nfail_threshold = 3\n";
        let c: Config = toml::from_str(text).unwrap();
        assert!(c.validate().is_err());
    }

    /// Review finding: with several clusters each runs `pool.size` write slots, and the
    /// file-descriptor reserve was sized for one.
    #[test]
    fn the_slot_reserve_counts_every_cluster() {
        let one = "[[cluster]]\nname = \"a\"\nuser = \"u\"\n[[cluster.member]]\nname = \"m\"\nhost = \"h\"\n";
        let two = format!("{one}{}", one.replace("\"a\"", "\"b\""));
        let c: Config = toml::from_str(&format!("[pool]\nsize = 10\n{one}")).unwrap();
        assert_eq!(c.max_pool_size(), 10);
        let c: Config = toml::from_str(&format!("[pool]\nsize = 10\n{two}")).unwrap();
        c.validate().unwrap();
        assert_eq!(c.max_pool_size(), 20);
    }
}

//! A real MariaDB Galera cluster on loopback, from the installed `galera-4` provider.
//!
//! [`Galera::start`] runs `n` nodes, each in its own directory under one temporary directory,
//! on free loopback ports (client, group communication, IST, SST). When it returns, every node
//! is `Synced` in one Primary component of `n` members and the app account can log in on it.
//!
//! Why it is fast (about 3 s for three nodes on a quiet machine, most of it Galera's own
//! membership rounds): no node copies data from another at start.
//! - A Galera template datadir is built once per machine from the sandbox template: one node
//!   bootstraps a cluster on it and shuts down cleanly, which stores a Galera position
//!   (`uuid:seqno`) in InnoDB and in `grastate.dat`. Every node of every cluster starts from
//!   a copy of it, so all nodes hold the same data at the same position.
//! - Instead of bootstrapping one node and letting the others join (each join runs the SST
//!   script, about 2 s, and waits for the donor), every node gets a `gvwstate.dat` describing
//!   one primary view of all `n` nodes (Galera's `pc.recovery`, the mechanism that reforms a
//!   cluster after all its nodes crashed). The nodes start in parallel, find each other and
//!   restore the primary component at the same position: no state transfer.
//!
//! A node restarted after a kill rejoins the running cluster like a production node: its
//! position is recovered with `--wsrep-recover` and it receives what it missed by IST (or an
//! rsync SST). As root, the rsync daemon of an SST runs as `nobody`, so the node directories
//! are opened to it (see [`open_for_sst`]).
//!
//! Failure detection is tightened for tests (`evs.suspect_timeout` 1.5 s, `inactive_timeout`
//! 3 s; Galera's defaults are 5 s and 15 s): a killed node leaves the others' view in a few
//! seconds. Until then, commits on the survivors wait for it, as on a real cluster.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::binaries::{self, Binaries};
use crate::config::{Layout, ServerConfig};
use crate::instance::{prepare_dir, read_tail};
use crate::template::{self, copy_template, INNODB_LOG_FILE_SIZE};
use crate::{ports, process, Instance, SandboxError};

/// Where Debian's `galera-4` puts the provider (`dpkg -L galera-4`).
const PROVIDER_PATHS: &[&str] = &[
    "/usr/lib/galera/libgalera_smm.so",
    "/usr/lib/libgalera_smm.so",
    "/usr/lib64/galera-4/libgalera_smm.so",
    "/usr/lib64/galera/libgalera_smm.so",
];
/// Bump when the Galera template's contents change.
const TEMPLATE_VERSION: u32 = 1;
const MARKER: &str = "osprey-galera-template.ok";
const PROBE_INTERVAL: Duration = Duration::from_millis(25);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Galera's `local_state` of a node that is in sync with the group and serves.
pub const WSREP_SYNCED: u32 = 4;

/// A Galera cluster of [`Instance`]s (role [`crate::Role::GaleraNode`]), owning their
/// processes and their temporary directory. Dropping it SIGKILLs every node and removes the
/// directory, as [`crate::Sandbox`] does.
#[derive(Debug)]
pub struct Galera {
    // Field order matters for drop: the servers go before their directory.
    nodes: Vec<Instance>,
    dir: tempfile::TempDir,
    started_in: Duration,
}

/// What a node says of itself and of its cluster (`SHOW GLOBAL STATUS LIKE 'wsrep_%'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsrepStatus {
    /// `wsrep_cluster_status`: `Primary`, `Non-Primary` or `Disconnected`.
    pub cluster_status: String,
    /// `wsrep_local_state`: 1 Joining, 2 Donor/Desynced, 3 Joined, 4 Synced.
    pub local_state: u32,
    /// `wsrep_local_state_comment`, e.g. `Synced`, `Donor/Desynced`.
    pub local_state_comment: String,
    /// `wsrep_local_index`: the node's index in the current view.
    pub local_index: Option<u32>,
    /// `wsrep_cluster_size`: members of the node's current view.
    pub cluster_size: u32,
    /// `wsrep_ready`: the node accepts queries.
    pub ready: bool,
}

impl WsrepStatus {
    /// Synced in a Primary component: the node may take writes.
    pub fn is_synced_primary(&self) -> bool {
        self.cluster_status == "Primary" && self.local_state == WSREP_SYNCED && self.ready
    }
}

impl Galera {
    /// Starts a cluster of `n` nodes (`n >= 1`) with the default settings.
    pub async fn start(n: usize) -> Result<Galera, SandboxError> {
        Galera::builder().nodes(n).start().await
    }

    /// A builder for non-default settings.
    pub fn builder() -> GaleraBuilder {
        GaleraBuilder::default()
    }

    /// The nodes, `node-1` first.
    pub fn nodes(&self) -> &[Instance] {
        &self.nodes
    }

    /// Node `i` (0-based).
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn node(&self, i: usize) -> &Instance {
        &self.nodes[i]
    }

    /// The temporary directory holding every node's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// How long [`GaleraBuilder::start`] took, from the call to every node Synced.
    pub fn start_time(&self) -> Duration {
        self.started_in
    }

    /// Waits until `node` reports a Primary component of `size` members.
    pub async fn wait_cluster_size(&self, node: &Instance, size: u32, timeout: Duration) -> Result<(), SandboxError> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match node.wsrep_status().await {
                Ok(s) if s.cluster_status == "Primary" && s.cluster_size == size => return Ok(()),
                Ok(s) => format!("{s:?}"),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(SandboxError::NotReady {
                    instance: node.name().to_owned(),
                    timeout,
                    reason: format!("wsrep_cluster_size never reached {size}: {last}"),
                    log_tail: node.log_tail(),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    async fn launch(builder: GaleraBuilder) -> Result<Galera, SandboxError> {
        let started = std::time::Instant::now();
        let n = builder.nodes.max(1);
        let bins = binaries::locate()?;
        let provider = locate_provider()?;
        let base = template::template(&bins).await?;
        let template = galera_template(&bins, &provider, &base).await?;
        let dir = tempfile::Builder::new()
            .prefix("osprey-galera-")
            .tempdir()
            .map_err(|e| SandboxError::io("creating the galera sandbox's temporary directory", e))?;
        open_for_sst(dir.path())?;
        let config = Arc::new(builder.config);
        let deadline = Instant::now() + config.ready_timeout;

        let mut specs = Vec::with_capacity(n);
        for _ in 0..n {
            specs.push((
                ports::pick_free_port()?,
                ports::pick_free_port()?,
                ports::pick_free_port()?,
                ports::pick_free_port()?,
            ));
        }
        let peers = specs
            .iter()
            .map(|(_, gcomm, _, _)| format!("127.0.0.1:{gcomm}"))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_name = unique_cluster_name();
        let uuids: Vec<String> = (0..n).map(node_uuid).collect();
        let mut nodes = Vec::with_capacity(n);
        for (i, (client, gcomm, ist, sst)) in specs.into_iter().enumerate() {
            let spec = Arc::new(NodeSpec {
                client_port: client,
                gcomm_port: gcomm,
                ist_port: ist,
                sst_port: sst,
                cluster_address: format!("gcomm://{peers}"),
                cluster_name: cluster_name.clone(),
                provider: provider.clone(),
                fast_failure_detection: builder.fast_failure_detection,
            });
            let name = format!("node-{}", i + 1);
            let layout = Layout {
                dir: dir.path().join(&name),
            };
            prepare_dir(&layout, &template).await?;
            write_gvwstate(&layout.datadir(), &uuids[i], &uuids)?;
            nodes.push(Instance::galera_node(
                name,
                i as u32 + 1,
                layout,
                bins.mariadbd.clone(),
                config.clone(),
                spec,
            ));
        }
        // From here on, dropping `galera` kills whatever was started.
        let galera = Galera {
            nodes,
            dir,
            started_in: Duration::ZERO,
        };
        for node in &galera.nodes {
            node.spawn(&[]).await?;
        }
        futures::future::try_join_all(galera.nodes.iter().map(|node| node.wait_ready(deadline))).await?;
        futures::future::try_join_all(
            galera
                .nodes
                .iter()
                .map(|node| wait_synced_size(node, n as u32, deadline)),
        )
        .await?;
        let mut galera = galera;
        galera.started_in = started.elapsed();
        tracing::info!(
            nodes = n,
            ports = ?galera.nodes.iter().map(Instance::port).collect::<Vec<_>>(),
            dir = %galera.dir.path().display(),
            elapsed = ?galera.started_in,
            "MariaDB Galera sandbox ready"
        );
        Ok(galera)
    }
}

impl Drop for Galera {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.signal_kill();
        }
        tracing::debug!(dir = %self.dir.path().display(), "MariaDB Galera sandbox dropped");
    }
}

/// Settings for [`Galera::builder`].
#[derive(Debug, Clone)]
pub struct GaleraBuilder {
    nodes: usize,
    config: ServerConfig,
    fast_failure_detection: bool,
}

impl Default for GaleraBuilder {
    fn default() -> Self {
        GaleraBuilder {
            nodes: 3,
            config: ServerConfig::default(),
            fast_failure_detection: true,
        }
    }
}

impl GaleraBuilder {
    /// Number of nodes (default 3).
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// `max_connections` on every node (default 1000).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.config.max_connections = n;
        self
    }

    /// Deadline for each readiness wait: start, restart (rejoin), clean shutdown (default 30 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.config.ready_timeout = timeout;
        self
    }

    /// Galera's failure detection tightened for tests (default on; off: Galera's defaults,
    /// a killed node stays in the view for 5 to 15 s).
    pub fn fast_failure_detection(mut self, on: bool) -> Self {
        self.fast_failure_detection = on;
        self
    }

    /// An extra `mariadbd` option for every node.
    pub fn server_arg(mut self, arg: impl Into<String>) -> Self {
        self.config.extra_args.push(arg.into());
        self
    }

    /// Starts the cluster; every node is Synced when it returns.
    pub async fn start(self) -> Result<Galera, SandboxError> {
        Galera::launch(self).await
    }
}

/// One node's place in its cluster.
#[derive(Debug)]
pub(crate) struct NodeSpec {
    pub(crate) client_port: u16,
    gcomm_port: u16,
    ist_port: u16,
    sst_port: u16,
    cluster_address: String,
    cluster_name: String,
    provider: PathBuf,
    fast_failure_detection: bool,
}

impl Instance {
    /// The node's Galera status (`SHOW GLOBAL STATUS LIKE 'wsrep_%'`), on a new connection.
    /// On a server without Galera every field is empty or zero.
    pub async fn wsrep_status(&self) -> Result<WsrepStatus, SandboxError> {
        let mut conn =
            tokio::time::timeout(PROBE_TIMEOUT, self.conn())
                .await
                .map_err(|_| SandboxError::NotReady {
                    instance: self.name().to_owned(),
                    timeout: PROBE_TIMEOUT,
                    reason: "login timed out".into(),
                    log_tail: String::new(),
                })??;
        let status = read_wsrep_status(&mut conn)
            .await
            .map_err(|e| SandboxError::mysql(self.name(), e));
        let _ = conn.disconnect().await;
        status
    }
}

async fn read_wsrep_status(conn: &mut Conn) -> Result<WsrepStatus, mysql_async::Error> {
    let rows: Vec<(String, String)> = conn.query("SHOW GLOBAL STATUS LIKE 'wsrep_%'").await?;
    let get = |name: &str| {
        rows.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    Ok(WsrepStatus {
        cluster_status: get("wsrep_cluster_status").to_owned(),
        local_state: get("wsrep_local_state").parse().unwrap_or(0),
        local_state_comment: get("wsrep_local_state_comment").to_owned(),
        local_index: get("wsrep_local_index").parse().ok(),
        cluster_size: get("wsrep_cluster_size").parse().unwrap_or(0),
        ready: get("wsrep_ready").eq_ignore_ascii_case("ON"),
    })
}

/// Waits until the node is Synced in a Primary component (any size).
pub(crate) async fn wait_synced(node: &Instance, deadline: Instant) -> Result<(), SandboxError> {
    wait_until(node, deadline, "Synced in a Primary component", |s| {
        s.is_synced_primary()
    })
    .await
}

async fn wait_synced_size(node: &Instance, size: u32, deadline: Instant) -> Result<(), SandboxError> {
    wait_until(
        node,
        deadline,
        &format!("Synced in a Primary component of {size}"),
        |s| s.is_synced_primary() && s.cluster_size == size,
    )
    .await
}

async fn wait_until(
    node: &Instance,
    deadline: Instant,
    what: &str,
    done: impl Fn(&WsrepStatus) -> bool,
) -> Result<(), SandboxError> {
    loop {
        let last = match node.wsrep_status().await {
            Ok(s) if done(&s) => return Ok(()),
            Ok(s) => format!("{s:?}"),
            Err(e) => e.to_string(),
        };
        if node.pid().is_none() {
            return Err(SandboxError::Exited {
                instance: node.name().to_owned(),
                status: "exited while joining its cluster".into(),
                log_tail: node.log_tail(),
            });
        }
        if Instant::now() >= deadline {
            return Err(SandboxError::NotReady {
                instance: node.name().to_owned(),
                timeout: node.ready_timeout(),
                reason: format!("not {what}: {last}"),
                log_tail: node.log_tail(),
            });
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// `--wsrep-start-position=uuid:seqno` for a node about to rejoin: `mariadbd --wsrep-recover`
/// reads the last committed position from InnoDB (after a kill `grastate.dat` says -1), as
/// `mysqld_safe` and the systemd unit do before every start.
pub(crate) async fn recover_position(node: &Instance) -> Result<String, SandboxError> {
    let spec = node.galera_spec().ok_or_else(|| SandboxError::NotRunning {
        instance: node.name().to_owned(),
    })?;
    let log = node.dir().join("recover.log");
    let _ = std::fs::remove_file(&log);
    let mut cmd = node_command(node.mariadbd(), node.config(), node.layout(), 0, spec);
    cmd.arg(format!("--log-error={}", log.display())).arg("--wsrep-recover");
    let mut child = process::spawn(cmd)
        .await
        .map_err(|e| SandboxError::io("starting mariadbd --wsrep-recover", e))?;
    let deadline = Instant::now() + node.ready_timeout();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => tokio::time::sleep(PROBE_INTERVAL).await,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SandboxError::NotReady {
                    instance: node.name().to_owned(),
                    timeout: node.ready_timeout(),
                    reason: "mariadbd --wsrep-recover did not finish".into(),
                    log_tail: read_tail(&log, 0),
                });
            }
            Err(e) => return Err(SandboxError::io("waiting for mariadbd --wsrep-recover", e)),
        }
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    match parse_recovered_position(&text) {
        Some(pos) if status.success() => Ok(format!("--wsrep-start-position={pos}")),
        _ => Err(SandboxError::Exited {
            instance: node.name().to_owned(),
            status: format!("mariadbd --wsrep-recover: {status}, no recovered position"),
            log_tail: read_tail(&log, 0),
        }),
    }
}

fn parse_recovered_position(log: &str) -> Option<String> {
    log.lines()
        .rev()
        .find_map(|l| {
            l.split_once("WSREP: Recovered position:")
                .map(|(_, p)| p.trim().to_owned())
        })
        .filter(|p| p.contains(':'))
}

/// The command line of one node (the server settings of a sandbox instance, without the
/// replication ones, plus wsrep).
pub(crate) fn node_command(
    mariadbd: &Path,
    config: &ServerConfig,
    layout: &Layout,
    server_id: u32,
    spec: &NodeSpec,
) -> Command {
    let mut cmd = Command::new(mariadbd);
    cmd.arg("--no-defaults");
    if nix::unistd::geteuid().is_root() {
        cmd.arg("--user=root");
    }
    cmd.arg(format!("--datadir={}", layout.datadir().display()))
        .arg(format!("--socket={}", layout.socket().display()))
        .arg(format!("--pid-file={}", layout.pid_file().display()))
        .arg(format!("--log-error={}", layout.error_log().display()))
        .arg(format!("--port={}", spec.client_port))
        .arg("--bind-address=127.0.0.1")
        .arg("--skip-name-resolve")
        .arg(format!("--server-id={}", server_id.max(1)))
        // Galera requires row events and interleaved auto-increment locks.
        .arg("--binlog-format=ROW")
        .arg("--innodb-autoinc-lock-mode=2")
        .arg(format!("--max-connections={}", config.max_connections))
        .arg("--max-allowed-packet=16M")
        .arg("--innodb-buffer-pool-size=64M")
        .arg(format!("--innodb-log-file-size={INNODB_LOG_FILE_SIZE}"))
        .arg("--innodb-temp-data-file-path=ibtmp1:1M:autoextend")
        .arg("--innodb-flush-log-at-trx-commit=2")
        .arg(format!(
            "--performance-schema={}",
            if config.performance_schema { "ON" } else { "OFF" }
        ))
        .arg("--wsrep-on=ON")
        .arg(format!("--wsrep-provider={}", spec.provider.display()))
        .arg(format!("--wsrep-cluster-name={}", spec.cluster_name))
        .arg(format!("--wsrep-cluster-address={}", spec.cluster_address))
        .arg(format!("--wsrep-node-name=node-{server_id}"))
        .arg("--wsrep-node-address=127.0.0.1")
        .arg(format!("--wsrep-node-incoming-address=127.0.0.1:{}", spec.client_port))
        .arg("--wsrep-sst-method=rsync")
        .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", spec.sst_port));
    let mut options = format!(
        "gmcast.listen_addr=tcp://127.0.0.1:{};ist.recv_addr=127.0.0.1:{};gcache.size=16M",
        spec.gcomm_port, spec.ist_port
    );
    if spec.fast_failure_detection {
        // keepalive <= inactive_check <= suspect <= inactive, install <= inactive.
        options.push_str(
            ";evs.join_retrans_period=PT0.2S;evs.keepalive_period=PT0.3S;evs.inactive_check_period=PT0.5S\
             ;evs.suspect_timeout=PT1.5S;evs.inactive_timeout=PT3S;evs.install_timeout=PT3S",
        );
    }
    cmd.arg(format!("--wsrep-provider-options={options}"));
    cmd.args(&config.extra_args);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

/// As root, the joiner's rsync daemon (started by `wsrep_sst_rsync`) drops to `nobody`: it
/// must be able to reach and write the node's datadir. Only the sandbox's own temporary
/// directories are opened.
pub(crate) fn open_for_sst(dir: &Path) -> Result<(), SandboxError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    open_tree(dir).map_err(|e| SandboxError::io(format!("opening {} to the SST rsync daemon", dir.display()), e))
}

/// The joiner's log says its state transfer failed and it gave up.
pub(crate) fn log_says_state_transfer_failed(log_tail: &str) -> bool {
    log_tail.contains("Will never receive state")
        || (log_tail.contains("State transfer to") && log_tail.contains("failed"))
}

/// The state-transfer lines of the other nodes' error logs (the donor says why an SST failed;
/// the joiner only that it did), to go with a joiner's error when it gives up.
pub(crate) fn peers_state_transfer_lines(node_dir: &Path) -> String {
    let Some(cluster_dir) = node_dir.parent() else {
        return String::new();
    };
    let Ok(entries) = std::fs::read_dir(cluster_dir) else {
        return String::new();
    };
    let mut peers: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.as_path() != node_dir && p.join("error.log").is_file())
        .collect();
    peers.sort();
    let mut out = String::new();
    for peer in peers {
        let text = String::from_utf8_lossy(&std::fs::read(peer.join("error.log")).unwrap_or_default()).into_owned();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.contains("SST") || l.contains("rsync") || l.contains("State transfer") || l.contains("[ERROR]")
            })
            .collect();
        let from = lines.len().saturating_sub(PEER_SST_LINES);
        out.push_str(&format!("\n--- {} (state transfer lines) ---\n", peer.display()));
        out.push_str(&lines[from..].join("\n"));
    }
    out
}

/// How many state-transfer lines of each peer's log go with a joiner's error.
const PEER_SST_LINES: usize = 25;

fn open_tree(dir: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            open_tree(&entry.path())?;
        } else if kind.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o666))?;
        }
    }
    Ok(())
}

fn locate_provider() -> Result<PathBuf, SandboxError> {
    PROVIDER_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| SandboxError::NotInstalled {
            binary: "libgalera_smm.so (apt-get install -y galera-4 rsync)".into(),
            searched: PROVIDER_PATHS.iter().map(PathBuf::from).collect(),
        })
}

/// A cluster name no other sandbox on the machine uses, so that two clusters never merge.
fn unique_cluster_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("osprey-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A node UUID unique to this process, cluster and node (Galera only needs uniqueness).
fn node_uuid(i: usize) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0) as u64;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:08x}-{:04x}-11ef-8{:03x}-{:012x}",
        std::process::id(),
        n & 0xffff,
        (i as u32) & 0xfff,
        nanos & 0xffff_ffff_ffff
    )
}

/// Galera's saved primary view (`pc.recovery`): a node that finds itself in it waits for the
/// other members and, once all are there, they restore the primary component together.
fn write_gvwstate(datadir: &Path, me: &str, all: &[String]) -> Result<(), SandboxError> {
    let mut text = format!("my_uuid: {me}\n#vwbeg\nview_id: 3 {} 1\nbootstrap: 0\n", all[0]);
    for uuid in all {
        let _ = writeln!(text, "member: {uuid} 0");
    }
    text.push_str("#vwend\n");
    std::fs::write(datadir.join("gvwstate.dat"), text).map_err(|e| SandboxError::io("writing gvwstate.dat", e))
}

/// The Galera template: the sandbox template after one bootstrap of a single-node cluster
/// and a clean shutdown, so that it holds a Galera position. Cached like the sandbox
/// template, beside it.
async fn galera_template(bins: &Binaries, provider: &Path, base: &Path) -> Result<PathBuf, SandboxError> {
    static TEMPLATE: OnceCell<PathBuf> = OnceCell::const_new();
    TEMPLATE
        .get_or_try_init(|| async {
            let base_name = base
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let key = base_name.rsplit('-').next().unwrap_or("0").to_owned();
            let dir = std::env::temp_dir().join(format!("osprey-galera-template-{key}-{:08x}", provider_key(provider)));
            if dir.join(MARKER).is_file() {
                return Ok(dir);
            }
            build_template(bins, provider, base, &dir).await?;
            Ok(dir)
        })
        .await
        .cloned()
}

fn provider_key(provider: &Path) -> u32 {
    let meta = std::fs::metadata(provider).ok();
    let len = meta.as_ref().map(|m| m.len()).unwrap_or(0);
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    (len ^ mtime.rotate_left(17) ^ u64::from(TEMPLATE_VERSION).rotate_left(40)) as u32
}

async fn build_template(bins: &Binaries, provider: &Path, base: &Path, dest: &Path) -> Result<(), SandboxError> {
    let started = std::time::Instant::now();
    let tmp = std::env::temp_dir();
    let build = tempfile::Builder::new()
        .prefix("osprey-galera-template-build-")
        .tempdir_in(&tmp)
        .map_err(|e| SandboxError::io(format!("creating a build dir in {}", tmp.display()), e))?;
    let layout = Layout {
        dir: build.path().join("node"),
    };
    std::fs::create_dir_all(&layout.dir).map_err(|e| SandboxError::io("creating the template build dir", e))?;
    copy_template(base, &layout.datadir())?;
    let config = ServerConfig::default();
    let client_port = ports::pick_free_port()?;
    let spec = NodeSpec {
        client_port,
        gcomm_port: ports::pick_free_port()?,
        ist_port: ports::pick_free_port()?,
        sst_port: ports::pick_free_port()?,
        // An empty address: a new cluster of one.
        cluster_address: "gcomm://".into(),
        cluster_name: unique_cluster_name(),
        provider: provider.to_path_buf(),
        fast_failure_detection: false,
    };
    let node = Instance::galera_node(
        "galera-template".into(),
        1,
        layout.clone(),
        bins.mariadbd.clone(),
        Arc::new(config),
        Arc::new(spec),
    );
    let deadline = Instant::now() + node.ready_timeout();
    node.spawn(&["--wsrep-new-cluster".to_owned()]).await?;
    node.wait_ready(deadline).await?;
    wait_synced(&node, deadline).await?;
    node.shutdown().await?;
    let data = layout.datadir();
    let grastate = std::fs::read_to_string(data.join("grastate.dat")).unwrap_or_default();
    if !grastate.lines().any(|l| l.starts_with("seqno:") && !l.contains("-1")) {
        return Err(SandboxError::Exited {
            instance: "galera-template".into(),
            status: format!("no Galera position saved after a clean shutdown: {grastate:?}"),
            log_tail: node.log_tail(),
        });
    }
    // The cache is recreated by every node; the saved view would make every copy wait for
    // the template's node.
    for leftover in ["galera.cache", "gvwstate.dat", "mariadbd.sock"] {
        let _ = std::fs::remove_file(data.join(leftover));
    }
    std::fs::write(data.join(MARKER), b"").map_err(|e| SandboxError::io("marking the galera template complete", e))?;
    match std::fs::rename(&data, dest) {
        Ok(()) => {}
        Err(_) if dest.join(MARKER).is_file() => {}
        Err(e) => {
            return Err(SandboxError::io(
                format!("moving the galera template to {}", dest.display()),
                e,
            ))
        }
    }
    tracing::info!(dir = %dest.display(), elapsed = ?started.elapsed(), "built the Galera template datadir");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_joiner_is_told_what_its_peers_logged_of_state_transfers() {
        let cluster = tempfile::tempdir().unwrap();
        for (node, log) in [
            ("node-1", "2026 [Note] WSREP: Shifting SYNCED -> DONOR\nWSREP_SST: [ERROR] rsync returned code 23:\n2026 [Note] WSREP: other\n"),
            ("node-2", "2026 [Note] WSREP: nothing to do with it\n"),
            ("node-3", "2026 [Warning] WSREP: State transfer to 2.0 (node-3) failed: Unknown error 255\n"),
        ] {
            std::fs::create_dir(cluster.path().join(node)).unwrap();
            std::fs::write(cluster.path().join(node).join("error.log"), log).unwrap();
        }
        let lines = peers_state_transfer_lines(&cluster.path().join("node-3"));
        assert!(lines.contains("rsync returned code 23"), "{lines}");
        assert!(lines.contains("node-2 (state transfer lines)"), "{lines}");
        assert!(!lines.contains("other") && !lines.contains("nothing to do"), "{lines}");
        assert!(
            !lines.contains("node-3"),
            "the joiner's own log is not repeated: {lines}"
        );
    }

    #[test]
    fn recovered_position_is_read_from_the_log() {
        let log = "2026-12-01 14:41:09 0 [Note] WSREP: Recovered position: 5b1c1a4e-0000-11ef-8000-0000000000aa:7\n\
                   2026-12-01 14:41:09 0 [Warning] something else";
        assert_eq!(
            parse_recovered_position(log).as_deref(),
            Some("5b1c1a4e-0000-11ef-8000-0000000000aa:7")
        );
        assert_eq!(parse_recovered_position("nothing here"), None);
    }

    #[test]
    fn node_uuids_are_distinct_and_well_formed() {
        let a = node_uuid(0);
        let b = node_uuid(1);
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }
}

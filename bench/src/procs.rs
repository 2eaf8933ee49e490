//! The processes the benchmark starts besides the sandbox: a real `osprey-dispatcher`
//! (which spawns its `osprey-worker`s) and HAProxy in TCP mode.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use osprey_sandbox::Instance;

const BINS: [&str; 2] = ["osprey-dispatcher", "osprey-worker"];

fn has_bins(dir: &Path) -> bool {
    BINS.iter().all(|b| dir.join(b).is_file())
}

/// Where `osprey-dispatcher` and `osprey-worker` are: `explicit` if given, else next to this
/// executable (`target/<profile>/`, or its parent when run from `deps/`), else the other
/// profile's directory (`target/release` for a debug build and the other way round).
pub fn bin_dir(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = explicit {
        if has_bins(dir) {
            return Ok(dir.to_path_buf());
        }
        bail!("{} does not hold osprey-dispatcher and osprey-worker", dir.display());
    }
    let exe = std::env::current_exe().context("current exe")?;
    let mut dir = exe.parent().context("exe dir")?.to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let mut candidates = vec![dir.clone()];
    if let Some(target) = dir.parent() {
        for profile in ["release", "debug"] {
            let other = target.join(profile);
            if other != dir {
                candidates.push(other);
            }
        }
    }
    for c in &candidates {
        if has_bins(c) {
            return Ok(c.clone());
        }
    }
    bail!(
        "osprey-dispatcher and osprey-worker not found in {}; build them first \
         (`cargo build --release --bins`, or `cargo build --bins` for debug) or pass --bin-dir",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A free loopback port (bound, then released).
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// The child dies (SIGTERM) when this thread exits. Spawn from the main thread.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

fn stop_child(child: &mut Child, grace: Duration) {
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A running `osprey-dispatcher` with `workers` idle workers. Stopped on drop.
pub struct Dispatcher {
    child: Child,
    pub client_addr: SocketAddr,
    /// Its MySQL port (`[mysql] listen`), user [`MYSQL_USER`] / [`MYSQL_PASSWORD`].
    pub mysql_addr: SocketAddr,
    pub client_token: String,
    _dir: tempfile::TempDir,
}

const CLIENT_TOKEN: &str = "bench-client-token";
pub const MYSQL_USER: &str = "bench";
pub const MYSQL_PASSWORD: &str = "bench-password";
const ADMIN_TOKEN: &str = "bench-admin-token";

impl Dispatcher {
    /// `replicas` empty: a `[backend]` on `backend`. Else a `[[cluster]]` of `backend`
    /// (primary) and the replicas with the read/write split on, `workers` read slots each.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        bin_dir: &Path,
        backend: &Instance,
        replicas: &[Instance],
        workers: usize,
        max_clients: usize,
        session_reset: &str,
        tls: Option<&crate::tls::BenchPki>,
        pipeline_depth: Option<usize>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("osprey-bench-").tempdir()?;
        let client_addr = free_addr()?;
        let admin_addr = free_addr()?;
        let mysql_addr = free_addr()?;
        let streams = max_clients.max(1024);
        let config = format!(
            r#"[listen]
client = "{client_addr}"
admin = "{admin_addr}"
runtime_dir = "{runtime}"

[auth]
client_tokens = ["{CLIENT_TOKEN}"]
admin_token = "{ADMIN_TOKEN}"

[pool]
size = {workers}
# One connection serves up to 256 load tasks here: let it use every worker.
max_per_connection = 0
max_requests = 0
max_age_s = 0
queue_capacity = {queue}
queue_timeout_ms = 60000
worker_log = "warn"
{depth}

[limits]
max_streams_per_connection = {streams}

[mysql]
listen = "{mysql_addr}"
max_connections = {mysql_connections}

[[mysql.users]]
name = "{MYSQL_USER}"
native_hash = "{native}"

[sessions]
# The transaction workload: every worker may be pinned (there is no other traffic), and
# one connection serves up to 256 tasks.
max_per_group = {workers}
max_per_connection = {streams}
open_timeout_ms = 60000
"#,
            runtime = dir.path().display(),
            queue = (2 * max_clients).max(4096),
            depth = pipeline_depth.map_or_else(String::new, |d| format!("pipeline_depth = {d}")),
            mysql_connections = max_clients + 64,
            native = osprey_client::mysql_auth::native_hash(MYSQL_PASSWORD),
        );
        let config = if replicas.is_empty() {
            format!(
                r#"{config}
[backend]
host = "{host}"
port = {port}
user = "{user}"
password = "{password}"
database = "{db}"
session_reset = "{session_reset}"
"#,
                host = backend.host(),
                port = backend.port(),
                user = backend.user(),
                password = backend.password(),
                db = backend.database(),
            )
        } else {
            let mut c = format!(
                r#"{config}
[[cluster]]
name = "bench"
user = "{user}"
password = "{password}"
database = "{db}"
monitor_user = "{mu}"
monitor_password = "{mp}"
session_reset = "{session_reset}"
read_split = true
"#,
                user = backend.user(),
                password = backend.password(),
                db = backend.database(),
                mu = backend.monitor_user(),
                mp = backend.monitor_password(),
            );
            for i in std::iter::once(backend).chain(replicas) {
                c.push_str(&format!(
                    "[[cluster.member]]\nname = \"{}\"\nhost = \"{}\"\nport = {}\n",
                    i.name(),
                    i.host(),
                    i.port()
                ));
            }
            c
        };
        let config = match tls {
            Some(pki) => format!(
                "{config}\n[listen.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
                pki.cert_file.display().to_string(),
                pki.key_file.display().to_string()
            ),
            None => config,
        };
        // An A/B of a setting with one binary (e.g. `[intercept]\nenabled = false`).
        let config = match std::env::var("OSPREY_BENCH_DISPATCHER_EXTRA") {
            Ok(extra) => format!("{config}\n{extra}\n"),
            Err(_) => config,
        };
        let config_path = dir.path().join("osprey.toml");
        std::fs::write(&config_path, config)?;
        let mut cmd = Command::new(bin_dir.join("osprey-dispatcher"));
        cmd.arg("--config")
            .arg(&config_path)
            .env(
                "RUST_LOG",
                std::env::var("OSPREY_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        die_with_parent(&mut cmd);
        let child = cmd.spawn().context("spawning osprey-dispatcher")?;
        let mut d = Dispatcher {
            child,
            client_addr,
            mysql_addr,
            client_token: CLIENT_TOKEN.into(),
            _dir: dir,
        };
        d.wait_idle(admin_addr, workers * (1 + replicas.len()), Duration::from_secs(60))
            .await?;
        Ok(d)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn wait_idle(&mut self, admin: SocketAddr, n: usize, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("osprey-dispatcher exited during start-up: {status}");
            }
            let url = format!("http://{admin}/status");
            let status = tokio::task::spawn_blocking(move || -> Option<serde_json::Value> {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .timeout_global(Some(Duration::from_secs(2)))
                    .build()
                    .into();
                let mut resp = agent
                    .get(&url)
                    .header("Authorization", &format!("Bearer {ADMIN_TOKEN}"))
                    .call()
                    .ok()?;
                serde_json::from_str(&resp.body_mut().read_to_string().ok()?).ok()
            })
            .await?;
            if let Some(s) = status {
                // Every slot group (the write slots, and the replicas' read slots).
                let groups = s["groups"].as_array().cloned().unwrap_or_default();
                let sum = |k: &str| groups.iter().filter_map(|g| g[k].as_u64()).sum::<u64>();
                if sum("idle") == n as u64 && sum("slots") == n as u64 {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                bail!("osprey-dispatcher: {n} idle workers not reached within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(10));
    }
}

/// `haproxy` on `PATH` or in `/usr/sbin`.
pub fn haproxy_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("haproxy"))
        .find(|p| p.is_file())
}

/// HAProxy in TCP mode in front of the backend, run in the foreground (`-db`). Killed on drop.
pub struct Haproxy {
    child: Child,
    pub port: u16,
    pub version: String,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    pub async fn start(binary: &Path, backend_port: u16, busy_polling: bool) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("osprey-bench-haproxy-").tempdir()?;
        let addr = free_addr()?;
        let config = format!(
            r#"global
    maxconn 5000
    {busy}

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h

listen mysql
    bind {addr}
    server db1 127.0.0.1:{backend_port}
"#,
            busy = if busy_polling { "busy-polling" } else { "" }
        );
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config)?;
        let version = Command::new(binary)
            .arg("-v")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().next().map(str::to_owned))
            .unwrap_or_default();
        let mut cmd = Command::new(binary);
        cmd.arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().context("spawning haproxy")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("haproxy exited during start-up: {status}");
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                bail!("haproxy did not listen on {addr} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Haproxy {
            child,
            port: addr.port(),
            version,
            _dir: dir,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(2));
    }
}

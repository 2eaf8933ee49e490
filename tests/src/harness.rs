//! Real processes for the integration tests: a MariaDB sandbox and the real
//! `osprey-dispatcher` binary (which spawns the real `osprey-worker`s), with
//! helpers to reach the admin API and wait on conditions with deadlines.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use osprey_client::{Client, ClientConfig};
use osprey_sandbox::{Instance, Sandbox};
use serde_json::Value as Json;

/// Directory holding the workspace's built binaries (`target/<profile>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test-binary>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir").to_path_buf();
    for bin in ["osprey-dispatcher", "osprey-worker"] {
        assert!(
            dir.join(bin).exists(),
            "{} not built; run the tests with `cargo test --workspace` so every binary is built",
            dir.join(bin).display()
        );
    }
    dir
}

/// A free loopback port (bound then released; the dispatcher binds it with SO_REUSEPORT).
pub fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// Polls `check` until it yields `Some`, or fails after `limit` with `what`.
pub async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running `osprey-dispatcher` process. Killed on drop.
pub struct Dispatcher {
    child: Option<Child>,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub client_token: String,
    pub admin_token: String,
    pub config_path: PathBuf,
    pub runtime_dir: tempfile::TempDir,
    config: toml::Table,
    /// RLIMIT_NOFILE (soft and hard) set for the dispatcher process, if any.
    nofile: Option<u64>,
    env: Vec<(String, String)>,
}

impl Dispatcher {
    /// Config for a dispatcher in front of `backend`, with test-friendly defaults;
    /// `overrides` is TOML merged on top (e.g. `[pool]\nsize = 8`).
    pub fn config_for(backend: &Instance, overrides: &str) -> toml::Table {
        let base = format!(
            r#"
[listen]
client = "{client}"
admin = "{admin}"

[auth]
client_tokens = ["test-client-token"]
admin_token = "test-admin-token"

[pool]
size = 4
register_timeout_ms = 10000
respawn_backoff_min_ms = 50
respawn_backoff_max_ms = 2000
worker_log = "warn"

[backend]
host = "{host}"
port = {port}
user = "{user}"
password = "{password}"
database = "{db}"
"#,
            client = free_addr(),
            admin = free_addr(),
            host = backend.host(),
            port = backend.port(),
            user = backend.user(),
            password = backend.password(),
            db = backend.database(),
        );
        let mut table: toml::Table = base.parse().expect("base config parses");
        pipeline_depth_from_env(&mut table);
        let extra: toml::Table = overrides.parse().expect("override TOML parses");
        merge(&mut table, extra);
        table
    }

    /// Starts a dispatcher and waits until `pool.size` workers are idle.
    pub async fn start(backend: &Instance, overrides: &str) -> anyhow::Result<Dispatcher> {
        let config = Dispatcher::config_for(backend, overrides);
        Dispatcher::start_with(config).await
    }

    pub async fn start_with(config: toml::Table) -> anyhow::Result<Dispatcher> {
        let d = Dispatcher::spawn_with(config)?;
        d.wait_idle(d.pool_size(), Duration::from_secs(30)).await?;
        Ok(d)
    }

    /// `pool.size` of this dispatcher's config (default 4).
    pub fn pool_size(&self) -> usize {
        self.config
            .get("pool")
            .and_then(|p| p.get("size"))
            .and_then(|v| v.as_integer())
            .unwrap_or(4) as usize
    }

    /// Like [`Dispatcher::start_with`], with the dispatcher's soft and hard RLIMIT_NOFILE
    /// set to `nofile` (its workers inherit it): file-descriptor exhaustion made cheap.
    pub async fn start_with_nofile(config: toml::Table, nofile: u64) -> anyhow::Result<Dispatcher> {
        let d = Dispatcher::spawn_with_nofile(config, Some(nofile))?;
        d.wait_idle(d.pool_size(), Duration::from_secs(30)).await?;
        Ok(d)
    }

    /// Writes the config and spawns the dispatcher, without waiting for its workers.
    pub fn spawn_with(config: toml::Table) -> anyhow::Result<Dispatcher> {
        Dispatcher::spawn_with_nofile(config, None)
    }

    /// [`Dispatcher::spawn_with`] with extra environment variables for the process
    /// (e.g. the test-only `OSPREY_FAULT_STOP_AFTER`).
    pub fn spawn_with_env(config: toml::Table, env: &[(&str, &str)]) -> anyhow::Result<Dispatcher> {
        let mut d = Dispatcher::prepare(config, None)?;
        d.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        d.spawn()?;
        Ok(d)
    }

    /// [`Dispatcher::spawn_with`], optionally with RLIMIT_NOFILE set to `nofile`.
    pub fn spawn_with_nofile(config: toml::Table, nofile: Option<u64>) -> anyhow::Result<Dispatcher> {
        let mut d = Dispatcher::prepare(config, nofile)?;
        d.spawn()?;
        Ok(d)
    }

    fn prepare(config: toml::Table, nofile: Option<u64>) -> anyhow::Result<Dispatcher> {
        let runtime_dir = tempfile::Builder::new().prefix("osprey-test-").tempdir()?;
        let config_path = runtime_dir.path().join("osprey.toml");
        let mut config = config;
        let listen = config
            .entry("listen")
            .or_insert_with(|| toml::Value::Table(Default::default()));
        if let toml::Value::Table(t) = listen {
            t.insert("runtime_dir".into(), runtime_dir.path().display().to_string().into());
        }
        std::fs::write(&config_path, toml::to_string(&config)?)?;
        let get = |section: &str, key: &str| -> Option<toml::Value> { config.get(section)?.get(key).cloned() };
        let addr = |v: Option<toml::Value>| -> anyhow::Result<SocketAddr> {
            Ok(v.and_then(|v| v.as_str().map(str::to_owned))
                .context("listen address")?
                .parse()?)
        };
        let client_addr = addr(get("listen", "client"))?;
        let admin_addr = addr(get("listen", "admin"))?;
        let client_token = get("auth", "client_tokens")
            .and_then(|v| v.as_array()?.first()?.as_str().map(str::to_owned))
            .context("client token")?;
        let admin_token = get("auth", "admin_token")
            .and_then(|v| v.as_str().map(str::to_owned))
            .context("admin token")?;
        let d = Dispatcher {
            child: None,
            client_addr,
            admin_addr,
            client_token,
            admin_token,
            config_path,
            runtime_dir,
            config,
            nofile,
            env: Vec::new(),
        };
        Ok(d)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut cmd = Command::new(bin_dir().join("osprey-dispatcher"));
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n as libc::rlim_t,
                        rlim_max: n as libc::rlim_t,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("--config")
            .arg(&self.config_path)
            .env(
                "RUST_LOG",
                std::env::var("OSPREY_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .spawn()
            .context("spawning osprey-dispatcher")?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn signal(&self, sig: Signal) {
        let _ = kill(Pid::from_raw(self.pid() as i32), sig);
    }

    /// Waits for the process to exit; returns its exit code.
    pub async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<Option<i32>> {
        let child = self.child.as_mut().context("not running")?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status.code());
            }
            if Instant::now() >= deadline {
                bail!("dispatcher did not exit within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::new(self.client_addr.to_string(), self.client_token.clone())
    }

    pub async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect(self.client_config()).await?)
    }

    async fn admin(&self, method: &'static str, path: &str, body: Option<Json>) -> anyhow::Result<(u16, String)> {
        let url = format!("http://{}{}", self.admin_addr, path);
        let auth = format!("Bearer {}", self.admin_token);
        tokio::task::spawn_blocking(move || -> anyhow::Result<(u16, String)> {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .into();
            let mut resp = match (method, body) {
                ("GET", _) => agent.get(&url).header("Authorization", &auth).call()?,
                (_, Some(b)) => agent.post(&url).header("Authorization", &auth).send_json(b)?,
                (_, None) => agent.post(&url).header("Authorization", &auth).send_empty()?,
            };
            let status = resp.status().as_u16();
            Ok((status, resp.body_mut().read_to_string()?))
        })
        .await?
    }

    /// `GET path` as JSON (HTTP 200 required).
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<Json> {
        let (code, body) = self.admin("GET", path, None).await?;
        if code != 200 {
            bail!("GET {path}: HTTP {code}: {body}");
        }
        Ok(serde_json::from_str(&body)?)
    }

    /// `POST path` with a JSON body: the status and the body text.
    pub async fn admin_post(&self, path: &str, body: Json) -> anyhow::Result<(u16, String)> {
        self.admin("POST", path, Some(body)).await
    }

    /// `GET /status` as JSON.
    pub async fn status(&self) -> anyhow::Result<Json> {
        let (code, body) = self.admin("GET", "/status", None).await?;
        if code != 200 {
            bail!("GET /status: HTTP {code}: {body}");
        }
        Ok(serde_json::from_str(&body)?)
    }

    pub async fn metrics(&self) -> anyhow::Result<String> {
        let (code, body) = self.admin("GET", "/metrics", None).await?;
        if code != 200 {
            bail!("GET /metrics: HTTP {code}: {body}");
        }
        Ok(body)
    }

    pub async fn resize(&self, size: usize) -> anyhow::Result<()> {
        let (code, body) = self
            .admin("POST", "/pool/size", Some(serde_json::json!({ "size": size })))
            .await?;
        if code != 200 {
            bail!("POST /pool/size: HTTP {code}: {body}");
        }
        Ok(())
    }

    /// Waits until exactly `n` slots exist and all are idle.
    pub async fn wait_idle(&self, n: usize, limit: Duration) -> anyhow::Result<Json> {
        wait_for(limit, &format!("{n} idle workers"), || async {
            let s = self.status().await.ok()?;
            let pool = &s["pool"];
            (pool["idle"].as_u64() == Some(n as u64) && pool["slots"].as_u64() == Some(n as u64)).then_some(s)
        })
        .await
    }

    /// Pids of the current workers, by slot.
    pub async fn worker_pids(&self) -> anyhow::Result<Vec<(u64, Option<u32>)>> {
        let s = self.status().await?;
        Ok(s["slots"]
            .as_array()
            .context("slots")?
            .iter()
            .map(|w| (w["slot"].as_u64().unwrap_or(0), w["pid"].as_u64().map(|p| p as u32)))
            .collect())
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn merge(base: &mut toml::Table, extra: toml::Table) {
    for (k, v) in extra {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(e)) => merge(b, e),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// `OSPREY_TEST_PIPELINE_DEPTH`, when set, is every test dispatcher's `pool.pipeline_depth`
/// (a test's own overrides still win): CI runs the fault suite again with 1 (no prefetch)
/// beside the default.
pub fn pipeline_depth_from_env(table: &mut toml::Table) {
    let Some(depth) = std::env::var("OSPREY_TEST_PIPELINE_DEPTH")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    else {
        return;
    };
    let mut pool = toml::Table::new();
    pool.insert("pipeline_depth".into(), toml::Value::Integer(depth));
    let mut extra = toml::Table::new();
    extra.insert("pool".into(), toml::Value::Table(pool));
    merge(table, extra);
}

/// A sandbox with a primary and no replica, plus a dispatcher in front of it.
pub struct Cluster {
    pub dispatcher: Dispatcher,
    pub sandbox: Sandbox,
}

impl Cluster {
    pub async fn start(overrides: &str) -> anyhow::Result<Cluster> {
        let sandbox = Sandbox::start(0).await?;
        let dispatcher = Dispatcher::start(sandbox.primary(), overrides).await?;
        Ok(Cluster { dispatcher, sandbox })
    }
}

/// Whether a process exists (not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

impl Dispatcher {
    /// The dispatcher's worker registration socket, `<runtime_dir>/worker-<pid>.sock`.
    pub fn worker_socket(&self) -> PathBuf {
        self.runtime_dir.path().join(format!("worker-{}.sock", self.pid()))
    }

    /// Waits until the dispatcher's and every given client's stream counters balance:
    /// admin `streams.opened == streams.closed`, `clients.open_streams == 0`, and for each
    /// client `stats().streams_opened == streams_closed`. Returns the admin status.
    pub async fn wait_closed_loop(&self, clients: &[&Client], limit: Duration) -> anyhow::Result<Json> {
        let status = wait_for(limit, "closed loop (streams opened == closed, none open)", || async {
            let s = self.status().await.ok()?;
            let opened = s["streams"]["opened"].as_u64()?;
            let closed = s["streams"]["closed"].as_u64()?;
            let open = s["clients"]["open_streams"].as_i64()?;
            let clients_balanced = clients.iter().all(|c| {
                let st = c.stats();
                st.streams_opened == st.streams_closed && st.in_flight == 0
            });
            (opened == closed && open == 0 && clients_balanced).then_some(s)
        })
        .await;
        match status {
            Ok(s) => Ok(s),
            Err(e) => {
                let s = self.status().await.ok();
                let stats: Vec<_> = clients.iter().map(|c| c.stats()).collect();
                bail!(
                    "{e}; admin streams = {:?}, clients = {:?}, client stats = {stats:?}",
                    s.as_ref().map(|s| &s["streams"]),
                    s.as_ref().map(|s| &s["clients"])
                )
            }
        }
    }
}

/// Resident set size of a process in KiB (`VmRSS` in `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

// ---------------------------------------------------------------------------------------
// Restarts and process hygiene (used by tests/tests/restart.rs and chaos.rs).

impl Dispatcher {
    /// The TOML config this dispatcher was started with (runtime_dir included).
    pub fn config(&self) -> &toml::Table {
        &self.config
    }

    /// A second dispatcher with the same config and client port (`SO_REUSEPORT`), for
    /// zero-downtime restarts, with its own admin address so that `status()` of each
    /// dispatcher reaches that one (a shared admin port is answered by either). Ready when
    /// every slot has a registered worker: under load they need not be idle.
    pub async fn start_beside(&self) -> anyhow::Result<Dispatcher> {
        let mut config = self.config.clone();
        if let Some(toml::Value::Table(listen)) = config.get_mut("listen") {
            listen.insert("admin".into(), free_addr().to_string().into());
        }
        let d = Dispatcher::spawn_with(config)?;
        let s = d.wait_registered(Duration::from_secs(30)).await?;
        anyhow::ensure!(
            s["pid"].as_u64() == Some(d.pid() as u64),
            "admin of the new dispatcher answered with pid {} instead of {}",
            s["pid"],
            d.pid()
        );
        Ok(d)
    }

    /// Waits until every slot (`pool.size`) has a registered worker, idle or busy. Unlike
    /// [`Dispatcher::wait_idle`] this is reached under load too: clients may already reach a
    /// new dispatcher through the shared port and keep some of its workers busy.
    pub async fn wait_registered(&self, limit: Duration) -> anyhow::Result<Json> {
        let size = self.pool_size() as u64;
        wait_for(limit, &format!("{size} registered workers"), || async {
            let s = self.status().await.ok()?;
            let pool = &s["pool"];
            let registered = pool["idle"].as_u64()? + pool["busy"].as_u64()?;
            (registered == size && pool["slots"].as_u64() == Some(size)).then_some(s)
        })
        .await
    }

    /// Restarts a dispatcher that has exited (or was killed) with the same config, same
    /// ports, and a fresh runtime dir; waits until its workers are registered.
    pub async fn restart_same(&self) -> anyhow::Result<Dispatcher> {
        let mut config = self.config.clone();
        if let Some(toml::Value::Table(listen)) = config.get_mut("listen") {
            listen.remove("runtime_dir");
        }
        let d = Dispatcher::spawn_with(config)?;
        d.wait_registered(Duration::from_secs(30)).await?;
        Ok(d)
    }

    /// SIGKILL (no drain): the workers must die through their parent-death signal.
    pub async fn kill_hard(&mut self) -> anyhow::Result<()> {
        self.signal(Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(5)).await.map(|_| ())
    }

    /// Live worker processes of this dispatcher, from `/proc` (children named `osprey-worker`).
    pub fn worker_children(&self) -> Vec<u32> {
        workers_of(self.pid())
    }
}

/// `/proc/<pid>/comm` (at most 15 characters), if the process exists.
pub fn process_comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// Parent pid from `/proc/<pid>/stat`.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

fn is_worker(pid: u32) -> bool {
    process_comm(pid).as_deref() == Some("osprey-worker") && process_alive(pid)
}

fn is_dispatcher(pid: u32) -> bool {
    // comm is truncated to 15 characters: "osprey-dispatch".
    process_comm(pid).is_some_and(|c| c.starts_with("osprey-dispatch")) && process_alive(pid)
}

/// Live `osprey-worker` children of `parent`.
pub fn workers_of(parent: u32) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|&p| parent_pid(p) == Some(parent) && is_worker(p))
        .collect()
}

/// Live `osprey-worker` processes whose parent is not a live `osprey-dispatcher` (their
/// dispatcher died and the parent-death signal did not take them), with their parent pid.
pub fn stray_workers() -> Vec<(u32, u32)> {
    all_pids()
        .into_iter()
        .filter(|&p| is_worker(p))
        .filter_map(|p| {
            let parent = parent_pid(p)?;
            (!is_dispatcher(parent)).then_some((p, parent))
        })
        .collect()
}

/// Waits (up to `limit`) until none of `pids` is a live `osprey-worker` and no stray
/// worker exists anywhere on the machine.
pub async fn wait_no_stray_workers(pids: &[u32], limit: Duration) -> anyhow::Result<()> {
    let r = wait_for(limit, "old workers gone and no stray osprey-worker", || async {
        let alive = pids.iter().any(|&p| is_worker(p));
        (!alive && stray_workers().is_empty()).then_some(())
    })
    .await;
    if r.is_err() {
        let alive: Vec<u32> = pids.iter().copied().filter(|&p| is_worker(p)).collect();
        bail!(
            "workers still alive: {alive:?}; strays (pid, parent): {:?}",
            stray_workers()
        );
    }
    Ok(())
}

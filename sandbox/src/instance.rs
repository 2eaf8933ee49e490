//! One `mariadbd` process: start, readiness, signals, clean shutdown and restart.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mysql_async::{Conn, Opts, OptsBuilder};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::config::{server_command, Layout, ServerConfig};
use crate::galera::{self, NodeSpec};
use crate::template::{copy_template, tail_lines};
use crate::{
    ports, process, replication, SandboxError, ADMIN_PASSWORD, ADMIN_USER, APP_DATABASE, APP_PASSWORD, APP_USER,
};

/// How many fresh ports a new instance tries when another process grabs its port first.
const PORT_ATTEMPTS: usize = 8;
/// How many times a restart retries when its (fixed) port is briefly unavailable.
const RESTART_ATTEMPTS: usize = 5;
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// Upper bound for one login attempt while waiting for readiness.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long [`Instance::stop`] waits for every thread of the server to be stopped.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of the error log quoted in errors.
const LOG_TAIL_LINES: usize = 30;

/// Whether an instance is the primary or a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The instance the replicas replicate from.
    Primary,
    /// A GTID (and semi-sync) replica of the primary.
    Replica,
    /// A node of a [`crate::Galera`] cluster: every Synced node can write.
    GaleraNode,
}

/// A running server process. Dropping it SIGKILLs and reaps the process, so no code path
/// (a cancelled future, a panic) can leave a server behind.
#[derive(Debug)]
struct Server {
    child: Child,
    reaped: bool,
}

impl Server {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once the process has exited (and is reaped).
    fn try_wait(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.reaped = true;
                Some(status.to_string())
            }
            Ok(None) => None,
            Err(e) => {
                // ECHILD: someone else reaped it (a broad waitpid(-1) elsewhere).
                self.reaped = true;
                Some(format!("unknown exit status ({e})"))
            }
        }
    }

    fn kill_and_reap(&mut self) {
        if self.reaped {
            return;
        }
        process::signal(self.pid(), Signal::SIGKILL);
        // Blocks only for the moment the kernel takes to tear a SIGKILLed process down.
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// One MariaDB server of a [`crate::Sandbox`].
///
/// All methods take `&self`; the process handle sits behind a mutex. Connections made with
/// [`Instance::opts`] log in as the app account (`osprey` / `osprey-sandbox`, ALL PRIVILEGES
/// on `*.*` but READ_ONLY ADMIN: it cannot write on a read-only server) over TCP to
/// `127.0.0.1`, default database `osprey`. [`Instance::admin_opts`] log in as the admin
/// account, which has everything (replication statements, `SET GLOBAL read_only`, `KILL`).
#[derive(Debug)]
pub struct Instance {
    name: String,
    role: Role,
    server_id: u32,
    port: u16,
    layout: Layout,
    mariadbd: PathBuf,
    config: Arc<ServerConfig>,
    /// Set on a Galera node: its ports, its peers and the provider.
    galera: Option<Arc<NodeSpec>>,
    server: Mutex<Option<Server>>,
}

impl Instance {
    /// Copies the template, starts the server on a free port and waits until the app account
    /// can log in over TCP. Retries on a fresh port when the port was taken meanwhile.
    pub(crate) async fn launch(
        name: String,
        role: Role,
        server_id: u32,
        dir: PathBuf,
        mariadbd: PathBuf,
        config: Arc<ServerConfig>,
        template: PathBuf,
    ) -> Result<Instance, SandboxError> {
        let deadline = Instant::now() + config.ready_timeout;
        let layout = Layout { dir };
        let mut log_tail = String::new();
        for attempt in 1..=PORT_ATTEMPTS {
            prepare_dir(&layout, &template).await?;
            let port = ports::pick_free_port()?;
            let instance = Instance {
                name: name.clone(),
                role,
                server_id,
                port,
                layout: layout.clone(),
                mariadbd: mariadbd.clone(),
                config: config.clone(),
                galera: None,
                server: Mutex::new(None),
            };
            instance.spawn(&[]).await?;
            match instance.wait_ready(deadline).await {
                Ok(()) => return Ok(instance),
                Err(SandboxError::Exited { log_tail: tail, .. }) if ports::log_says_port_in_use(&tail) => {
                    tracing::info!(instance = %name, port, attempt, "port taken by someone else; trying another");
                    log_tail = tail;
                }
                Err(e) => return Err(e),
            }
        }
        Err(SandboxError::NoFreePort {
            instance: name,
            attempts: PORT_ATTEMPTS,
            log_tail,
        })
    }

    /// A Galera node that is not started yet (see [`crate::galera`]).
    pub(crate) fn galera_node(
        name: String,
        server_id: u32,
        layout: Layout,
        mariadbd: PathBuf,
        config: Arc<ServerConfig>,
        spec: Arc<NodeSpec>,
    ) -> Instance {
        Instance {
            name,
            role: Role::GaleraNode,
            server_id,
            port: spec.client_port,
            layout,
            mariadbd,
            config,
            galera: Some(spec),
            server: Mutex::new(None),
        }
    }

    pub(crate) fn galera_spec(&self) -> Option<&NodeSpec> {
        self.galera.as_deref()
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn mariadbd(&self) -> &Path {
        &self.mariadbd
    }

    pub(crate) fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// `primary`, `replica-1`, `replica-2`, ... (`node-1`, ... in a Galera cluster)
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is the primary or a replica.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The server's `server_id` (primary 1, replica *n* is *n* + 1).
    pub fn server_id(&self) -> u32 {
        self.server_id
    }

    /// Always `127.0.0.1`.
    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    /// The TCP port; it stays the same across [`Instance::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The app account's user name, `osprey`.
    pub fn user(&self) -> &str {
        APP_USER
    }

    /// The app account's password, `osprey-sandbox`.
    pub fn password(&self) -> &str {
        APP_PASSWORD
    }

    /// The app database, `osprey`.
    pub fn database(&self) -> &str {
        APP_DATABASE
    }

    /// `mysql://osprey:osprey-sandbox@127.0.0.1:PORT/osprey`.
    ///
    /// For `mysql_async`, prefer [`Instance::opts`], or append `?prefer_socket=false`: by
    /// default the driver silently switches a local TCP connection to the Unix socket.
    pub fn url(&self) -> String {
        format!(
            "mysql://{}:{}@{}:{}/{}",
            APP_USER,
            APP_PASSWORD,
            self.host(),
            self.port,
            APP_DATABASE
        )
    }

    /// Connection options for the app account, with `prefer_socket(false)` so that the
    /// connection really stays on TCP (and goes through any proxy placed in front).
    pub fn opts(&self) -> Opts {
        OptsBuilder::default()
            .ip_or_hostname(self.host())
            .tcp_port(self.port)
            .user(Some(APP_USER))
            .pass(Some(APP_PASSWORD))
            .db_name(Some(APP_DATABASE))
            .prefer_socket(false)
            // Known values, so the driver skips querying them at every connect.
            .max_allowed_packet(Some(16 * 1024 * 1024))
            .wait_timeout(Some(28_800))
            .into()
    }

    /// A new connection with [`Instance::opts`]. There is no connect timeout: against a
    /// SIGSTOPped server this waits until it is continued (wrap it in `tokio::time::timeout`).
    pub async fn conn(&self) -> Result<Conn, SandboxError> {
        Conn::new(self.opts())
            .await
            .map_err(|e| SandboxError::mysql(&self.name, e))
    }

    /// The admin/monitor account's user name, `osprey_admin` (ALL PRIVILEGES, bypasses
    /// `read_only`): for a failover's or a monitor's configuration.
    pub fn monitor_user(&self) -> &str {
        ADMIN_USER
    }

    /// The admin/monitor account's password.
    pub fn monitor_password(&self) -> &str {
        ADMIN_PASSWORD
    }

    /// [`Instance::opts`] for the admin account (no default database).
    pub fn admin_opts(&self) -> Opts {
        OptsBuilder::from_opts(self.opts())
            .user(Some(ADMIN_USER))
            .pass(Some(ADMIN_PASSWORD))
            .db_name(None::<String>)
            .into()
    }

    /// A new admin connection (see [`Instance::admin_opts`]); no connect timeout, as
    /// [`Instance::conn`].
    pub async fn admin_conn(&self) -> Result<Conn, SandboxError> {
        Conn::new(self.admin_opts())
            .await
            .map_err(|e| SandboxError::mysql(&self.name, e))
    }

    /// The server's process id while it runs (`None` after it was killed, shut down or exited).
    pub fn pid(&self) -> Option<u32> {
        let mut guard = self.lock();
        let running = guard.as_mut().is_some_and(|s| s.try_wait().is_none());
        if !running {
            *guard = None;
        }
        guard.as_ref().map(Server::pid)
    }

    /// The instance's directory (datadir `data/`, `error.log`, socket, pid file).
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// The server's data directory.
    pub fn datadir(&self) -> PathBuf {
        self.layout.datadir()
    }

    /// The server's error log.
    pub fn error_log(&self) -> PathBuf {
        self.layout.error_log()
    }

    /// The Unix socket (the app account can log in on it as `osprey@localhost`).
    pub fn socket(&self) -> PathBuf {
        self.layout.socket()
    }

    /// SIGKILLs the server (a crash: no clean shutdown) and reaps it. Blocks only for the
    /// moment the kernel needs to tear the process down. No-op when it is not running.
    pub fn kill(&self) {
        if let Some(mut server) = self.lock().take() {
            tracing::info!(instance = %self.name, pid = server.pid(), "SIGKILL");
            server.kill_and_reap();
        }
    }

    /// SIGSTOPs the server: it keeps its sockets but answers nothing (a hung server).
    /// Returns once every thread of it is stopped, so that nothing sent after this call is
    /// answered until [`Instance::cont`].
    ///
    /// # Panics
    /// When the server does not stop within [`STOP_TIMEOUT`] (a test helper that cannot do
    /// what it promises must not let the test go on).
    pub fn stop(&self) {
        let Some(pid) = self.pid() else { return };
        tracing::info!(instance = %self.name, pid, "SIGSTOP");
        assert!(
            process::stop_and_wait(pid, STOP_TIMEOUT),
            "{}: mariadbd (pid {pid}) did not stop within {STOP_TIMEOUT:?}",
            self.name
        );
    }

    /// SIGCONTs a server stopped with [`Instance::stop`].
    pub fn cont(&self) {
        self.send(Signal::SIGCONT);
    }

    /// Stops the server cleanly (SIGTERM, as `mysqladmin shutdown` would) and waits for it to
    /// exit. If it has not exited within the sandbox's ready timeout it is SIGKILLed and an
    /// error is returned. Ok when it was not running.
    pub async fn shutdown(&self) -> Result<(), SandboxError> {
        // The guard stays owned here: if this future is dropped, `Server::drop` kills the process.
        let Some(mut server) = self.lock().take() else {
            return Ok(());
        };
        let pid = server.pid();
        tracing::info!(instance = %self.name, pid, "shutting down");
        process::signal(pid, Signal::SIGTERM);
        // A stopped server would never see the SIGTERM.
        process::signal(pid, Signal::SIGCONT);
        let deadline = Instant::now() + self.config.ready_timeout;
        while Instant::now() < deadline {
            if server.try_wait().is_some() {
                return Ok(());
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
        server.kill_and_reap();
        Err(SandboxError::NotReady {
            instance: self.name.clone(),
            timeout: self.config.ready_timeout,
            reason: "clean shutdown did not finish; the server was SIGKILLed".into(),
            log_tail: self.log_tail(),
        })
    }

    /// Starts the server again on the same port and datadir (after a clean shutdown if it
    /// still runs, or after a kill) and waits until it is ready: the app account can log in,
    /// and on a replica the SQL thread runs and the IO thread runs or is connecting (the
    /// primary may be down), unless it has no replication configured (a failover promoted it). A replica resumes replication by itself (even if it had been
    /// broken with [`Instance::break_replication`]).
    ///
    /// A Galera node rejoins its cluster: its last committed position is recovered from
    /// InnoDB (`--wsrep-recover`, as `mysqld_safe` does), it asks a Synced peer for what it
    /// missed (IST, or an rsync SST when the peer's cache no longer has it), and this
    /// returns once it is `Synced` again. It needs a Primary component to rejoin.
    pub async fn restart(&self) -> Result<(), SandboxError> {
        self.shutdown().await?;
        let deadline = Instant::now() + self.config.ready_timeout;
        let mut extra = Vec::new();
        if self.galera.is_some() {
            extra.push(galera::recover_position(self).await?);
            // Files and database directories the node created since the cluster started
            // (0700 / 0660, owned by root) must be writable by the joiner's rsync daemon
            // (`nobody` under root), should this restart need a full state transfer.
            galera::open_for_sst(self.dir())?;
        } else if self.config.semi_sync {
            // Semi-sync crash recovery (MariaDB 10.6+, MDEV-21117): a server that was
            // primary and died rolls back and truncates from its binary log the commits no
            // replica acknowledged (prepared, not committed: AFTER_SYNC), so that it can
            // rejoin the new primary instead of carrying a diverged history. Harmless on a
            // server that was a replica.
            extra.push("--init-rpl-role=SLAVE".to_owned());
        }
        for attempt in 1..=RESTART_ATTEMPTS {
            let log_start = file_len(&self.layout.error_log());
            self.spawn(&extra).await?;
            match self.wait_ready(deadline).await {
                Ok(()) => break,
                Err(SandboxError::Exited { .. })
                    if attempt < RESTART_ATTEMPTS && ports::log_says_port_in_use(&self.log_since(log_start)) =>
                {
                    tracing::info!(instance = %self.name, port = self.port, attempt, "port still busy; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // A Galera joiner whose state transfer failed aborts ("Will never receive
                // state"); as an operator would, start it again: it asks for a new one.
                Err(SandboxError::Exited { .. })
                    if attempt < RESTART_ATTEMPTS
                        && self.galera.is_some()
                        && galera::log_says_state_transfer_failed(&self.log_since(log_start)) =>
                {
                    tracing::info!(instance = %self.name, attempt, "state transfer failed; starting the node again");
                    galera::open_for_sst(self.dir())?;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // The joiner's log says only that the transfer failed: the donor's says why.
                Err(SandboxError::Exited {
                    instance,
                    status,
                    mut log_tail,
                }) if self.galera.is_some() && galera::log_says_state_transfer_failed(&log_tail) => {
                    log_tail.push_str(&galera::peers_state_transfer_lines(self.dir()));
                    return Err(SandboxError::Exited {
                        instance,
                        status,
                        log_tail,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        if self.role == Role::Replica {
            replication::wait_running(self, deadline, true).await?;
        }
        if self.galera.is_some() {
            galera::wait_synced(self, deadline).await?;
        }
        Ok(())
    }

    /// `STOP SLAVE` on a replica: it stops applying the primary's changes and falls behind.
    pub async fn break_replication(&self) -> Result<(), SandboxError> {
        replication::break_replication(self).await
    }

    /// `START SLAVE` on a replica and wait (up to the ready timeout) until both replication
    /// threads run.
    pub async fn repair_replication(&self) -> Result<(), SandboxError> {
        replication::repair_replication(self).await
    }

    pub(crate) fn ready_timeout(&self) -> Duration {
        self.config.ready_timeout
    }

    /// The last lines of the error log (and of the captured stderr, if any).
    pub fn log_tail(&self) -> String {
        let mut tail = read_tail(&self.layout.error_log(), 0);
        let stderr = read_tail(&self.stderr_path(), 0);
        if !stderr.trim().is_empty() {
            tail.push_str("\n--- stderr ---\n");
            tail.push_str(&stderr);
        }
        tail
    }

    fn log_since(&self, offset: u64) -> String {
        read_tail(&self.layout.error_log(), offset)
    }

    fn stderr_path(&self) -> PathBuf {
        self.layout.dir.join("stderr.log")
    }

    fn lock(&self) -> MutexGuard<'_, Option<Server>> {
        // A panic while holding the lock cannot leave the Option inconsistent.
        self.server.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, sig: Signal) {
        if let Some(server) = self.lock().as_ref() {
            tracing::info!(instance = %self.name, pid = server.pid(), signal = ?sig, "signal");
            process::signal(server.pid(), sig);
        }
    }

    /// Sends SIGKILL without reaping (used to kill several servers at once on drop).
    pub(crate) fn signal_kill(&self) {
        self.send(Signal::SIGKILL);
    }

    /// Starts the process with the instance's command line plus `extra` arguments.
    pub(crate) async fn spawn(&self, extra: &[String]) -> Result<(), SandboxError> {
        let mut cmd = match &self.galera {
            Some(spec) => {
                galera::open_for_sst(&self.layout.dir)?;
                galera::node_command(&self.mariadbd, &self.config, &self.layout, self.server_id, spec)
            }
            None => server_command(
                &self.mariadbd,
                &self.config,
                &self.layout,
                self.server_id,
                self.port,
                self.role == Role::Primary,
            ),
        };
        cmd.args(extra);
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr_path())
            .map_err(|e| SandboxError::io("opening the server's stderr file", e))?;
        cmd.stderr(Stdio::from(stderr));
        let child = process::spawn(cmd)
            .await
            .map_err(|e| SandboxError::io(format!("starting {}", self.mariadbd.display()), e))?;
        tracing::info!(instance = %self.name, pid = child.id(), port = self.port, dir = %self.layout.dir.display(), "mariadbd started");
        *self.lock() = Some(Server { child, reaped: false });
        Ok(())
    }

    /// Waits until the app account can log in over TCP, or the server exits, or the deadline.
    pub(crate) async fn wait_ready(&self, deadline: Instant) -> Result<(), SandboxError> {
        loop {
            let exited = {
                let mut guard = self.lock();
                match guard.as_mut() {
                    None => Some("not running".to_owned()),
                    Some(server) => server.try_wait(),
                }
            };
            if let Some(status) = exited {
                *self.lock() = None;
                return Err(SandboxError::Exited {
                    instance: self.name.clone(),
                    status,
                    log_tail: self.log_tail(),
                });
            }
            let last_error = match tokio::time::timeout(PROBE_TIMEOUT, Conn::new(self.opts())).await {
                Ok(Ok(conn)) => {
                    let _ = conn.disconnect().await;
                    return Ok(());
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("login timed out after {PROBE_TIMEOUT:?}"),
            };
            if Instant::now() >= deadline {
                return Err(SandboxError::NotReady {
                    instance: self.name.clone(),
                    timeout: self.config.ready_timeout,
                    reason: format!("app account login over TCP failed: {last_error}"),
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }
}

/// A fresh copy of the template as the datadir, and no logs from an earlier attempt.
pub(crate) async fn prepare_dir(layout: &Layout, template: &Path) -> Result<(), SandboxError> {
    let layout = layout.clone();
    let template = template.to_path_buf();
    tokio::task::spawn_blocking(move || {
        if layout.dir.exists() {
            std::fs::remove_dir_all(&layout.dir)
                .map_err(|e| SandboxError::io(format!("clearing {}", layout.dir.display()), e))?;
        }
        std::fs::create_dir_all(&layout.dir)
            .map_err(|e| SandboxError::io(format!("creating {}", layout.dir.display()), e))?;
        copy_template(&template, &layout.datadir())
    })
    .await
    .map_err(|e| SandboxError::io("preparing an instance directory", std::io::Error::other(e)))?
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

pub(crate) fn read_tail(path: &Path, offset: u64) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
            tail_lines(&String::from_utf8_lossy(&bytes[start..]), LOG_TAIL_LINES)
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

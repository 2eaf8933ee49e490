//! Real MariaDB servers for tests, benchmarks and the quickstart.
//!
//! [`Sandbox::start`] runs a primary and N replicas from the installed `mariadbd`, each in its
//! own directory under one temporary directory and on a free loopback port, with GTID
//! replication (`master_use_gtid=slave_pos`, `gtid_strict_mode`, row-based binary logs on every
//! instance) and semi-synchronous replication. When it returns, the app account can log in
//! over TCP on every instance, every replica's IO and SQL threads run, and the primary sees all
//! replicas as semi-sync clients.
//!
//! ```no_run
//! # async fn demo() -> Result<(), osprey_sandbox::SandboxError> {
//! use mysql_async::prelude::Queryable;
//! let sandbox = osprey_sandbox::Sandbox::start(2).await?;
//! let mut conn = sandbox.primary().conn().await?;
//! conn.query_drop("CREATE TABLE t (id INT PRIMARY KEY)").await.unwrap();
//! sandbox.wait_replicas_caught_up(std::time::Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```
//!
//! Accounts: the app account [`APP_USER`] / [`APP_PASSWORD`] has ALL PRIVILEGES on `*.*` from
//! `127.0.0.1` (TCP) and `localhost` (socket) except READ_ONLY ADMIN (it cannot write on a
//! read-only server); the admin account [`ADMIN_USER`] has everything; database [`APP_DATABASE`] exists; replicas log in
//! to the primary as [`REPL_USER`]. `root@localhost` has no password.
//!
//! Clean-up: dropping the [`Sandbox`] (also during a panic) SIGKILLs its servers, reaps them
//! and removes the temporary directory. Every server also has `PR_SET_PDEATHSIG(SIGKILL)`, so
//! it dies with the owning process even on `kill -9` (see the thread caveat in `process.rs`).
//! [`Galera::start`] runs a MariaDB Galera cluster instead (see `galera.rs`): its nodes are
//! [`Instance`]s too, with role [`Role::GaleraNode`].
//!
//! One initialised template datadir per machine is cached in
//! `$TMPDIR/osprey-sandbox-template-*` (see `template.rs`) and is deliberately kept.

mod binaries;
mod config;
mod error;
mod galera;
mod instance;
mod ports;
mod process;
mod replication;
mod template;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub use error::SandboxError;
pub use galera::{Galera, GaleraBuilder, WsrepStatus, WSREP_SYNCED};
pub use instance::{Instance, Role};

use config::ServerConfig;

/// The app account's user name.
pub const APP_USER: &str = "osprey";
/// The app account's password.
pub const APP_PASSWORD: &str = "osprey-sandbox";
/// The database created on every instance.
pub const APP_DATABASE: &str = "osprey";
/// The admin/monitor account: ALL PRIVILEGES (it may write on a read-only server, change
/// replication, kill connections). The app account cannot bypass `read_only`.
pub const ADMIN_USER: &str = "osprey_admin";
/// The admin account's password.
pub const ADMIN_PASSWORD: &str = "osprey-admin-sandbox";
/// The account replicas use to connect to the primary (REPLICATION SLAVE only).
pub const REPL_USER: &str = "repl";
/// The replication account's password.
pub const REPL_PASSWORD: &str = "repl-sandbox";

/// A primary and its replicas, owning their processes and their temporary directory.
#[derive(Debug)]
pub struct Sandbox {
    // Field order matters for drop: the servers go before their directory.
    primary: Instance,
    replicas: Vec<Instance>,
    dir: tempfile::TempDir,
}

impl Sandbox {
    /// Starts a primary and `replicas` replicas with the default settings.
    pub async fn start(replicas: usize) -> Result<Sandbox, SandboxError> {
        Sandbox::builder().replicas(replicas).start().await
    }

    /// A builder for non-default settings.
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder::default()
    }

    /// Finds the binaries and builds the template datadir, so that a later start is fast.
    /// Optional: `start` does it on first use.
    pub async fn prepare() -> Result<(), SandboxError> {
        let bins = binaries::locate()?;
        template::template(&bins).await.map(drop)
    }

    /// The primary.
    pub fn primary(&self) -> &Instance {
        &self.primary
    }

    /// The replicas, `replica-1` first.
    pub fn replicas(&self) -> &[Instance] {
        &self.replicas
    }

    /// The primary, then the replicas.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> {
        std::iter::once(&self.primary).chain(&self.replicas)
    }

    /// The temporary directory holding every instance's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until every replica has applied everything in the primary's binary log at the
    /// time of the call (GTID positions: the primary's `@@gtid_binlog_pos` against each
    /// replica's `@@gtid_slave_pos`, per replication domain, via `MASTER_GTID_WAIT`).
    pub async fn wait_replicas_caught_up(&self, timeout: Duration) -> Result<(), SandboxError> {
        replication::wait_caught_up(&self.primary, &self.replicas, timeout).await
    }

    async fn launch(config: ServerConfig) -> Result<Sandbox, SandboxError> {
        let started = std::time::Instant::now();
        let bins = binaries::locate()?;
        let template = template::template(&bins).await?;
        let dir = tempfile::Builder::new()
            .prefix("osprey-sandbox-")
            .tempdir()
            .map_err(|e| SandboxError::io("creating the sandbox's temporary directory", e))?;
        let config = Arc::new(config);
        let deadline = Instant::now() + config.ready_timeout;

        let names = std::iter::once(("primary".to_owned(), Role::Primary))
            .chain((1..=config.replicas).map(|n| (format!("replica-{n}"), Role::Replica)));
        let launches = names.enumerate().map(|(i, (name, role))| {
            let server_id = i as u32 + 1;
            let instance_dir = dir.path().join(&name);
            Instance::launch(
                name,
                role,
                server_id,
                instance_dir,
                bins.mariadbd.clone(),
                config.clone(),
                template.clone(),
            )
        });
        // On error the instances already started are dropped, which kills them.
        let mut instances = futures::future::try_join_all(launches).await?;
        let replicas = instances.split_off(1);
        let primary = instances.pop().expect("the primary was launched");
        let sandbox = Sandbox { primary, replicas, dir };

        let port = sandbox.primary.port();
        futures::future::try_join_all(sandbox.replicas.iter().map(|r| replication::configure(r, port))).await?;
        futures::future::try_join_all(
            sandbox
                .replicas
                .iter()
                .map(|r| replication::wait_running(r, deadline, false)),
        )
        .await?;
        if config.semi_sync && !sandbox.replicas.is_empty() {
            replication::wait_semi_sync_clients(&sandbox.primary, sandbox.replicas.len(), deadline).await?;
        }
        tracing::info!(
            replicas = sandbox.replicas.len(),
            primary_port = port,
            dir = %sandbox.dir.path().display(),
            elapsed = ?started.elapsed(),
            "MariaDB sandbox ready"
        );
        Ok(sandbox)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // SIGKILL everything first so the servers die in parallel; the instances' own drops
        // then reap them, and the TempDir removes the files.
        for instance in self.instances() {
            instance.signal_kill();
        }
        tracing::debug!(dir = %self.dir.path().display(), "MariaDB sandbox dropped");
    }
}

/// Settings for [`Sandbox::builder`].
#[derive(Debug, Clone, Default)]
pub struct SandboxBuilder {
    config: ServerConfig,
}

impl SandboxBuilder {
    /// Number of replicas (default 0).
    pub fn replicas(mut self, n: usize) -> Self {
        self.config.replicas = n;
        self
    }

    /// `max_connections` on every instance (default 1000; MariaDB's own default is 151).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.config.max_connections = n;
        self
    }

    /// Semi-synchronous replication (default on): a commit on the primary returns once a
    /// replica has acknowledged it, or after [`SandboxBuilder::semi_sync_timeout`].
    pub fn semi_sync(mut self, on: bool) -> Self {
        self.config.semi_sync = on;
        self
    }

    /// `rpl_semi_sync_master_timeout` (default 2 s; MariaDB's default is 10 s): how long a
    /// commit waits for an ack before the primary falls back to asynchronous replication.
    pub fn semi_sync_timeout(mut self, timeout: Duration) -> Self {
        self.config.semi_sync_timeout = timeout;
        self
    }

    /// Deadline for each readiness wait: start, restart, clean shutdown, repair (default 30 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.config.ready_timeout = timeout;
        self
    }

    /// Turns the Performance Schema on (default off, as in MariaDB; it costs memory and
    /// start-up time). The app account may read `performance_schema` either way.
    pub fn performance_schema(mut self, on: bool) -> Self {
        self.config.performance_schema = on;
        self
    }

    /// An extra `mariadbd` option for every instance, e.g. `"--long-query-time=0.1"`.
    pub fn server_arg(mut self, arg: impl Into<String>) -> Self {
        self.config.extra_args.push(arg.into());
        self
    }

    /// TLS on every instance (`--ssl-cert`, `--ssl-key`, `--ssl-ca`: PEM files). Clients may
    /// still connect in clear unless the server is also given
    /// `--require-secure-transport=ON` (see [`SandboxBuilder::server_arg`]).
    pub fn tls(mut self, cert: &Path, key: &Path, ca: &Path) -> Self {
        for (opt, path) in [("ssl-cert", cert), ("ssl-key", key), ("ssl-ca", ca)] {
            self.config.extra_args.push(format!("--{opt}={}", path.display()));
        }
        self
    }

    /// Starts the sandbox; ready when it returns.
    pub async fn start(self) -> Result<Sandbox, SandboxError> {
        Sandbox::launch(self.config).await
    }
}

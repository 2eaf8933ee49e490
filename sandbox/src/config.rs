//! Server settings shared by every instance of a sandbox, and the `mariadbd` command line.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::template::INNODB_LOG_FILE_SIZE;

/// Settings chosen with [`crate::SandboxBuilder`].
#[derive(Debug, Clone)]
pub(crate) struct ServerConfig {
    pub(crate) replicas: usize,
    pub(crate) max_connections: u32,
    pub(crate) semi_sync: bool,
    pub(crate) semi_sync_timeout: Duration,
    pub(crate) ready_timeout: Duration,
    pub(crate) performance_schema: bool,
    pub(crate) extra_args: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            replicas: 0,
            max_connections: 1000,
            semi_sync: true,
            semi_sync_timeout: Duration::from_secs(2),
            ready_timeout: Duration::from_secs(30),
            performance_schema: false,
            extra_args: Vec::new(),
        }
    }
}

/// Where an instance keeps its files.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) dir: std::path::PathBuf,
}

impl Layout {
    pub(crate) fn datadir(&self) -> std::path::PathBuf {
        self.dir.join("data")
    }
    pub(crate) fn socket(&self) -> std::path::PathBuf {
        self.dir.join("mariadbd.sock")
    }
    pub(crate) fn pid_file(&self) -> std::path::PathBuf {
        self.dir.join("mariadbd.pid")
    }
    pub(crate) fn error_log(&self) -> std::path::PathBuf {
        self.dir.join("error.log")
    }
}

/// The command that starts one instance.
pub(crate) fn server_command(
    mariadbd: &Path,
    config: &ServerConfig,
    layout: &Layout,
    server_id: u32,
    port: u16,
    is_primary: bool,
) -> Command {
    let mut cmd = Command::new(mariadbd);
    // `--no-defaults` must come first: no my.cnf from the machine leaks in.
    cmd.arg("--no-defaults");
    if nix::unistd::geteuid().is_root() {
        cmd.arg("--user=root");
    }
    cmd.arg(format!("--datadir={}", layout.datadir().display()))
        .arg(format!("--socket={}", layout.socket().display()))
        .arg(format!("--pid-file={}", layout.pid_file().display()))
        .arg(format!("--log-error={}", layout.error_log().display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--skip-name-resolve")
        .arg(format!("--server-id={server_id}"))
        // Every instance has a binary log with its replicated changes, so any replica can be
        // promoted and the others re-pointed at it by GTID.
        .arg("--log-bin=bin")
        .arg("--log-slave-updates=1")
        .arg("--relay-log=relay")
        .arg("--binlog-format=ROW")
        .arg("--gtid-strict-mode=1")
        // Replicas notice a dead or stopped primary in seconds, not the default minute.
        .arg("--slave-net-timeout=5")
        .arg(format!("--max-connections={}", config.max_connections))
        .arg("--max-allowed-packet=16M")
        .arg("--innodb-buffer-pool-size=64M")
        .arg(format!("--innodb-log-file-size={INNODB_LOG_FILE_SIZE}"))
        // The default (12M) is written out in full at every start.
        .arg("--innodb-temp-data-file-path=ibtmp1:1M:autoextend")
        // Survives a kill -9 of the server (not of the machine), and is much faster.
        .arg("--innodb-flush-log-at-trx-commit=2")
        .arg(format!(
            "--performance-schema={}",
            if config.performance_schema { "ON" } else { "OFF" }
        ));
    // Semi-sync: the primary waits for a replica's ack before a commit returns (up to the
    // timeout, then it falls back to asynchronous until a replica catches up). Only the
    // primary has the master side on: with no replicas connected it would stall each commit
    // for the timeout. A promoted replica needs `SET GLOBAL rpl_semi_sync_master_enabled=1`.
    let master_side = config.semi_sync && is_primary && config.replicas > 0;
    cmd.arg(format!("--rpl-semi-sync-master-enabled={}", u8::from(master_side)))
        .arg(format!("--rpl-semi-sync-slave-enabled={}", u8::from(config.semi_sync)))
        .arg(format!(
            "--rpl-semi-sync-master-timeout={}",
            config.semi_sync_timeout.as_millis()
        ))
        // The commit waits for the ack between the binary log and the engine: a commit the
        // client saw acknowledged is on a replica, and one that was not is only prepared on
        // the primary, so a primary that dies can roll it back when it comes back (see
        // `Instance::restart`). Every instance may become primary, so all get it.
        .arg("--rpl-semi-sync-master-wait-point=AFTER_SYNC");
    if !is_primary {
        // Like a production replica: the app account cannot write here (no READ_ONLY ADMIN).
        cmd.arg("--read-only=1");
    }
    cmd.args(&config.extra_args);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

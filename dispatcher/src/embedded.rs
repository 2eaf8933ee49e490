//! The embedded default (feature `embedded`, on by default): with neither `[backend]` nor
//! `[[cluster]]` in its config, the dispatcher starts a local MariaDB sandbox (a primary
//! and two replicas, `osprey-sandbox`) and fronts it as cluster `sandbox`, for a first run
//! and the README's tour. A dispatcher built with `--no-default-features` links none of the
//! launch code and refuses such a config.

use std::path::Path;

use anyhow::Context;
#[cfg(feature = "embedded")]
use tracing::{info, warn};

#[cfg(not(feature = "embedded"))]
use crate::cluster::ClusterConfig;
#[cfg(feature = "embedded")]
use crate::cluster::{ClusterConfig, FailoverConfig, HealthConfig, MemberConfig, Topology};

/// The running sandbox: it lives (and dies) with the dispatcher.
#[cfg(feature = "embedded")]
pub type Embedded = osprey_sandbox::Sandbox;

/// Without the feature there is never a sandbox.
#[cfg(not(feature = "embedded"))]
pub enum Embedded {}

/// Starts the sandbox and returns it as a cluster.
#[cfg(feature = "embedded")]
pub async fn start() -> anyhow::Result<(ClusterConfig, Embedded)> {
    info!("no [backend] or [[cluster]] configured: starting a local MariaDB sandbox (primary + 2 replicas)");
    let sandbox = osprey_sandbox::Sandbox::start(2)
        .await
        .context("starting the embedded MariaDB sandbox")?;
    let cluster = sandbox_cluster(&sandbox);
    info!(url = %sandbox.primary().url(), "sandbox ready");
    Ok((cluster, sandbox))
}

#[cfg(not(feature = "embedded"))]
pub async fn start() -> anyhow::Result<(ClusterConfig, Embedded)> {
    Err(anyhow::anyhow!(
        "no [backend] or [[cluster]] configured, and this dispatcher was built without the embedded sandbox (cargo feature `embedded`)"
    ))
    .context("choosing the clusters to front")
}

#[cfg(not(feature = "embedded"))]
pub fn write_members_file(sandbox: &Embedded, _dir: &Path) {
    match *sandbox {}
}

#[cfg(feature = "embedded")]
/// The embedded default: the sandbox as cluster `sandbox`, with failover on.
fn sandbox_cluster(sandbox: &Embedded) -> ClusterConfig {
    let p = sandbox.primary();
    ClusterConfig {
        name: "sandbox".into(),
        topology: Topology::Replication,
        user: p.user().to_string(),
        password: p.password().to_string(),
        database: Some(p.database().to_string()),
        // The app account cannot set read_only (nor write on a read-only member): the
        // monitor and the failover log in as the sandbox's admin account.
        monitor_user: Some(p.monitor_user().to_string()),
        monitor_password: Some(p.monitor_password().to_string()),
        replication_user: Some(osprey_sandbox::REPL_USER.into()),
        replication_password: Some(osprey_sandbox::REPL_PASSWORD.into()),
        connect_timeout_ms: 5_000,
        session_reset: Default::default(),
        ssl_mode: Default::default(),
        ssl_ca: None,
        ssl_server_name: None,
        // The tour shows reads on the replicas.
        read_split: true,
        read_fallback: Default::default(),
        members: sandbox
            .instances()
            .map(|i| MemberConfig::new(i.name(), i.host(), i.port()))
            .collect(),
        health: HealthConfig::default(),
        failover: FailoverConfig {
            // A tour shows several failovers in a row.
            cooldown_s: 10,
            ..FailoverConfig::default()
        },
        // The tour shows a lagging replica leaving the read pool.
        delay_period_ms: Some(500),
        delay_threshold_ms: Some(1000),
        delay_database: Some("osprey".into()),
    }
}

#[cfg(feature = "embedded")]
/// `<runtime_dir>/sandbox`: one line per embedded server, `name pid port datadir`, so that
/// the README's tour (and an operator) can kill -9 or stop a member of the sandbox.
pub fn write_members_file(sandbox: &Embedded, dir: &Path) {
    let text: String = sandbox
        .instances()
        .map(|i| {
            format!(
                "{} {} {} {}\n",
                i.name(),
                i.pid().map_or_else(|| "-".into(), |p| p.to_string()),
                i.port(),
                i.datadir().display()
            )
        })
        .collect();
    let path = dir.join("sandbox");
    match std::fs::write(&path, text) {
        Ok(()) => info!(file = %path.display(), "sandbox members listed"),
        Err(e) => warn!(file = %path.display(), "cannot list the sandbox members: {e}"),
    }
}

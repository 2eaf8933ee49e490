//! A replication cluster behind fault proxies, with a dispatcher in front and a
//! writer through it: the stage of the failover tests.
//!
//! Every member sits behind its own [`FaultProxy`]; the dispatcher (workers, monitor,
//! failover) *and the replicas' IO threads* reach a member only through its proxy, so
//! a blackholed proxy cuts the member off from everything, as a network cut would.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mysql_async::prelude::Queryable;
use osprey_client::{Client, ClientConfig, Value};
use osprey_sandbox::{Instance, Sandbox};
use serde_json::Value as Json;

use crate::fault_proxy::FaultProxy;
use crate::harness::{free_addr, wait_for, Dispatcher};

/// Fast probes for `[[cluster]]`, so that the suite stays quick: a dead primary is seen in
/// ~0.3 s, and nothing holds a failover back (no cooldown, no lock).
pub const FAST: &str = r#"
[cluster.health]
interval_ms = 100
window_ms = 1000
fail_threshold = 3
recover_successes = 3
[cluster.failover]
cooldown_s = 0
catchup_timeout_ms = 5000
lock = "none"
"#;

/// The sandbox, one proxy per instance (primary first), and the member names.
pub struct Rig {
    pub sandbox: Sandbox,
    pub proxies: Vec<FaultProxy>,
    pub names: Vec<String>,
}

impl Rig {
    /// A primary and `replicas` replicas (semi-sync), each behind a proxy, replication
    /// re-pointed through the proxies.
    pub async fn start(replicas: usize) -> anyhow::Result<Rig> {
        let sandbox = Sandbox::start(replicas).await?;
        let mut proxies = Vec::new();
        for i in sandbox.instances() {
            proxies.push(FaultProxy::start(format!("{}:{}", i.host(), i.port()).parse()?).await?);
        }
        let names = sandbox.instances().map(|i| i.name().to_string()).collect();
        let rig = Rig {
            sandbox,
            proxies,
            names,
        };
        let primary_proxy = rig.proxies[0].addr();
        for r in rig.sandbox.replicas() {
            point_replica(r, primary_proxy.port()).await?;
        }
        rig.sandbox.wait_replicas_caught_up(Duration::from_secs(20)).await?;
        Ok(rig)
    }

    pub fn instance(&self, name: &str) -> &Instance {
        self.sandbox
            .instances()
            .find(|i| i.name() == name)
            .expect("a member of the rig")
    }

    pub fn proxy(&self, name: &str) -> &FaultProxy {
        let i = self.names.iter().position(|n| n == name).expect("a member of the rig");
        &self.proxies[i]
    }

    /// `[[cluster]]` TOML for this rig named `cluster`, members through the proxies;
    /// `extra` goes inside the cluster table (e.g. health settings).
    pub fn cluster_toml(&self, cluster: &str, extra: &str) -> String {
        let members = self
            .names
            .iter()
            .zip(&self.proxies)
            .map(|(n, p)| (n.as_str(), p.addr().port()));
        cluster_toml(self.sandbox.primary(), cluster, extra, members)
    }
}

/// `[[cluster]]` TOML (topology `replication`) named `cluster`, with the sandbox's
/// accounts (those of `primary`) and `members` as (name, port) on 127.0.0.1; `extra` goes
/// inside the cluster table, before the members.
pub fn cluster_toml<'a>(
    primary: &Instance,
    cluster: &str,
    extra: &str,
    members: impl IntoIterator<Item = (&'a str, u16)>,
) -> String {
    let p = primary;
    let mut s = format!(
        r#"
[[cluster]]
name = "{cluster}"
topology = "replication"
user = "{user}"
password = "{password}"
database = "{db}"
monitor_user = "{mu}"
monitor_password = "{mp}"
replication_user = "{ru}"
replication_password = "{rp}"
connect_timeout_ms = 1000
{extra}
"#,
        user = p.user(),
        password = p.password(),
        db = p.database(),
        mu = p.monitor_user(),
        mp = p.monitor_password(),
        ru = osprey_sandbox::REPL_USER,
        rp = osprey_sandbox::REPL_PASSWORD,
    );
    for (name, port) in members {
        s.push_str(&format!(
            "[[cluster.member]]\nname = \"{name}\"\nhost = \"127.0.0.1\"\nport = {port}\n"
        ));
    }
    s
}

/// Points a replica's IO thread at `port` (a proxy), GTID positions kept.
pub async fn point_replica(replica: &Instance, port: u16) -> anyhow::Result<()> {
    let mut c = replica.admin_conn().await?;
    c.query_drop("STOP SLAVE").await?;
    c.query_drop(format!(
        "CHANGE MASTER TO master_host='127.0.0.1', master_port={port}, master_use_gtid=slave_pos, \
         master_heartbeat_period=0.5, master_connect_retry=1"
    ))
    .await?;
    c.query_drop("START SLAVE").await?;
    Ok(())
}

/// Base dispatcher config (no `[backend]`) with `clusters` TOML appended.
pub fn dispatcher_config(clusters: &str, overrides: &str) -> toml::Table {
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
respawn_backoff_max_ms = 1000
queue_timeout_ms = 15000
worker_log = "warn"
{clusters}
"#,
        client = free_addr(),
        admin = free_addr(),
    );
    let mut table: toml::Table = base.parse().expect("base config parses");
    crate::harness::pipeline_depth_from_env(&mut table);
    let extra: toml::Table = overrides.parse().expect("override TOML parses");
    crate::harness::merge(&mut table, extra);
    table
}

/// `GET /cluster` of the dispatcher's first cluster (or `name`).
pub async fn cluster_view(d: &Dispatcher, name: Option<&str>) -> anyhow::Result<Json> {
    let path = match name {
        Some(n) => format!("/cluster?cluster={n}"),
        None => "/cluster".into(),
    };
    let v = d.admin_get(&path).await?;
    v["clusters"][0].as_object().context("no cluster in /cluster")?;
    Ok(v["clusters"][0].clone())
}

/// Waits until the cluster's primary is `want` (any member but `not`, when `want` is None).
pub async fn wait_primary(
    d: &Dispatcher,
    cluster: Option<&str>,
    want: Option<&str>,
    not: Option<&str>,
    limit: Duration,
) -> anyhow::Result<String> {
    let r = wait_for(limit, &format!("primary {want:?} (not {not:?})"), || async {
        let v = cluster_view(d, cluster).await.ok()?;
        let p = v["primary"].as_str()?.to_string();
        let ok = want.is_none_or(|w| w == p) && not.is_none_or(|n| n != p);
        // The write slots must be on it too.
        let slots_on = v["write_pool"]["member"].as_str() == Some(p.as_str());
        (ok && slots_on).then_some(p)
    })
    .await;
    if r.is_err() {
        // What the dispatcher saw, so that a failure on CI can be read afterwards.
        let view = cluster_view(d, cluster).await.map(|v| v.to_string());
        let events = d.admin_get("/cluster/events").await.map(|v| v.to_string());
        eprintln!("cluster view at the timeout: {view:?}\nevents: {events:?}");
    }
    r
}

/// What the writer saw.
#[derive(Debug, Default)]
pub struct WriterReport {
    /// Ids whose INSERT was acknowledged (END received).
    pub acked: BTreeSet<u64>,
    /// Errors with `dispatched = false` (never reached a database): must be 0 through a
    /// switch (they should have waited).
    pub undispatched_errors: Vec<String>,
    /// Errors with `dispatched = true` (outcome unknown: in flight on the dead primary).
    pub dispatched_errors: Vec<String>,
    /// Longest time between two acknowledged writes.
    pub longest_gap: Duration,
    /// For each acknowledged id: when its INSERT was sent and when it was acknowledged.
    pub ack_times: Vec<(u64, Instant, Instant)>,
}

impl WriterReport {
    /// How long after `t` the first write *sent* after `t` was acknowledged: the write gap
    /// of a fault at `t` (a write already in flight at `t` may still be acknowledged by the
    /// dying primary and says nothing about the new one).
    pub fn first_ack_after(&self, t: Instant) -> Option<Duration> {
        self.ack_times
            .iter()
            .find(|(_, sent, _)| *sent > t)
            .map(|(_, _, acked)| *acked - t)
    }
}

/// A task inserting increasing ids into `osprey.failover_ids` through the dispatcher,
/// one at a time, until stopped.
pub struct Writer {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<WriterReport>,
    pub next: Arc<AtomicU64>,
    last_ack: Arc<Mutex<Instant>>,
    /// When the last acknowledged write was sent.
    last_sent_ack: Arc<Mutex<Instant>>,
}

impl Writer {
    /// Creates the table (through `client`) and starts writing.
    pub async fn start(config: ClientConfig, cluster: Option<&str>) -> anyhow::Result<Writer> {
        let mut config = config;
        config.cluster = cluster.map(str::to_owned);
        config.request_timeout = Some(Duration::from_secs(20));
        // The SDK's own retries of undispatched requests would hide what the dispatcher
        // did: every error is seen and counted here.
        config.max_retries = 0;
        let client = Client::connect(config).await?;
        client
            .execute(
                "CREATE TABLE IF NOT EXISTS failover_ids (id BIGINT PRIMARY KEY) ENGINE=InnoDB",
                &[],
            )
            .await?;
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(1));
        let last_ack = Arc::new(Mutex::new(Instant::now()));
        let last_sent_ack = Arc::new(Mutex::new(Instant::now()));
        let handle = tokio::spawn(write_loop(
            client,
            stop.clone(),
            next.clone(),
            last_ack.clone(),
            last_sent_ack.clone(),
        ));
        Ok(Writer {
            stop,
            handle,
            next,
            last_ack,
            last_sent_ack,
        })
    }

    /// Waits until `n` more writes were acknowledged.
    pub async fn wait_progress(&self, n: u64, limit: Duration) -> anyhow::Result<()> {
        let start = self.next.load(Ordering::Relaxed);
        wait_for(limit, &format!("{n} more acknowledged writes"), || async {
            (self.next.load(Ordering::Relaxed) >= start + n).then_some(())
        })
        .await
    }

    /// When the last write was acknowledged.
    pub fn last_ack(&self) -> Instant {
        *self.last_ack.lock().unwrap()
    }

    /// When the last acknowledged write was sent (after a fault at `t`: it says the new
    /// primary serves once this is after `t`).
    pub fn last_sent_ack(&self) -> Instant {
        *self.last_sent_ack.lock().unwrap()
    }

    pub async fn stop(self) -> anyhow::Result<WriterReport> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.handle.await?)
    }
}

async fn write_loop(
    client: Client,
    stop: Arc<AtomicBool>,
    next: Arc<AtomicU64>,
    last_ack: Arc<Mutex<Instant>>,
    last_sent_ack: Arc<Mutex<Instant>>,
) -> WriterReport {
    let mut report = WriterReport::default();
    let mut id = 1u64;
    let mut prev = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        match client
            .execute("INSERT INTO failover_ids (id) VALUES (?)", &[Value::UInt(id)])
            .await
        {
            Ok(_) => {
                report.acked.insert(id);
                let now = Instant::now();
                report.ack_times.push((id, sent, now));
                report.longest_gap = report.longest_gap.max(now - prev);
                prev = now;
                *last_ack.lock().unwrap() = now;
                *last_sent_ack.lock().unwrap() = sent;
                id += 1;
                next.store(id, Ordering::Relaxed);
            }
            Err(e) => {
                let dispatched = e.dispatched();
                let text = format!("id {id}: {e}");
                if dispatched {
                    report.dispatched_errors.push(text);
                } else {
                    report.undispatched_errors.push(text);
                }
                // Outcome unknown: the row may or may not be there; never reuse the id.
                id += 1;
                next.store(id, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    report
}

/// Every acknowledged id is on `instance` (counted there, directly).
pub async fn assert_no_lost_writes(instance: &Instance, report: &WriterReport) -> anyhow::Result<usize> {
    let mut c = instance.conn().await?;
    let ids: Vec<u64> = c.query("SELECT id FROM failover_ids").await?;
    let present: BTreeSet<u64> = ids.into_iter().collect();
    let lost: Vec<u64> = report.acked.difference(&present).copied().collect();
    if !lost.is_empty() {
        bail!(
            "{} acknowledged writes missing on {}: {:?}",
            lost.len(),
            instance.name(),
            &lost[..lost.len().min(20)]
        );
    }
    Ok(report.acked.len())
}

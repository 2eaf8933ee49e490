//! Following a primary the backend elects itself, end to end: a real three-node
//! MariaDB Galera cluster behind the dispatcher (topology `galera`), a writer through
//! Osprey, and the writer node killed.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_sandbox::Galera;
use osprey_tests::failover_rig::{assert_no_lost_writes, cluster_view, dispatcher_config, wait_primary, Writer};
use osprey_tests::harness::Dispatcher;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_galera_writer_killed_moves_the_writes_with_no_undispatched_error() -> anyhow::Result<()> {
    let galera = Galera::start(3).await?;
    let first = galera.node(0);
    let mut toml = format!(
        r#"
[[cluster]]
name = "g"
topology = "galera"
user = "{user}"
password = "{password}"
database = "{db}"
connect_timeout_ms = 1000
[cluster.health]
interval_ms = 100
window_ms = 1000
fail_threshold = 3
"#,
        user = first.user(),
        password = first.password(),
        db = first.database(),
    );
    for n in galera.nodes() {
        toml.push_str(&format!(
            "[[cluster.member]]\nname = \"{}\"\nhost = \"{}\"\nport = {}\n",
            n.name(),
            n.host(),
            n.port()
        ));
    }
    let d = Dispatcher::start_with(dispatcher_config(&toml, "")).await?;
    let writer_node = wait_primary(&d, None, None, None, Duration::from_secs(20)).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(30, Duration::from_secs(20)).await?;
    let killed = Instant::now();
    galera
        .nodes()
        .iter()
        .find(|n| n.name() == writer_node)
        .expect("the writer is a node")
        .kill();
    let new = wait_primary(&d, None, None, Some(&writer_node), Duration::from_secs(10)).await?;
    let moved = killed.elapsed();
    writer.wait_progress(30, Duration::from_secs(20)).await?;
    let report = writer.stop().await?;
    let gap = report.first_ack_after(killed).expect("a write after the kill");
    println!(
        "galera: writes moved {writer_node} -> {new} in {moved:?}; first write after the kill {gap:?}; \
         {} acked, {} outcome-unknown, {} undispatched errors",
        report.acked.len(),
        report.dispatched_errors.len(),
        report.undispatched_errors.len()
    );
    assert!(
        report.undispatched_errors.is_empty(),
        "{:?}",
        report.undispatched_errors
    );
    // Synchronous replication: every acknowledged row is on every node still in the cluster.
    for n in galera.nodes().iter().filter(|n| n.name() != writer_node) {
        assert_no_lost_writes(n, &report).await?;
    }
    let v = cluster_view(&d, None).await?;
    assert_eq!(v["topology"], "galera");
    let killed_view = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == writer_node.as_str())
        .cloned()
        .unwrap();
    assert_ne!(killed_view["role"], "primary");
    // Only the chosen node took the writes after the move (one writer at a time).
    let mut c = galera.nodes().iter().find(|n| n.name() == new).unwrap().conn().await?;
    let n: u64 = c.query_first("SELECT COUNT(*) FROM failover_ids").await?.unwrap_or(0);
    assert!(n as usize >= report.acked.len());
    Ok(())
}

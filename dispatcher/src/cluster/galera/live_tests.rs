//! The provider against a real three-node Galera cluster (`osprey_sandbox::Galera`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_sandbox::Galera;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::spawn_galera;
use crate::cluster::config::{ClusterConfig, HealthConfig, MemberConfig, Topology};
use crate::cluster::events::EventLog;
use crate::cluster::view::{ClusterView, Command, MemberHealth, Role};
use crate::metrics::{MemberLabel, Metrics};

const INTERVAL_MS: u64 = 200;
/// Slack over one interval for a move: the round's own probe timeouts and a loaded machine.
const MOVE_BUDGET: Duration = Duration::from_millis(INTERVAL_MS * 3);
/// The probe in a row that, timing out, takes a node out: 3 are borne, so that a loaded
/// machine's slow probe (in a run of them: after a timeout the next probe connects again)
/// moves nothing.
const FAIL_THRESHOLD: u32 = 4;
/// A hung writer: up to an interval to the first probe, `FAIL_THRESHOLD` timed-out probes
/// an interval apart, and one interval more than [`MOVE_BUDGET`]'s slack (ticks drift on a
/// loaded machine).
const HUNG_BUDGET: Duration = Duration::from_millis(INTERVAL_MS * (FAIL_THRESHOLD as u64 + 3));

fn config(galera: &Galera, priorities: &[u32]) -> ClusterConfig {
    ClusterConfig {
        name: "g".into(),
        topology: Topology::Galera,
        user: osprey_sandbox::APP_USER.into(),
        password: osprey_sandbox::APP_PASSWORD.into(),
        database: None,
        monitor_user: None,
        monitor_password: None,
        replication_user: None,
        replication_password: None,
        connect_timeout_ms: 1_000,
        session_reset: Default::default(),
        ssl_mode: Default::default(),
        ssl_ca: None,
        ssl_server_name: None,
        read_split: false,
        read_fallback: Default::default(),
        members: galera
            .nodes()
            .iter()
            .zip(priorities)
            .map(|(n, p)| MemberConfig {
                priority: *p,
                ..MemberConfig::new(n.name(), n.host(), n.port())
            })
            .collect(),
        health: HealthConfig {
            interval_ms: INTERVAL_MS,
            window_ms: 2_000,
            fail_threshold: FAIL_THRESHOLD,
            recover_successes: 3,
            ..Default::default()
        },
        failover: Default::default(),
        delay_period_ms: None,
        delay_threshold_ms: None,
        delay_database: None,
    }
}

async fn wait_view(
    rx: &mut watch::Receiver<ClusterView>,
    within: Duration,
    what: &str,
    ok: impl Fn(&ClusterView) -> bool,
) -> ClusterView {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        {
            let v = rx.borrow_and_update();
            if ok(&v) {
                return v.clone();
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            _ => panic!("{what}: not within {within:?}; last view: {:#?}", *rx.borrow()),
        }
    }
}

/// The writer the cluster's own order picks: lowest local index among the nodes.
async fn lowest_index_node(galera: &Galera, among: &[usize]) -> usize {
    let mut best = (u32::MAX, 0);
    for &i in among {
        let idx = galera.node(i).wsrep_status().await.unwrap().local_index.unwrap();
        best = best.min((idx, i));
    }
    best.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_the_synced_nodes_of_a_real_galera_cluster() {
    let galera = Galera::start(3).await.expect("galera cluster");
    println!("galera sandbox started in {:?}", galera.start_time());
    // Equal priorities: the lowest wsrep_local_index wins.
    let cfg = config(&galera, &[0, 0, 0]);
    let (_cfg_tx, cfg_rx) = watch::channel(Arc::new(cfg));
    let events = Arc::new(EventLog::default());
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let health: Vec<(String, watch::Receiver<MemberHealth>)> = Vec::new();
    let handle = spawn_galera(cfg_rx, health, events.clone(), metrics.clone(), shutdown.clone());
    let mut view = handle.view.clone();

    let expected = galera
        .node(lowest_index_node(&galera, &[0, 1, 2]).await)
        .name()
        .to_owned();
    let v = wait_view(&mut view, Duration::from_secs(5), "first writer", |v| {
        v.primary.is_some()
    })
    .await;
    assert_eq!(v.primary.as_deref(), Some(expected.as_str()), "{v:#?}");
    assert_eq!(v.epoch, 1);
    assert!(v.members.iter().all(|m| m.state.as_deref() == Some("Synced")), "{v:#?}");
    assert_eq!(v.members.iter().filter(|m| m.role == Role::Primary).count(), 1);
    let gauge = |m: &str| {
        metrics
            .galera_writer
            .get_or_create(&MemberLabel {
                cluster: "g".into(),
                member: m.into(),
            })
            .get()
    };
    assert_eq!(gauge(&expected), 1);

    // kill -9 the writer: the next round moves the writes to another Synced node.
    let writer_i = galera.nodes().iter().position(|n| n.name() == expected).unwrap();
    let killed_at = Instant::now();
    galera.node(writer_i).kill();
    let v = wait_view(&mut view, MOVE_BUDGET, "writer moved after kill -9", |v| {
        v.primary.is_some() && v.primary.as_deref() != Some(expected.as_str())
    })
    .await;
    let moved_in = killed_at.elapsed();
    println!(
        "kill -9 of {expected} -> writer {:?} after {moved_in:?} (interval {INTERVAL_MS} ms)",
        v.primary
    );
    let rest: Vec<usize> = (0..3).filter(|&i| i != writer_i).collect();
    let new_writer = v.primary.clone().unwrap();
    assert!(rest.iter().any(|&i| galera.node(i).name() == new_writer));
    assert_eq!(v.epoch, 2);
    let killed_view = v.member(&expected).unwrap();
    assert_eq!(killed_view.role, Role::Detached);
    assert!(
        killed_view.reason.as_deref().unwrap_or("").starts_with("unreachable"),
        "{killed_view:?}"
    );
    let ev = events.list(Some("g"));
    let last = ev.last().expect("a followed event");
    assert_eq!(last.kind, "followed");
    assert_eq!(last.old_primary.as_deref(), Some(expected.as_str()));
    assert_eq!(last.new_primary.as_deref(), Some(new_writer.as_str()));
    assert_eq!(gauge(&expected), 0);
    assert_eq!(gauge(&new_writer), 1);

    // The new writer takes writes once Galera has evicted the dead node.
    let new_i = galera.nodes().iter().position(|n| n.name() == new_writer).unwrap();
    let mut c = galera.node(new_i).conn().await.unwrap();
    c.query_drop("CREATE TABLE osprey.w (id INT PRIMARY KEY)")
        .await
        .unwrap();
    c.query_drop("INSERT INTO osprey.w VALUES (1)").await.unwrap();
    // Galera holds commits until it has evicted the dead node (evs.suspect_timeout).
    println!(
        "first write acknowledged by {new_writer} {:?} after the kill",
        killed_at.elapsed()
    );

    // The killed node comes back Synced: same priority, so the writes stay where they are.
    galera.node(writer_i).restart().await.expect("rejoin");
    let v = wait_view(&mut view, Duration::from_secs(10), "restarted node Synced again", |v| {
        v.member(&expected).is_some_and(|m| m.role == Role::Replica)
    })
    .await;
    assert_eq!(v.primary.as_deref(), Some(new_writer.as_str()));
    // A few more rounds than the failback streak: still no move.
    tokio::time::sleep(Duration::from_millis(INTERVAL_MS * 5)).await;
    let v = view.borrow().clone();
    let moves = || {
        events
            .list(Some("g"))
            .iter()
            .map(|e| format!("{:?} -> {:?}: {:?}", e.old_primary, e.new_primary, e.detail))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        v.primary.as_deref(),
        Some(new_writer.as_str()),
        "no failback at equal priority: {:#?}",
        moves()
    );
    assert_eq!(v.epoch, 2, "{:#?}", moves());

    // Desync the writer: it is Donor/Desynced, so the writes leave it, and it is not chosen.
    let mut c = galera.node(new_i).conn().await.unwrap();
    c.query_drop("SET GLOBAL wsrep_desync = ON").await.unwrap();
    let v = wait_view(&mut view, MOVE_BUDGET * 2, "writer moved off the desynced node", |v| {
        v.primary.is_some() && v.primary.as_deref() != Some(new_writer.as_str())
    })
    .await;
    let desynced = v.member(&new_writer).unwrap();
    assert_eq!(desynced.role, Role::Detached, "{desynced:?}");
    assert!(
        desynced.reason.as_deref().unwrap_or("").contains("not Synced"),
        "{desynced:?}"
    );
    println!(
        "desynced {new_writer}: {:?}; writer now {:?}",
        desynced.reason, v.primary
    );

    // A switchover to the desynced node is refused; to the other Synced node it works.
    let (tx, rx) = oneshot::channel();
    handle
        .commands
        .send(Command::Switchover {
            to: Some(new_writer.clone()),
            reply: tx,
        })
        .await
        .unwrap();
    let refused = rx.await.unwrap();
    assert!(refused.is_err(), "{refused:?}");
    let third = (0..3)
        .map(|i| galera.node(i).name().to_owned())
        .find(|n| *n != new_writer && Some(n) != v.primary.as_ref())
        .unwrap();
    let (tx, rx) = oneshot::channel();
    handle
        .commands
        .send(Command::Switchover {
            to: Some(third.clone()),
            reply: tx,
        })
        .await
        .unwrap();
    let ev = rx.await.unwrap().expect("switchover to a Synced node");
    assert_eq!(ev.new_primary.as_deref(), Some(third.as_str()));
    assert_eq!(view.borrow().primary.as_deref(), Some(third.as_str()));

    // Without a target: the next eligible node, never the desynced one.
    let before = v.primary.clone().unwrap();
    let (tx, rx) = oneshot::channel();
    handle
        .commands
        .send(Command::Switchover { to: None, reply: tx })
        .await
        .unwrap();
    let ev = rx.await.unwrap().expect("switchover to the next Synced node");
    assert_eq!(ev.new_primary.as_deref(), Some(before.as_str()));
    assert_eq!(ev.kind, "switchover");

    // Synced again: it serves reads, and the pinned writer keeps the writes.
    c.query_drop("SET GLOBAL wsrep_desync = OFF").await.unwrap();
    let v = wait_view(&mut view, Duration::from_secs(5), "desynced node Synced again", |v| {
        v.member(&new_writer).is_some_and(|m| m.role == Role::Replica)
    })
    .await;
    assert_eq!(v.primary.as_deref(), Some(before.as_str()));
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_decides_and_a_lower_priority_node_takes_the_writes_back() {
    let galera = Galera::start(3).await.expect("galera cluster");
    // node-3 is preferred, whatever its index.
    let cfg = config(&galera, &[5, 5, 1]);
    let (_cfg_tx, cfg_rx) = watch::channel(Arc::new(cfg));
    let events = Arc::new(EventLog::default());
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let handle = spawn_galera(cfg_rx, Vec::new(), events.clone(), metrics, shutdown.clone());
    let mut view = handle.view.clone();
    let v = wait_view(&mut view, Duration::from_secs(5), "first writer", |v| {
        v.primary.is_some()
    })
    .await;
    assert_eq!(v.primary.as_deref(), Some("node-3"));

    galera.node(2).kill();
    let killed_at = Instant::now();
    let v = wait_view(&mut view, MOVE_BUDGET, "writer moved", |v| {
        v.primary.is_some() && v.primary.as_deref() != Some("node-3")
    })
    .await;
    println!(
        "kill -9 of node-3 -> writer {:?} after {:?}",
        v.primary,
        killed_at.elapsed()
    );
    // Equal priorities among the survivors: the lower local index of the view the round
    // saw (indexes are renumbered when Galera evicts the dead node), so either survivor.
    assert!(
        v.primary.as_deref() == Some("node-1") || v.primary.as_deref() == Some("node-2"),
        "{v:#?}"
    );

    // Back and Synced for recover_successes rounds: its lower priority takes the writes back.
    galera.node(2).restart().await.expect("rejoin");
    let back = Instant::now();
    let v = wait_view(&mut view, Duration::from_secs(10), "failback to node-3", |v| {
        v.primary.as_deref() == Some("node-3")
    })
    .await;
    println!("node-3 Synced again -> writes back after {:?}", back.elapsed());
    let last = events.list(Some("g")).last().cloned().unwrap();
    assert_eq!(last.kind, "followed");
    assert!(
        last.detail.as_deref().unwrap_or("").contains("lower priority"),
        "{last:?}"
    );
    // Kill, then failback: two moves at least. Under a loaded machine probe timeouts can
    // add moves (each one logged and correct); the test asserts where the writes end up.
    assert!(v.epoch >= 3, "{v:#?}");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_writer_or_one_its_monitor_marks_down_loses_the_writes() {
    use crate::cluster::view::HealthState;
    let galera = Galera::start(3).await.expect("galera cluster");
    let cfg = config(&galera, &[0, 1, 2]);
    let (_cfg_tx, cfg_rx) = watch::channel(Arc::new(cfg));
    let mut health_tx = Vec::new();
    let mut health = Vec::new();
    for n in galera.nodes() {
        let (tx, rx) = watch::channel(MemberHealth::default());
        health_tx.push(tx);
        health.push((n.name().to_owned(), rx));
    }
    let shutdown = CancellationToken::new();
    let handle = spawn_galera(
        cfg_rx,
        health,
        Arc::new(EventLog::default()),
        Arc::new(Metrics::new()),
        shutdown.clone(),
    );
    let mut view = handle.view.clone();
    let v = wait_view(&mut view, Duration::from_secs(5), "first writer", |v| {
        v.primary.is_some()
    })
    .await;
    assert_eq!(v.primary.as_deref(), Some("node-1"), "priority 0");

    // A stall shorter than `fail_threshold` probes: the writer is late once (SIGCONT as soon
    // as the view says so), keeps the writes, and is on time again at the next round.
    galera.node(0).stop();
    let v = wait_view(&mut view, MOVE_BUDGET * 2, "writer late", |v| {
        v.member("node-1")
            .is_some_and(|m| m.reason.as_deref().is_some_and(|r| r.starts_with("late:")))
    })
    .await;
    galera.node(0).cont();
    let late = v.member("node-1").unwrap();
    assert_eq!(late.role, Role::Primary, "{late:?}");
    assert!(late.reason.as_deref().unwrap().contains("timed out"), "{late:?}");
    let v = wait_view(&mut view, MOVE_BUDGET, "writer on time again", |v| {
        v.member("node-1").is_some_and(|m| m.reason.is_none())
    })
    .await;
    assert_eq!(v.primary.as_deref(), Some("node-1"));
    assert_eq!(v.epoch, 1, "one late probe moves no writes");

    // SIGSTOP for good: every probe times out below the interval, and the round of the
    // `fail_threshold`-th timeout in a row moves the writes.
    galera.node(0).stop();
    let stopped_at = Instant::now();
    let v = wait_view(&mut view, HUNG_BUDGET, "writer moved off the hung node", |v| {
        v.primary.as_deref() == Some("node-2")
    })
    .await;
    println!("SIGSTOP of node-1 -> writer node-2 after {:?}", stopped_at.elapsed());
    let hung = v.member("node-1").unwrap();
    assert!(hung.reason.as_deref().unwrap_or("").contains("timed out"), "{hung:?}");
    assert!(
        stopped_at.elapsed() >= Duration::from_millis(INTERVAL_MS * (FAIL_THRESHOLD as u64 - 1)),
        "moved before {FAIL_THRESHOLD} probes could time out"
    );
    galera.node(0).cont();

    // The monitor says node-2 is down (e.g. the business statement fails there) while its
    // wsrep status is fine: it takes no requests either.
    health_tx[1].send_replace(MemberHealth {
        state: HealthState::Down,
        ..Default::default()
    });
    let v = wait_view(
        &mut view,
        MOVE_BUDGET,
        "writer moved off the node its monitor marks down",
        |v| v.primary.as_deref().is_some_and(|p| p != "node-2"),
    )
    .await;
    assert_eq!(v.member("node-2").unwrap().reason.as_deref(), Some("health: down"));
    println!("health down on node-2 -> writer {:?}", v.primary);
    shutdown.cancel();
}

//! Real-server tests of the Galera sandbox (`galera-4` must be installed: `.ci/run` does it).

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_sandbox::{Galera, Role};

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_and_a_killed_node_leaves_and_rejoins() {
    let galera = Galera::start(3).await.expect("galera cluster starts");
    println!("galera sandbox of 3 nodes started in {:?}", galera.start_time());
    for node in galera.nodes() {
        assert_eq!(node.role(), Role::GaleraNode);
        let s = node.wsrep_status().await.unwrap();
        assert!(s.is_synced_primary(), "{}: {s:?}", node.name());
        assert_eq!(s.cluster_size, 3, "{}: {s:?}", node.name());
    }
    let mut indexes: Vec<u32> = Vec::new();
    for node in galera.nodes() {
        indexes.push(node.wsrep_status().await.unwrap().local_index.expect("local index"));
    }
    indexes.sort_unstable();
    assert_eq!(indexes, vec![0, 1, 2], "each node has its own index in the view");

    // A write on one node is read on another (Galera replicates synchronously: with
    // wsrep_sync_wait the read waits for every writeset certified before it).
    let (n1, n2, n3) = (galera.node(0), galera.node(1), galera.node(2));
    let mut c1 = n1.conn().await.unwrap();
    c1.query_drop("CREATE TABLE osprey.g (id INT PRIMARY KEY, v VARCHAR(40))")
        .await
        .unwrap();
    c1.query_drop("INSERT INTO osprey.g VALUES (1, 'from node-1')")
        .await
        .unwrap();
    let mut c2 = n2.conn().await.unwrap();
    c2.query_drop("SET SESSION wsrep_sync_wait = 1").await.unwrap();
    let v: Option<String> = c2.query_first("SELECT v FROM osprey.g WHERE id = 1").await.unwrap();
    assert_eq!(v.as_deref(), Some("from node-1"));

    // kill -9 a node: the others' view shrinks.
    n3.kill();
    let killed = Instant::now();
    galera
        .wait_cluster_size(n1, 2, DEADLINE)
        .await
        .expect("the killed node leaves the view");
    println!("wsrep_cluster_size 3 -> 2 after {:?}", killed.elapsed());
    let s = n2.wsrep_status().await.unwrap();
    assert!(s.is_synced_primary() && s.cluster_size == 2, "{s:?}");

    // Written while it was down, then it rejoins (IST) and has the row.
    c2.query_drop("INSERT INTO osprey.g VALUES (2, 'while node-3 was down')")
        .await
        .unwrap();
    let restarted = Instant::now();
    n3.restart().await.expect("the killed node rejoins");
    println!("node-3 restarted and Synced in {:?}", restarted.elapsed());
    galera.wait_cluster_size(n1, 3, DEADLINE).await.unwrap();
    let mut c3 = n3.conn().await.unwrap();
    c3.query_drop("SET SESSION wsrep_sync_wait = 1").await.unwrap();
    let n: Option<i64> = c3.query_first("SELECT COUNT(*) FROM osprey.g").await.unwrap();
    assert_eq!(n, Some(2));
}

#[tokio::test]
async fn dropping_the_cluster_removes_its_processes_and_files() {
    let galera = Galera::start(2).await.expect("galera cluster starts");
    let dir = galera.dir().to_path_buf();
    let pids: Vec<u32> = galera.nodes().iter().filter_map(|n| n.pid()).collect();
    assert_eq!(pids.len(), 2);
    drop(galera);
    assert!(!dir.exists(), "{} removed", dir.display());
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} gone"
        );
    }
}

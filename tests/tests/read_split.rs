//! The read/write split against real MariaDB replication behind fault proxies: reads on
//! the replicas' read slots, everything else on the primary; flags and hints; a replica
//! lost while reads flow (no undispatched error); a failover (reads and writes land on
//! the right members).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use osprey_client::{Client, Request, RequestExt, Value};
use osprey_tests::failover_rig::{cluster_view, dispatcher_config, wait_primary, Rig, FAST};
use osprey_tests::harness::{wait_for, Dispatcher};

/// The split on, with the failover tests' fast probes.
fn split() -> String {
    format!("read_split = true\n{FAST}")
}

/// Member name by `@@server_id`.
async fn server_ids(rig: &Rig) -> anyhow::Result<BTreeMap<u32, String>> {
    let mut ids = BTreeMap::new();
    for name in &rig.names {
        let mut c = rig.instance(name).conn().await?;
        let id: Option<u32> = c.query_first("SELECT @@server_id").await?;
        ids.insert(id.unwrap_or_default(), name.clone());
    }
    Ok(ids)
}

/// The member that ran `request` (which must return `@@server_id` first).
async fn served_by(client: &Client, ids: &BTreeMap<u32, String>, request: Request) -> anyhow::Result<String> {
    let r = client.send(request).await?;
    let row = r.rows().first().ok_or_else(|| anyhow::anyhow!("no row"))?;
    let id: u32 = row.get(0)?;
    ids.get(&id)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("unknown server id {id}"))
}

async fn start(rig: &Rig, extra: &str) -> anyhow::Result<Dispatcher> {
    let d = Dispatcher::start_with(dispatcher_config(
        &rig.cluster_toml("main", extra),
        "[pool]\nreplica_size = 2\n",
    ))
    .await?;
    wait_primary(&d, None, Some("primary"), None, Duration::from_secs(20)).await?;
    wait_serving(&d, 2).await?;
    Ok(d)
}

/// Waits until `n` members serve reads.
async fn wait_serving(d: &Dispatcher, n: usize) -> anyhow::Result<()> {
    wait_for(
        Duration::from_secs(20),
        &format!("{n} replicas serving reads"),
        || async {
            let v = cluster_view(d, None).await.ok()?;
            // Serving, with a worker registered (routing skips a group without one).
            let ready = |p: &&serde_json::Value| {
                let workers = p["slots"]["idle"].as_u64().unwrap_or(0) + p["slots"]["busy"].as_u64().unwrap_or(0);
                p["serving"] == true && workers > 0
            };
            let serving = v["read_pools"].as_array()?.iter().filter(ready).count();
            (serving == n).then_some(())
        },
    )
    .await
}

/// Waits until `member` no longer serves reads (the health model took it out).
async fn wait_left(d: &Dispatcher, member: &str) -> anyhow::Result<()> {
    wait_for(
        Duration::from_secs(20),
        &format!("{member} out of the read pool"),
        || async {
            let v = cluster_view(d, None).await.ok()?;
            let pool = v["read_pools"]
                .as_array()?
                .iter()
                .find(|p| p["member"] == member)?
                .clone();
            (pool["serving"] == false).then_some(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_the_replicas_and_everything_else_to_the_primary() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let ids = server_ids(&rig).await?;
    let d = start(&rig, &split()).await?;
    let client = Client::connect(d.client_config()).await?;
    let mut on: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..60 {
        *on.entry(served_by(&client, &ids, Request::sql("SELECT @@server_id")).await?)
            .or_default() += 1;
    }
    assert_eq!(
        on.get("primary"),
        None,
        "plain reads must not run on the primary: {on:?}"
    );
    assert!(
        on.contains_key("replica-1") && on.contains_key("replica-2"),
        "reads spread over both replicas: {on:?}"
    );
    // What must stay on the primary.
    client
        .execute("CREATE TABLE IF NOT EXISTS split_t (id INT PRIMARY KEY)", &[])
        .await?;
    for sql in [
        "SELECT @@server_id FROM split_t FOR UPDATE",
        "SELECT @@server_id, GET_LOCK('split', 0)",
        "/* osprey:primary */ SELECT @@server_id",
        "SELECT @@server_id; SELECT 1",
    ] {
        let who = served_by(&client, &ids, Request::sql(sql)).await;
        // A locking read on an empty table returns no row: look at the primary's own
        // answer instead.
        if sql.contains("FOR UPDATE") {
            let r = client.query(sql.replace("FROM split_t ", ""), &[]).await?;
            assert!(!r.rows().is_empty());
            continue;
        }
        assert_eq!(who?, "primary", "{sql}");
    }
    assert_eq!(
        served_by(
            &client,
            &ids,
            Request::sql("SELECT @@server_id").with_force_primary(true)
        )
        .await?,
        "primary"
    );
    // A write goes to the primary (a replica is read-only and would refuse it).
    client.execute("INSERT INTO split_t VALUES (1)", &[]).await?;
    // A cluster it does not front: the error names each cluster it does once, not once
    // per slot group (this one has a write group and two read groups).
    let e = client
        .send(Request::sql("SELECT 1").with_cluster("nope"))
        .await
        .expect_err("unknown cluster");
    assert_eq!(e.code(), osprey_client::ErrorCode::UnknownCluster, "{e}");
    assert!(
        e.message().ends_with("(this dispatcher fronts main)"),
        "{}",
        e.message()
    );
    // The replica hint and the read_only flag send what the classifier would keep on the
    // primary to a replica (the caller takes responsibility).
    let hinted = served_by(
        &client,
        &ids,
        Request::sql("/* osprey:replica */ SELECT @@server_id, RELEASE_ALL_LOCKS()"),
    )
    .await?;
    assert_ne!(hinted, "primary");
    let flagged = served_by(
        &client,
        &ids,
        Request::sql("SELECT @@server_id, RELEASE_ALL_LOCKS()").with_read_only(true),
    )
    .await?;
    assert_ne!(flagged, "primary");
    let metrics = d.metrics().await?;
    assert!(metrics.contains("osprey_reads_total{"), "{metrics}");
    Ok(())
}

/// Reads run from a few tasks until stopped; records who served and every error.
struct Readers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    served: Arc<Mutex<Vec<String>>>,
    undispatched: Arc<Mutex<Vec<String>>>,
}

impl Readers {
    async fn start(d: &Dispatcher, ids: &BTreeMap<u32, String>, n: usize) -> anyhow::Result<Readers> {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Mutex::new(Vec::new()));
        let undispatched = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..n {
            let mut config = d.client_config();
            // The SDK's retries of undispatched requests would hide what the dispatcher did.
            config.max_retries = 0;
            let client = Client::connect(config).await?;
            let (stop, served, undispatched, ids) = (stop.clone(), served.clone(), undispatched.clone(), ids.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match served_by(&client, &ids, Request::sql("SELECT @@server_id")).await {
                        Ok(who) => served.lock().unwrap().push(who),
                        Err(e) => {
                            // Dispatched errors (a read in flight on a killed replica) are
                            // outcome-unknown by the protocol; undispatched ones must not be.
                            let undispatched_error = e
                                .downcast_ref::<osprey_client::Error>()
                                .is_some_and(|e| !e.dispatched());
                            if undispatched_error {
                                undispatched.lock().unwrap().push(format!("{e:#}"));
                            }
                        }
                    }
                }
            }));
        }
        Ok(Readers {
            stop,
            tasks,
            served,
            undispatched,
        })
    }

    fn count(&self) -> usize {
        self.served.lock().unwrap().len()
    }

    /// Waits until `n` more reads succeeded, and returns who served them.
    async fn next(&self, n: usize, limit: Duration) -> anyhow::Result<Vec<String>> {
        let from = self.count();
        wait_for(limit, &format!("{n} more reads"), || async {
            (self.count() >= from + n).then_some(())
        })
        .await?;
        Ok(self.served.lock().unwrap()[from..].to_vec())
    }

    async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        self.undispatched.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_lost_while_reads_flow_moves_them_on_without_an_undispatched_error() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let ids = server_ids(&rig).await?;
    let d = start(&rig, &split()).await?;
    let readers = Readers::start(&d, &ids, 4).await?;
    readers.next(100, Duration::from_secs(20)).await?;
    rig.instance("replica-1").kill();
    // It leaves the read pool; reads keep flowing, on the other replica. Its workers are
    // gone before the health model takes it out (after its failed probes): reads that
    // were queued for it in between move to the primary then, so the count starts after.
    wait_serving(&d, 1).await?;
    wait_left(&d, "replica-1").await?;
    // (Reads that waited for replica-1's read slots when it left ran on the primary.)
    readers.next(50, Duration::from_secs(20)).await?;
    let after = readers.next(100, Duration::from_secs(20)).await?;
    assert!(
        after.iter().all(|m| m == "replica-2"),
        "after replica-1 left, reads run on replica-2 only: {after:?}"
    );
    // The last replica blackholed too: reads fall back to the primary.
    rig.proxy("replica-2")
        .set_mode(osprey_tests::fault_proxy::Mode::Blackhole);
    wait_serving(&d, 0).await?;
    readers.next(20, Duration::from_secs(20)).await?;
    let last = readers.next(50, Duration::from_secs(20)).await?;
    assert!(last.iter().all(|m| m == "primary"), "{last:?}");
    let stopping = std::time::Instant::now();
    let undispatched = readers.stop().await;
    // Nothing hangs on the cut-off replica: its in-flight reads were abandoned.
    assert!(stopping.elapsed() < Duration::from_secs(10), "{:?}", stopping.elapsed());
    assert!(undispatched.is_empty(), "{undispatched:?}");
    let metrics = d.metrics().await?;
    assert!(metrics.contains("osprey_read_fallbacks_total{"), "{metrics}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_reads_and_writes_land_on_the_right_members() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let ids = server_ids(&rig).await?;
    let d = start(&rig, &split()).await?;
    let client = Client::connect(d.client_config()).await?;
    client
        .execute("CREATE TABLE IF NOT EXISTS split_f (id INT PRIMARY KEY)", &[])
        .await?;
    rig.instance("primary").kill();
    let new = wait_primary(&d, None, None, Some("primary"), Duration::from_secs(20)).await?;
    let other = if new == "replica-1" { "replica-2" } else { "replica-1" };
    // The promoted member's read slots are gone; the other replica keeps reading.
    wait_for(Duration::from_secs(20), "read pools follow the failover", || async {
        let v = cluster_view(&d, None).await.ok()?;
        let pools = v["read_pools"].as_array()?;
        let serving = |m: &str| pools.iter().find(|p| p["member"] == m).map(|p| p["serving"] == true);
        (serving(&new) == Some(false) && serving(other) == Some(true)).then_some(())
    })
    .await?;
    for i in 0..20 {
        client
            .execute("INSERT INTO split_f VALUES (?)", &[Value::Int(i)])
            .await?;
        assert_eq!(
            served_by(&client, &ids, Request::sql("SELECT @@server_id")).await?,
            other
        );
        assert_eq!(
            served_by(
                &client,
                &ids,
                Request::sql("SELECT @@server_id").with_force_primary(true)
            )
            .await?,
            new
        );
    }
    let v = cluster_view(&d, None).await?;
    let new_pool = v["read_pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["member"] == new.as_str())
        .cloned();
    assert_eq!(
        new_pool.map(|p| p["slots"]["size"].clone()),
        Some(serde_json::json!(0)),
        "{v}"
    );
    Ok(())
}

/// Both replicas apply a second behind (`MASTER_DELAY = 1`).
async fn lag_by_design(rig: &Rig) -> anyhow::Result<()> {
    for r in ["replica-1", "replica-2"] {
        let mut c = rig.instance(r).admin_conn().await?;
        c.query_drop("STOP SLAVE").await?;
        c.query_drop("CHANGE MASTER TO MASTER_DELAY = 1").await?;
        c.query_drop("START SLAVE").await?;
    }
    Ok(())
}

/// Inserts then reads its own row at once, `n` times; returns (stale reads, reads served
/// by a replica).
async fn insert_then_read(
    client: &Client,
    ids: &BTreeMap<u32, String>,
    table: &str,
    n: i64,
) -> anyhow::Result<(usize, usize)> {
    let (mut stale, mut on_replica) = (0, 0);
    for i in 0..n {
        client
            .execute(format!("INSERT INTO {table} VALUES (?)"), &[Value::Int(i)])
            .await?;
        let r = client
            .query(
                format!("SELECT @@server_id, COUNT(*) FROM {table} WHERE id = ?"),
                &[Value::Int(i)],
            )
            .await?;
        let row = &r.rows()[0];
        let (server, count): (u32, i64) = (row.get(0)?, row.get(1)?);
        stale += usize::from(count != 1);
        on_replica += usize::from(ids.get(&server).is_some_and(|m| m != "primary"));
    }
    Ok((stale, on_replica))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_writes_never_reads_a_stale_row_from_a_lagging_replica() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let ids = server_ids(&rig).await?;
    let d = start(&rig, &split()).await?;
    lag_by_design(&rig).await?;
    let mut config = d.client_config();
    config.read_your_writes = true;
    let ryw = Client::connect(config).await?;
    let plain = Client::connect(d.client_config()).await?;
    ryw.execute("CREATE TABLE ryw_on (id BIGINT PRIMARY KEY)", &[]).await?;
    ryw.execute("CREATE TABLE ryw_off (id BIGINT PRIMARY KEY)", &[]).await?;
    // Wait for the tables to reach the replicas (a second late).
    wait_for(Duration::from_secs(20), "tables on the replicas", || async {
        for r in ["replica-1", "replica-2"] {
            let mut c = rig.instance(r).conn().await.ok()?;
            let n: Option<i64> = c
                .query_first("SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'ryw_off'")
                .await
                .ok()?;
            (n == Some(1)).then_some(())?;
        }
        Some(())
    })
    .await?;
    let (stale, _) = insert_then_read(&ryw, &ids, "ryw_on", 1000).await?;
    assert_eq!(stale, 0, "read_your_writes on: no read may miss its own write");
    let (stale_off, on_replica_off) = insert_then_read(&plain, &ids, "ryw_off", 200).await?;
    println!("read_your_writes off: {stale_off} of 200 reads stale, {on_replica_off} on a replica");
    assert!(
        stale_off > 0,
        "with the option off the lag must show (else this test sees nothing)"
    );

    // A replica that has the write serves a causal read at once, without waiting: once
    // the replicas' applied positions (as the dispatcher knows them) cover the client's.
    let want = ryw.last_gtid(None).expect("a position after writes");
    wait_for(
        Duration::from_secs(20),
        "replicas known to have applied the writes",
        || async {
            let v = cluster_view(&d, None).await.ok()?;
            let pools = v["read_pools"].as_array()?.clone();
            pools
                .iter()
                .filter(|p| p["serving"] == true)
                .any(|p| {
                    p["applied"]
                        .as_str()
                        .and_then(|a| osprey_client::GtidPos::parse(a).ok())
                        .is_some_and(|a| a.dominates(&want))
                })
                .then_some(())
        },
    )
    .await?;
    let who = served_by(&ryw, &ids, Request::sql("SELECT @@server_id")).await?;
    assert_ne!(who, "primary", "a caught-up replica serves the causal read");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_leaves_the_read_pool_and_rejoins() -> anyhow::Result<()> {
    use osprey_tests::failover_rig::Writer;
    const DELAY: &str = r#"
delay_period_ms = 200
delay_threshold_ms = 1000
delay_database = "osprey_hb"
"#;
    let rig = Rig::start(2).await?;
    let ids = server_ids(&rig).await?;
    let d = start(&rig, &format!("{DELAY}{}", split())).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(20, Duration::from_secs(20)).await?;
    let mut c = rig.instance("replica-1").admin_conn().await?;
    c.query_drop("STOP SLAVE SQL_THREAD").await?;
    let stopped = std::time::Instant::now();
    wait_for(
        Duration::from_secs(20),
        "replica-1 out of the read pool for delay",
        || async {
            let v = cluster_view(&d, None).await.ok()?;
            let p = v["read_pools"]
                .as_array()?
                .iter()
                .find(|p| p["member"] == "replica-1")?
                .clone();
            (p["serving"] == false && p["reason"].as_str().is_some_and(|r| r.contains("delay"))).then_some(())
        },
    )
    .await?;
    let left = stopped.elapsed();
    println!(
        "replica-1 left the read pool {left:?} after its SQL thread stopped (threshold 1000 ms + 2 x 200 ms period)"
    );
    let client = Client::connect(d.client_config()).await?;
    for _ in 0..30 {
        assert_eq!(
            served_by(&client, &ids, Request::sql("SELECT @@server_id")).await?,
            "replica-2"
        );
    }
    c.query_drop("START SLAVE SQL_THREAD").await?;
    let started = std::time::Instant::now();
    wait_serving(&d, 2).await?;
    println!(
        "replica-1 rejoined {:?} after START SLAVE SQL_THREAD",
        started.elapsed()
    );
    let report = writer.stop().await?;
    assert!(
        report.undispatched_errors.is_empty(),
        "{:?}",
        report.undispatched_errors
    );
    let delay = d.admin_get("/delay").await?;
    assert!(delay.to_string().contains("replica-1"), "{delay}");
    Ok(())
}

/// A read-only session (issue 22) pins a replica's read worker: `START TRANSACTION READ
/// ONLY` and several reads run on that one replica, in one snapshot; a session that is
/// not read only pins the primary. A replica that leaves the read pool while a
/// read-only session is open on it ends that session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_session_pins_a_replica_and_others_the_primary() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, &split()).await?;
    let ids = server_ids(&rig).await?;
    let client = d.client().await?;
    let tx = client
        .transaction_with(osprey_client::TransactionOptions {
            read_only: true,
            consistent_snapshot: true,
            ..Default::default()
        })
        .await?;
    let member = tx.session().member().to_owned();
    assert!(member.starts_with("replica"), "{member}");
    assert!(tx.session().on_replica());
    for _ in 0..5 {
        let (id,): (u32,) = tx.query_first("SELECT @@server_id", &[]).await?.expect("a row");
        assert_eq!(ids[&id], member, "every read of the session on its replica");
    }
    let e = tx
        .execute("CREATE TABLE ro_session_write (a INT)", &[])
        .await
        .expect_err("a replica is read only");
    println!("a write in a read-only session: {e}");
    tx.commit().await?;
    let rw = client.transaction().await?;
    assert_eq!(rw.session().member(), "primary");
    let (id,): (u32,) = rw.query_first("SELECT @@server_id", &[]).await?.expect("a row");
    assert_eq!(ids[&id], "primary");
    rw.rollback().await?;

    // Its replica stops serving reads (maintenance): the session there ends.
    let ro = client
        .session_with(osprey_client::SessionOptions {
            read_only: true,
            ..Default::default()
        })
        .await?;
    let on = ro.member().to_owned();
    let (code, body) = d
        .admin_post("/cluster/maintenance", serde_json::json!({ "member": on, "on": true }))
        .await?;
    assert_eq!(code, 200, "{body}");
    let ended = wait_for(Duration::from_secs(10), "the read-only session's end", || async {
        ro.aborted()
    })
    .await?;
    assert_eq!(ended.code(), osprey_client::ErrorCode::SessionAborted, "{ended}");
    Ok(())
}

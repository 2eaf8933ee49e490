//! Read-your-writes plumbing, end to end (issue 11 item 5): the GTID of each write
//! flows from the worker (MariaDB's `last_gtid` session tracking) through the
//! dispatcher to the SDK, which keeps the newest position per cluster and sends it as
//! `causal_gtid`. The routing that uses it is tested with the read/write split.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use osprey_client::{statement, Client, ExecResult, GtidPos, Request, RequestExt, Value};
use osprey_sandbox::{Instance, Sandbox};
use osprey_tests::harness::{wait_for, Cluster, Dispatcher};

async fn binlog_pos(db: &Instance) -> anyhow::Result<GtidPos> {
    let mut c = db.conn().await?;
    let pos: Option<String> = c.query_first("SELECT @@gtid_binlog_pos").await?;
    c.disconnect().await?;
    Ok(GtidPos::parse(&pos.unwrap_or_default())?)
}

fn gtid_of(r: &ExecResult) -> GtidPos {
    GtidPos::parse(r.gtid.as_deref().unwrap_or_else(|| panic!("no gtid in {r:?}"))).unwrap()
}

async fn client_with_ryw(d: &Dispatcher) -> anyhow::Result<Client> {
    let mut cfg = d.client_config();
    cfg.read_your_writes = true;
    Ok(Client::connect(cfg).await?)
}

/// A write's END carries the GTID the primary logged for it (through a default-config
/// dispatcher); a read's carries none; a batch carries its COMMIT's; after a session
/// reset the next write still reports one; the client's position follows every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_reports_its_gtid_and_the_client_keeps_the_newest() -> anyhow::Result<()> {
    let c = Cluster::start("").await?;
    let (d, primary) = (&c.dispatcher, c.sandbox.primary());
    let client = client_with_ryw(d).await?;
    assert_eq!(client.last_gtid(None), None);

    let r = client
        .execute("CREATE TABLE t_ryw (id INT PRIMARY KEY, v INT)", &[])
        .await?;
    let ddl = gtid_of(&r);
    assert_eq!(ddl, binlog_pos(primary).await?, "DDL");

    let r = client
        .execute("INSERT INTO t_ryw VALUES (?, ?)", &[Value::Int(1), Value::Int(0)])
        .await?;
    let insert = gtid_of(&r);
    let primary_pos = binlog_pos(primary).await?;
    assert_eq!(insert.len(), 1, "{insert}");
    let g = insert.iter().next().unwrap();
    assert_eq!(
        primary_pos.get(g.domain),
        Some(g),
        "END says {insert}, the primary {primary_pos}"
    );
    assert_eq!(client.last_gtid(None), Some(insert.clone()));

    // Reads: no GTID, and the client's position stays.
    let r = client
        .query("SELECT v FROM t_ryw WHERE id = ?", &[Value::Int(1)])
        .await?;
    assert_eq!(r.summary.gtid, None);
    let r = client.query("SELECT COUNT(*) FROM t_ryw", &[]).await?;
    assert_eq!(r.summary.gtid, None);
    assert_eq!(client.last_gtid(None), Some(insert.clone()));

    // A batch: one transaction, the COMMIT's GTID.
    let r = client
        .batch(vec![
            statement("INSERT INTO t_ryw VALUES (2, 0)", vec![]),
            statement("UPDATE t_ryw SET v = v + 1 WHERE id = 1", vec![]),
        ])
        .await?;
    let batch = gtid_of(&r.summary);
    assert_eq!(batch, binlog_pos(primary).await?);
    assert_eq!(batch.iter().next().unwrap().seq, g.seq + 1, "one GTID for the batch");

    // A session reset (after a request that leaves state) keeps the tracking.
    client.execute("SET @x = 1", &[]).await?;
    let r = client.execute("INSERT INTO t_ryw VALUES (3, 0)", &[]).await?;
    assert_eq!(gtid_of(&r), binlog_pos(primary).await?, "after a session reset");

    // The position grows with every write, whichever worker ran it.
    let mut last = client.last_gtid(None).expect("a position");
    for i in 10..40 {
        let r = client
            .execute(format!("INSERT INTO t_ryw VALUES ({i}, 0)"), &[])
            .await?;
        let now = client.last_gtid(None).expect("a position");
        assert!(now.dominates(&last) && !last.dominates(&now), "{last} then {now}");
        assert!(now.dominates(&gtid_of(&r)));
        last = now;
    }
    assert_eq!(last, binlog_pos(primary).await?);

    // Concurrent writers on clones: the merged position is the newest of all.
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..10 {
                    client
                        .execute(format!("INSERT INTO t_ryw VALUES ({}, 0)", 1000 + t * 100 + i), &[])
                        .await?;
                }
                Ok::<_, osprey_client::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    assert_eq!(client.last_gtid(None), Some(binlog_pos(primary).await?));

    // Reads carrying a position are served (a GTID beyond the primary's too: today's
    // dispatcher ignores the field; with routing, no replica has it and the primary serves).
    let r = client.query("SELECT COUNT(*) FROM t_ryw", &[]).await?;
    assert_eq!(r.rows()[0].get::<i64>(0)?, 113);
    let future = GtidPos::parse("0-1-999999999")?;
    let r = client.send(Request::sql("SELECT 1").with_causal_gtid(&future)).await?;
    assert_eq!(r.rows().len(), 1);
    // A malformed position is refused before it reaches the database.
    let bad = Request {
        causal_gtid: Some("0-1".into()),
        ..Request::sql("SELECT 1")
    };
    let e = client.send(bad).await.expect_err("malformed causal_gtid");
    assert!(!e.dispatched(), "{e}");
    Ok(())
}

/// A client that names several clusters keeps one position per cluster: a write to one
/// moves only that cluster's position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_are_kept_per_cluster() -> anyhow::Result<()> {
    let (sa, sb) = (Sandbox::start(0).await?, Sandbox::start(0).await?);
    let cluster = |name: &str, db: &Instance| {
        format!(
            "[[cluster]]\nname = \"{name}\"\ntopology = \"replication\"\nuser = \"{}\"\npassword = \"{}\"\n\
             database = \"{}\"\n[[cluster.member]]\nname = \"m\"\nhost = \"{}\"\nport = {}\n",
            db.user(),
            db.password(),
            db.database(),
            db.host(),
            db.port()
        )
    };
    let clusters = format!("{}{}", cluster("a", sa.primary()), cluster("b", sb.primary()));
    let d = Dispatcher::start_with(osprey_tests::failover_rig::dispatcher_config(&clusters, "")).await?;
    let client = client_with_ryw(&d).await?;
    let on = |cluster: &str, sql: &str| Request::sql(sql).with_cluster(cluster);
    wait_for(Duration::from_secs(20), "both clusters serving", || async {
        let a = client.send(on("a", "SELECT 1")).await.ok();
        let b = client.send(on("b", "SELECT 1")).await.ok();
        (a.is_some() && b.is_some()).then_some(())
    })
    .await?;

    client.send(on("a", "CREATE TABLE t_a (id INT PRIMARY KEY)")).await?;
    for i in 0..5 {
        client.send(on("a", &format!("INSERT INTO t_a VALUES ({i})"))).await?;
    }
    let a = client.last_gtid(Some("a")).expect("a's position");
    assert_eq!(a, binlog_pos(sa.primary()).await?);
    assert_eq!(client.last_gtid(Some("b")), None, "b has seen no write");
    assert_eq!(
        client.last_gtid(None),
        None,
        "nor has the default cluster (as named by no request)"
    );

    client.send(on("b", "CREATE TABLE t_b (id INT PRIMARY KEY)")).await?;
    client.send(on("b", "INSERT INTO t_b VALUES (1)")).await?;
    assert_eq!(client.last_gtid(Some("b")), Some(binlog_pos(sb.primary()).await?));
    assert_eq!(client.last_gtid(Some("a")), Some(a), "a write to b does not move a");
    Ok(())
}

/// What the GTID costs per statement, straight at MariaDB with mysql_async (this
/// workspace's, which negotiates session tracking): an INSERT and a point SELECT on a
/// session that tracks `last_gtid` (what the worker does) against one that does not,
/// and the fallback the tracking avoids (`SELECT @@last_gtid` after each write).
/// Rounds alternate so that load on the machine hits every variant alike.
/// `cargo test -p osprey-tests --test read_your_writes -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement"]
async fn measure_gtid_tracking_cost() -> anyhow::Result<()> {
    use std::time::Instant;
    const N: u32 = 500;
    const ROUNDS: u32 = 6;
    let sandbox = Sandbox::start(0).await?;
    let db = sandbox.primary();
    let mut tracked = db.conn().await?;
    tracked
        .query_drop(
            "SET SESSION session_track_system_variables = \
             CONCAT_WS(',', NULLIF(@@session.session_track_system_variables, ''), 'last_gtid')",
        )
        .await?;
    let mut plain = db.conn().await?;
    plain
        .query_drop("CREATE TABLE t_cost (id INT PRIMARY KEY, v INT)")
        .await?;
    plain.query_drop("INSERT INTO t_cost VALUES (0, 0)").await?;
    let mut next_id = 1;
    // [tracked insert, plain insert, plain insert + SELECT @@last_gtid, tracked select, plain select]
    let mut total = [Duration::ZERO; 5];
    for _ in 0..ROUNDS {
        for (i, total) in total.iter_mut().enumerate() {
            let t0 = Instant::now();
            for _ in 0..N {
                match i {
                    0..=2 => {
                        let conn = if i == 0 { &mut tracked } else { &mut plain };
                        conn.query_drop(format!("INSERT INTO t_cost VALUES ({next_id}, 0)"))
                            .await?;
                        next_id += 1;
                        if i == 0 {
                            let ok = conn.last_ok_packet().expect("an OK packet");
                            assert!(!ok.session_state_info()?.is_empty(), "the OK packet carries last_gtid");
                        }
                        if i == 2 {
                            let g: Option<String> = conn.query_first("SELECT @@last_gtid").await?;
                            assert!(g.is_some());
                        }
                    }
                    _ => {
                        let conn = if i == 3 { &mut tracked } else { &mut plain };
                        let _: Option<i64> = conn.query_first("SELECT v FROM t_cost WHERE id = 0").await?;
                    }
                }
            }
            *total += t0.elapsed();
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(N * ROUNDS);
    eprintln!(
        "µs per statement over {} each: INSERT tracked {:.1}, untracked {:.1}, untracked + SELECT @@last_gtid {:.1}; \
         point SELECT tracked {:.1}, untracked {:.1}",
        N * ROUNDS,
        per(total[0]),
        per(total[1]),
        per(total[2]),
        per(total[3]),
        per(total[4]),
    );
    Ok(())
}

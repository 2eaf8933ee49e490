//! Sessions and interactive transactions (protocol 1.5), end to end against a real
//! MariaDB: isolation between pinned workers, locks, deadlocks and the retry helper, no
//! state leaking to the next session, the bounds (cap per group, idle in transaction)
//! and the truth after a fault (a killed worker, a client gone).

use std::sync::Arc;
use std::time::{Duration, Instant};

use osprey_client::{params, Client, ErrorCode, TransactionOptions, TransactionOutcome};
use osprey_tests::fault_proxy::FaultProxy;
use osprey_tests::harness::{wait_for, Cluster};

use crate::{assert_closed_loop, client, cluster, describe};

async fn setup(client: &Client, table: &str) {
    for sql in [
        format!("DROP TABLE IF EXISTS {table}"),
        format!("CREATE TABLE {table} (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB"),
        format!("INSERT INTO {table} VALUES (1, 100), (2, 100)"),
    ] {
        client
            .execute(&sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    }
}

async fn value(client: &Client, table: &str, id: i64) -> Option<i64> {
    client
        .query_first::<(i64,)>(format!("SELECT v FROM {table} WHERE id = ?"), &params![id])
        .await
        .unwrap_or_else(|e| panic!("read: {}", describe(&e)))
        .map(|(v,)| v)
}

/// Outside a session, transaction control is still refused (statement pooling), and the
/// message says how to open a session instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_control_outside_a_session_says_how_to_open_one() {
    let c = cluster("[pool]\nsize = 2\n").await;
    let client = client(&c).await;
    for sql in [
        "BEGIN",
        "START TRANSACTION",
        "SET autocommit = 0",
        "LOCK TABLES t WRITE",
    ] {
        let e = client.execute(sql, &[]).await.expect_err(sql);
        assert_eq!(e.code(), ErrorCode::InvalidRequest, "{sql}: {}", describe(&e));
        assert!(!e.dispatched(), "{sql}");
        assert!(e.message().contains("open a session"), "{sql}: {}", e.message());
    }
    assert_closed_loop(&c, &[&client]).await;
}

/// Two transactions on two pinned workers, REPEATABLE READ: a write is seen by the
/// other only after its COMMIT (and not inside the other's snapshot), and `SELECT … FOR
/// UPDATE` blocks the other until the COMMIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_are_isolated_and_for_update_blocks_until_commit() {
    let c = cluster("[pool]\nsize = 4\n").await;
    let client = client(&c).await;
    setup(&client, "iso").await;
    let t1 = client
        .transaction()
        .await
        .unwrap_or_else(|e| panic!("t1: {}", describe(&e)));
    let t2 = client
        .transaction()
        .await
        .unwrap_or_else(|e| panic!("t2: {}", describe(&e)));
    assert_ne!(t1.session().slot(), t2.session().slot(), "two sessions, two workers");
    // t2's snapshot starts here.
    assert_eq!(
        t2.query_first::<(i64,)>("SELECT v FROM iso WHERE id = 1", &[])
            .await
            .unwrap(),
        Some((100,))
    );
    t1.execute("UPDATE iso SET v = 90 WHERE id = 1", &[]).await.unwrap();
    assert_eq!(
        t1.query_first::<(i64,)>("SELECT v FROM iso WHERE id = 1", &[])
            .await
            .unwrap(),
        Some((90,)),
        "t1 sees its own write"
    );
    assert_eq!(
        value(&client, "iso", 1).await,
        Some(100),
        "nobody else sees it before COMMIT"
    );
    t1.commit().await.unwrap();
    assert_eq!(value(&client, "iso", 1).await, Some(90), "seen after COMMIT");
    assert_eq!(
        t2.query_first::<(i64,)>("SELECT v FROM iso WHERE id = 1", &[])
            .await
            .unwrap(),
        Some((100,)),
        "t2's snapshot (REPEATABLE READ) does not move"
    );
    t2.rollback().await.unwrap();

    // FOR UPDATE: the second locker waits for the first's COMMIT.
    let a = client.transaction().await.unwrap();
    a.query("SELECT v FROM iso WHERE id = 2 FOR UPDATE", &[]).await.unwrap();
    let b = client.transaction().await.unwrap();
    let blocked = tokio::spawn(async move {
        let started = Instant::now();
        let r = b
            .query_first::<(i64,)>("SELECT v FROM iso WHERE id = 2 FOR UPDATE", &[])
            .await;
        let waited = started.elapsed();
        b.rollback().await.unwrap();
        (r.map_err(|e| describe(&e)), waited)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!blocked.is_finished(), "b's FOR UPDATE must wait for a's lock");
    a.execute("UPDATE iso SET v = 80 WHERE id = 2", &[]).await.unwrap();
    a.commit().await.unwrap();
    let (r, waited) = blocked.await.unwrap();
    assert_eq!(
        r.unwrap(),
        Some((80,)),
        "b reads a's committed value once the lock is free"
    );
    assert!(waited >= Duration::from_millis(500), "{waited:?}");
    assert_closed_loop(&c, &[&client]).await;
}

/// A deadlock between two transactions: one gets 1213 (SQLSTATE 40001) and the other
/// commits; the SDK's `run_transaction` runs the loser again and both transfers land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_fails_one_transaction_and_run_transaction_completes_both() {
    let c = cluster("[pool]\nsize = 4\n").await;
    let client = client(&c).await;
    setup(&client, "dl").await;
    // By hand: opposite lock orders.
    let t1 = client.transaction().await.unwrap();
    let t2 = client.transaction().await.unwrap();
    t1.execute("UPDATE dl SET v = v - 1 WHERE id = 1", &[]).await.unwrap();
    t2.execute("UPDATE dl SET v = v - 1 WHERE id = 2", &[]).await.unwrap();
    let first = tokio::spawn(async move {
        let r = t1.execute("UPDATE dl SET v = v + 1 WHERE id = 2", &[]).await;
        (t1, r)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r2 = t2.execute("UPDATE dl SET v = v + 1 WHERE id = 1", &[]).await;
    let (t1, r1) = first.await.unwrap();
    // The loser's transaction was rolled back by InnoDB; its session ends here.
    let (loser, winner, winner_tx) = match (r1, r2) {
        (Ok(_), Err(e)) => {
            drop(t2);
            (e, "t1", t1)
        }
        (Err(e), Ok(_)) => {
            drop(t1);
            (e, "t2", t2)
        }
        (a, b) => panic!(
            "one of them must deadlock: {:?} {:?}",
            a.map_err(|e| describe(&e)),
            b.map_err(|e| describe(&e))
        ),
    };
    assert_eq!(loser.errno(), Some(1213), "{}", describe(&loser));
    assert_eq!(loser.sqlstate(), Some("40001"), "{}", describe(&loser));
    winner_tx
        .commit()
        .await
        .unwrap_or_else(|e| panic!("{winner} commits: {}", describe(&e)));
    assert_eq!(
        value(&client, "dl", 1).await.unwrap() + value(&client, "dl", 2).await.unwrap(),
        200
    );

    // With the helper: both transfers complete, whatever deadlocks on the way.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let transfer = |from: i64, to: i64| {
        let (client, barrier) = (client.clone(), barrier.clone());
        tokio::spawn(async move {
            let mut first = true;
            client
                .run_transaction(TransactionOptions::default(), 5, move |tx| {
                    let barrier = barrier.clone();
                    let wait = std::mem::take(&mut first);
                    Box::pin(async move {
                        tx.execute("UPDATE dl SET v = v - 10 WHERE id = ?", &params![from])
                            .await?;
                        if wait {
                            // Both hold their first row before either asks for the second.
                            barrier.wait().await;
                        }
                        tx.execute("UPDATE dl SET v = v + 10 WHERE id = ?", &params![to])
                            .await?;
                        Ok(())
                    })
                })
                .await
        })
    };
    let (a, b) = (transfer(1, 2), transfer(2, 1));
    a.await
        .unwrap()
        .unwrap_or_else(|e| panic!("transfer 1->2: {}", describe(&e)));
    b.await
        .unwrap()
        .unwrap_or_else(|e| panic!("transfer 2->1: {}", describe(&e)));
    assert_eq!(
        value(&client, "dl", 1).await.unwrap() + value(&client, "dl", 2).await.unwrap(),
        200
    );
    let st = client.stats();
    assert!(st.streams_opened > 0);
    assert_closed_loop(&c, &[&client]).await;
}

/// What a session leaves in its database session is gone before anyone else uses the
/// worker: temporary table, user variable, isolation level, an open transaction (its
/// write), a `GET_LOCK`. One worker, so the next session is on the same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_session_state_leaks_to_the_next_session() {
    let c = cluster("[pool]\nsize = 1\n[sessions]\nmax_per_group = 1\n").await;
    let client = client(&c).await;
    setup(&client, "leak").await;
    let s = client.session().await.unwrap();
    let conn_id: (i64,) = s.query_first("SELECT CONNECTION_ID()", &[]).await.unwrap().unwrap();
    for sql in [
        "CREATE TEMPORARY TABLE leak_tmp (a INT)",
        "SET @leak = 42",
        "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SELECT GET_LOCK('leak_lock', 0)",
        "START TRANSACTION",
        "UPDATE leak SET v = 0 WHERE id = 1",
    ] {
        s.query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    }
    let (locked,): (Option<i64>,) = s
        .query_first("SELECT IS_USED_LOCK('leak_lock') IS NOT NULL", &[])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(locked, Some(1));
    // Dropped, not closed: the dispatcher ends it all the same.
    drop(s);
    let next = wait_for(Duration::from_secs(10), "a new session on the freed worker", || async {
        client.session().await.ok()
    })
    .await
    .unwrap();
    let same: (i64,) = next.query_first("SELECT CONNECTION_ID()", &[]).await.unwrap().unwrap();
    assert_eq!(same, conn_id, "one worker, and the reset keeps its connection");
    let r = next
        .query(
            "SELECT @leak, @@session.tx_isolation, @@in_transaction, IS_USED_LOCK('leak_lock'), \
             (SELECT v FROM leak WHERE id = 1)",
            &[],
        )
        .await
        .unwrap();
    let row = &r.rows()[0];
    assert_eq!(row.get::<Option<i64>>(0).unwrap(), None, "user variable leaked");
    assert_eq!(
        row.get::<String>(1).unwrap(),
        "REPEATABLE-READ",
        "isolation level leaked"
    );
    assert_eq!(row.get::<i64>(2).unwrap(), 0, "transaction leaked");
    assert_eq!(row.get::<Option<i64>>(3).unwrap(), None, "GET_LOCK leaked");
    assert_eq!(
        row.get::<i64>(4).unwrap(),
        100,
        "the open transaction's write was rolled back"
    );
    let e = next
        .query("SELECT * FROM leak_tmp", &[])
        .await
        .expect_err("temporary table leaked");
    assert_eq!(e.errno(), Some(1146), "{}", describe(&e));
    next.close().await.unwrap();
    assert_closed_loop(&c, &[&client]).await;
}

/// `sessions.idle_in_transaction_timeout_ms`: a transaction left idle is rolled back and
/// its session ended with SESSION_ABORTED (rolled back); the worker serves others again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transaction_is_rolled_back_and_its_session_ended() {
    let c = cluster("[pool]\nsize = 2\n[sessions]\nidle_in_transaction_timeout_ms = 400\n").await;
    let client = client(&c).await;
    setup(&client, "idle").await;
    let tx = client.transaction().await.unwrap();
    tx.execute("UPDATE idle SET v = 1 WHERE id = 1", &[]).await.unwrap();
    // The application "thinks" longer than the bound.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let e = tx
        .execute("UPDATE idle SET v = 2 WHERE id = 2", &[])
        .await
        .expect_err("the session was ended");
    assert_eq!(e.code(), ErrorCode::SessionAborted, "{}", describe(&e));
    let ended = tx.session().aborted().expect("the session's stream says why");
    assert_eq!(ended.code(), ErrorCode::SessionAborted, "{}", describe(&ended));
    assert_eq!(
        ended.transaction_outcome(),
        Some(TransactionOutcome::RolledBack),
        "{}",
        describe(&ended)
    );
    assert!(ended.message().contains("idle"), "{}", ended.message());
    assert_eq!(value(&client, "idle", 1).await, Some(100), "rolled back");
    assert_eq!(value(&client, "idle", 2).await, Some(100), "never ran");
    drop(tx);
    let m = c.dispatcher.metrics().await.unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("osprey_sessions_ended_total{reason=\"idle_in_transaction\"} 1")),
        "{m}"
    );
    c.dispatcher.wait_idle(2, Duration::from_secs(10)).await.unwrap();
    assert_closed_loop(&c, &[&client]).await;
}

/// `sessions.max_per_group`: sessions beyond it wait (bounded) and get SESSION_LIMIT;
/// single statements keep the unpinned workers meanwhile, from the same connection too
/// (a pinned worker counts against `pool.max_per_connection`, ¾ of 4 = 3); a closed
/// session frees a place for one that waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_capped_per_group_and_autocommit_keeps_its_workers() {
    let c = cluster("[pool]\nsize = 4\n[sessions]\nopen_timeout_ms = 300\n").await;
    let client = client(&c).await;
    let s1 = client.session().await.unwrap();
    let s2 = client.session().await.unwrap();
    let started = Instant::now();
    let e = client.session().await.expect_err("half of 4 workers: two sessions");
    assert_eq!(e.code(), ErrorCode::SessionLimit, "{}", describe(&e));
    assert!(!e.dispatched());
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert!(e.message().contains("max_per_group"), "{}", e.message());
    let other = crate::client(&c).await;
    for _ in 0..20 {
        client
            .query("SELECT 1", &[])
            .await
            .unwrap_or_else(|e| panic!("autocommit: {}", describe(&e)));
        other
            .query("SELECT 1", &[])
            .await
            .unwrap_or_else(|e| panic!("another client: {}", describe(&e)));
    }
    // A waiting open gets the place the first one frees.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            let opts = osprey_client::SessionOptions {
                open_timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            };
            client.session_with(opts).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    s1.close().await.unwrap();
    let s3 = waiting
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("after a close: {}", describe(&e)));
    s3.close().await.unwrap();
    s2.close().await.unwrap();
    assert_closed_loop(&c, &[&client, &other]).await;
}

/// A pinned worker killed (-9): the session ends with SESSION_ABORTED, and the error says
/// what became of the transaction: rolled back when no commit was in flight (a SLEEP
/// inside a transaction), unknown when one was (an autocommit write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pinned_worker_aborts_its_session_and_tells_the_truth() {
    let c = cluster("[pool]\nsize = 4\n").await;
    let client = client(&c).await;
    setup(&client, "killed").await;
    async fn kill_slot(c: &Cluster, slot: u32) {
        let pids = c.dispatcher.worker_pids().await.unwrap();
        let pid = pids
            .iter()
            .find(|(s, _)| *s == u64::from(slot))
            .and_then(|(_, p)| *p)
            .expect("pinned pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    // Inside a transaction, a statement that commits nothing in flight: rolled back.
    let tx = client.transaction().await.unwrap();
    tx.execute("UPDATE killed SET v = 1 WHERE id = 1", &[]).await.unwrap();
    let slot = tx.session().slot();
    let running = tokio::spawn(async move { (tx.query("SELECT SLEEP(5)", &[]).await, tx) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill_slot(&c, slot).await;
    let (r, tx) = running.await.unwrap();
    let e = r.expect_err("its worker died");
    assert_eq!(e.code(), ErrorCode::SessionAborted, "{}", describe(&e));
    assert!(e.dispatched());
    assert_eq!(
        e.transaction_outcome(),
        Some(TransactionOutcome::RolledBack),
        "{}",
        describe(&e)
    );
    let ended = wait_for(Duration::from_secs(5), "the session's own abort", || async {
        tx.session().aborted()
    })
    .await
    .unwrap();
    assert_eq!(
        ended.transaction_outcome(),
        Some(TransactionOutcome::RolledBack),
        "{}",
        describe(&ended)
    );
    assert_eq!(value(&client, "killed", 1).await, Some(100), "rolled back");
    drop(tx);

    // Outside a transaction, a write in flight may have committed: unknown.
    let s = client.session().await.unwrap();
    let slot = s.slot();
    let running =
        tokio::spawn(async move { (s.query("UPDATE killed SET v = 7 + SLEEP(5) WHERE id = 2", &[]).await, s) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill_slot(&c, slot).await;
    let (r, _s) = running.await.unwrap();
    let e = r.expect_err("its worker died");
    assert_eq!(e.code(), ErrorCode::SessionAborted, "{}", describe(&e));
    assert_eq!(
        e.transaction_outcome(),
        Some(TransactionOutcome::Unknown),
        "{}",
        describe(&e)
    );
    c.dispatcher.wait_idle(4, Duration::from_secs(20)).await.unwrap();
    assert_closed_loop(&c, &[&client]).await;
}

/// A client whose connection is cut with a transaction open (and a row locked): rolled
/// back, the lock released, and its worker reset and back in the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_transaction_is_rolled_back_and_its_worker_returned() {
    let c = cluster("[pool]\nsize = 2\n").await;
    let observer = client(&c).await;
    setup(&observer, "gone").await;
    let proxy = FaultProxy::start(c.dispatcher.client_addr).await.unwrap();
    let mut cfg = c.dispatcher.client_config();
    cfg.addrs = vec![proxy.addr().to_string()];
    let leaving = Client::connect(cfg).await.unwrap();
    let tx = leaving.transaction().await.unwrap();
    tx.execute("UPDATE gone SET v = 5 WHERE id = 1", &[]).await.unwrap();
    tx.query("SELECT v FROM gone WHERE id = 2 FOR UPDATE", &[])
        .await
        .unwrap();
    proxy.reset_all();
    c.dispatcher.wait_idle(2, Duration::from_secs(10)).await.unwrap();
    assert_eq!(value(&observer, "gone", 1).await, Some(100));
    // The row lock went with the transaction.
    let t2 = observer.transaction().await.unwrap();
    let r = t2.query("SELECT v FROM gone WHERE id = 2 FOR UPDATE NOWAIT", &[]).await;
    assert!(r.is_ok(), "lock released: {:?}", r.map_err(|e| describe(&e)));
    t2.commit().await.unwrap();
    // The abandoned transaction learns it: its connection is gone.
    let e = tx
        .execute("UPDATE gone SET v = 6 WHERE id = 1", &[])
        .await
        .expect_err("session gone");
    assert_eq!(e.code(), ErrorCode::SessionAborted, "{}", describe(&e));
    drop(tx);
    let m = c.dispatcher.metrics().await.unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("osprey_sessions_ended_total{reason=\"disconnected\"} 1")),
        "{m}"
    );
    assert_closed_loop(&c, &[&observer]).await;
}

/// `osprey shell` keeps one session across its statements: a transaction typed by hand
/// (a statement over two lines, `BEGIN`, a write seen inside, `ROLLBACK`) behaves as in the
/// mariadb client, and a user variable lives from one statement to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn osprey_shell_runs_a_transaction_on_one_session() {
    let c = cluster("[pool]\nsize = 2\n").await;
    let client = client(&c).await;
    setup(&client, "shell").await;
    let script = "SET @who = 'shell';\nBEGIN;\nUPDATE shell\n  SET v = 7 WHERE id = 1;\n\
                  SELECT v, @who AS who FROM shell WHERE id = 1;\nROLLBACK;\n\
                  SELECT v AS after FROM shell WHERE id = 1;\n\\q\n";
    let (addr, token) = (c.dispatcher.client_addr.to_string(), c.dispatcher.client_token.clone());
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new(osprey_tests::harness::bin_dir().join("osprey"))
            .args(["--addr", &addr, "--token", &token, "shell"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run osprey shell");
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let inside = stdout.find("shell").expect("the variable survived to the SELECT");
    assert!(
        stdout[..inside].contains('7'),
        "the write is seen inside the transaction:\n{stdout}"
    );
    let after = stdout.find("after").expect("the last SELECT ran");
    assert!(stdout[after..].contains("100"), "rolled back:\n{stdout}");
    assert_eq!(value(&client, "shell", 1).await, Some(100));
    c.dispatcher.wait_idle(2, Duration::from_secs(10)).await.unwrap();
    assert_closed_loop(&c, &[&client]).await;
}

/// What ops see: `/status` counts the pinned sessions and those in a transaction,
/// `GET /sessions` lists each (connection, session, member, slot, transaction age), and
/// `POST /sessions/kill` ends one: its client gets SESSION_ABORTED (rolled back), the
/// worker is reset and serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_see_the_sessions_and_can_end_one() {
    let c = cluster("[pool]\nsize = 2\n").await;
    let client = client(&c).await;
    setup(&client, "ops_s").await;
    let tx = client.transaction().await.unwrap();
    tx.execute("UPDATE ops_s SET v = 1 WHERE id = 1", &[]).await.unwrap();
    let status = c.dispatcher.status().await.unwrap();
    let group = &status["groups"][0];
    assert_eq!(group["sessions"], 1, "{group}");
    assert_eq!(group["max_sessions"], 1, "half of 2: {group}");
    assert_eq!(group["sessions_in_transaction"], 1, "{group}");
    let listed = c.dispatcher.admin_get("/sessions").await.unwrap();
    let one = &listed[0];
    assert_eq!(one["slot"], u64::from(tx.session().slot()), "{listed}");
    assert_eq!(one["in_transaction"], true, "{listed}");
    assert_eq!(one["member"], tx.session().member(), "{listed}");
    let (conn, session) = (one["conn"].as_u64().unwrap(), one["session"].as_u64().unwrap());
    let (code, body) = c
        .dispatcher
        .admin_post("/sessions/kill", serde_json::json!({"conn": conn, "session": session}))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let ended = wait_for(Duration::from_secs(5), "the session's abort", || async {
        tx.session().aborted()
    })
    .await
    .unwrap();
    assert_eq!(ended.code(), ErrorCode::SessionAborted, "{}", describe(&ended));
    assert_eq!(ended.transaction_outcome(), Some(TransactionOutcome::RolledBack));
    assert!(ended.message().contains("operator"), "{}", ended.message());
    assert_eq!(value(&client, "ops_s", 1).await, Some(100), "rolled back");
    let (code, _) = c
        .dispatcher
        .admin_post("/sessions/kill", serde_json::json!({"conn": conn, "session": session}))
        .await
        .unwrap();
    assert_eq!(code, 404, "gone");
    drop(tx);
    let status = c.dispatcher.status().await.unwrap();
    assert_eq!(status["groups"][0]["sessions"], 0, "{status}");
    c.dispatcher.wait_idle(2, Duration::from_secs(10)).await.unwrap();
    assert_closed_loop(&c, &[&client]).await;
}

/// A session that only ran a transaction ends with a ROLLBACK, not the full reset (its
/// worker keeps its prepared statements): the next session on the worker finds no
/// transaction open, the uncommitted write undone, no row lock held, autocommit on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_only_ran_a_transaction_ends_rolled_back() {
    let c = cluster("[pool]\nsize = 1\n[sessions]\nmax_per_group = 1\n").await;
    let client = client(&c).await;
    setup(&client, "clean").await;
    let tx = client.transaction().await.unwrap();
    tx.execute("SAVEPOINT s1", &[]).await.unwrap();
    tx.execute("UPDATE clean SET v = 0 WHERE id = 1", &[]).await.unwrap();
    tx.query("SELECT v FROM clean WHERE id = 2 FOR UPDATE", &[])
        .await
        .unwrap();
    let (conn_id,): (i64,) = tx.query_first("SELECT CONNECTION_ID()", &[]).await.unwrap().unwrap();
    drop(tx);
    let next = wait_for(Duration::from_secs(10), "a new session on the freed worker", || async {
        client.session().await.ok()
    })
    .await
    .unwrap();
    let r = next
        .query(
            "SELECT CONNECTION_ID(), @@in_transaction, @@autocommit, (SELECT v FROM clean WHERE id = 1)",
            &[],
        )
        .await
        .unwrap();
    let row = &r.rows()[0];
    assert_eq!(
        row.get::<i64>(0).unwrap(),
        conn_id,
        "the same worker and database session"
    );
    assert_eq!(row.get::<i64>(1).unwrap(), 0, "no transaction left open");
    assert_eq!(row.get::<i64>(2).unwrap(), 1, "autocommit on");
    assert_eq!(row.get::<i64>(3).unwrap(), 100, "the write was rolled back");
    // From another database session (its own locks would not conflict with themselves).
    use mysql_async::prelude::Queryable;
    let mut other = c.sandbox.primary().conn().await.unwrap();
    other.query_drop("START TRANSACTION").await.unwrap();
    let locked = other
        .query_drop("SELECT v FROM clean WHERE id = 2 FOR UPDATE NOWAIT")
        .await;
    assert!(locked.is_ok(), "the row lock went: {locked:?}");
    other.query_drop("ROLLBACK").await.unwrap();
    next.close().await.unwrap();
    assert_closed_loop(&c, &[&client]).await;
}

//! Risk: the database session of a worker dies under it (killed by an operator, a proxy,
//! a failover). The request gets an error, the worker exits, a fresh one takes the slot.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_client::{Client, Error, ErrorCode, Origin};
use osprey_tests::harness::{process_alive, wait_for, Cluster};

use crate::{assert_closed_loop, cluster, describe, serial, slots, wait_busy, wait_replaced, SlotInfo};

/// The errors a request may get when its worker's session was killed: the worker's
/// DATABASE_FATAL, or WORKER_LOST if the worker died before answering.
fn assert_fatal(err: &Error) {
    match (err.code(), err.origin()) {
        (ErrorCode::DatabaseFatal, Origin::Worker) | (ErrorCode::WorkerLost, _) => {}
        _ => panic!(
            "expected DATABASE_FATAL (origin worker) or WORKER_LOST, got {}",
            describe(err)
        ),
    }
    assert!(err.dispatched(), "{}", describe(err));
}

async fn fatal_exits(c: &Cluster) -> u64 {
    c.dispatcher.status().await.unwrap()["pool"]["fatal_exits"]
        .as_u64()
        .unwrap()
}

/// After the session of `victim` was killed and its request failed: the worker is gone,
/// a fresh one (new pid, new database session) serves the slot.
async fn assert_replaced(c: &Cluster, victim: &SlotInfo) {
    let pid = victim.pid.unwrap();
    let fresh = wait_replaced(&c.dispatcher, victim.slot, pid, Duration::from_secs(10)).await;
    assert_ne!(fresh.db_connection_id, victim.db_connection_id);
    wait_for(Duration::from_secs(2), "the worker to exit", || async {
        (!process_alive(pid)).then_some(())
    })
    .await
    .unwrap();
    println!(
        "fatal database error: slot {} pid {pid} (session {:?}) replaced by pid {:?} (session {:?})",
        victim.slot, victim.db_connection_id, fresh.pid, fresh.db_connection_id
    );
}

async fn kill_session(db: &mut mysql_async::Conn, id: u64) {
    db.query_drop(format!("KILL {id}")).await.expect("KILL <connection id>");
}

/// Test 5. `KILL <db_connection_id>` from outside, while the worker is idle and while it
/// is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_session_killed() {
    let _serial = serial().await;
    // One connection keeps both workers busy: no per-connection cap.
    let c = cluster("[pool]\nsize = 2\nmax_per_connection = 0\n").await;
    let d = &c.dispatcher;
    let client: Client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let mut db = c.sandbox.primary().conn().await.unwrap();

    // Idle: kill one worker's session, then keep both workers busy at once so that one of
    // the two requests lands on it. Exactly that one fails; the other succeeds.
    let exits0 = fatal_exits(&c).await;
    let victim = slots(d).await[0].clone();
    assert_eq!(victim.state, "idle");
    kill_session(&mut db, victim.db_connection_id.expect("db connection id")).await;
    let results = futures::future::join_all((0..2).map(|i| client.query(format!("SELECT SLEEP(0.3), {i}"), &[]))).await;
    let errors: Vec<&Error> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(
        errors.len(),
        1,
        "exactly the request on the killed session fails: {results:?}"
    );
    println!("idle session killed: {}", describe(errors[0]));
    assert_fatal(errors[0]);
    assert_replaced(&c, &victim).await;
    wait_for(Duration::from_secs(5), "fatal_exits to count the worker", || async {
        (fatal_exits(&c).await == exits0 + 1).then_some(())
    })
    .await
    .unwrap();
    for i in 0..4 {
        client.query(format!("SELECT {i}"), &[]).await.unwrap();
    }
    assert_closed_loop(&c, &[&client], 2).await;

    // Busy: kill the session under a running SELECT SLEEP(5).
    let t0 = Instant::now();
    let running = tokio::spawn({
        let client = client.clone();
        async move { client.query("SELECT SLEEP(5)", &[]).await }
    });
    let busy = wait_busy(d, Duration::from_secs(2)).await;
    kill_session(&mut db, busy.db_connection_id.expect("db connection id")).await;
    let err = tokio::time::timeout(Duration::from_secs(3), running)
        .await
        .expect("the request must end soon after its session was killed")
        .unwrap()
        .expect_err("its session was killed");
    println!(
        "busy session killed: {} after {} ms",
        describe(&err),
        t0.elapsed().as_millis()
    );
    assert_fatal(&err);
    assert_replaced(&c, &busy).await;
    wait_for(Duration::from_secs(5), "fatal_exits to count the worker", || async {
        (fatal_exits(&c).await == exits0 + 2).then_some(())
    })
    .await
    .unwrap();
    for i in 0..4 {
        client.query(format!("SELECT {i}"), &[]).await.unwrap();
    }
    assert_closed_loop(&c, &[&client], 2).await;
    drop(db);
}

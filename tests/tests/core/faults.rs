//! Tests 3, 4, 6, 7: batch atomicity, killed workers, queue overflow and timeout, refusals.
//! Each ends with the closed-loop check (test 9).

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use mysql_async::prelude::Queryable;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use osprey_client::{statement, Client, ClientConfig, ErrorCode, Origin, Value};
use osprey_protocol::{ErrorBody, Frame, FrameCodec, Hello, HelloAck, Kind, Request, Role, DEFAULT_MAX_PAYLOAD};
use osprey_tests::harness::{process_alive, wait_for, Dispatcher};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::codec::Framed;

use crate::{assert_closed_loop, client, cluster, describe};

/// Test 3: a batch whose third statement fails leaves no trace; a good batch commits all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_transaction_is_atomic() {
    let c = cluster("[pool]\nsize = 1\n").await;
    let mut db = c.sandbox.primary().conn().await.unwrap();
    db.query_drop("CREATE TABLE acct (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
        .await
        .unwrap();
    db.query_drop("INSERT INTO acct VALUES (3, 'existing')").await.unwrap();
    let client = client(&c).await;

    let err = client
        .batch(vec![
            statement("INSERT INTO acct VALUES (?, ?)", vec![Value::Int(1), "one".into()]),
            statement("INSERT INTO acct VALUES (2, 'two')", vec![]),
            statement("INSERT INTO acct VALUES (?, 'dup')", vec![Value::Int(3)]),
            statement("INSERT INTO acct VALUES (4, 'four')", vec![]),
        ])
        .await
        .expect_err("the duplicate key must fail the batch");
    assert_eq!(err.origin(), Origin::Database, "{}", describe(&err));
    assert_eq!(err.code(), ErrorCode::Database, "{}", describe(&err));
    assert_eq!(err.errno(), Some(1062), "{}", describe(&err));
    assert_eq!(err.sqlstate(), Some("23000"), "{}", describe(&err));
    assert!(err.dispatched(), "{}", describe(&err));
    let ids: Vec<i32> = db.query("SELECT id FROM acct ORDER BY id").await.unwrap();
    assert_eq!(ids, vec![3], "the failed batch left a trace");
    // The (only) worker's session is not left inside a transaction.
    let in_tx: Option<(i64,)> = client.query_first("SELECT @@in_transaction", &[]).await.unwrap();
    assert_eq!(in_tx, Some((0,)));

    let ok = client
        .batch(vec![
            statement("INSERT INTO acct VALUES (?, ?)", vec![Value::Int(1), "one".into()]),
            statement("INSERT INTO acct VALUES (2, 'two')", vec![]),
            statement("UPDATE acct SET v = ? WHERE id = 3", vec!["updated".into()]),
            statement("SELECT COUNT(*) FROM acct", vec![]),
        ])
        .await
        .unwrap_or_else(|e| panic!("good batch: {}", describe(&e)));
    assert_eq!(ok.summary.affected_rows, 3);
    assert_eq!(ok.sets.len(), 1, "the SELECT's result set");
    assert_eq!(
        ok.sets[0].rows[0].get::<i64>(0).unwrap(),
        3,
        "the batch sees its own writes"
    );
    let rows: Vec<(i32, String)> = db.query("SELECT id, v FROM acct ORDER BY id").await.unwrap();
    assert_eq!(
        rows,
        vec![(1, "one".into()), (2, "two".into()), (3, "updated".into())],
        "the good batch committed everything"
    );
    assert_closed_loop(&c, &[&client]).await;
}

fn pid_of(status: &serde_json::Value, slot: u64) -> Option<u64> {
    status["slots"].as_array()?.iter().find(|s| s["slot"] == slot)?["pid"].as_u64()
}

/// Waits (1 s) until `slot` has a live worker process other than `old`.
async fn wait_new_pid(d: &Dispatcher, slot: u64, old: u64) -> u64 {
    let started = Instant::now();
    let new = wait_for(Duration::from_secs(1), &format!("a new pid in slot {slot}"), || async {
        let s = d.status().await.ok()?;
        pid_of(&s, slot).filter(|p| *p != old && process_alive(*p as u32))
    })
    .await
    .unwrap();
    println!("slot {slot}: pid {old} -> {new} in {:?}", started.elapsed());
    new
}

/// Test 4: kill -9 of an idle worker and of a busy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_are_replaced_and_only_their_request_fails() {
    let c = cluster("[pool]\nsize = 4\n").await;
    let d = &c.dispatcher;
    let client = client(&c).await;

    // Idle worker.
    let s = d.status().await.unwrap();
    let slot = s["slots"][0]["slot"].as_u64().unwrap();
    let victim = pid_of(&s, slot).expect("slot has a worker");
    kill(Pid::from_raw(victim as i32), Signal::SIGKILL).unwrap();
    wait_new_pid(d, slot, victim).await;
    d.wait_idle(4, Duration::from_secs(10)).await.expect("pool refilled");

    // Busy worker: one long request, identified as the only busy slot.
    let long = {
        let client = client.clone();
        tokio::spawn(async move { client.query("SELECT SLEEP(30)", &[]).await })
    };
    let (slot, victim) = wait_for(Duration::from_secs(5), "one busy slot", || async {
        let s = d.status().await.ok()?;
        let busy: Vec<_> = s["slots"].as_array()?.iter().filter(|w| w["state"] == "busy").collect();
        (busy.len() == 1).then(|| (busy[0]["slot"].as_u64().unwrap(), busy[0]["pid"].as_u64().unwrap()))
    })
    .await
    .unwrap();
    // Ten other requests on the same client connection, running on the other workers.
    let others: Vec<_> = (0..10)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.query("SELECT SLEEP(0.3), ?", &[Value::Int(i)]).await })
        })
        .collect();
    wait_for(Duration::from_secs(5), "the others to be running", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["busy"].as_u64()? >= 2).then_some(())
    })
    .await
    .unwrap();
    kill(Pid::from_raw(victim as i32), Signal::SIGKILL).unwrap();
    let killed_at = Instant::now();
    wait_new_pid(d, slot, victim).await;

    let err = tokio::time::timeout(Duration::from_secs(5), long)
        .await
        .expect("the killed worker's request ends promptly")
        .unwrap()
        .expect_err("the killed worker's request fails");
    println!(
        "busy worker's request failed after {:?}: {}",
        killed_at.elapsed(),
        describe(&err)
    );
    assert_eq!(err.origin(), Origin::Worker, "{}", describe(&err));
    assert!(
        matches!(err.code(), ErrorCode::WorkerLost | ErrorCode::DatabaseFatal),
        "{}",
        describe(&err)
    );
    assert!(err.dispatched(), "it had reached the database: {}", describe(&err));
    for (i, h) in others.into_iter().enumerate() {
        let r = h
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {i}: {}", describe(&e)));
        assert_eq!(r.rows()[0].get::<i64>(1).unwrap(), i as i64);
    }
    d.wait_idle(4, Duration::from_secs(10)).await.expect("pool refilled");
    let s = assert_closed_loop(&c, &[&client]).await;
    assert!(s["pool"]["respawns"].as_u64().unwrap() >= 2, "{}", s["pool"]);
}

/// Test 6: queue overflow (QUEUE_FULL at once) and queue timeout (after ~1.5 s; long
/// enough that a loaded CI machine still sees both requests queued before it passes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_overflow_and_queue_timeout() {
    let c = cluster("[pool]\nsize = 1\nqueue_capacity = 2\nqueue_timeout_ms = 1500\n").await;
    let d = &c.dispatcher;
    let client = client(&c).await;

    let occupier = {
        let client = client.clone();
        tokio::spawn(async move { client.query("SELECT SLEEP(6)", &[]).await })
    };
    wait_for(Duration::from_secs(5), "the worker busy", || async {
        (d.status().await.ok()?["pool"]["busy"] == 1).then_some(())
    })
    .await
    .unwrap();

    let queued_at = Instant::now();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                (client.query("SELECT 1", &[]).await, t.elapsed())
            })
        })
        .collect();
    wait_for(Duration::from_millis(1200), "two requests in the queue", || async {
        (d.status().await.ok()?["pool"]["queue_depth"] == 2).then_some(())
    })
    .await
    .expect("both requests wait (the queue timeout has not passed yet)");

    let t = Instant::now();
    let full = client.query("SELECT 1", &[]).await.expect_err("the queue is full");
    let full_after = t.elapsed();
    println!("QUEUE_FULL after {full_after:?}: {}", describe(&full));
    assert_eq!(full.code(), ErrorCode::QueueFull, "{}", describe(&full));
    assert_eq!(full.origin(), Origin::Dispatcher, "{}", describe(&full));
    assert!(!full.dispatched(), "{}", describe(&full));
    // Immediately: while the two others are still waiting for their 1.5 s.
    assert!(
        waiting.iter().all(|h| !h.is_finished()),
        "QUEUE_FULL came only after a queued request had ended ({:?} after queueing)",
        queued_at.elapsed()
    );

    for h in waiting {
        let (r, elapsed) = h.await.unwrap();
        let e = r.expect_err("no worker frees up within the queue timeout");
        println!("QUEUE_TIMEOUT after {elapsed:?}: {}", describe(&e));
        assert_eq!(e.code(), ErrorCode::QueueTimeout, "{}", describe(&e));
        assert_eq!(e.origin(), Origin::Dispatcher, "{}", describe(&e));
        assert!(!e.dispatched(), "{}", describe(&e));
        assert!(elapsed >= Duration::from_millis(1500), "timed out early: {elapsed:?}");
        assert!(elapsed < Duration::from_millis(3500), "timed out late: {elapsed:?}");
    }

    // With room in the queue again, one more request waits, then times out.
    let t = Instant::now();
    let e = client.query("SELECT 1", &[]).await.expect_err("still no worker");
    let elapsed = t.elapsed();
    assert_eq!(e.code(), ErrorCode::QueueTimeout, "{}", describe(&e));
    assert!(!e.dispatched());
    assert!(
        (Duration::from_millis(1500)..Duration::from_millis(3500)).contains(&elapsed),
        "{elapsed:?}"
    );

    let r = occupier
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("occupier: {}", describe(&e)));
    assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 0);
    // And the pool serves again.
    client.query("SELECT 1", &[]).await.unwrap();
    let s = assert_closed_loop(&c, &[&client]).await;
    assert_eq!(s["pool"]["queue_depth"], 0);
}

/// A raw client connection speaking frames, for what the SDK would hide.
async fn raw_client(d: &Dispatcher) -> (Framed<TcpStream, FrameCodec>, HelloAck) {
    let tcp = TcpStream::connect(d.client_addr).await.unwrap();
    let mut f = Framed::new(tcp, FrameCodec::new(DEFAULT_MAX_PAYLOAD));
    let hello = Hello {
        version_major: 1,
        version_minor: 0,
        role: Role::Client,
        token: Some(d.client_token.clone()),
        secret: None,
        slot: None,
        pid: None,
        name: Some("core-test-raw".into()),
        stream_window: None,
    };
    f.send(Frame::new(Kind::Hello, 0, &hello)).await.unwrap();
    let ack = f.next().await.expect("an answer").unwrap();
    assert_eq!(ack.kind, Kind::HelloAck);
    let ack: HelloAck = ack.body().unwrap();
    (f, ack)
}

/// Test 7: wrong token, one stream over the cap, a worker without the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals() {
    let c = cluster("[pool]\nsize = 2\n[limits]\nmax_streams_per_connection = 4\n").await;
    let d = &c.dispatcher;

    // Wrong token.
    let err = Client::connect(ClientConfig::new(d.client_addr.to_string(), "not-the-token"))
        .await
        .expect_err("a wrong token is refused");
    assert_eq!(err.code(), ErrorCode::AuthFailed, "{}", describe(&err));
    assert_eq!(err.origin(), Origin::Dispatcher, "{}", describe(&err));
    assert!(!err.dispatched());

    // One stream over the cap: raw frames (the SDK would queue locally at the cap).
    let (mut f, ack) = raw_client(d).await;
    assert_eq!(ack.max_streams, 4);
    for stream in 1..=4u32 {
        let req = Request::sql(format!("SELECT SLEEP(0.5), {stream}"));
        f.feed(Frame::new(Kind::Request, stream, &req)).await.unwrap();
    }
    f.feed(Frame::new(Kind::Request, 5, &Request::sql("SELECT 5")))
        .await
        .unwrap();
    SinkExt::<Frame>::flush(&mut f).await.unwrap();
    let mut ended: Vec<u32> = Vec::new();
    let mut errors: Vec<(u32, ErrorBody)> = Vec::new();
    let mut rows_seen: Vec<u32> = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while ended.len() < 5 {
            let frame = f.next().await.expect("connection stays open").unwrap();
            match frame.kind {
                Kind::Ping => f
                    .send(Frame::new(
                        Kind::Pong,
                        0,
                        &frame.body::<osprey_protocol::Ping>().unwrap(),
                    ))
                    .await
                    .unwrap(),
                Kind::Error => errors.push((frame.stream, frame.body().unwrap())),
                Kind::End => {
                    assert!(!ended.contains(&frame.stream), "second END on stream {}", frame.stream);
                    ended.push(frame.stream);
                }
                Kind::Rows => rows_seen.push(frame.stream),
                Kind::Columns => {}
                other => panic!("unexpected {other:?} on stream {}", frame.stream),
            }
        }
    })
    .await
    .expect("all five streams end");
    assert_eq!(errors.len(), 1, "only the fifth stream fails: {errors:?}");
    assert_eq!(errors[0].0, 5);
    assert_eq!(errors[0].1.code, ErrorCode::TooManyStreams, "{:?}", errors[0].1);
    assert!(!errors[0].1.dispatched);
    assert_eq!(
        ended[0], 5,
        "the refusal comes at once, before the sleeping streams end: {ended:?}"
    );
    let mut rest = ended[1..].to_vec();
    rest.sort();
    assert_eq!(rest, vec![1, 2, 3, 4]);
    rows_seen.sort();
    assert_eq!(rows_seen, vec![1, 2, 3, 4], "each sleeping stream got its row");
    drop(f);

    // A worker without the secret.
    let before = d.worker_pids().await.unwrap();
    let sock = UnixStream::connect(d.worker_socket()).await.expect("worker socket");
    let mut w = Framed::new(sock, FrameCodec::new(DEFAULT_MAX_PAYLOAD));
    let hello = Hello {
        version_major: 1,
        version_minor: 0,
        role: Role::Worker,
        token: None,
        secret: Some("not-the-secret".into()),
        slot: Some(before[0].0 as u32),
        pid: Some(std::process::id()),
        name: Some("impostor".into()),
        stream_window: None,
    };
    w.send(Frame::new(Kind::Hello, 0, &hello)).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("an answer")
        .expect("an ERROR frame")
        .unwrap();
    assert_eq!((answer.kind, answer.stream), (Kind::Error, 0));
    let body: ErrorBody = answer.body().unwrap();
    assert_eq!(body.code, ErrorCode::AuthFailed, "{body:?}");
    let closed = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("the connection closes");
    assert!(closed.is_none(), "nothing after the ERROR: {closed:?}");
    // The pool is unaffected: same workers, all idle, and they serve.
    d.wait_idle(2, Duration::from_secs(5)).await.unwrap();
    assert_eq!(d.worker_pids().await.unwrap(), before);
    let client = client(&c).await;
    let r = client.query("SELECT ?", &[Value::Int(7)]).await.unwrap();
    assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 7);
    assert_closed_loop(&c, &[&client]).await;
}

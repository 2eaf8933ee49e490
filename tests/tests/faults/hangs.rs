//! Risks: a worker that hangs in the middle of a request, and a database that hangs.

use std::time::{Duration, Instant};

use futures::future::join_all;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use osprey_client::{ErrorCode, Origin};
use osprey_tests::harness::{process_alive, wait_for};

use osprey_protocol::{ErrorBody, Frame, Kind, Request};

use crate::raw::{Got, Raw};
use crate::{assert_closed_loop, cluster, describe, ms, serial, slots, wait_busy, wait_replaced};

/// Test 3. A worker is SIGSTOPped while it runs `SELECT SLEEP(3)`: at `request_timeout`
/// (1 s) the client gets ERROR REQUEST_TIMEOUT (origin dispatcher) + END, the worker is
/// killed and replaced, and the other streams of the same connection are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_worker_during_request() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 3\n[timeouts]\nrequest_timeout_ms = 1000\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();

    let t0 = Instant::now();
    let hung = tokio::spawn({
        let client = client.clone();
        async move {
            let r = client.query("SELECT SLEEP(3)", &[]).await;
            (r, t0.elapsed())
        }
    });
    let busy = wait_busy(d, Duration::from_secs(2)).await;
    let pid = busy.pid.unwrap();
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
    wait_for(Duration::from_millis(500), "the worker to be stopped", || async {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')').next()?.trim_start().starts_with('T').then_some(())
    })
    .await
    .unwrap();
    let stopped_ms = ms(t0);
    assert!(
        stopped_ms < 900,
        "the worker was stopped only after {stopped_ms} ms: the test proves nothing"
    );

    // Other streams on the same connection keep being served by the other workers.
    let mut others = 0;
    while !hung.is_finished() {
        let r = client
            .query("SELECT 7", &[])
            .await
            .unwrap_or_else(|e| panic!("other stream: {}", describe(&e)));
        assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 7);
        others += 1;
        assert!(t0.elapsed() < Duration::from_secs(5), "the hung request never ended");
    }
    let (r, took) = hung.await.unwrap();
    let err = r.expect_err("a hung worker cannot answer");
    println!(
        "hung worker: {} after {} ms ({others} other requests served meanwhile)",
        describe(&err),
        took.as_millis()
    );
    assert_eq!(err.code(), ErrorCode::RequestTimeout, "{}", describe(&err));
    assert_eq!(err.origin(), Origin::Dispatcher, "{}", describe(&err));
    assert!(err.dispatched(), "{}", describe(&err));
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_millis(2000),
        "the stream ended {took:?} after start, expected ~1 s"
    );
    assert!(others > 0);

    let fresh = wait_replaced(d, busy.slot, pid, Duration::from_secs(10)).await;
    println!("hung worker: slot {} now pid {:?}", busy.slot, fresh.pid);
    wait_for(Duration::from_secs(2), "the hung worker to be gone", || async {
        (!process_alive(pid)).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 1.0);
    for i in 0..6 {
        client.query(format!("SELECT {i}"), &[]).await.unwrap();
    }
    assert_closed_loop(&c, &[&client], 3).await;
}

/// Test 4. The database hangs (`mariadbd` SIGSTOPped) for ~3 s. Requests fail within
/// bounds with REQUEST_TIMEOUT (on a worker) or QUEUE_TIMEOUT (waiting for one); the
/// replaced workers cannot connect (connect_timeout 500 ms) and their slots back off
/// instead of respawning in a hot loop; after SIGCONT the pool recovers and queries succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_database() {
    let _serial = serial().await;
    const SLOTS: u64 = 4;
    const MIN_BACKOFF_MS: f64 = 50.0; // harness default respawn_backoff_min_ms
    let c = cluster(
        "[pool]\nsize = 4\nqueue_timeout_ms = 1000\n\
         [timeouts]\nrequest_timeout_ms = 1000\n\
         [backend]\nconnect_timeout_ms = 500\n",
    )
    .await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    join_all((0..8).map(|i| client.query(format!("SELECT SLEEP(0.05), {i}"), &[])))
        .await
        .into_iter()
        .for_each(|r| {
            r.unwrap();
        });
    let respawns0 = d.status().await.unwrap()["pool"]["respawns"].as_u64().unwrap();

    let primary = c.sandbox.primary();
    let t_stop = Instant::now();
    primary.stop();
    let mut timeouts = 0;
    let mut queue_timeouts = 0;
    let mut slowest = Duration::ZERO;
    // Waves of concurrent requests while the database is stopped.
    while t_stop.elapsed() < Duration::from_millis(3000) {
        let wave = join_all((0..6).map(|i| {
            let client = client.clone();
            async move {
                let t = Instant::now();
                let r = client.query(format!("SELECT {i}"), &[]).await;
                (r, t.elapsed())
            }
        }))
        .await;
        for (r, took) in wave {
            let err = r.expect_err("the database is stopped: nothing can succeed");
            match err.code() {
                ErrorCode::RequestTimeout => timeouts += 1,
                ErrorCode::QueueTimeout => {
                    assert!(!err.dispatched(), "{}", describe(&err));
                    queue_timeouts += 1
                }
                _ => panic!("unexpected error while the database hangs: {}", describe(&err)),
            }
            assert_eq!(err.origin(), Origin::Dispatcher, "{}", describe(&err));
            // At worst: queue_timeout, then a worker handed over at the last moment hangs
            // for request_timeout.
            assert!(took < Duration::from_millis(2800), "a request took {took:?}");
            slowest = slowest.max(took);
        }
    }
    let stopped_for = t_stop.elapsed();
    let respawns = d.status().await.unwrap()["pool"]["respawns"].as_u64().unwrap() - respawns0;
    primary.cont();
    // Back-off bound. A slot's first respawn after a kill is immediate; after that, every
    // failed start (BACKEND_UNAVAILABLE) doubles a back-off starting at 50 ms, so within T ms
    // a slot makes at most log2(T/50 + 1) + 1 further attempts (ignoring the time each start
    // itself takes, 500 ms connect timeout included). A hot loop would make hundreds.
    let t_ms = stopped_for.as_millis() as f64;
    let per_slot = ((t_ms / MIN_BACKOFF_MS + 1.0).log2().floor() as u64) + 2;
    let bound = SLOTS * per_slot;
    println!(
        "hung database: stopped {} ms; {timeouts} REQUEST_TIMEOUT, {queue_timeouts} QUEUE_TIMEOUT, slowest {slowest:?}; \
         {respawns} respawns (bound {bound} = {SLOTS} slots x {per_slot})",
        stopped_for.as_millis()
    );
    assert!(timeouts >= 1, "no request reached a hung worker");
    assert!(respawns >= 1, "hung workers must have been replaced");
    assert!(
        respawns <= bound,
        "{respawns} respawns in {t_ms} ms: respawn loop without back-off"
    );

    // Recovery: every slot idle again (slots may sit in back-off up to 2 s), queries succeed.
    let t_cont = Instant::now();
    d.wait_idle(SLOTS as usize, Duration::from_secs(20))
        .await
        .expect("pool recovers");
    println!("hung database: pool all idle {} ms after SIGCONT", ms(t_cont));
    let results = join_all((0..8).map(|i| client.query(format!("SELECT {i}"), &[]))).await;
    for (i, r) in results.into_iter().enumerate() {
        let r = r.unwrap_or_else(|e| panic!("after recovery: {}", describe(&e)));
        assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), i as i64);
    }
    let s = assert_closed_loop(&c, &[&client], SLOTS as usize).await;
    assert_eq!(slots(d).await.len(), SLOTS as usize);
    println!("hung database: final pool {}", s["pool"]);
}

/// Review finding (relay rewrite). A REQUEST bigger than the worker socket's buffer
/// with a 1 ms timeout is a REQUEST_TIMEOUT on one worker. The deadline once also
/// bounded the write of the REQUEST into the worker socket, so the write "failed", the
/// worker was taken for dead, the request went to the next worker and the next: three
/// healthy workers killed and WORKER_LOST (retryable) for the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_with_a_short_timeout() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 3\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    d.wait_idle(3, Duration::from_secs(10)).await.unwrap();

    // ~15 MB of SQL: a Unix socket takes a few hundred KB before its reader must
    // catch up, so the write alone outlasts 1 ms. A raw client: the SDK would give up
    // locally at 1 ms and cancel.
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    let sql = format!("SELECT LENGTH('{}')", "x".repeat(15_000_000));
    let request = Request {
        timeout_ms: 1,
        ..Request::sql(sql)
    };
    let t0 = Instant::now();
    raw.send(Frame::new(Kind::Request, 1, &request)).await;
    let err = match raw.next_data(Duration::from_secs(10)).await {
        Got::Frame(f) if f.kind == Kind::Error && f.stream == 1 => f.body::<ErrorBody>().unwrap(),
        other => panic!("expected ERROR on stream 1, got {other:?}"),
    };
    match raw.next_data(Duration::from_secs(5)).await {
        Got::Frame(f) if f.kind == Kind::End && f.stream == 1 => {}
        other => panic!("expected END on stream 1, got {other:?}"),
    }
    println!("large request, 1 ms timeout: {err:?} after {} ms", ms(t0));
    assert_eq!(err.code, ErrorCode::RequestTimeout, "{err:?}");
    assert_eq!(err.origin, Origin::Dispatcher, "{err:?}");
    // The worker that got the request is killed (request_timeout stops a statement by
    // killing its worker); no other.
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 1.0);
    d.wait_idle(3, Duration::from_secs(10)).await.unwrap();
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 1.0);
    client.query("SELECT 1", &[]).await.unwrap();
    assert_closed_loop(&c, &[&client], 3).await;
}

//! Risk: a client that stops reading pins a worker (and dispatcher memory) forever.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_protocol::{ErrorBody, ErrorCode, Frame, Kind, Ping, Rows};
use osprey_tests::harness::{process_alive, rss_kib, wait_for};

use crate::raw::{request, Got, Raw};
use crate::{assert_closed_loop, cluster, describe, ms, serial, slots};

/// Test 7. A raw client asks for ~200 MB of rows and never reads: within a few seconds
/// (client_write_timeout 1 s once the socket buffers are full) the dispatcher cuts it off
/// and the worker goes back to idle through KILL QUERY (same pid), while a normal client's
/// queries keep succeeding throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_client_is_cut_off() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\n[limits]\nclient_write_timeout_ms = 1000\nclient_write_queue = 16\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let rss0 = rss_kib(d.pid()).unwrap();

    // The normal client, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let normal = tokio::spawn({
        let (client, stop, ok) = (client.clone(), stop.clone(), ok.clone());
        async move {
            let mut worst = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let r = client.query("SELECT 'still here'", &[]).await;
                if let Err(e) = r {
                    panic!("the normal client failed: {}", describe(&e));
                }
                worst = worst.max(t.elapsed());
                ok.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            worst
        }
    });

    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    let t0 = Instant::now();
    raw.send(request(1, "SELECT REPEAT('x', 1000) FROM seq_1_to_200000"))
        .await;
    // The big request runs on a worker: the slot that stays busy with the same request
    // count (the normal client's requests are short).
    let busy = wait_for(Duration::from_secs(5), "the big request on a worker", || async {
        let b = slots(d).await.into_iter().find(|s| s.state == "busy")?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = slots(d).await.into_iter().find(|s| s.slot == b.slot)?;
        (again.state == "busy" && again.requests == b.requests).then_some(b)
    })
    .await
    .unwrap();

    // Cut off: only the normal client stays connected.
    wait_for(Duration::from_secs(10), "the stopped client to be cut off", || async {
        let s = d.status().await.ok()?;
        (s["clients"]["connections"].as_i64() == Some(1)).then_some(())
    })
    .await
    .unwrap();
    let cut_ms = ms(t0);
    let freed = wait_for(
        Duration::from_secs(5),
        "the worker of the stopped client to be idle",
        || async {
            slots(d)
                .await
                .into_iter()
                .find(|s| s.slot == busy.slot && s.state == "idle")
        },
    )
    .await
    .unwrap();
    let freed_ms = ms(t0);
    let rss1 = rss_kib(d.pid()).unwrap();
    assert_eq!(freed.pid, busy.pid, "the worker was killed instead of cancelled");
    assert!(cut_ms < 8000, "cut off after {cut_ms} ms");
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 0.0);

    // A few more normal requests after the cut-off, then stop the normal client.
    let n = ok.load(Ordering::SeqCst);
    wait_for(Duration::from_secs(5), "more normal requests", || async {
        (ok.load(Ordering::SeqCst) >= n + 5).then_some(())
    })
    .await
    .unwrap();
    stop.store(true, Ordering::SeqCst);
    let worst = normal.await.unwrap();
    println!(
        "stopped client: cut off after {cut_ms} ms, worker idle after {freed_ms} ms; \
         normal client: {} queries ok, slowest {worst:?}; dispatcher RSS {rss0} KiB -> {rss1} KiB",
        ok.load(Ordering::SeqCst)
    );
    // The stopped client's socket is closed by the dispatcher: after what was buffered, EOF.
    let Raw { rd, wr } = raw;
    let mut sock = rd.into_inner().reunite(wr.into_inner()).unwrap();
    let buffered = crate::raw::read_to_close(&mut sock, Duration::from_secs(10))
        .await
        .expect("the dispatcher closed the stopped client's connection");
    println!("stopped client: {buffered} bytes were in flight when it was cut off");
    drop(sock);
    assert_closed_loop(&c, &[&client], 2).await;
}

/// Review finding (flow control). A client on a slow path that keeps reading steadily is
/// not cut off, however long its result takes: client_write_timeout (1 s here) counts
/// from the last bytes the socket took, not a whole batch of writes (nor one write step:
/// see `a_big_frame_to_a_client_that_keeps_reading_is_not_cut_off` in
/// dispatcher/src/client_conn.rs). It once timed the batch, which goes on
/// as long as the client's queue never runs empty, so a 20 MB result read at ~10 MB/s
/// through a 64 KiB receive window was cut off after 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_steady_client_is_not_cut_off() {
    let _serial = serial().await;
    let c = cluster(
        "[pool]\nsize = 1\nbatch_rows = 100\n\
         [limits]\nclient_write_timeout_ms = 1000\nclient_write_queue = 16\n",
    )
    .await;
    let d = &c.dispatcher;
    let (mut raw, _) = Raw::open_small_rcvbuf(d.client_addr, &d.client_token, 64 * 1024).await;
    const ROWS: u64 = 20_000;
    raw.send(request(1, &format!("SELECT REPEAT('x', 1000) FROM seq_1_to_{ROWS}")))
        .await;
    let t0 = Instant::now();
    let mut rows = 0u64;
    loop {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) if f.stream == 1 && f.kind == Kind::Rows => {
                rows += f.body::<Rows>().unwrap().rows.len() as u64;
                // About 100 KB a frame: ~10 MB/s.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Got::Frame(f) if f.stream == 1 && f.kind == Kind::Columns => {}
            Got::Frame(f) if f.stream == 1 && f.kind == Kind::End => break,
            other => panic!("after {rows} rows in {} ms: {other:?}", ms(t0)),
        }
    }
    let took = ms(t0);
    println!("slow steady client: {rows} rows in {took} ms");
    assert_eq!(rows, ROWS);
    assert!(took > 1500, "read in {took} ms: too fast to show anything");
    raw.expect_query_ok(3, "SELECT 1").await;
    assert_closed_loop(&c, &[], 1).await;
}

/// Review finding (relay rewrite). A client that pauses reading a big result for longer
/// than keepalive_timeout (but well within client_write_timeout), while it keeps its own
/// link alive with PINGs, gets its whole result afterwards, from the same worker. While
/// the client's queue is full the dispatcher does not read the worker's socket; that
/// silence once counted as the worker's (keepalive timeout, worker killed), and the
/// worker, getting no PINGs, gave up on the dispatcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_client_keeps_its_worker() {
    let _serial = serial().await;
    let c = cluster(
        "[pool]\nsize = 2\n[timeouts]\nkeepalive_interval_ms = 200\nkeepalive_timeout_ms = 1500\n\
         [limits]\nclient_write_timeout_ms = 20000\nclient_write_queue = 16\n",
    )
    .await;
    let d = &c.dispatcher;
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.expect_query_ok(1, "SELECT 1").await;
    let before = slots(d).await;

    // ~30 MB of rows: far more than the socket buffers and the client queue hold.
    const ROWS: u64 = 30_000;
    raw.send(request(3, &format!("SELECT REPEAT('x', 1000) FROM seq_1_to_{ROWS}")))
        .await;
    // Pause reading for over two keepalive timeouts; keep our own link alive meanwhile.
    let pause = Duration::from_millis(3500);
    let t0 = Instant::now();
    let mut nonce = 0;
    while t0.elapsed() < pause {
        nonce += 1;
        raw.send(Frame::new(Kind::Ping, 0, &Ping { nonce })).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut rows = 0u64;
    loop {
        match raw.next_data(Duration::from_secs(20)).await {
            Got::Frame(f) if f.stream == 3 && f.kind == Kind::Rows => {
                rows += f.body::<Rows>().expect("ROWS body").rows.len() as u64;
            }
            Got::Frame(f) if f.stream == 3 && f.kind == Kind::Columns => {}
            Got::Frame(f) if f.stream == 3 && f.kind == Kind::End => break,
            other => panic!("after the pause: unexpected {other:?} ({rows} rows so far)"),
        }
    }
    println!(
        "paused client: {rows} rows after a {pause:?} pause, whole stream in {} ms",
        ms(t0)
    );
    assert_eq!(rows, ROWS);
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 0.0);
    let after = slots(d).await;
    let pids = |s: &[crate::SlotInfo]| s.iter().map(|s| s.pid).collect::<Vec<_>>();
    assert_eq!(pids(&before), pids(&after), "a worker was replaced");
    raw.expect_query_ok(5, "SELECT 1").await;
}

/// Second review finding (relay rewrite). A worker's ERROR DATABASE_FATAL reaches the
/// dispatcher while its client's write queue is full (another stream's big result, the
/// client paused); the worker exits meanwhile, so the relay's PING to it fails. The
/// ERROR in hand must still reach the client, followed by END: the relay used to drop
/// it half-sent, and the client saw a bare END — success — for a failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fatal_error_behind_a_full_client_queue() {
    let _serial = serial().await;
    // Frequent PINGs (the relay's PING to the exiting worker is what once dropped the
    // ERROR), but a long keepalive_timeout: this client is silent while it waits on
    // the admin API, which a loaded machine can make slow.
    // (One connection keeps both workers busy: no per-connection cap.)
    let c = cluster(
        "[pool]\nsize = 2\nmax_per_connection = 0\n[timeouts]\nkeepalive_interval_ms = 200\nkeepalive_timeout_ms = 5000\n\
         [limits]\nclient_write_timeout_ms = 20000\nclient_write_queue = 16\n",
    )
    .await;
    let d = &c.dispatcher;
    let mut db = c.sandbox.primary().conn().await.unwrap();
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.expect_query_ok(1, "SELECT 1").await;

    raw.send(request(5, "SELECT SLEEP(5)")).await;
    let sleeper = crate::wait_busy(d, Duration::from_secs(2)).await;
    const ROWS: u64 = 30_000;
    raw.send(request(3, &format!("SELECT REPEAT('x', 1000) FROM seq_1_to_{ROWS}")))
        .await;
    // The client does not read (but keeps its link alive): wait until the dispatcher
    // can queue no more for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut nonce = 0;
    let mut prev = -1.0;
    loop {
        nonce += 1;
        raw.send(Frame::new(Kind::Ping, 0, &Ping { nonce })).await;
        let now = crate::metric(d, "osprey_bytes_to_clients_total").await;
        if now > 1e6 && now == prev {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the client's queue never filled up ({now} bytes)"
        );
        prev = now;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    db.query_drop(format!("KILL {}", sleeper.db_connection_id.unwrap()))
        .await
        .unwrap();
    // Stay paused (answering nothing, PINGing ourselves) until the worker has exited and
    // a few keepalive intervals passed for the relay.
    let pid = sleeper.pid.unwrap();
    let t0 = Instant::now();
    while process_alive(pid) || t0.elapsed() < Duration::from_millis(1000) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the worker did not exit");
        nonce += 1;
        raw.send(Frame::new(Kind::Ping, 0, &Ping { nonce })).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (mut rows, mut error, mut ends) = (0u64, None, 0);
    while ends < 2 {
        match raw.next_data(Duration::from_secs(20)).await {
            Got::Frame(f) if f.stream == 3 && f.kind == Kind::Rows => {
                rows += f.body::<Rows>().expect("ROWS body").rows.len() as u64;
            }
            Got::Frame(f) if f.stream == 3 && f.kind == Kind::Columns => {}
            Got::Frame(f) if f.kind == Kind::End && (f.stream == 3 || f.stream == 5) => {
                if f.stream == 5 {
                    assert!(error.is_some(), "END on the failed stream without its ERROR");
                }
                ends += 1;
            }
            Got::Frame(f) if f.stream == 5 && f.kind == Kind::Error => {
                error = Some(f.body::<ErrorBody>().expect("ERROR body"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let error = error.unwrap();
    println!("fatal behind a full queue: stream 5 got {error:?}; stream 3 {rows} rows");
    assert_eq!(error.code, ErrorCode::DatabaseFatal, "{error:?}");
    assert_eq!(rows, ROWS);
    raw.expect_query_ok(7, "SELECT 1").await;
    drop(raw);
    assert_closed_loop(&c, &[], 2).await;
}

/// Issue 9, item 2. Clients that ask for rows of 4 MiB and never read (protocol 1.0, no
/// flow control) cost the dispatcher at most their write queue's byte budget each
/// (`client_write_queue_bytes`, default 4 MiB; a larger frame goes alone), plus the frame
/// each worker serving them holds in hand and in its read buffer. The queue was bounded
/// in frames only: each client made the dispatcher hold its whole result (here 50 × 4 MiB)
/// for client_write_timeout. A well-behaved client is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_huge_rows_cost_at_most_the_byte_budget() {
    let _serial = serial().await;
    const HOGS: u64 = 3;
    const ROW: u64 = 4 * 1024 * 1024;
    const BUDGET: u64 = 4 * 1024 * 1024; // the documented default
    let c = cluster("[pool]\nsize = 4\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let rss0 = rss_kib(d.pid()).unwrap();

    let mut hogs = Vec::new();
    for _ in 0..HOGS {
        let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
        raw.send(request(1, &format!("SELECT REPEAT('x', {ROW}) FROM seq_1_to_50")))
            .await;
        hogs.push(raw);
    }
    // Until the dispatcher queues no more for them (or has queued far more than allowed).
    let mut prev = -1.0;
    let mut rss_max = rss0;
    let t0 = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        rss_max = rss_max.max(rss_kib(d.pid()).unwrap());
        let now = crate::metric(d, "osprey_bytes_to_clients_total").await;
        if (now > (HOGS * ROW) as f64 && now == prev) || t0.elapsed() > Duration::from_secs(15) {
            break;
        }
        prev = now;
    }
    // Meanwhile and now: a well-behaved client is served.
    let t1 = Instant::now();
    for i in 0..20 {
        let r = client.query("SELECT ?", &[osprey_client::Value::Int(i)]).await;
        if let Err(e) = r {
            panic!("the well-behaved client failed: {}", describe(&e));
        }
        rss_max = rss_max.max(rss_kib(d.pid()).unwrap());
    }
    let served = t1.elapsed();
    let queued = crate::metric(d, "osprey_bytes_to_clients_total").await;
    let grew_mib = (rss_max.saturating_sub(rss0)) as f64 / 1024.0;
    // Per hog: its queue (the budget, or one frame) and the frame its worker holds in
    // hand plus the one in the link's read buffer; and allocator slack.
    let bound_mib = (HOGS * (BUDGET.max(ROW) + 2 * ROW)) as f64 / 1048576.0 + 48.0;
    println!(
        "unread 4 MiB rows: {HOGS} clients, dispatcher RSS {rss0} KiB -> max {rss_max} KiB \
         (+{grew_mib:.0} MiB, bound {bound_mib:.0} MiB); {:.0} MiB queued to clients; \
         20 queries of a well-behaved client in {served:?}",
        queued / 1048576.0
    );
    assert!(
        grew_mib < bound_mib,
        "dispatcher RSS grew by {grew_mib:.0} MiB with {HOGS} unread clients (bound {bound_mib:.0} MiB)"
    );
    drop(hogs);
    assert_closed_loop(&c, &[&client], 4).await;
}

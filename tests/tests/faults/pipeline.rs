//! Prefetch (`pool.pipeline_depth`): requests written to a busy worker behind the one it
//! runs. Order and isolation under load, a worker killed with a full pipeline, a slow
//! statement that must not hold the requests behind it, and a cancel of one that waits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use osprey_client::{Client, ErrorCode, Value};
use osprey_protocol::{Cancel, ErrorBody, Frame, Kind};
use osprey_tests::harness::{wait_for, Dispatcher};
use serde_json::Value as Json;

use crate::raw::{request, Got, Raw};
use crate::{assert_closed_loop, cluster, describe, metric, ms, serial, slots};

/// The `pipeline` figure (requests written to the worker) of every slot.
async fn pipelines(d: &Dispatcher) -> Vec<u64> {
    let s: Json = d.status().await.expect("status");
    s["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .map(|s| s["pipeline"].as_u64().expect("slot.pipeline"))
        .collect()
}

/// The slot's `osprey_pipeline_slot_depth` series, if `/metrics` has one.
async fn slot_depth(d: &Dispatcher, slot: u64) -> Option<f64> {
    let text = d.metrics().await.expect("metrics");
    let want = format!("slot=\"{slot}\"}}");
    text.lines()
        .filter(|l| l.starts_with("osprey_pipeline_slot_depth{"))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            name.ends_with(&want).then(|| value.parse().ok()).flatten()
        })
}

async fn wait_pipeline(d: &Dispatcher, want: u64, limit: Duration) {
    wait_for(limit, &format!("a slot with {want} requests written to it"), || async {
        pipelines(d).await.contains(&want).then_some(())
    })
    .await
    .expect("pipeline filled");
}

/// Thousands of mixed reads and writes from many streams on two workers with prefetch on:
/// every answer is its own request's (ids in the SQL), no error, every write landed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_requests_keep_their_order_and_their_answers() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\npipeline_depth = 4\nmax_per_connection = 0\n").await;
    let d = &c.dispatcher;
    let setup = d.client().await.unwrap();
    setup
        .execute("CREATE TABLE pipe (id INT PRIMARY KEY, who VARCHAR(40))", &[])
        .await
        .unwrap();
    let clients = [d.client().await.unwrap(), d.client().await.unwrap()];
    const TASKS: usize = 16;
    const EACH: usize = 150;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let client: Client = clients[t % 2].clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let id = (t * EACH + i) as i64;
                match i % 3 {
                    0 => {
                        let r = client
                            .execute(
                                "INSERT INTO pipe VALUES (?, ?)",
                                &[Value::Int(id), format!("t{t}-{i}").into()],
                            )
                            .await
                            .map_err(|e| format!("insert {id}: {}", describe(&e)))?;
                        if r.affected_rows != 1 {
                            return Err(format!("insert {id}: {} rows", r.affected_rows));
                        }
                    }
                    1 => {
                        let sql = format!("SELECT {id} AS id, CONCAT('r', {id}) AS tag");
                        let r: Option<(i64, String)> = client
                            .query_first(sql, &[])
                            .await
                            .map_err(|e| format!("select {id}: {}", describe(&e)))?;
                        if r != Some((id, format!("r{id}"))) {
                            return Err(format!("select {id} answered {r:?}"));
                        }
                    }
                    _ => {
                        // Reads back the row this task inserted just before (same session or not).
                        let prev = id - 2;
                        let r: Option<(String,)> = client
                            .query_first("SELECT who FROM pipe WHERE id = ?", &[Value::Int(prev)])
                            .await
                            .map_err(|e| format!("read {prev}: {}", describe(&e)))?;
                        let want = format!("t{t}-{}", i - 2);
                        if r.as_ref().map(|r| &r.0) != Some(&want) {
                            return Err(format!("read {prev} answered {r:?}, wanted {want}"));
                        }
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            failures.push(e);
        }
    }
    let elapsed = started.elapsed();
    assert!(
        failures.is_empty(),
        "{} tasks failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let rows: Option<(i64,)> = setup.query_first("SELECT COUNT(*) FROM pipe", &[]).await.unwrap();
    assert_eq!(
        rows,
        Some(((TASKS * EACH).div_ceil(3) as i64,)),
        "every insert landed once"
    );
    let prefetched = metric(d, "osprey_pipeline_prefetched_total").await;
    println!(
        "{} requests on 2 workers in {:?}; {prefetched} written to a busy worker",
        TASKS * EACH,
        elapsed
    );
    assert!(
        prefetched > 0.0,
        "16 streams on 2 workers must have had requests written ahead"
    );
    assert_closed_loop(&c, &[&setup, &clients[0], &clients[1]], 2).await;
}

/// kill -9 of a worker with four requests written to it: the one it ran ends with
/// WORKER_LOST (dispatched), the three behind it run on the fresh worker without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_a_full_pipeline_loses_only_the_request_it_ran() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\npipeline_depth = 4\npipeline_hold_ms = 60000\nmax_per_connection = 0\n").await;
    let d = &c.dispatcher;
    let client = Arc::new(d.client().await.unwrap());
    let spawn = |sql: String| {
        let client = client.clone();
        tokio::spawn(async move { client.query_first::<(i64,)>(sql, &[]).await })
    };
    // The worker is busy first, so that the next four wait in the queue; when it ends that
    // one, its link takes the sleeper and writes the three behind it at once.
    let first = spawn("SELECT SLEEP(1)".into());
    wait_pipeline(d, 1, Duration::from_secs(5)).await;
    let sleeper = spawn("SELECT SLEEP(30)".into());
    wait_for(Duration::from_secs(5), "the sleeper queued", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["queue_depth"].as_u64()? >= 1).then_some(())
    })
    .await
    .expect("queued");
    let behind: Vec<_> = (1..=3i64).map(|i| spawn(format!("SELECT {i}"))).collect();
    assert!(first.await.unwrap().is_ok(), "the first request");
    wait_pipeline(d, 4, Duration::from_secs(5)).await;
    let slot = slots(d).await[0].clone();
    assert_eq!(
        slot_depth(d, slot.slot).await,
        Some(4.0),
        "the slot's series in /metrics"
    );
    let pid = slot.pid.expect("worker pid");
    let t = Instant::now();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();

    let err = sleeper.await.unwrap().expect_err("the request the worker ran");
    assert_eq!(err.code(), ErrorCode::WorkerLost, "{}", describe(&err));
    assert!(err.dispatched(), "it was running: {}", describe(&err));
    for (i, b) in behind.into_iter().enumerate() {
        let got = b
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {} behind it: {}", i + 1, describe(&e)));
        assert_eq!(got, Some((i as i64 + 1,)), "request {} behind it", i + 1);
    }
    println!("the three behind it answered {} ms after the kill", ms(t));
    assert_closed_loop(&c, &[&client], 1).await;
    assert_eq!(slot_depth(d, slot.slot).await, Some(0.0), "the refilled slot, idle");
}

/// A slow statement with requests written behind it: they are taken back within
/// `pipeline_hold_ms` and run on the other worker, long before the slow one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_statement_does_not_hold_the_requests_written_behind_it() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\npipeline_depth = 8\npipeline_hold_ms = 20\nmax_per_connection = 0\n").await;
    let d = &c.dispatcher;
    let client = Arc::new(d.client().await.unwrap());
    let spawn = |sql: String| {
        let client = client.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let r = client.query_first::<(i64,)>(sql, &[]).await;
            (r, t.elapsed())
        })
    };
    // Both workers busy; then the slow one and the fast ones queue behind them in that order,
    // so that the link that takes the slow one writes fast ones behind it.
    let busy: Vec<_> = (0..2).map(|_| spawn("SELECT SLEEP(0.5)".into())).collect();
    wait_for(Duration::from_secs(5), "both workers busy", || async {
        (pipelines(d).await.iter().filter(|p| **p >= 1).count() == 2).then_some(())
    })
    .await
    .expect("busy");
    let slow = spawn("SELECT SLEEP(3)".into());
    wait_for(Duration::from_secs(5), "the slow one queued", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["queue_depth"].as_u64()? >= 1).then_some(())
    })
    .await
    .expect("queued");
    let fast: Vec<_> = (0..30i64).map(|i| spawn(format!("SELECT {i}"))).collect();
    for b in busy {
        assert!(b.await.unwrap().0.is_ok());
    }
    let mut worst = Duration::ZERO;
    for (i, f) in fast.into_iter().enumerate() {
        let (r, took) = f.await.unwrap();
        let got = r.unwrap_or_else(|e| panic!("fast {i}: {}", describe(&e)));
        assert_eq!(got, Some((i as i64,)));
        worst = worst.max(took);
    }
    let (r, slow_took) = slow.await.unwrap();
    assert!(r.is_ok(), "the slow one");
    let reclaimed = metric(d, "osprey_pipeline_reclaimed_total").await;
    println!("slowest fast request {worst:?}, slow one {slow_took:?}, {reclaimed} taken back");
    assert!(
        reclaimed >= 1.0,
        "requests were written behind the slow one and taken back"
    );
    // Queued behind two 0.5 s sleeps: about 0.5 s; stuck behind the 3 s one: over 2.5 s.
    assert!(
        worst < Duration::from_millis(2000),
        "a fast request waited {worst:?}: held behind the slow statement"
    );
    assert_closed_loop(&c, &[&client], 2).await;
}

/// A CANCEL of a request written behind the running one is answered at once (CANCELLED,
/// dispatched: it reached the worker), the running one is unharmed, and the worker skips it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_request_waiting_behind_another_is_answered_at_once() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\npipeline_depth = 4\npipeline_hold_ms = 60000\nmax_per_connection = 0\n").await;
    let d = &c.dispatcher;
    let (mut raw, _ack) = Raw::open(d.client_addr, &d.client_token).await;
    raw.send(request(1, "SELECT SLEEP(0.5)")).await;
    wait_pipeline(d, 1, Duration::from_secs(5)).await;
    raw.send(request(3, "SELECT SLEEP(2), 3")).await;
    raw.send(request(5, "SELECT 5")).await;
    wait_pipeline(d, 2, Duration::from_secs(5)).await;
    let t = Instant::now();
    raw.send(Frame::new(Kind::Cancel, 5, &Cancel { reason: "test".into() }))
        .await;
    let mut ended = Vec::new();
    let mut cancelled = None;
    while ended.len() < 3 {
        match raw.next(Duration::from_secs(10)).await {
            Got::Frame(f) if f.kind == Kind::Error && f.stream == 5 => {
                let body: ErrorBody = f.body().unwrap();
                cancelled = Some((body, t.elapsed()));
            }
            Got::Frame(f) if f.kind == Kind::Error => panic!("stream {}: {:?}", f.stream, f.body::<ErrorBody>()),
            Got::Frame(f) if f.kind == Kind::End => ended.push((f.stream, t.elapsed())),
            Got::Frame(_) => {}
            Got::Closed => panic!("connection closed"),
        }
    }
    let (body, after) = cancelled.expect("ERROR for the cancelled stream");
    assert_eq!(body.code, ErrorCode::Cancelled, "{body:?}");
    assert!(body.dispatched, "it had reached the worker: {body:?}");
    let order: Vec<u32> = ended.iter().map(|e| e.0).collect();
    assert_eq!(
        order,
        vec![1, 5, 3],
        "the cancelled one ends before the one it waited behind"
    );
    assert!(
        after < Duration::from_millis(1000),
        "answered {after:?} after its CANCEL"
    );
    println!(
        "cancelled stream answered after {after:?}; the running one ended after {:?}",
        ended[2].1
    );
    raw.expect_query_ok(7, "SELECT 7").await;
    drop(raw);
    assert_closed_loop(&c, &[], 1).await;
}

/// A client that stops reading its large result holds its worker (until
/// `client_write_timeout`), but not the requests of others written behind it: they are
/// taken back within `pipeline_hold_ms` and served by the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_hold_the_requests_written_behind_it() {
    let _serial = serial().await;
    let c = cluster(
        "[pool]\nsize = 2\npipeline_depth = 4\npipeline_hold_ms = 20\nmax_per_connection = 0\n\
         [limits]\nclient_write_timeout_ms = 20000\n",
    )
    .await;
    let d = &c.dispatcher;
    let client = Arc::new(d.client().await.unwrap());
    let spawn = |sql: String| {
        let client = client.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let r = client.query_first::<(i64,)>(sql, &[]).await;
            (r, t.elapsed())
        })
    };
    let busy: Vec<_> = (0..2).map(|_| spawn("SELECT SLEEP(0.5)".into())).collect();
    wait_for(Duration::from_secs(5), "both workers busy", || async {
        (pipelines(d).await.iter().filter(|p| **p >= 1).count() == 2).then_some(())
    })
    .await
    .expect("busy");
    // A flow-controlled client with a window of one data frame, which it never renews.
    let (mut stuck, _) = Raw::open_with_window(d.client_addr, &d.client_token, 1).await;
    stuck
        .send(request(1, "SELECT REPEAT('x', 2000) FROM seq_1_to_100000"))
        .await;
    wait_for(Duration::from_secs(5), "the large read queued", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["queue_depth"].as_u64()? >= 1).then_some(())
    })
    .await
    .expect("queued");
    let fast: Vec<_> = (0..20i64).map(|i| spawn(format!("SELECT {i}"))).collect();
    for b in busy {
        assert!(b.await.unwrap().0.is_ok());
    }
    let mut worst = Duration::ZERO;
    for (i, f) in fast.into_iter().enumerate() {
        let (r, took) = f.await.unwrap();
        let got = r.unwrap_or_else(|e| panic!("fast {i}: {}", describe(&e)));
        assert_eq!(got, Some((i as i64,)));
        worst = worst.max(took);
    }
    let reclaimed = metric(d, "osprey_pipeline_reclaimed_total").await;
    println!("slowest fast request {worst:?} beside a client that does not read; {reclaimed} taken back");
    assert!(
        reclaimed >= 1.0,
        "requests were written behind the unread result and taken back"
    );
    assert!(
        worst < Duration::from_secs(5),
        "a fast request waited {worst:?}: held behind a client that does not read"
    );
    drop(stuck);
    assert_closed_loop(&c, &[&client], 2).await;
}

/// kill -9 of a worker that pipelined statements on its session (STARTED): the one it
/// ran and the ones it had sent to the database behind it end with WORKER_LOST
/// (dispatched: they may have run); those it had not been given complete on the fresh
/// worker without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_statements_pipelined_loses_what_it_sent_and_nothing_else() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\npipeline_depth = 4\npipeline_hold_ms = 60000\nmax_per_connection = 0\n").await;
    let d = &c.dispatcher;
    let client = Arc::new(d.client().await.unwrap());
    // The worker learns both texts as fast (it pipelines only behind those) and caches
    // their prepared statements.
    const FAST: [&str; 3] = ["SELECT ? + 0 AS v1", "SELECT ? + 0 AS v2", "SELECT ? + 0 AS v3"];
    for i in 0..3 {
        client.query("SELECT SLEEP(?)", &[Value::Int(0)]).await.unwrap();
        for sql in FAST {
            client.query(sql, &[Value::Int(i)]).await.unwrap();
        }
    }
    let spawn = |sql: &'static str, v: Value| {
        let client = client.clone();
        tokio::spawn(async move { client.query(sql, &[v]).await })
    };
    // Busy with a statement it does not know (nothing goes behind it), while the next
    // ones queue: a sleeper with a known-fast text, three fast ones, and two more.
    let blocker = spawn("SELECT SLEEP(0.5), ? AS b", Value::Int(0));
    wait_pipeline(d, 1, Duration::from_secs(5)).await;
    let sleeper = spawn("SELECT SLEEP(?)", Value::Int(30));
    wait_for(Duration::from_secs(5), "the sleeper queued", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["queue_depth"].as_u64()? >= 1).then_some(())
    })
    .await
    .expect("queued");
    let behind: Vec<_> = FAST.iter().map(|sql| spawn(sql, Value::Int(1))).collect();
    wait_for(Duration::from_secs(5), "the three queued", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["queue_depth"].as_u64()? >= 4).then_some(())
    })
    .await
    .expect("queued");
    let later: Vec<_> = (10..=11i64)
        .map(|i| spawn("SELECT ? + 0 AS v", Value::Int(i)))
        .collect();
    assert!(blocker.await.unwrap().is_ok());
    // The sleeper runs; the worker has sent the three behind it to the database.
    wait_for(Duration::from_secs(5), "three statements pipelined", || async {
        (metric(d, "osprey_pipeline_started_total").await >= 3.0).then_some(())
    })
    .await
    .expect("pipelined");
    let pid = slots(d).await[0].pid.expect("worker pid");
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();

    let err = sleeper.await.unwrap().expect_err("the running statement");
    assert_eq!(err.code(), ErrorCode::WorkerLost, "{}", describe(&err));
    assert!(err.dispatched(), "{}", describe(&err));
    for (i, b) in behind.into_iter().enumerate() {
        let err = b.await.unwrap().expect_err("a statement the worker had sent");
        assert_eq!(err.code(), ErrorCode::WorkerLost, "pipelined {i}: {}", describe(&err));
        assert!(err.dispatched(), "pipelined {i}: it may have run: {}", describe(&err));
    }
    for (i, l) in later.into_iter().enumerate() {
        let r = l
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("a request never sent {i}: {}", describe(&e)));
        assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 10 + i as i64);
    }
    assert_closed_loop(&c, &[&client], 1).await;
}

/// The frames a worker sent while the relay waited for a slow client's credit (read to reach
/// the answers to its reclaims, and put aside) wait for the deadline too: a stream whose
/// deadline passed while its data frame waited for credit ends with `REQUEST_TIMEOUT`,
/// although its `END` was among the frames put aside. The relay once acted on those frames
/// first, and ended the stream at that `END` as dropped rows (`CANCELLED`, outcome "ok").
/// The request written behind it ran (the worker took it at that `END`, before the reclaim
/// came): with the worker killed at the timeout it is lost, `dispatched`, as the pipeline
/// rules say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passed_waiting_for_credit_is_a_timeout_even_with_its_end_put_aside() {
    let _serial = serial().await;
    // The hold is shorter than the wait for credit: the request behind is reclaimed during
    // it, and the frames read to reach the answer are put aside.
    let c = cluster(
        "[pool]\nsize = 1\npipeline_depth = 4\npipeline_hold_ms = 800\nmax_per_connection = 0\n\
         [limits]\nclient_write_timeout_ms = 20000\n",
    )
    .await;
    let d = &c.dispatcher;
    // A window of one frame: COLUMNS spends it, the ROWS behind it waits.
    let (mut raw, ack) = Raw::open_with_window(d.client_addr, &d.client_token, 1).await;
    assert_eq!(ack.stream_window, 1);
    // The worker is busy first, so that the next two queue; when it ends that one, its link
    // takes the first and writes the second behind it.
    raw.send(request(5, "DO SLEEP(1)")).await;
    wait_pipeline(d, 1, Duration::from_secs(5)).await;
    // A result small enough that the worker writes COLUMNS, ROWS and END in one write.
    let mut first = osprey_protocol::Request::sql("SELECT seq FROM seq_1_to_3");
    first.timeout_ms = 3000;
    raw.send(Frame::new(Kind::Request, 1, &first)).await;
    let t0 = Instant::now();
    raw.send(request(3, "DO 3")).await;
    let mut frames: std::collections::HashMap<u32, Vec<Frame>> = Default::default();
    let ended = |f: &std::collections::HashMap<u32, Vec<Frame>>, s: u32| {
        f.get(&s).and_then(|k| k.last()).is_some_and(|f| f.kind == Kind::End)
    };
    let mut timed_out_after = None;
    while !(ended(&frames, 1) && ended(&frames, 3) && ended(&frames, 5)) {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) => {
                if f.stream == 1 && f.kind == Kind::Error {
                    timed_out_after = Some(t0.elapsed());
                }
                frames.entry(f.stream).or_default().push(f);
            }
            Got::Closed => panic!("closed before the ENDs: {frames:?}"),
        }
    }
    let kinds = |s: u32| frames[&s].iter().map(|f| f.kind).collect::<Vec<_>>();
    let error = |s: u32| {
        frames[&s]
            .iter()
            .find(|f| f.kind == Kind::Error)
            .map(|f| f.body::<ErrorBody>().expect("ERROR body"))
    };
    assert_eq!(
        kinds(1),
        [Kind::Columns, Kind::Error, Kind::End],
        "no credit was given for more"
    );
    let e = error(1).unwrap();
    assert_eq!(e.code, ErrorCode::RequestTimeout, "{e:?}");
    let after = timed_out_after.unwrap();
    assert!(after >= Duration::from_millis(2900), "answered after {after:?}");
    // The scene was the one described: the request behind was written ahead, and the
    // reclaim came too late to take it back.
    assert_eq!(metric(d, "osprey_pipeline_prefetched_total").await, 1.0);
    assert_eq!(metric(d, "osprey_pipeline_reclaimed_total").await, 0.0);
    assert_eq!(error(5), None, "the request before it");
    let e = error(3).expect("the request behind it ran on the worker killed at the timeout");
    assert_eq!(e.code, ErrorCode::WorkerLost, "{e:?}");
    assert!(e.dispatched, "{e:?}");
    assert_eq!(metric(d, "osprey_requests_total{outcome=\"timeout\"}").await, 1.0);
}

/// A request's `END` that waits for room towards a client that does not read, with requests
/// of another client written behind it: the worker runs those as soon as it has sent that
/// `END`, and their answers, read to reach the answers to the reclaims, are kept in order.
/// The link once took them for frames out of turn and gave the worker up, and the requests
/// that had run were answered `WORKER_LOST` although they had succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_behind_an_end_that_waits_for_a_client_keep_their_answers() {
    let _serial = serial().await;
    let c = cluster(
        "[pool]\nsize = 2\npipeline_depth = 4\npipeline_hold_ms = 20\nmax_per_connection = 0\n\
         [limits]\nclient_write_queue_bytes = 4096\nclient_write_timeout_ms = 3000\n",
    )
    .await;
    let d = &c.dispatcher;
    // A client that never reads: a large result fills its socket and its queue (that
    // worker waits for it).
    let (mut stuck, _) = Raw::open(d.client_addr, &d.client_token).await;
    stuck
        .send(request(1, "SELECT REPEAT('x', 2000) FROM seq_1_to_100000"))
        .await;
    wait_pipeline(d, 1, Duration::from_secs(5)).await;
    let client = Arc::new(d.client().await.unwrap());
    let spawn = |sql: String| {
        let client = client.clone();
        tokio::spawn(async move { client.query_first::<(i64,)>(sql, &[]).await })
    };
    let busy = spawn("SELECT SLEEP(0.5)".into());
    wait_for(Duration::from_secs(5), "both workers busy", || async {
        (pipelines(d).await.iter().filter(|p| **p >= 1).count() == 2).then_some(())
    })
    .await
    .expect("busy");
    // Its END waits for the client that does not read; whatever the turns between the two
    // clients, requests of the other one are written behind it.
    stuck.send(request(3, "DO 3")).await;
    wait_for(Duration::from_secs(5), "its request queued", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["queue_depth"].as_u64()? >= 1).then_some(())
    })
    .await
    .expect("queued");
    let behind: Vec<_> = (0..3i64).map(|i| spawn(format!("SELECT {i}"))).collect();
    assert!(busy.await.unwrap().is_ok());
    for (i, b) in behind.into_iter().enumerate() {
        let got = b
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {i} behind it: {}", describe(&e)));
        assert_eq!(got, Some((i as i64,)));
    }
    assert_eq!(metric(d, "osprey_requests_total{outcome=\"worker_lost\"}").await, 0.0);
    assert!(
        metric(d, "osprey_pipeline_prefetched_total").await >= 1.0,
        "requests were written behind the one whose END waited"
    );
    drop(stuck);
    assert_closed_loop(&c, &[&client], 2).await;
}

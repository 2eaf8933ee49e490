//! Risk (issue 9, item 4): one client takes every worker. A connection with a thousand
//! slow streams filled the one shared FIFO, so every other connection's requests waited
//! behind it until QUEUE_TIMEOUT.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use osprey_client::{Client, ErrorCode};
use osprey_protocol::{Cancel, ErrorBody, Frame, Kind};
use osprey_tests::harness::wait_for;

use crate::raw::{request, Got, Raw};
use crate::{assert_closed_loop, cluster, describe, metric, serial};

/// Streams of the abusive connection: the whole of the default per-connection stream cap.
const ABUSIVE_STREAMS: u32 = 1024;

/// Latencies of `SELECT 1` every 10 ms for `phase`; panics on any error (QUEUE_TIMEOUT
/// above all). Each query is bounded, so that a starved client fails the test in seconds.
async fn sample(client: &Client, phase: Duration) -> Vec<Duration> {
    let mut lat = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < phase {
        let t = Instant::now();
        match tokio::time::timeout(Duration::from_secs(6), client.query("SELECT 1", &[])).await {
            Ok(Ok(_)) => lat.push(t.elapsed()),
            Ok(Err(e)) => panic!(
                "the well-behaved client failed after {} ok queries: {}",
                lat.len(),
                describe(&e)
            ),
            Err(_) => panic!(
                "the well-behaved client waited 6 s for SELECT 1 after {} ok queries",
                lat.len()
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lat
}

fn p50(lat: &[Duration]) -> Duration {
    let mut v = lat.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn p99(lat: &[Duration]) -> Duration {
    let mut v = lat.to_vec();
    v.sort();
    v[(v.len() * 99).div_ceil(100).saturating_sub(1)]
}

/// A connection with 1024 `SELECT SLEEP(1)` streams beside one doing `SELECT 1` every
/// 10 ms (pool of 4, every setting at its default but the test harness's): the second
/// one's p99 stays within 25 ms of its p99 on the idle dispatcher and it sees no error.
/// The abusive streams then end by CANCEL, each with END, and the loop closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_starve_another() {
    let _serial = serial().await;
    let c = cluster("").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();

    let idle = sample(&client, Duration::from_millis(1500)).await;
    let idle_p99 = p99(&idle);

    let (raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    let Raw { mut rd, mut wr } = raw;
    // The abuser reads everything (its answers must not be what holds the workers),
    // and keeps each stream's terminal frames.
    let reader = tokio::spawn(async move {
        let mut ended: HashMap<u32, Option<ErrorCode>> = HashMap::new();
        let mut errors: HashMap<u32, ErrorCode> = HashMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while ended.len() < ABUSIVE_STREAMS as usize {
            let frame = match tokio::time::timeout_at(deadline, rd.next()).await {
                Ok(Some(Ok(f))) => f,
                other => panic!("abusive connection: {} streams ended, then {other:?}", ended.len()),
            };
            match frame.kind {
                Kind::Error if frame.stream != 0 => {
                    let body: ErrorBody = frame.body().expect("ERROR body");
                    errors.insert(frame.stream, body.code);
                }
                Kind::End => {
                    assert!(
                        ended.insert(frame.stream, errors.remove(&frame.stream)).is_none(),
                        "two ENDs on stream {}",
                        frame.stream
                    );
                }
                Kind::Error => panic!("connection error on the abusive connection: {frame:?}"),
                _ => {}
            }
        }
        ended
    });
    for stream in 1..=ABUSIVE_STREAMS {
        wr.feed(request(stream, "SELECT SLEEP(1)")).await.unwrap();
    }
    SinkExt::<Frame>::flush(&mut wr).await.unwrap();
    let queued = wait_for(Duration::from_secs(5), "the abusive streams to be queued", || async {
        let s = d.status().await.ok()?;
        let depth = s["pool"]["queue_depth"].as_u64()?;
        (depth >= u64::from(ABUSIVE_STREAMS) - 4).then_some(s)
    })
    .await
    .unwrap();
    println!("beside the abuser: pool {}", queued["pool"]);

    let t0 = Instant::now();
    let loaded = sample(&client, Duration::from_millis(2000)).await;
    let loaded_p99 = p99(&loaded);
    let busy_status = d.status().await.unwrap();
    println!(
        "fairness: SELECT 1 every 10 ms, p99 idle {idle_p99:?} ({} queries, max {:?}), \
         beside 1024 SLEEP(1) streams {loaded_p99:?} ({} queries, max {:?}); pool then {}",
        idle.len(),
        idle.iter().max().unwrap(),
        loaded.len(),
        loaded.iter().max().unwrap(),
        busy_status["pool"]
    );
    assert!(
        loaded_p99 <= idle_p99 + Duration::from_millis(25),
        "p99 beside the abuser {loaded_p99:?}, idle {idle_p99:?}"
    );
    // The abuser kept its workers meanwhile: it was capped, not starved.
    let busy = busy_status["pool"]["busy"].as_u64().unwrap();
    assert!(busy >= 2, "the abusive connection held {busy} workers");

    // The abusive streams end: CANCEL each, then every one has its END.
    for stream in 1..=ABUSIVE_STREAMS {
        let cancel = Frame::new(Kind::Cancel, stream, &Cancel { reason: "test".into() });
        wr.feed(cancel).await.unwrap();
    }
    SinkExt::<Frame>::flush(&mut wr).await.unwrap();
    let ended = reader.await.unwrap();
    let mut codes: HashMap<String, usize> = HashMap::new();
    for code in ended.values() {
        *codes.entry(format!("{code:?}")).or_default() += 1;
    }
    println!("abusive streams ended after {:?}: {codes:?}", t0.elapsed());
    assert_eq!(ended.len(), ABUSIVE_STREAMS as usize);
    assert!(
        // (On a slow machine some may pass queue_timeout before the CANCEL: the abuser's
        // own requests time out, which is the point.)
        ended
            .values()
            .all(|c| matches!(c, None | Some(ErrorCode::Cancelled | ErrorCode::QueueTimeout))),
        "abusive streams ended with {codes:?}"
    );
    drop(wr);
    assert_closed_loop(&c, &[&client], 4).await;
}

/// Connections that flood the pool in issue 20's scene.
const FLOODERS: usize = 4;
/// Streams each flooder writes at once: enough to keep the four workers busy for the
/// whole scene (64 x 4 x ~0.7 s / 4 workers, about 45 s).
const FLOOD_STREAMS: u32 = 64;

/// How soon after the newcomer sent a query a flooder's END counts as a worker it could
/// have had (see the measure in [`flooders_cannot_starve_a_newcomer`]).
const IN_LINE: Duration = Duration::from_millis(20);

/// A request that ran this long on its worker (its END's server time) puts its
/// connection's next one in the second class (docs/CONFIG.md, `[pool]`).
const HEAVY: Duration = Duration::from_millis(50);

/// The flooders' statements last 0.5 to 0.9 s, so that the workers come free at
/// different moments (with one length for all they would all end together).
fn flood_sql(stream: u32) -> String {
    format!("SELECT SLEEP(0.{})", 5 + stream % 5)
}

/// Issue 20, item 1: four connections each write 64 slow statements at once; once each
/// has had a worker, a fifth one sends `SELECT 1` after `SELECT 1` for 6 s. Every worker
/// stays busy with a flooder's statement, so the newcomer must wait for one to come free;
/// what it must not do is wait behind the flooders' queued requests, or behind requests
/// prefetched onto the worker it should have had. Each of its queries is answered within
/// 50 ms of the first flooder's END after it was sent (an END frees a worker), p99 over
/// the scene — except one whose previous query ran for `HEAVY` on its worker (the machine
/// stalled that `SELECT 1`): the rule puts that one in line with the flooders, in turn.
async fn flooders_cannot_starve_a_newcomer(depth: u32) {
    let _serial = serial().await;
    // The flooders' requests wait longer than the scene: none may time out meanwhile.
    let c = cluster(&format!(
        "[pool]\npipeline_depth = {depth}\nqueue_timeout_ms = 120000\n"
    ))
    .await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();

    let t0 = Instant::now();
    // Flooders that have had an END: the scene is measured once every one has held a
    // worker (before that, a flooder that never had one is as entitled to the next free
    // worker as the newcomer).
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..FLOODERS {
        let (raw, _) = Raw::open(d.client_addr, &d.client_token).await;
        let Raw { mut rd, mut wr } = raw;
        // Each reader keeps when every END came (a worker came free then) and how each
        // stream ended.
        let served = served.clone();
        readers.push(tokio::spawn(async move {
            let mut ends: Vec<Duration> = Vec::new();
            let mut ended: HashMap<u32, Option<ErrorCode>> = HashMap::new();
            let mut errors: HashMap<u32, ErrorCode> = HashMap::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while ended.len() < FLOOD_STREAMS as usize {
                let frame = match tokio::time::timeout_at(deadline, rd.next()).await {
                    Ok(Some(Ok(f))) => f,
                    other => panic!("flooder: {} streams ended, then {other:?}", ended.len()),
                };
                match frame.kind {
                    Kind::Error if frame.stream != 0 => {
                        let body: ErrorBody = frame.body().expect("ERROR body");
                        errors.insert(frame.stream, body.code);
                    }
                    Kind::End => {
                        if ends.is_empty() {
                            served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        ends.push(t0.elapsed());
                        let code = errors.remove(&frame.stream);
                        assert!(
                            ended.insert(frame.stream, code).is_none(),
                            "two ENDs on {}",
                            frame.stream
                        );
                    }
                    Kind::Error => panic!("connection error on a flooder: {frame:?}"),
                    _ => {}
                }
            }
            (ends, ended)
        }));
        for stream in 1..=FLOOD_STREAMS {
            wr.feed(request(stream, &flood_sql(stream))).await.unwrap();
        }
        SinkExt::<Frame>::flush(&mut wr).await.unwrap();
        writers.push(wr);
    }
    wait_for(Duration::from_secs(10), "every flooder served once", || async {
        (served.load(std::sync::atomic::Ordering::Relaxed) == FLOODERS).then_some(())
    })
    .await
    .unwrap();
    let s = d.status().await.unwrap();
    assert_eq!(s["pool"]["busy"], 4, "every worker busy with a flooder: {}", s["pool"]);

    // The newcomer: one query at a time for 6 s, each bounded (a starved one fails fast).
    let mut sent: Vec<(Duration, Duration, Duration)> = Vec::new();
    let scene = Instant::now();
    while scene.elapsed() < Duration::from_secs(6) {
        let at = t0.elapsed();
        match tokio::time::timeout(Duration::from_secs(6), client.query("SELECT 1", &[])).await {
            Ok(Ok(r)) => sent.push((at, t0.elapsed(), r.summary.server_time)),
            Ok(Err(e)) => panic!("the newcomer failed after {} queries: {}", sent.len(), describe(&e)),
            Err(_) => panic!("the newcomer waited 6 s for SELECT 1 after {} queries", sent.len()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waits_metric = metric(
        d,
        "osprey_queue_longest_wait_seconds{cluster=\"default\",role=\"write\",member=\"primary\"}",
    )
    .await;

    // The flooders end: CANCEL every stream, then each has its END.
    for wr in &mut writers {
        for stream in 1..=FLOOD_STREAMS {
            let cancel = Frame::new(Kind::Cancel, stream, &Cancel { reason: "test".into() });
            wr.feed(cancel).await.unwrap();
        }
        SinkExt::<Frame>::flush(wr).await.unwrap();
    }
    let mut ends = Vec::new();
    for r in readers {
        let (e, ended) = r.await.unwrap();
        assert!(
            ended
                .values()
                .all(|c| matches!(c, None | Some(ErrorCode::Cancelled | ErrorCode::QueueTimeout))),
            "flood streams ended with {ended:?}"
        );
        ends.extend(e);
    }
    ends.sort();

    // For each query: how long after the first worker came free it was answered, less the
    // time it ran on its worker (its END's server time: a stall of its own statement is
    // no wait for a worker), and how many workers came free for the flooders meanwhile.
    // A worker is taken as free for it from the first flooder END read [`IN_LINE`] after
    // it was sent: an END read sooner may have left its worker before the query was in
    // line.
    let mut added: Vec<Duration> = Vec::new();
    let mut total: Vec<Duration> = Vec::new();
    let mut passed_over = 0;
    let mut demoted = 0;
    for (i, &(at, done, ran_itself)) in sent.iter().enumerate() {
        let free = ends.iter().copied().find(|e| *e >= at + IN_LINE).unwrap_or(at);
        total.push(done - at);
        let ran = i.checked_sub(1).map(|p| sent[p].2);
        if ran.is_some_and(|ran| ran >= HEAVY) {
            println!("in the second class: sent {at:?}, answered {done:?}; the one before ran {ran:?}");
            demoted += 1;
            continue;
        }
        let waited = done.saturating_sub(free.max(at)).saturating_sub(ran_itself);
        added.push(waited);
        passed_over += ends
            .iter()
            .filter(|e| **e >= at + IN_LINE && **e + IN_LINE < done)
            .count();
        if waited > Duration::from_millis(50) {
            let near: Vec<_> = ends
                .iter()
                .filter(|e| **e + Duration::from_millis(50) >= at && **e <= done + Duration::from_millis(10))
                .collect();
            println!("slow: sent {at:?}, answered {done:?}, ran {ran_itself:?}; flooder ENDs then: {near:?}");
        }
    }
    assert!(
        added.len() >= 5,
        "only {} queries measured in 6 s ({} sent)",
        added.len(),
        sent.len()
    );
    // A stalled SELECT 1 is rare: were most of them heavy, the rule's measure would be wrong.
    assert!(
        demoted * 4 <= sent.len(),
        "{demoted} of {} after one that ran for HEAVY",
        sent.len()
    );
    println!(
        "newcomer beside {FLOODERS} flooders at depth {depth}: {} queries ({demoted} after one \
         that ran for HEAVY), wait p50 {:?} max {:?}; after the first free worker p50 {:?} \
         p99 {:?} max {:?}; workers that came free for flooders while it waited: \
         {passed_over}; longest-wait gauge {waits_metric}",
        sent.len(),
        p50(&total),
        total.iter().max().unwrap(),
        p50(&added),
        p99(&added),
        added.iter().max().unwrap(),
    );
    // The flooders' requests had waited for seconds when it was read: the gauge says so.
    assert!(waits_metric >= 1.0, "osprey_queue_longest_wait_seconds {waits_metric}");
    assert!(
        p99(&added) <= Duration::from_millis(50),
        "p99 wait after the first free worker {:?} (all: {added:?})",
        p99(&added)
    );
    drop(writers);
    assert_closed_loop(&c, &[&client], 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooders_cannot_starve_a_newcomer_with_prefetch() {
    flooders_cannot_starve_a_newcomer(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooders_cannot_starve_a_newcomer_one_at_a_time() {
    flooders_cannot_starve_a_newcomer(1).await;
}

/// What A and B ask for in [`first_served`]: well under `HEAVY`, long enough to order them.
const SHORT: &str = "SELECT SLEEP(0.02)";

/// With one worker, held by C's statement: A asks for [`SHORT`] first, B 100 ms later.
/// Whom the worker serves first once C's ends: a light A (it holds none, its last request
/// was short) is first in the first class; a heavy one waits in the second class, behind B.
/// (Each runs 20 ms, so the one served second is answered 20 ms after the other.)
async fn first_served(
    d: &osprey_tests::harness::Dispatcher,
    a_asks: impl std::future::Future<Output = ()>,
    b: &Client,
    c: &Client,
) -> &'static str {
    let c = c.clone();
    let hold = tokio::spawn(async move { c.query("SELECT SLEEP(0.6)", &[]).await });
    wait_for(Duration::from_secs(5), "C holds the worker", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["busy"] == 1 && s["pool"]["queue_depth"] == 0).then_some(())
    })
    .await
    .unwrap();
    let a = async {
        a_asks.await;
        Instant::now()
    };
    let b = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        b.query(SHORT, &[]).await.expect("B's statement");
        Instant::now()
    };
    let t0 = Instant::now();
    let (a_done, b_done) = tokio::join!(a, b);
    hold.await.unwrap().expect("C's statement");
    println!("A answered after {:?}, B after {:?}", a_done - t0, b_done - t0);
    if a_done < b_done {
        "A"
    } else {
        "B"
    }
}

/// Waits until the pool's one worker is idle: the request before has ended at the
/// dispatcher (and its weight was judged), not only at its client.
async fn worker_free_again(d: &osprey_tests::harness::Dispatcher) {
    wait_for(Duration::from_secs(10), "the worker idle again", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["busy"] == 0 && s["pool"]["idle"] == 1).then_some(())
    })
    .await
    .unwrap();
}

/// A statement that failed, or was stopped at its timeout, held its worker until then,
/// though its END (after an ERROR) carries no time: its connection is heavy (review of
/// the fix that judged the weight by END's `server_time_us`, which reads 0 there and made
/// it light).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_that_failed_late_makes_its_connection_heavy() {
    use osprey_client::RequestExt;
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\npipeline_depth = 1\n").await;
    let d = &c.dispatcher;
    let (a, b, holder) = (
        d.client().await.unwrap(),
        d.client().await.unwrap(),
        d.client().await.unwrap(),
    );
    // A light to begin with: its last request ran briefly (the rule's own measure; a
    // first statement on a fresh worker may not).
    let mut ran = Vec::new();
    while ran.last().is_none_or(|r| *r >= Duration::from_millis(10)) {
        assert!(ran.len() < 5, "SELECT 1 ran {ran:?}");
        ran.push(a.query("SELECT 1", &[]).await.unwrap().summary.server_time);
    }
    let asks = async { a.query(SHORT, &[]).await.map(drop).expect("A's statement") };
    assert_eq!(
        first_served(d, asks, &b, &holder).await,
        "A",
        "A is light: first come first"
    );

    // The database's error after 300 ms (the subquery is read after the SLEEP).
    let e = a
        .query("SELECT IF(SLEEP(0.3) = 0, (SELECT 1 UNION SELECT 2), 0)", &[])
        .await
        .expect_err("more than one row");
    assert_eq!(e.errno(), Some(1242), "{}", describe(&e));
    // The client has the ERROR; the request ends at its END, right behind it.
    worker_free_again(d).await;
    let asks = async { a.query(SHORT, &[]).await.map(drop).expect("A's statement") };
    assert_eq!(first_served(d, asks, &b, &holder).await, "B", "A is heavy: B first");
    // A's last ran 20 ms: light again. Then a statement stopped at its timeout.
    let asks = async { a.query(SHORT, &[]).await.map(drop).expect("A's statement") };
    assert_eq!(first_served(d, asks, &b, &holder).await, "A", "A is light again");
    let slow = osprey_client::Request::sql("SELECT SLEEP(5)").with_timeout(Duration::from_millis(300));
    let e = a.send(slow).await.expect_err("a timeout");
    assert_eq!(e.code(), ErrorCode::RequestTimeout, "{}", describe(&e));
    // The SDK gives up at its own copy of the timeout, a moment before the dispatcher
    // stops the statement: until it has, A still holds the worker, and "C holds it" below
    // could be that statement (a CI run saw A served first that way).
    worker_free_again(d).await;
    let asks = async { a.query(SHORT, &[]).await.map(drop).expect("A's statement") };
    assert_eq!(first_served(d, asks, &b, &holder).await, "B", "A is heavy: B first");
    assert_closed_loop(&c, &[&a, &b, &holder], 1).await;
}

/// A result the worker wrote at once, but whose client took it slowly, held the worker
/// until the client had it all: the worker's own time (a moment) is not the weight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_a_client_takes_slowly_make_its_connection_heavy() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\npipeline_depth = 1\nbatch_rows = 10\n").await;
    let d = &c.dispatcher;
    let (b, holder) = (d.client().await.unwrap(), d.client().await.unwrap());
    // A window of two frames per stream: one row (COLUMNS, ROWS) goes through at once.
    let (mut a, ack) = Raw::open_with_window(d.client_addr, &d.client_token, 2).await;
    assert_eq!(ack.stream_window, 2);
    a.expect_query_ok(1, "SELECT 1").await;
    assert_eq!(
        first_served(d, a.expect_query_ok(2, SHORT), &b, &holder).await,
        "A",
        "A is light: first come first"
    );

    // Three ROWS frames of 10 KB: the worker writes them at once, two wait for A's
    // credit, which A gives 300 ms later.
    a.send(request(3, "SELECT REPEAT('x', 1000) FROM seq_1_to_30")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.send(Frame::new(Kind::Window, 3, &osprey_protocol::Window { increment: 16 }))
        .await;
    let mut kinds = Vec::new();
    loop {
        match a.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) if f.stream == 3 && f.kind == Kind::End => {
                let end: osprey_protocol::End = f.body().expect("END body");
                assert!(
                    end.server_time_us < 100_000,
                    "the worker took {} µs: the test needs a result it writes at once",
                    end.server_time_us
                );
                break;
            }
            Got::Frame(f) if f.stream == 3 => kinds.push(f.kind),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(kinds, [Kind::Columns, Kind::Rows, Kind::Rows, Kind::Rows]);
    assert_eq!(
        first_served(d, a.expect_query_ok(4, SHORT), &b, &holder).await,
        "B",
        "A is heavy: B first"
    );
    assert_closed_loop(&c, &[&b, &holder], 1).await;
}

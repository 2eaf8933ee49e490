//! Risk: a client gives up on a request. The statement must be stopped (KILL QUERY) and the
//! worker returned to the pool — not killed, not left running a 30 s query.

use std::time::{Duration, Instant};

use osprey_client::ErrorCode;
use osprey_protocol::{Cancel, ErrorBody, Frame, Kind};
use osprey_tests::harness::{process_alive, wait_for};

use crate::raw::{request, Got, Raw};
use crate::{assert_closed_loop, cluster, ms, serial, slots, wait_busy, wait_replaced};

fn cancel(stream: u32) -> Frame {
    Frame::new(Kind::Cancel, stream, &Cancel { reason: "test".into() })
}

/// Test 6. SDK: a `SELECT SLEEP(30)` whose future is dropped frees its worker within 1 s,
/// through KILL QUERY (same pid), and that worker serves the next request. Raw frames:
/// REQUEST + CANCEL gives exactly one ERROR(CANCELLED) + END on that stream, and nothing after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancel() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let before = slots(d).await;

    // SDK: drop the future after 300 ms.
    let dropped = tokio::time::timeout(Duration::from_millis(300), client.query("SELECT SLEEP(30)", &[])).await;
    assert!(dropped.is_err(), "SLEEP(30) cannot finish in 300 ms");
    let t_drop = Instant::now();
    let busy = wait_for(Duration::from_millis(200), "the cancelled request's slot", || async {
        slots(d).await.into_iter().find(|s| s.state == "busy")
    })
    .await
    .ok();
    wait_for(
        Duration::from_secs(1),
        "the worker to be idle within 1 s of the drop",
        || async { slots(d).await.iter().all(|s| s.state == "idle").then_some(()) },
    )
    .await
    .unwrap();
    println!(
        "client cancel (SDK): worker idle {} ms after the drop (busy slot seen: {busy:?})",
        ms(t_drop)
    );
    let after = slots(d).await;
    assert_eq!(
        before.iter().map(|s| s.pid).collect::<Vec<_>>(),
        after.iter().map(|s| s.pid).collect::<Vec<_>>(),
        "a cancelled worker must not be killed"
    );
    // LIFO: the freed worker is on top of the idle stack and serves the next request.
    let top = after.iter().max_by_key(|s| s.requests).unwrap().clone();
    let r = client.query("SELECT 5", &[]).await.unwrap();
    assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 5);
    let served: u64 = slots(d).await.iter().map(|s| s.requests).sum();
    assert_eq!(served, after.iter().map(|s| s.requests).sum::<u64>() + 1);
    println!("client cancel (SDK): next request served; slot of most requests {top:?}");
    assert!(crate::metric(d, "osprey_requests_total{outcome=\"cancelled\"}").await >= 1.0);
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 0.0);

    // Raw: REQUEST, wait until it runs on a worker, CANCEL.
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.send(request(7, "SELECT SLEEP(30)")).await;
    let busy = wait_busy(d, Duration::from_secs(2)).await;
    let t_cancel = Instant::now();
    raw.send(cancel(7)).await;
    // Result frames may precede it (MariaDB sends SLEEP's column metadata before the
    // statement ends); then exactly one ERROR, immediately followed by END.
    let mut kinds = Vec::new();
    let mut err: Option<ErrorBody> = None;
    loop {
        match raw.next_data(Duration::from_secs(3)).await {
            Got::Frame(f) if f.stream == 7 => {
                kinds.push(f.kind.name());
                match f.kind {
                    Kind::Columns | Kind::Rows => assert!(err.is_none(), "result after ERROR: {kinds:?}"),
                    Kind::Error => {
                        assert!(err.is_none(), "two ERRORs: {kinds:?}");
                        err = Some(f.body::<ErrorBody>().unwrap());
                    }
                    Kind::End => break,
                    _ => panic!("unexpected frame on stream 7: {f:?}"),
                }
            }
            other => panic!("expected frames of stream 7, got {other:?}"),
        }
    }
    let err = err.unwrap_or_else(|| panic!("the cancelled stream ended without ERROR: {kinds:?}"));
    assert_eq!(err.code, ErrorCode::Cancelled, "{err:?}");
    assert!(err.dispatched, "{err:?}");
    assert_eq!(
        kinds[kinds.len() - 2..],
        [Kind::Error.name(), Kind::End.name()],
        "{kinds:?}"
    );
    println!(
        "client cancel (raw): {kinds:?}: ERROR {} (origin {:?}, errno {:?}) + END {} ms after CANCEL",
        err.code,
        err.origin,
        err.errno,
        ms(t_cancel)
    );
    // A CANCEL for the ended stream is ignored; nothing more arrives on stream 7, and the
    // connection keeps working.
    raw.send(cancel(7)).await;
    raw.expect_query_ok(9, "SELECT 1").await;
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(500) {
        match tokio::time::timeout(Duration::from_millis(100), raw.next_data(Duration::from_secs(1))).await {
            Err(_) => {}
            Ok(got) => panic!("nothing may follow the END: {got:?}"),
        }
    }
    let freed = slots(d).await.into_iter().find(|s| s.slot == busy.slot).unwrap();
    assert_eq!(freed.state, "idle");
    assert_eq!(freed.pid, busy.pid, "the cancelled worker was killed");
    drop(raw);
    assert_closed_loop(&c, &[&client], 2).await;
}

/// Cancels per connection in [`early_cancels_kill_no_worker`], and connections.
const EARLY_CANCELS: usize = 250;
const EARLY_CONNECTIONS: usize = 1;
/// The bound on CANCEL → END: half the dispatcher's `cancel_grace_ms` (2000).
const CANCEL_BOUND: Duration = Duration::from_millis(1000);

/// Sends `SELECT SLEEP(3)` and cancels it after a random 0–20 ms, `count` times or until
/// `until`; each stream must end with CANCELLED within `bound` of its CANCEL. Returns the
/// CANCEL → END latencies.
async fn early_cancels(
    addr: std::net::SocketAddr,
    token: String,
    seed: u64,
    count: usize,
    until: Option<Instant>,
    bound: Duration,
) -> Vec<Duration> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut raw, _) = Raw::open(addr, &token).await;
    let mut latencies = Vec::with_capacity(count);
    for n in 0..count {
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        let stream = n as u32 + 1;
        raw.send(request(stream, "SELECT SLEEP(3)")).await;
        let delay = Duration::from_micros(rng.random_range(0..=20_000));
        tokio::time::sleep(delay).await;
        raw.send(cancel(stream)).await;
        let t = Instant::now();
        let mut err: Option<ErrorBody> = None;
        loop {
            match raw.next_data(Duration::from_secs(10)).await {
                Got::Frame(f) if f.stream == stream => match f.kind {
                    Kind::Columns | Kind::Rows => {}
                    Kind::Error => err = Some(f.body().unwrap()),
                    Kind::End => break,
                    other => panic!("unexpected {other:?}"),
                },
                other => panic!("expected frames of stream {stream}, got {other:?}"),
            }
        }
        let took = t.elapsed();
        // A success could only be a statement that finished first: not within 20 ms of 3 s.
        let e = err.unwrap_or_else(|| panic!("cancel {n} (after {delay:?}) ended without ERROR"));
        assert_eq!(e.code, ErrorCode::Cancelled, "cancel {n} after {delay:?}: {e:?}");
        assert!(
            took < bound,
            "cancel {n} sent {delay:?} after the request took {took:?} to end ({e:?})"
        );
        latencies.push(took);
    }
    latencies
}

/// Issue 9 item 7. Cancels that arrive 0–20 ms after the request — while the statement may
/// not have started on the server, where a `KILL QUERY` is lost — all end with CANCELLED
/// well within `cancel_grace_ms`, and no worker is killed or replaced. One connection:
/// with several `SLEEP`s being killed at once MariaDB 10.11 itself can hold a killed
/// `SLEEP` for ~2 s (processlist `Killed / Executing`; they share one server mutex), which
/// no client-side retry can shorten: [`concurrent_early_cancels_kill_no_worker`] covers that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_cancels_kill_no_worker() {
    let _serial = serial().await;
    let c = cluster(&format!("[pool]\nsize = {EARLY_CONNECTIONS}\n")).await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    let pids = d.worker_pids().await.unwrap();
    let kills = crate::metric(d, "osprey_worker_kills_total").await;
    let respawns = crate::metric(d, "osprey_worker_respawns_total").await;

    // A probe beside the workers: how long a trivial statement takes on its own connection
    // while the cancels run (a stall of the database itself shows here).
    let probe_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let stop = probe_stop.clone();
        let mut conn = c.sandbox.primary().conn().await.unwrap();
        tokio::spawn(async move {
            use mysql_async::prelude::Queryable;
            let mut worst = (Duration::ZERO, Duration::ZERO);
            let start = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t = Instant::now();
                let _: Option<i64> = conn.query_first("SELECT 1").await.unwrap();
                if t.elapsed() > worst.0 {
                    worst = (t.elapsed(), t - start);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            worst
        })
    };
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..EARLY_CONNECTIONS)
        .map(|i| {
            tokio::spawn(early_cancels(
                d.client_addr,
                d.client_token.clone(),
                0x5eed + i as u64,
                EARLY_CANCELS,
                None,
                CANCEL_BOUND,
            ))
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        match t.await {
            Ok(v) => all.extend(v),
            Err(e) => {
                probe_stop.store(true, std::sync::atomic::Ordering::SeqCst);
                let worst = probe.await.unwrap();
                panic!("{e}; probe worst SELECT 1 {worst:?}");
            }
        }
    }
    probe_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    println!("probe worst SELECT 1: {:?}", probe.await.unwrap());
    all.sort();
    let pct = |p: usize| all[(all.len() * p / 100).min(all.len() - 1)];
    println!(
        "early cancels: {} in {:?}; CANCEL -> END p50 {:?} p99 {:?} max {:?}",
        all.len(),
        t0.elapsed(),
        pct(50),
        pct(99),
        all[all.len() - 1]
    );
    assert_eq!(
        crate::metric(d, "osprey_worker_kills_total").await,
        kills,
        "a worker was killed"
    );
    assert_eq!(
        crate::metric(d, "osprey_worker_respawns_total").await,
        respawns,
        "a worker was respawned"
    );
    assert_eq!(d.worker_pids().await.unwrap(), pids, "a worker was replaced");
    assert_closed_loop(&c, &[&client], EARLY_CONNECTIONS).await;
}

/// Connections in [`concurrent_early_cancels_kill_no_worker`] (one worker each), the
/// cancels each makes at most, and the time they get.
const CONCURRENT_CONNECTIONS: usize = 4;
const CONCURRENT_CANCELS: usize = 50;
const CONCURRENT_TIME: Duration = Duration::from_secs(15);

/// Issue 9 item 7, several at once. With 2–4 `SLEEP`s killed at the same moment MariaDB can
/// keep one in `Killed / Executing` for ~2 s (its KILL retries that long for the mutex all
/// `SLEEP`s share), up to and past `cancel_grace_ms` (2000), although every repeated
/// `KILL QUERY` returns OK. Before the fix the dispatcher killed such a worker at the grace
/// (about one run in two here, 3–4 workers each time). The worker is alive and keeps killing:
/// the dispatcher answers the stream at `cancel_grace_ms` and waits for the statement to
/// end rather than killing the worker. Every stream ends with CANCELLED within the grace
/// (plus a margin for a loaded machine); no worker is killed, respawned or replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_early_cancels_kill_no_worker() {
    let _serial = serial().await;
    let c = cluster(&format!("[pool]\nsize = {CONCURRENT_CONNECTIONS}\n")).await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    let pids = d.worker_pids().await.unwrap();
    let kills = crate::metric(d, "osprey_worker_kills_total").await;
    let respawns = crate::metric(d, "osprey_worker_respawns_total").await;
    // cancel_grace_ms (the harness keeps the default, 2000) and a margin.
    let bound = Duration::from_millis(2000 + 1500);
    let t0 = Instant::now();
    let until = t0 + CONCURRENT_TIME;
    let tasks: Vec<_> = (0..CONCURRENT_CONNECTIONS)
        .map(|i| {
            tokio::spawn(early_cancels(
                d.client_addr,
                d.client_token.clone(),
                0xca2ce1 + i as u64,
                CONCURRENT_CANCELS,
                Some(until),
                bound,
            ))
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let pct = |p: usize| all[(all.len() * p / 100).min(all.len() - 1)];
    let overruns = crate::metric(d, "osprey_cancel_overruns_total").await;
    println!(
        "concurrent early cancels: {} on {CONCURRENT_CONNECTIONS} connections in {:?}; CANCEL -> END p50 {:?} \
         p99 {:?} max {:?}; statements past cancel_grace_ms: {overruns}; worker kills: {}",
        all.len(),
        t0.elapsed(),
        pct(50),
        pct(99),
        all[all.len() - 1],
        crate::metric(d, "osprey_worker_kills_total").await - kills,
    );
    assert!(all.len() >= 100, "only {} cancels in {CONCURRENT_TIME:?}", all.len());
    assert_eq!(
        crate::metric(d, "osprey_worker_kills_total").await,
        kills,
        "a worker was killed"
    );
    assert_eq!(
        crate::metric(d, "osprey_worker_respawns_total").await,
        respawns,
        "a worker was respawned"
    );
    assert_eq!(d.worker_pids().await.unwrap(), pids, "a worker was replaced");
    assert_closed_loop(&c, &[&client], CONCURRENT_CONNECTIONS).await;
}

/// The other side of [`concurrent_early_cancels_kill_no_worker`]: a worker that really does
/// not respond (SIGSTOP before the CANCEL reaches it) still costs its process. The stream
/// ends with CANCELLED at `cancel_grace_ms`; the dispatcher's PING then goes unanswered for
/// another `cancel_grace_ms` and the worker is killed and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_worker_after_cancel_is_killed() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let _serial = serial().await;
    const GRACE: Duration = Duration::from_millis(1000);
    let c = cluster(&format!(
        "[pool]\nsize = 2\n[timeouts]\ncancel_grace_ms = {}\n",
        GRACE.as_millis()
    ))
    .await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    let kills = crate::metric(d, "osprey_worker_kills_total").await;

    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.send(request(3, "SELECT SLEEP(30)")).await;
    let busy = wait_busy(d, Duration::from_secs(2)).await;
    let pid = busy.pid.unwrap();
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
    wait_for(Duration::from_millis(500), "the worker to be stopped", || async {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')').next()?.trim_start().starts_with('T').then_some(())
    })
    .await
    .unwrap();
    let t_cancel = Instant::now();
    raw.send(cancel(3)).await;
    let mut err: Option<ErrorBody> = None;
    loop {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) if f.stream == 3 => match f.kind {
                Kind::Columns | Kind::Rows => assert!(err.is_none(), "result after ERROR"),
                Kind::Error => {
                    assert!(err.is_none(), "two ERRORs");
                    err = Some(f.body().unwrap());
                }
                Kind::End => break,
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("expected frames of stream 3, got {other:?}"),
        }
    }
    let answered = t_cancel.elapsed();
    let err = err.expect("the cancelled stream ended without ERROR");
    assert_eq!(err.code, ErrorCode::Cancelled, "{err:?}");
    assert!(err.dispatched, "{err:?}");
    assert!(
        answered >= GRACE - Duration::from_millis(50) && answered < GRACE + Duration::from_millis(1500),
        "the stream ended {answered:?} after CANCEL, expected ~cancel_grace_ms ({GRACE:?})"
    );
    // Killed after a second grace without a PONG: within 2 × grace and a margin.
    let fresh = wait_replaced(d, busy.slot, pid, Duration::from_secs(10)).await;
    let replaced = t_cancel.elapsed();
    wait_for(Duration::from_secs(2), "the hung worker to be gone", || async {
        (!process_alive(pid)).then_some(())
    })
    .await
    .unwrap();
    println!(
        "hung worker after cancel: stream answered {answered:?} after CANCEL ({err:?}); slot {} \
         replaced (pid {pid} -> {:?}) {replaced:?} after CANCEL",
        busy.slot, fresh.pid
    );
    assert!(
        replaced < 2 * GRACE + Duration::from_secs(3),
        "the hung worker was replaced only {replaced:?} after CANCEL"
    );
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, kills + 1.0);
    // Nothing more on stream 3; the connection keeps working on the other worker.
    raw.expect_query_ok(5, "SELECT 1").await;
    drop(raw);
    assert_closed_loop(&c, &[&client], 2).await;
}

/// The hard bound of a cancel: a worker that stays alive (answers every PING) but whose
/// statement never ends — the database itself is SIGSTOPped, so neither the statement nor
/// the worker's `KILL QUERY` gets anywhere — has its stream answered at `cancel_grace_ms` and
/// is killed `5 × cancel_grace_ms` after the CANCEL, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_statement_that_never_ends_costs_its_worker_at_the_hard_bound() {
    let _serial = serial().await;
    const GRACE: Duration = Duration::from_millis(500);
    let hard = GRACE * 5;
    let c = cluster(&format!(
        "[pool]\nsize = 2\n[timeouts]\ncancel_grace_ms = {}\n[backend]\nconnect_timeout_ms = 500\n",
        GRACE.as_millis()
    ))
    .await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    let kills = crate::metric(d, "osprey_worker_kills_total").await;

    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.send(request(3, "SELECT SLEEP(30)")).await;
    let busy = wait_busy(d, Duration::from_secs(2)).await;
    let primary = c.sandbox.primary();
    primary.stop();
    let t_cancel = Instant::now();
    raw.send(cancel(3)).await;
    let mut err: Option<ErrorBody> = None;
    loop {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) if f.stream == 3 => match f.kind {
                Kind::Columns | Kind::Rows => {}
                Kind::Error => err = Some(f.body().unwrap()),
                Kind::End => break,
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("expected frames of stream 3, got {other:?}"),
        }
    }
    let answered = t_cancel.elapsed();
    let killed = wait_for(Duration::from_secs(10), "the worker to be killed", || async {
        (crate::metric(d, "osprey_worker_kills_total").await > kills).then(|| t_cancel.elapsed())
    })
    .await;
    primary.cont();
    let killed = killed.unwrap();
    let err = err.expect("the cancelled stream ended without ERROR");
    println!(
        "never-ending cancelled statement: stream answered {answered:?} after CANCEL, worker (pid {:?}) \
         killed {killed:?} after it (cancel_grace_ms {GRACE:?}, hard bound {hard:?})",
        busy.pid
    );
    assert_eq!(err.code, ErrorCode::Cancelled, "{err:?}");
    assert!(err.dispatched, "{err:?}");
    assert!(
        answered < GRACE + Duration::from_millis(1000),
        "the stream ended {answered:?} after CANCEL"
    );
    assert!(
        killed >= hard - Duration::from_millis(50) && killed < hard + Duration::from_millis(1500),
        "the alive worker was killed {killed:?} after CANCEL; expected at the hard bound {hard:?}"
    );
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, kills + 1.0);
    wait_replaced(d, busy.slot, busy.pid.unwrap(), Duration::from_secs(20)).await;
    raw.expect_query_ok(5, "SELECT 1").await;
    drop(raw);
    assert_closed_loop(&c, &[&client], 2).await;
}

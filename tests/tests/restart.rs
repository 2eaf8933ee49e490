//! Shutdown and restart (issue "Robustness"): graceful SIGTERM under load, the drain
//! timeout and a second SIGTERM, zero-downtime restarts (a new dispatcher beside the old
//! one on the same ports, then SIGTERM the old one), and the SDK reconnecting after the
//! dispatcher was killed with SIGKILL.
//!
//! Each test waits on conditions with deadlines and ends with the closed loop: the client
//! stats balance, the (last) dispatcher's stream counters balance, the workers of every
//! stopped dispatcher are gone and no stray `osprey-worker` is left (scan of `/proc`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use nix::sys::signal::Signal;
use osprey_client::{Client, ClientConfig, Error, ErrorCode, Origin, Request, RequestExt, Value};
use osprey_tests::harness::{bin_dir, process_alive, wait_for, wait_no_stray_workers, Cluster, Dispatcher};

fn describe(e: &Error) -> String {
    format!(
        "{:?}/{} errno={:?} dispatched={} msg={}",
        e.origin(),
        e.code().as_str(),
        e.errno(),
        e.dispatched(),
        e.message()
    )
}

/// Worker pids of `d`, from its admin view and from `/proc` (children named `osprey-worker`).
async fn worker_pids(d: &Dispatcher) -> Vec<u32> {
    let mut pids: Vec<u32> = d
        .worker_pids()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|(_, p)| p)
        .collect();
    pids.extend(d.worker_children());
    pids.sort_unstable();
    pids.dedup();
    assert!(!pids.is_empty(), "dispatcher {} has workers", d.pid());
    pids
}

/// One request's record: when it started and ended, what it was, how it ended.
#[derive(Debug, Clone)]
struct Record {
    start: Instant,
    end: Instant,
    what: &'static str,
    token: Option<String>,
    result: Result<(), Error>,
}

type Log = Arc<Mutex<Vec<Record>>>;

/// `tasks` tasks (spread over `clients`) issuing `next(task, i)` requests back to back
/// until `stop`; every request is recorded.
fn spawn_load(
    clients: &[Client],
    tasks: usize,
    stop: &Arc<AtomicBool>,
    log: &Log,
    next: fn(usize, u64) -> (&'static str, Request, Option<String>),
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|t| {
            let client = clients[t % clients.len()].clone();
            let (stop, log) = (stop.clone(), log.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let (what, req, token) = next(t, i);
                    let start = Instant::now();
                    // Far above any legitimate duration here: a hang is a failure, not a wait.
                    let result = match tokio::time::timeout(Duration::from_secs(60), client.send(req)).await {
                        Ok(r) => r.map(|_| ()),
                        Err(_) => panic!("request {what} hung for 60 s"),
                    };
                    log.lock().unwrap().push(Record {
                        start,
                        end: Instant::now(),
                        what,
                        token,
                        result,
                    });
                }
            })
        })
        .collect()
}

fn tally(records: &[Record]) -> BTreeMap<String, usize> {
    let mut t = BTreeMap::new();
    for r in records {
        let key = match &r.result {
            Ok(()) => format!("ok {}", r.what),
            Err(e) => format!("error {} dispatched={}", e.code().as_str(), e.dispatched()),
        };
        *t.entry(key).or_default() += 1;
    }
    t
}

/// Test 1: SIGTERM while 16 tasks run queries: every accepted request completes, the
/// ones issued after GOAWAY fail undispatched (there is no second dispatcher), the
/// process exits 0 within the drain timeout and its workers are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_finishes_every_accepted_request() {
    let drain = Duration::from_secs(10);
    let Cluster {
        mut dispatcher,
        sandbox: _sandbox,
    } = Cluster::start("[pool]\nsize = 4\n[timeouts]\ndrain_timeout_ms = 10000\n")
        .await
        .expect("cluster");
    let d = &mut dispatcher;
    let mut cfg = d.client_config();
    cfg.connection_wait = Duration::from_secs(1);
    cfg.backoff_max = Duration::from_millis(200);
    let clients = vec![
        Client::connect(cfg.clone()).await.unwrap(),
        Client::connect(cfg.clone()).await.unwrap(),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let log: Log = Default::default();
    let handles = spawn_load(&clients, 16, &stop, &log, |t, i| {
        if (t + i as usize).is_multiple_of(3) {
            ("sleep", Request::sql("SELECT SLEEP(0.2)"), None)
        } else {
            (
                "point",
                Request::sql("SELECT ? + 1").with_params(vec![Value::Int(i as i64)]),
                None,
            )
        }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let pids = worker_pids(d).await;
    let busy = d.status().await.unwrap()["pool"]["busy"].as_u64().unwrap();
    let t_term = Instant::now();
    d.signal(Signal::SIGTERM);
    let code = d
        .wait_exit(drain + Duration::from_secs(5))
        .await
        .expect("dispatcher exits");
    let exit_after = t_term.elapsed();
    assert_eq!(code, Some(0), "exit code after SIGTERM");
    assert!(exit_after < drain, "exit took {exit_after:?}, drain timeout {drain:?}");
    // Keep issuing for a while: these find no dispatcher at all.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    let records = log.lock().unwrap().clone();
    let t = tally(&records);
    println!(
        "SIGTERM under load: {} busy at SIGTERM, exit 0 after {exit_after:?}; tally {t:?}",
        busy
    );

    let mut drained_ok = 0;
    for r in &records {
        match &r.result {
            Ok(()) => {
                if r.start < t_term && r.end > t_term {
                    drained_ok += 1;
                }
            }
            Err(e) => {
                // Nothing that reached a database was lost: every failure is undispatched
                // and says why (draining, or no dispatcher to connect to).
                assert!(!e.dispatched(), "an in-flight request failed: {}", describe(e));
                assert!(
                    matches!(e.code(), ErrorCode::ConnectFailed | ErrorCode::ShuttingDown),
                    "unexpected error {}",
                    describe(e)
                );
                assert!(r.end > t_term, "error before SIGTERM: {}", describe(e));
            }
        }
    }
    assert!(drained_ok > 0, "some requests were in flight at SIGTERM and finished");
    assert!(
        records
            .iter()
            .any(|r| r.result.is_err() && r.start > t_term + exit_after),
        "requests issued after the exit fail (CONNECT_FAILED)"
    );
    println!("{drained_ok} requests in flight at SIGTERM completed successfully");
    for c in &clients {
        let s = c.stats();
        assert_eq!(s.streams_opened, s.streams_closed, "client stats {s:?}");
        assert_eq!(s.in_flight, 0, "client stats {s:?}");
    }
    wait_no_stray_workers(&pids, Duration::from_secs(3))
        .await
        .expect("workers gone");
}

/// Starts a `SELECT SLEEP(secs)` and waits until a slot is busy with it.
async fn long_request(
    d: &Dispatcher,
    client: &Client,
    secs: u32,
) -> tokio::task::JoinHandle<(Result<(), Error>, Instant)> {
    let c = client.clone();
    let h = tokio::spawn(async move {
        let r = c.query(format!("SELECT SLEEP({secs})"), &[]).await.map(|_| ());
        (r, Instant::now())
    });
    wait_for(Duration::from_secs(5), "a busy slot", || async {
        let s = d.status().await.ok()?;
        (s["pool"]["busy"].as_u64()? == 1).then_some(())
    })
    .await
    .unwrap();
    h
}

fn assert_shutting_down(r: &Result<(), Error>) {
    let e = r.as_ref().expect_err("the long request must fail");
    assert_eq!(e.code(), ErrorCode::ShuttingDown, "{}", describe(e));
    assert_eq!(e.origin(), Origin::Dispatcher, "{}", describe(e));
    assert!(e.dispatched(), "it had reached a worker: {}", describe(e));
}

/// Test 2a: with `drain_timeout_ms = 500`, a `SELECT SLEEP(10)` in flight at SIGTERM gets
/// `ERROR SHUTTING_DOWN` (dispatched) + `END` about 0.5 s later; the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_fails_what_is_left() {
    let Cluster {
        mut dispatcher,
        sandbox: _sandbox,
    } = Cluster::start("[pool]\nsize = 2\n[timeouts]\ndrain_timeout_ms = 500\n")
        .await
        .expect("cluster");
    let d = &mut dispatcher;
    let client = d.client().await.unwrap();
    let h = long_request(d, &client, 10).await;
    let pids = worker_pids(d).await;
    let t0 = Instant::now();
    d.signal(Signal::SIGTERM);
    let (r, ended) = tokio::time::timeout(Duration::from_secs(5), h)
        .await
        .expect("answered")
        .unwrap();
    let after = ended - t0;
    println!(
        "drain_timeout 500 ms: long request ended after {after:?} with {:?}",
        r.as_ref().map_err(describe)
    );
    assert_shutting_down(&r);
    assert!(
        after >= Duration::from_millis(450) && after < Duration::from_millis(1500),
        "ended {after:?} after SIGTERM"
    );
    let code = d.wait_exit(Duration::from_secs(5)).await.expect("exits");
    println!("exit {code:?} after {:?}", t0.elapsed());
    assert_eq!(code, Some(0));
    let s = client.stats();
    assert_eq!(
        (s.streams_opened, s.in_flight),
        (s.streams_closed, 0),
        "client stats {s:?}"
    );
    wait_no_stray_workers(&pids, Duration::from_secs(3))
        .await
        .expect("workers gone");
}

/// `osprey_worker_respawns_total` from `/metrics`.
async fn respawns(d: &Dispatcher) -> u64 {
    let text = d
        .metrics()
        .await
        .expect("GET /metrics (a slot retrying without pause starves the admin port)");
    text.lines()
        .find_map(|l| l.strip_prefix("osprey_worker_respawns_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("osprey_worker_respawns_total") as u64
}

/// A slot whose worker cannot be started keeps backing off during a drain. Its binary is
/// removed and its idle worker killed, so every respawn fails; then SIGTERM with a long
/// request in flight (drain_timeout 3 s). Before the fix, the drain ended the back-off
/// at once on every round and the slot retried without pause (thousands of attempts a
/// second, one core spinning, the admin port starved); now it tries once per back-off
/// (1, 2, 4 s …), and the end of the drain ends the back-off it sleeps in: the process
/// exits on time, not when a 4 s back-off runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_that_cannot_respawn_backs_off_during_a_drain() {
    let dir = tempfile::tempdir().unwrap();
    let worker = dir.path().join("osprey-worker");
    std::fs::copy(bin_dir().join("osprey-worker"), &worker).unwrap();
    let Cluster {
        mut dispatcher,
        sandbox: _sandbox,
    } = Cluster::start(&format!(
        "[pool]\nsize = 2\nworker_binary = {:?}\nrespawn_backoff_min_ms = 1000\nrespawn_backoff_max_ms = 10000\n\
         [timeouts]\ndrain_timeout_ms = 3000\n",
        worker.display().to_string()
    ))
    .await
    .expect("cluster");
    let d = &mut dispatcher;
    let client = d.client().await.unwrap();
    let h = long_request(d, &client, 20).await;
    let status = d.status().await.unwrap();
    let idle: Vec<u32> = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "idle")
        .filter_map(|s| s["pid"].as_u64().map(|p| p as u32))
        .collect();
    assert_eq!(idle.len(), 1, "one idle worker beside the busy one: {status}");
    let pids = worker_pids(d).await;
    std::fs::remove_file(&worker).unwrap();
    let before = respawns(d).await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(idle[0] as i32), Signal::SIGKILL).unwrap();
    wait_for(Duration::from_secs(5), "a failed respawn", || async {
        (respawns(d).await > before).then_some(())
    })
    .await
    .unwrap();
    let t0 = Instant::now();
    d.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let during = respawns(d).await;
    let attempts = during - before;
    println!("respawn attempts by {:?} after SIGTERM: {attempts}", t0.elapsed());
    // 1 s, then 2 s apart: 2 or 3 since the kill; a slot that does not back off makes
    // thousands.
    assert!(attempts <= 5, "{attempts} respawn attempts in 2 s of drain");
    let (r, _) = tokio::time::timeout(Duration::from_secs(5), h)
        .await
        .expect("answered")
        .unwrap();
    assert_shutting_down(&r);
    let code = d.wait_exit(Duration::from_secs(15)).await.expect("exits");
    let exited = t0.elapsed();
    println!("exit {code:?} after {exited:?}");
    assert_eq!(code, Some(0));
    // The drain ends at 3 s; the slot then sleeps in a back-off of 4 s.
    assert!(exited < Duration::from_millis(4500), "exited {exited:?} after SIGTERM");
    wait_no_stray_workers(&pids, Duration::from_secs(3))
        .await
        .expect("workers gone");
}

/// Test 2b: a second SIGTERM during a drain (long request in flight, drain timeout 30 s)
/// stops at once: exit 0 within about a second, the request gets ERROR + END.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_sigterm_stops_at_once() {
    let Cluster {
        mut dispatcher,
        sandbox: _sandbox,
    } = Cluster::start("[pool]\nsize = 2\n[timeouts]\ndrain_timeout_ms = 30000\n")
        .await
        .expect("cluster");
    let d = &mut dispatcher;
    let client = d.client().await.unwrap();
    let h = long_request(d, &client, 20).await;
    let pids = worker_pids(d).await;
    d.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(process_alive(d.pid()), "still draining after the first SIGTERM");
    assert!(!h.is_finished(), "the long request is still running during the drain");
    let t1 = Instant::now();
    d.signal(Signal::SIGTERM);
    let code = d
        .wait_exit(Duration::from_secs(3))
        .await
        .expect("exits after the second SIGTERM");
    let exit_after = t1.elapsed();
    let (r, ended) = tokio::time::timeout(Duration::from_secs(2), h)
        .await
        .expect("answered")
        .unwrap();
    println!(
        "second SIGTERM: exit {code:?} after {exit_after:?}; request ended after {:?} with {:?}",
        ended.saturating_duration_since(t1),
        r.as_ref().map_err(describe)
    );
    assert_eq!(code, Some(0));
    assert!(exit_after < Duration::from_millis(1200), "exit took {exit_after:?}");
    assert_shutting_down(&r);
    let s = client.stats();
    assert_eq!(
        (s.streams_opened, s.in_flight),
        (s.streams_closed, 0),
        "client stats {s:?}"
    );
    wait_no_stray_workers(&pids, Duration::from_secs(3))
        .await
        .expect("workers gone");
}

/// Streams opened so far on `d` (its own admin).
async fn opened(d: &Dispatcher) -> u64 {
    d.status().await.unwrap()["streams"]["opened"].as_u64().unwrap()
}

/// Test 3: zero-downtime restart, twice (A → B → C), under 24 tasks of non-idempotent
/// point selects and inserts: no client-visible error at all, every insert exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_downtime_restart_twice() {
    let Cluster { dispatcher, sandbox } = Cluster::start("[pool]\nsize = 4\n[timeouts]\ndrain_timeout_ms = 10000\n")
        .await
        .expect("cluster");
    let mut db = sandbox.primary().conn().await.unwrap();
    db.query_drop(
        "CREATE TABLE zt (id BIGINT AUTO_INCREMENT PRIMARY KEY, token VARCHAR(64) NOT NULL, KEY (token)) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    db.query_drop("INSERT INTO zt (token) SELECT CONCAT('seed-', seq) FROM seq_1_to_100")
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(dispatcher.client().await.unwrap());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let log: Log = Default::default();
    let handles = spawn_load(&clients, 24, &stop, &log, |t, i| {
        if i % 3 == 0 {
            let token = format!("zt-{t}-{i}");
            let req = Request::sql("INSERT INTO zt (token) VALUES (?)").with_params(vec![Value::Text(token.clone())]);
            ("insert", req, Some(token))
        } else {
            (
                "point",
                Request::sql("SELECT id, token FROM zt WHERE id = ?")
                    .with_params(vec![Value::Int((i % 100 + 1) as i64)]),
                None,
            )
        }
    });
    let mut current = dispatcher;
    let mut old_pids = Vec::new();
    let mut switches = Vec::new();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for round in 1..=2 {
        let t_start = Instant::now();
        let next = current.start_beside().await.expect("new dispatcher beside the old one");
        let ready = t_start.elapsed();
        let served_before = opened(&next).await;
        let pids = worker_pids(&current).await;
        let t_term = Instant::now();
        current.signal(Signal::SIGTERM);
        let code = current
            .wait_exit(Duration::from_secs(15))
            .await
            .expect("old dispatcher exits");
        let drained = t_term.elapsed();
        assert_eq!(code, Some(0), "round {round}: old dispatcher's exit code");
        wait_no_stray_workers(&pids, Duration::from_secs(3))
            .await
            .expect("old workers gone");
        old_pids.extend(pids);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let served = opened(&next).await - served_before;
        println!("round {round}: new dispatcher ready in {ready:?}, old one drained and exited 0 in {drained:?}, new one served {served} requests in 1.5 s since");
        assert!(served > 0, "round {round}: requests continue on the new dispatcher");
        switches.push((ready, drained, served));
        current = next;
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    let records = log.lock().unwrap().clone();
    let t = tally(&records);
    let stats: Vec<_> = clients.iter().map(Client::stats).collect();
    println!(
        "zero-downtime restart x2: {} requests; tally {t:?}; client stats {stats:?}",
        records.len()
    );
    let errors: Vec<String> = records
        .iter()
        .filter_map(|r| r.result.as_ref().err())
        .map(describe)
        .collect();
    assert!(
        errors.is_empty(),
        "{} client-visible errors across the switch: {:?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
    for s in &stats {
        assert!(s.reconnects >= 2, "each client moved twice: {s:?}");
    }
    // Every acknowledged insert is in the table exactly once, and nothing else is.
    let rows: Vec<(String, u64)> = db
        .query("SELECT token, COUNT(*) FROM zt WHERE token LIKE 'zt-%' GROUP BY token")
        .await
        .unwrap();
    let in_db: HashMap<String, u64> = rows.into_iter().collect();
    let inserted: Vec<&String> = records
        .iter()
        .filter(|r| r.result.is_ok())
        .filter_map(|r| r.token.as_ref())
        .collect();
    for tok in &inserted {
        assert_eq!(in_db.get(*tok).copied(), Some(1), "insert {tok}");
    }
    assert_eq!(in_db.len(), inserted.len(), "no row without an acknowledged insert");
    current
        .wait_closed_loop(&clients.iter().collect::<Vec<_>>(), Duration::from_secs(10))
        .await
        .expect("closed loop");
    current
        .wait_idle(4, Duration::from_secs(10))
        .await
        .expect("every slot idle");
    wait_no_stray_workers(&old_pids, Duration::from_secs(3))
        .await
        .expect("no stray workers");
}

/// Test 4: the dispatcher is killed with SIGKILL and a new one is started on the same
/// ports. In-flight non-idempotent requests end `OUTCOME_UNKNOWN` (origin client), the
/// idempotent one is resent and succeeds on the new dispatcher, requests queued in the
/// SDK (never written) succeed, new requests work without restarting the application,
/// and the old workers died with their parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_reconnects_after_dispatcher_sigkill() {
    let Cluster {
        mut dispatcher,
        sandbox: _sandbox,
    } = Cluster::start("[pool]\nsize = 2\nmax_per_connection = 0\n[limits]\nmax_streams_per_connection = 2\n")
        .await
        .expect("cluster");
    let a = &mut dispatcher;
    let mut cfg: ClientConfig = a.client_config();
    cfg.connection_wait = Duration::from_secs(30);
    cfg.backoff_max = Duration::from_millis(300);
    let client = Client::connect(cfg).await.unwrap();
    let c1 = client.clone();
    let non_idempotent = tokio::spawn(async move { c1.send(Request::sql("SELECT SLEEP(3), 1")).await });
    let c2 = client.clone();
    let idempotent =
        tokio::spawn(async move { c2.send(Request::sql("SELECT SLEEP(1), 2").with_idempotent(true)).await });
    wait_for(Duration::from_secs(5), "two busy slots", || async {
        let s = a.status().await.ok()?;
        (s["pool"]["busy"].as_u64()? == 2).then_some(())
    })
    .await
    .unwrap();
    // Two more, non-idempotent: max_streams is 2, so they wait in the SDK, unsent.
    let queued: Vec<_> = (3..5)
        .map(|v| {
            let c = client.clone();
            tokio::spawn(async move { c.send(Request::sql("SELECT ?").with_params(vec![Value::Int(v)])).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        client.stats().in_flight,
        2,
        "only two streams written: {:?}",
        client.stats()
    );
    let pids = worker_pids(a).await;

    a.kill_hard().await.expect("SIGKILL");
    let t_kill = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(5), non_idempotent)
        .await
        .expect("answered at once")
        .unwrap()
        .expect_err("the in-flight non-idempotent request cannot know its outcome");
    assert_eq!(e.code(), ErrorCode::OutcomeUnknown, "{}", describe(&e));
    assert_eq!(e.origin(), Origin::Client, "{}", describe(&e));
    assert!(e.dispatched(), "{}", describe(&e));
    // The workers died with their parent (parent-death signal).
    wait_no_stray_workers(&pids, Duration::from_secs(3))
        .await
        .expect("old workers died with the dispatcher");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !idempotent.is_finished(),
        "the idempotent request waits for a dispatcher"
    );
    assert!(
        queued.iter().all(|q| !q.is_finished()),
        "the queued requests wait for a dispatcher"
    );

    let b = a.restart_same().await.expect("new dispatcher on the same ports");
    println!("new dispatcher up {:?} after the SIGKILL", t_kill.elapsed());
    let r = tokio::time::timeout(Duration::from_secs(10), idempotent)
        .await
        .expect("answered")
        .unwrap();
    let r = r.unwrap_or_else(|e| panic!("idempotent request: {}", describe(&e)));
    assert_eq!(r.rows()[0].get::<i64>(1).unwrap(), 2);
    for (q, v) in queued.into_iter().zip(3..) {
        let r = tokio::time::timeout(Duration::from_secs(10), q)
            .await
            .expect("answered")
            .unwrap();
        let r = r.unwrap_or_else(|e| panic!("queued request: {}", describe(&e)));
        assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), v);
    }
    let r: Option<(i64,)> = client
        .query_first("SELECT 5", &[])
        .await
        .expect("new request after reconnect");
    assert_eq!(r, Some((5,)));
    let s = client.stats();
    println!("after reconnect: client stats {s:?}");
    assert!(s.reconnects >= 1 && s.retries >= 1, "{s:?}");
    b.wait_closed_loop(&[&client], Duration::from_secs(10))
        .await
        .expect("closed loop");
    b.wait_idle(2, Duration::from_secs(10)).await.expect("slots idle");
    wait_no_stray_workers(&pids, Duration::from_secs(1))
        .await
        .expect("no stray workers");
}

/// Sessions at SIGTERM (issue 22): a transaction open at the signal may go on until
/// `drain_timeout` (its statements are still taken after GOAWAY) and commits; one still
/// open at the deadline is aborted (SESSION_ABORTED, rolled back) and its write is not
/// there; the dispatcher then exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_open_transactions_finish_until_its_deadline() {
    let Cluster {
        mut dispatcher,
        sandbox,
    } = Cluster::start("[pool]\nsize = 4\n[timeouts]\ndrain_timeout_ms = 1500\n")
        .await
        .expect("cluster");
    let d = &mut dispatcher;
    let client = d.client().await.unwrap();
    client
        .execute("CREATE TABLE drain_tx (id INT PRIMARY KEY) ENGINE=InnoDB", &[])
        .await
        .unwrap();
    let finishing = client.transaction().await.unwrap();
    let lingering = client.transaction().await.unwrap();
    finishing.execute("INSERT INTO drain_tx VALUES (1)", &[]).await.unwrap();
    lingering.execute("INSERT INTO drain_tx VALUES (2)", &[]).await.unwrap();
    let t0 = Instant::now();
    d.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // After GOAWAY: the open transaction goes on and commits.
    finishing
        .execute("INSERT INTO drain_tx VALUES (3)", &[])
        .await
        .unwrap_or_else(|e| panic!("a statement of an open session during the drain: {}", describe(&e)));
    finishing
        .commit()
        .await
        .unwrap_or_else(|e| panic!("commit during the drain: {}", describe(&e)));
    // The other is still open at the deadline: aborted, rolled back.
    let ended = wait_for(Duration::from_secs(5), "the lingering session's abort", || async {
        lingering.session().aborted()
    })
    .await
    .unwrap();
    assert_eq!(ended.code(), ErrorCode::SessionAborted, "{}", describe(&ended));
    assert_eq!(
        ended.transaction_outcome(),
        Some(osprey_client::TransactionOutcome::RolledBack),
        "{}",
        describe(&ended)
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(1400),
        "not before drain_timeout: {:?}",
        t0.elapsed()
    );
    drop(lingering);
    let code = d.wait_exit(Duration::from_secs(10)).await.expect("exits");
    assert_eq!(code, Some(0));
    let mut conn = sandbox.primary().conn().await.unwrap();
    let ids: Vec<i64> = conn.query("SELECT id FROM drain_tx ORDER BY id").await.unwrap();
    assert_eq!(
        ids,
        vec![1, 3],
        "the finished transaction is there, the aborted one is not"
    );
}

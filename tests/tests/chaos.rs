//! Chaos under steady load (test 5), and the long soak (ignored; `scripts/soak.sh`).
//!
//! Real processes throughout: a MariaDB sandbox, the real dispatcher and workers, SDK
//! clients reaching the dispatcher through [`FaultProxy`]s.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use osprey_client::{Client, ClientConfig, Error, ErrorCode, Request, RequestExt, Value};
use osprey_tests::fault_proxy::{FaultProxy, Mode};
use osprey_tests::harness::{rss_kib, wait_for, wait_no_stray_workers, workers_of, Cluster, Dispatcher};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

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

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Soak: steady load with recycling (`max_requests = 200`) for `OSPREY_SOAK_SECS`
/// (default 300), sampling the RSS of the dispatcher and its workers every
/// `OSPREY_SOAK_SAMPLE_SECS` (default 10). Prints the samples and whether memory stayed
/// flat (mean of the first quarter vs the last quarter, warm-up sample excluded).
/// Run it with `scripts/soak.sh DURATION [SAMPLE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run with scripts/soak.sh"]
async fn soak() {
    let secs = env_secs("OSPREY_SOAK_SECS", 300);
    let every = env_secs("OSPREY_SOAK_SAMPLE_SECS", 10).max(1);
    let tasks = env_secs("OSPREY_SOAK_TASKS", 8) as usize;
    let c = Cluster::start("[pool]\nsize = 4\nmax_requests = 200\n")
        .await
        .expect("cluster");
    let d = &c.dispatcher;
    let mut db = c.sandbox.primary().conn().await.unwrap();
    db.query_drop("CREATE TABLE soak (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64)) ENGINE=InnoDB")
        .await
        .unwrap();
    db.query_drop("INSERT INTO soak (v) SELECT CONCAT('row-', seq) FROM seq_1_to_1000")
        .await
        .unwrap();
    let client = d.client().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (client, stop, ok, errors) = (client.clone(), stop.clone(), ok.clone(), errors.clone());
        handles.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let r = match i % 10 {
                    0 | 1 => client
                        .execute("INSERT INTO soak (v) VALUES (?)", &[Value::Text(format!("t{t}-{i}"))])
                        .await
                        .map(|_| ()),
                    2 => client.query("SELECT SLEEP(0.01)", &[]).await.map(|_| ()),
                    _ => client
                        .query(
                            "SELECT id, v FROM soak WHERE id = ?",
                            &[Value::Int((i % 1000 + 1) as i64)],
                        )
                        .await
                        .map(|_| ()),
                };
                match r {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        errors.lock().unwrap().push(describe(&e));
                        0
                    }
                };
            }
        }));
    }
    println!("soak: {secs} s, {tasks} tasks, pool 4, max_requests 200, sample every {every} s");
    println!(
        "{:>6} {:>10} {:>14} {:>8} {:>14} {:>10} {:>9}",
        "t_s", "requests", "dispatcher_kib", "workers", "worker_avg_kib", "recycles", "errors"
    );
    let started = Instant::now();
    let mut samples: Vec<(f64, f64, f64)> = Vec::new(); // (t, dispatcher, worker avg)
    let mut next = started;
    while started.elapsed() < Duration::from_secs(secs) {
        next += Duration::from_secs(every);
        tokio::time::sleep_until(next.into()).await;
        let drss = rss_kib(d.pid()).unwrap_or(0) as f64;
        let ws: Vec<u64> = workers_of(d.pid())
            .into_iter()
            .filter_map(|p| rss_kib(p).ok())
            .collect();
        let wavg = mean(&ws.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let recycles = d
            .status()
            .await
            .map(|s| s["pool"]["recycles"].as_u64().unwrap_or(0))
            .unwrap_or(0);
        println!(
            "{:>6.0} {:>10} {:>14.0} {:>8} {:>14.0} {:>10} {:>9}",
            started.elapsed().as_secs_f64(),
            ok.load(Ordering::Relaxed),
            drss,
            ws.len(),
            wavg,
            recycles,
            errors.lock().unwrap().len()
        );
        samples.push((started.elapsed().as_secs_f64(), drss, wavg));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    let status = d
        .wait_closed_loop(&[&client], Duration::from_secs(10))
        .await
        .expect("closed loop");
    let total = ok.load(Ordering::Relaxed);
    let errors = errors.lock().unwrap().clone();
    // Memory: first quarter vs last quarter (the first sample is warm-up).
    let body = if samples.len() > 4 { &samples[1..] } else { &samples[..] };
    let q = (body.len() / 4).max(1);
    let (first, last) = (&body[..q], &body[body.len() - q..]);
    let d_first = mean(&first.iter().map(|s| s.1).collect::<Vec<_>>());
    let d_last = mean(&last.iter().map(|s| s.1).collect::<Vec<_>>());
    let w_first = mean(&first.iter().map(|s| s.2).collect::<Vec<_>>());
    let w_last = mean(&last.iter().map(|s| s.2).collect::<Vec<_>>());
    // Flat: grew by less than 10 % + 2 MiB (allocator noise).
    let flat = |a: f64, b: f64| b <= a * 1.10 + 2048.0;
    println!(
        "soak result: {total} requests in {:.0} s ({:.0}/s), {} errors, recycles {}, respawns {}, streams {}/{}",
        started.elapsed().as_secs_f64(),
        total as f64 / started.elapsed().as_secs_f64(),
        errors.len(),
        status["pool"]["recycles"],
        status["pool"]["respawns"],
        status["streams"]["opened"],
        status["streams"]["closed"],
    );
    println!(
        "dispatcher RSS first quarter {d_first:.0} KiB, last quarter {d_last:.0} KiB ({:+.1} %): {}",
        (d_last / d_first - 1.0) * 100.0,
        if flat(d_first, d_last) { "FLAT" } else { "GROWING" }
    );
    println!(
        "worker RSS (mean per worker) first quarter {w_first:.0} KiB, last quarter {w_last:.0} KiB ({:+.1} %): {}",
        (w_last / w_first - 1.0) * 100.0,
        if flat(w_first, w_last) { "FLAT" } else { "GROWING" }
    );
    assert!(
        errors.is_empty(),
        "errors under steady load: {:?}",
        &errors[..errors.len().min(10)]
    );
    assert!(flat(d_first, d_last), "dispatcher memory grew");
    assert!(flat(w_first, w_last), "worker memory grew");
    let pids = workers_of(d.pid());
    drop(c);
    wait_no_stray_workers(&pids, Duration::from_secs(5)).await.unwrap();
}

/// How long after an injected fault ended its effects may still show up as errors (keepalive
/// timeout 1.5 s, reconnect back-off, a respawned worker's first request).
const GRACE: Duration = Duration::from_secs(3);

/// Error codes the chaos scenario may legitimately produce (docs/PROTOCOL.md, section 8).
const DOCUMENTED: &[ErrorCode] = &[
    ErrorCode::OutcomeUnknown,
    ErrorCode::WorkerLost,
    ErrorCode::DatabaseFatal,
    ErrorCode::Cancelled,
    ErrorCode::RequestTimeout,
    ErrorCode::ShuttingDown,
];

#[derive(Debug, Clone)]
enum Outcome {
    Ok,
    Err(Error),
    /// The task gave up on it (timeout-cancel: the future was dropped mid-flight).
    Dropped,
}

#[derive(Debug, Clone)]
struct Record {
    start: Instant,
    end: Instant,
    what: &'static str,
    token: Option<String>,
    outcome: Outcome,
}

#[derive(Debug, Clone)]
struct Fault {
    kind: &'static str,
    start: Instant,
    end: Instant,
    detail: String,
}

/// One load task: a seeded mix of point selects (half of them idempotent), inserts with a
/// unique token, short sleeps, and requests it drops mid-flight after a random timeout.
async fn load_task(
    t: usize,
    client: Client,
    seed: u64,
    stop: Arc<AtomicBool>,
    issued: Arc<AtomicU64>,
    log: Arc<Mutex<Vec<Record>>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let token = format!("c-{t}-{i}");
        let p: f64 = rng.random();
        let (what, req, tok, drop_after) = if p < 0.40 {
            let req = Request::sql("SELECT id, token FROM ch WHERE id = ?")
                .with_params(vec![Value::Int(rng.random_range(1..=200))])
                .with_idempotent(rng.random_bool(0.5));
            ("point", req, None, None)
        } else if p < 0.78 {
            let req = Request::sql("INSERT INTO ch (token) VALUES (?)").with_params(vec![Value::Text(token.clone())]);
            ("insert", req, Some(token), None)
        } else if p < 0.92 {
            ("sleep", Request::sql("SELECT SLEEP(0.05)"), None, None)
        } else if p < 0.96 {
            let after = Duration::from_millis(rng.random_range(10..300));
            ("cancel-sleep", Request::sql("SELECT SLEEP(0.5)"), None, Some(after))
        } else {
            // Inserts after a sleep: dropped during the sleep it must not appear, after it
            // it may; either way at most once.
            let after = Duration::from_millis(rng.random_range(10..400));
            let req = Request::sql("INSERT INTO ch (token) SELECT ? FROM DUAL WHERE SLEEP(0.2) = 0")
                .with_params(vec![Value::Text(token.clone())]);
            ("cancel-insert", req, Some(token), Some(after))
        };
        issued.fetch_add(1, Ordering::SeqCst);
        let start = Instant::now();
        let call = client.send(req);
        let outcome = match drop_after {
            Some(after) => match tokio::time::timeout(after, call).await {
                Ok(Ok(_)) => Outcome::Ok,
                Ok(Err(e)) => Outcome::Err(e),
                Err(_) => Outcome::Dropped,
            },
            // Far above anything legitimate: a hang is a lost outcome, a failure.
            None => match tokio::time::timeout(Duration::from_secs(60), call).await {
                Ok(Ok(_)) => Outcome::Ok,
                Ok(Err(e)) => Outcome::Err(e),
                Err(_) => panic!("request {what} {tok:?} hung for 60 s: its outcome was lost"),
            },
        };
        log.lock().unwrap().push(Record {
            start,
            end: Instant::now(),
            what,
            token: tok,
            outcome,
        });
    }
}

fn pids_and_db_ids(status: &serde_json::Value) -> Vec<(u64, Option<u32>, Option<u64>)> {
    status["slots"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["slot"].as_u64().unwrap_or(0),
                        s["pid"].as_u64().map(|p| p as u32),
                        s["db_connection_id"].as_u64(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn all_worker_pids(d: &Dispatcher) -> Vec<u32> {
    let mut pids: Vec<u32> = d
        .worker_pids()
        .await
        .map(|v| v.into_iter().filter_map(|(_, p)| p).collect())
        .unwrap_or_default();
    pids.extend(d.worker_children());
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Test 5: chaos. 64 tasks over 4 SDK clients, each client reaching the dispatcher through
/// its own FaultProxy, for `OSPREY_CHAOS_SECS` (default 60) while, at random (seeded:
/// `OSPREY_CHAOS_SEED`, printed), workers are SIGKILLed, proxies are blackholed or flapped
/// (longer than the keepalive timeout), workers' database sessions are killed
/// (`KILL <id>`), and the dispatcher is restarted twice without downtime. Tasks also drop
/// some requests mid-flight. Then: every request has exactly one outcome, errors only
/// with documented codes and only near a fault, inserts exactly once (or at most once when
/// the outcome is unknown, never when undispatched), the loop closed everywhere, slots
/// idle, no stray process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    let secs = env_secs("OSPREY_CHAOS_SECS", 60);
    let seed = std::env::var("OSPREY_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("chaos: {secs} s, seed {seed} (OSPREY_CHAOS_SEED={seed} to replay the schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let pool_size = 6;
    let overrides = format!(
        "[pool]\nsize = {pool_size}\nqueue_timeout_ms = 10000\nrespawn_backoff_max_ms = 1000\n\
         [timeouts]\nkeepalive_interval_ms = 300\nkeepalive_timeout_ms = 1500\ndrain_timeout_ms = 5000\n\
         request_timeout_ms = 10000\ncancel_grace_ms = 1000\n"
    );
    let Cluster { dispatcher, sandbox } = Cluster::start(&overrides).await.expect("cluster");
    let mut db = sandbox.primary().conn().await.unwrap();
    db.query_drop(
        "CREATE TABLE ch (id BIGINT AUTO_INCREMENT PRIMARY KEY, token VARCHAR(64) NOT NULL, KEY (token)) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    db.query_drop("INSERT INTO ch (token) SELECT CONCAT('seed-', seq) FROM seq_1_to_200")
        .await
        .unwrap();

    let mut proxies = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let proxy = FaultProxy::start(dispatcher.client_addr).await.unwrap();
        let mut cfg = ClientConfig::new(proxy.addr().to_string(), dispatcher.client_token.clone());
        cfg.keepalive_interval = Duration::from_millis(300);
        cfg.keepalive_timeout = Duration::from_millis(1500);
        cfg.connect_timeout = Duration::from_secs(1);
        cfg.connection_wait = Duration::from_secs(30);
        cfg.backoff_max = Duration::from_millis(500);
        clients.push(Client::connect(cfg).await.unwrap());
        proxies.push(proxy);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicU64::new(0));
    let log = Arc::new(Mutex::new(Vec::<Record>::new()));
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            tokio::spawn(load_task(
                t,
                clients[t % clients.len()].clone(),
                seed,
                stop.clone(),
                issued.clone(),
                log.clone(),
            ))
        })
        .collect();

    let started = Instant::now();
    let total = Duration::from_secs(secs);
    let restarts_at = [total / 3, total * 2 / 3];
    let mut restarts_done = 0;
    let mut current = dispatcher;
    let mut dead_pids: Vec<u32> = Vec::new();
    let mut faults: Vec<Fault> = Vec::new();
    while started.elapsed() < total {
        tokio::time::sleep(Duration::from_millis(rng.random_range(700..1800))).await;
        if started.elapsed() >= total {
            break;
        }
        let t = Instant::now();
        if restarts_done < restarts_at.len() && started.elapsed() >= restarts_at[restarts_done] {
            restarts_done += 1;
            let next = current.start_beside().await.expect("new dispatcher beside the old one");
            dead_pids.extend(all_worker_pids(&current).await);
            let old_pid = current.pid();
            current.signal(Signal::SIGTERM);
            let code = current
                .wait_exit(Duration::from_secs(15))
                .await
                .expect("old dispatcher exits");
            assert_eq!(code, Some(0), "restart {restarts_done}: old dispatcher's exit code");
            faults.push(Fault {
                kind: "restart",
                start: t,
                end: Instant::now(),
                detail: format!("dispatcher pid {old_pid} -> {}", next.pid()),
            });
            current = next;
            continue;
        }
        let status = match current.status().await {
            Ok(s) => s,
            Err(_) => continue,
        };
        let slots = pids_and_db_ids(&status);
        match rng.random_range(0..4) {
            0 => {
                let live: Vec<_> = slots.iter().filter_map(|s| s.1).collect();
                if live.is_empty() {
                    continue;
                }
                let pid = live[rng.random_range(0..live.len())];
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                dead_pids.push(pid);
                faults.push(Fault {
                    kind: "worker_sigkill",
                    start: t,
                    end: Instant::now(),
                    detail: format!("pid {pid}"),
                });
            }
            1 => {
                let i = rng.random_range(0..proxies.len());
                let len = Duration::from_millis(rng.random_range(2500..3500));
                proxies[i].set_mode(Mode::Blackhole);
                tokio::time::sleep(len).await;
                proxies[i].set_mode(Mode::Pass);
                faults.push(Fault {
                    kind: "blackhole",
                    start: t,
                    end: Instant::now(),
                    detail: format!("proxy {i} for {len:?}"),
                });
            }
            2 => {
                // Blackhole phases longer than the keepalive timeout: with this proxy the
                // bytes dropped during a blackhole are lost for good, which real TCP never
                // does, so a shorter blackhole would corrupt a live connection. End inside
                // a pass phase for the same reason.
                let i = rng.random_range(0..proxies.len());
                let pass = Duration::from_millis(rng.random_range(300..800));
                let blackhole = Duration::from_millis(2500);
                let periods = rng.random_range(1..=2u32);
                let t_set = Instant::now();
                proxies[i].set_mode(Mode::Flap { pass, blackhole });
                tokio::time::sleep_until((t_set + (pass + blackhole) * periods + Duration::from_millis(100)).into())
                    .await;
                proxies[i].set_mode(Mode::Pass);
                faults.push(Fault {
                    kind: "flap",
                    start: t,
                    end: Instant::now(),
                    detail: format!("proxy {i}: {periods} x (pass {pass:?}, blackhole {blackhole:?})"),
                });
            }
            _ => {
                let with_db: Vec<_> = slots.iter().filter(|s| s.2.is_some()).collect();
                if with_db.is_empty() {
                    continue;
                }
                let (slot, _, db_id) = *with_db[rng.random_range(0..with_db.len())];
                let db_id = db_id.unwrap();
                let killed = db.query_drop(format!("KILL {db_id}")).await;
                // The fault lasts until the slot has a fresh session.
                let _ = wait_for(Duration::from_secs(10), "the slot's session replaced", || async {
                    let s = current.status().await.ok()?;
                    let now = pids_and_db_ids(&s).into_iter().find(|x| x.0 == slot)?;
                    (now.2.is_some() && now.2 != Some(db_id)).then_some(())
                })
                .await;
                faults.push(Fault {
                    kind: "db_kill",
                    start: t,
                    end: Instant::now(),
                    detail: format!("slot {slot} session {db_id}: {killed:?}"),
                });
            }
        }
    }
    let load_secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for h in tasks {
        h.await.expect("load task");
    }
    for p in &proxies {
        assert_eq!(p.mode(), Mode::Pass);
    }
    let records = log.lock().unwrap().clone();

    // Tally.
    let mut by_code: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_fault: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &faults {
        *by_fault.entry(f.kind).or_default() += 1;
    }
    let (mut ok, mut dropped) = (0, 0);
    for r in &records {
        match &r.outcome {
            Outcome::Ok => ok += 1,
            Outcome::Dropped => dropped += 1,
            Outcome::Err(e) => {
                *by_code
                    .entry(format!("{} dispatched={}", e.code().as_str(), e.dispatched()))
                    .or_default() += 1
            }
        }
    }
    println!(
        "chaos tally: {} requests in {load_secs:.1} s, {ok} ok, {dropped} dropped by the caller, errors {by_code:?}",
        records.len()
    );
    println!("faults injected: {by_fault:?}");
    for f in &faults {
        println!(
            "  {:>6.2}s..{:>6.2}s {:<15} {}",
            (f.start - started).as_secs_f64(),
            (f.end - started).as_secs_f64(),
            f.kind,
            f.detail
        );
    }
    let stats: Vec<_> = clients.iter().map(Client::stats).collect();
    println!("client stats {stats:?}");

    // Exactly one outcome per request issued.
    assert_eq!(
        records.len() as u64,
        issued.load(Ordering::SeqCst),
        "requests issued vs outcomes"
    );
    assert!(ok > records.len() / 2, "the load mostly succeeded");
    // Errors: documented codes only, and only near a fault.
    let near_fault = |r: &Record| faults.iter().any(|f| r.start <= f.end + GRACE && r.end >= f.start);
    let mut unexplained = Vec::new();
    for r in &records {
        if let Outcome::Err(e) = &r.outcome {
            assert!(
                DOCUMENTED.contains(&e.code()),
                "undocumented error for {}: {}",
                r.what,
                describe(e)
            );
            if !near_fault(r) {
                unexplained.push(format!(
                    "{} at {:.2}s..{:.2}s: {}",
                    r.what,
                    (r.start - started).as_secs_f64(),
                    (r.end - started).as_secs_f64(),
                    describe(e)
                ));
            }
        }
    }
    assert!(unexplained.is_empty(), "errors during quiet periods: {unexplained:#?}");

    // Inserts: exactly once when acknowledged, never when provably undispatched, at most
    // once otherwise; and no row that no request asked for.
    let rows: Vec<(String, u64)> = db
        .query("SELECT token, COUNT(*) FROM ch WHERE token LIKE 'c-%' GROUP BY token")
        .await
        .unwrap();
    let in_db: HashMap<String, u64> = rows.into_iter().collect();
    let mut tokens = HashMap::new();
    let mut unknown_applied = 0;
    for r in records.iter().filter(|r| r.token.is_some()) {
        let tok = r.token.clone().unwrap();
        let n = in_db.get(&tok).copied().unwrap_or(0);
        match &r.outcome {
            Outcome::Ok => assert_eq!(n, 1, "acknowledged insert {tok} ({})", r.what),
            Outcome::Err(e) if !e.dispatched() => assert_eq!(n, 0, "undispatched insert {tok}: {}", describe(e)),
            Outcome::Err(e) => {
                assert!(n <= 1, "insert {tok} applied {n} times: {}", describe(e));
                unknown_applied += n;
            }
            Outcome::Dropped => assert!(n <= 1, "dropped insert {tok} applied {n} times"),
        }
        tokens.insert(tok, ());
    }
    for tok in in_db.keys() {
        assert!(tokens.contains_key(tok), "row {tok} was never inserted by a request");
    }
    println!(
        "inserts: {} rows, {unknown_applied} of them from requests whose outcome was an error",
        in_db.len()
    );

    // The closed loop, on the clients and on the last dispatcher; every slot idle.
    let status = current
        .wait_closed_loop(&clients.iter().collect::<Vec<_>>(), Duration::from_secs(15))
        .await
        .expect("closed loop");
    current
        .wait_idle(pool_size, Duration::from_secs(15))
        .await
        .expect("every slot idle");
    println!(
        "last dispatcher: streams {}/{}, pool {}",
        status["streams"]["opened"], status["streams"]["closed"], status["pool"]
    );
    for s in &stats {
        assert!(
            s.reconnects >= 2,
            "every client moved at least across the two restarts: {s:?}"
        );
    }
    wait_no_stray_workers(&dead_pids, Duration::from_secs(5))
        .await
        .expect("no stray workers");
    drop(proxies);
}

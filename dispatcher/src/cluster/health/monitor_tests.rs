//! The monitor against real MariaDB (`osprey-sandbox`): kill -9, SIGSTOP/SIGCONT, a
//! failing business statement, passive reports, and its CPU cost.

use super::*;
use osprey_sandbox::{Instance, Sandbox};

fn target(instance: &Instance) -> MonitorTarget {
    MonitorTarget {
        cluster: "c1".into(),
        member: instance.name().into(),
        host: instance.host().into(),
        port: instance.port(),
        user: instance.user().into(),
        password: instance.password().into(),
        tls: Default::default(),
    }
}

fn fast() -> HealthConfig {
    HealthConfig {
        interval_ms: 100,
        window_ms: 1_000,
        fail_threshold: 3,
        recover_successes: 3,
        ..HealthConfig::default()
    }
}

struct Running {
    handle: MonitorHandle,
    health: watch::Receiver<MemberHealth>,
    cfg: watch::Sender<HealthConfig>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

fn start(instance: &Instance, cfg: HealthConfig) -> Running {
    let (cfg_tx, cfg_rx) = watch::channel(cfg);
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let handle = spawn_monitor(target(instance), cfg_rx, metrics.clone(), stop.clone());
    Running {
        health: handle.health(),
        handle,
        cfg: cfg_tx,
        metrics,
        stop,
    }
}

/// Waits (bounded) until the published health satisfies `pred`; returns it.
async fn wait_for(
    rx: &mut watch::Receiver<MemberHealth>,
    within: Duration,
    what: &str,
    pred: impl Fn(&MemberHealth) -> bool,
) -> MemberHealth {
    let deadline = Instant::now() + within;
    loop {
        {
            let h = rx.borrow_and_update();
            if pred(&h) {
                return h.clone();
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("monitor gone while waiting for {what}"),
            Err(_) => panic!("{what}: not within {within:?}; last published: {:#?}", *rx.borrow()),
        }
    }
}

fn factor<'a>(h: &'a MemberHealth, name: &str) -> &'a FactorResult {
    h.factors
        .iter()
        .find(|f| f.factor == name)
        .unwrap_or_else(|| panic!("no factor {name} in {h:#?}"))
}

fn metric_line(metrics: &Metrics, prefix: &str) -> Option<String> {
    metrics
        .encode()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_owned)
}

fn metric_value(metrics: &Metrics, prefix: &str) -> Option<f64> {
    metric_line(metrics, prefix)?.rsplit(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_member_goes_up_and_kill_9_marks_it_down() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let cfg = fast();
    let mut m = start(sandbox.primary(), cfg.clone());

    let up = wait_for(&mut m.health, Duration::from_secs(5), "up", |h| {
        h.state == HealthState::Up
    })
    .await;
    assert!(factor(&up, "connect").ok && factor(&up, "ping").ok, "{up:#?}");
    assert!(
        up.factors.iter().all(|f| f.factor != "business"),
        "no business_sql configured"
    );
    assert_eq!((up.fail_threshold, up.window_ms), (3, 1_000));
    assert!(up.since.is_some());
    let gauge = r#"osprey_member_up{cluster="c1",member="primary"}"#;
    assert_eq!(metric_value(&m.metrics, gauge), Some(1.0));

    let killed = Instant::now();
    sandbox.primary().kill();
    let down = wait_for(&mut m.health, Duration::from_secs(5), "down after kill -9", |h| {
        h.state == HealthState::Down
    })
    .await;
    let took = killed.elapsed();
    println!(
        "kill -9 -> down in {} ms (interval {} ms, fail_threshold {}), {} failed rounds",
        took.as_millis(),
        cfg.interval_ms,
        cfg.fail_threshold,
        down.failed_rounds
    );
    // At worst: the round in progress at the kill passes, then fail_threshold failed
    // rounds; the rest is slack for a loaded machine.
    let bound = Duration::from_millis(cfg.interval_ms * (u64::from(cfg.fail_threshold) + 1) + 400);
    assert!(took <= bound, "down after {took:?}, bound {bound:?}");
    assert!(down.failures_in_window >= cfg.fail_threshold, "{down:#?}");
    let connect = factor(&down, "connect");
    assert!(!connect.ok, "{down:#?}");
    assert!(
        connect.error.as_deref().unwrap_or("").contains("refused"),
        "a killed server's port refuses: {connect:?}"
    );
    assert!(!factor(&down, "ping").ok);
    assert_eq!(metric_value(&m.metrics, gauge), Some(0.0));
    let connect_failures = metric_value(
        &m.metrics,
        r#"osprey_probe_failures_total{cluster="c1",member="primary",factor="connect"}"#,
    );
    assert!(
        connect_failures >= Some(f64::from(cfg.fail_threshold)),
        "{connect_failures:?} in {}",
        m.metrics.encode()
    );
    let rounds = metric_value(
        &m.metrics,
        r#"osprey_probe_rounds_total{cluster="c1",member="primary"}"#,
    );
    assert!(rounds >= Some(down.rounds as f64), "{rounds:?} vs {}", down.rounds);

    // Shutdown ends the task: the sender side of the health channel goes away.
    m.stop.cancel();
    tokio::time::timeout(Duration::from_secs(2), async {
        while m.health.changed().await.is_ok() {}
    })
    .await
    .expect("monitor did not stop within 2 s of shutdown");
    assert_eq!(
        metric_line(&m.metrics, gauge),
        None,
        "a stopped monitor leaves no gauge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_times_out_pings_on_schedule_and_sigcont_recovers() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let cfg = fast();
    let mut m = start(sandbox.primary(), cfg.clone());
    wait_for(&mut m.health, Duration::from_secs(5), "up", |h| {
        h.state == HealthState::Up
    })
    .await;

    let stopped = Instant::now();
    sandbox.primary().stop();
    let down = wait_for(&mut m.health, Duration::from_secs(5), "down after SIGSTOP", |h| {
        h.state == HealthState::Down
    })
    .await;
    let took = stopped.elapsed();
    println!("SIGSTOP -> down in {} ms", took.as_millis());
    let bound = Duration::from_millis(cfg.interval_ms * (u64::from(cfg.fail_threshold) + 1) + 400);
    assert!(took <= bound, "down after {took:?}, bound {bound:?}");
    let ping = factor(&down, "ping");
    assert!(
        !ping.ok && ping.error.as_deref().unwrap_or("").contains("timed out"),
        "a hung server times the ping out: {ping:?}"
    );
    // The kernel still completes TCP handshakes into the stopped server's backlog: the
    // connect factor alone cannot see a hung server, which is why the ping exists.
    assert!(factor(&down, "connect").ok, "{down:#?}");

    // Every probe hangs now; rounds must keep to the schedule: neither drift (slower)
    // nor pile up (faster, catching up missed ticks).
    let (r0, t0) = (down.rounds, Instant::now());
    let ten_later = wait_for(&mut m.health, Duration::from_secs(3), "10 more rounds", |h| {
        h.rounds >= r0 + 10
    })
    .await;
    let spent = t0.elapsed();
    // The watch keeps only the latest value: the waiter may see round r0 + 11 first.
    let rounds = ten_later.rounds - r0;
    let per_round = spent / rounds as u32;
    println!("{rounds} rounds against a stopped server took {} ms", spent.as_millis());
    assert!(rounds >= 10);
    assert!(
        per_round >= Duration::from_millis(80) && per_round <= Duration::from_millis(150),
        "{rounds} rounds of 100 ms took {spent:?}: neither drift nor pile-up allowed"
    );
    assert_eq!(ten_later.state, HealthState::Down);

    let continued = Instant::now();
    sandbox.primary().cont();
    let back = wait_for(&mut m.health, Duration::from_secs(5), "up after SIGCONT", |h| {
        h.state == HealthState::Up
    })
    .await;
    let took = continued.elapsed();
    println!(
        "SIGCONT -> up in {} ms ({} consecutive successes needed)",
        took.as_millis(),
        cfg.recover_successes
    );
    assert!(back.consecutive_successes >= cfg.recover_successes, "{back:#?}");
    assert!(factor(&back, "ping").ok && factor(&back, "connect").ok);
    // recover_successes rounds take (recover_successes - 1) intervals at least.
    assert!(
        took >= Duration::from_millis(cfg.interval_ms * u64::from(cfg.recover_successes - 1))
            - Duration::from_millis(20)
    );
    assert!(took <= Duration::from_secs(3), "{took:?}");
    m.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_business_sql_fails_the_business_factor_and_sighup_fixes_it() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let cfg = HealthConfig {
        business_sql: Some("SELECT 1 FROM osprey.no_such_table".into()),
        ..fast()
    };
    let mut m = start(sandbox.primary(), cfg.clone());
    let down = wait_for(&mut m.health, Duration::from_secs(5), "down on business_sql", |h| {
        h.state == HealthState::Down
    })
    .await;
    let business = factor(&down, "business");
    assert!(!business.ok, "{down:#?}");
    let error = business.error.as_deref().unwrap_or("");
    assert!(error.contains("1146") && error.contains("no_such_table"), "{error}");
    // The server answered: the session and the listener are fine.
    assert!(factor(&down, "ping").ok && factor(&down, "connect").ok, "{down:#?}");
    let failures = metric_value(
        &m.metrics,
        r#"osprey_probe_failures_total{cluster="c1",member="primary",factor="business"}"#,
    );
    assert!(failures >= Some(3.0), "{failures:?}");
    assert_eq!(
        metric_value(
            &m.metrics,
            r#"osprey_probe_failures_total{cluster="c1",member="primary",factor="ping"}"#
        ),
        None
    );

    // SIGHUP with a statement that works: back up after recover_successes rounds, and the
    // new threshold shows.
    m.cfg
        .send(HealthConfig {
            business_sql: Some("SELECT 1".into()),
            fail_threshold: 4,
            ..cfg
        })
        .unwrap();
    let up = wait_for(&mut m.health, Duration::from_secs(5), "up after the fix", |h| {
        h.state == HealthState::Up
    })
    .await;
    assert!(factor(&up, "business").ok, "{up:#?}");
    assert_eq!(up.fail_threshold, 4);

    // A new interval takes over the schedule at once.
    m.cfg
        .send(HealthConfig {
            interval_ms: 250,
            window_ms: 2_500,
            ..fast()
        })
        .unwrap();
    let r0 = wait_for(&mut m.health, Duration::from_secs(1), "new settings", |h| {
        h.window_ms == 2_500
    })
    .await
    .rounds;
    let t0 = Instant::now();
    wait_for(&mut m.health, Duration::from_secs(3), "4 rounds at 250 ms", |h| {
        h.rounds >= r0 + 4
    })
    .await;
    let spent = t0.elapsed();
    println!(
        "4 rounds after the interval went to 250 ms took {} ms",
        spent.as_millis()
    );
    assert!(
        spent >= Duration::from_millis(950) && spent <= Duration::from_millis(1_400),
        "{spent:?}"
    );
    m.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_failures_count_at_most_once_per_interval() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let cfg = HealthConfig {
        interval_ms: 500,
        window_ms: 10_000,
        fail_threshold: 5,
        recover_successes: 2,
        ..HealthConfig::default()
    };
    let mut m = start(sandbox.primary(), cfg.clone());
    let up = wait_for(&mut m.health, Duration::from_secs(5), "up", |h| {
        h.state == HealthState::Up
    })
    .await;

    // A pool's worth of workers losing their sessions at once.
    let first = Instant::now();
    for i in 0..100 {
        m.handle.passive_failure(&format!("worker {i}: lost session"));
    }
    let seen = wait_for(&mut m.health, Duration::from_secs(2), "passive failure counted", |h| {
        h.failures_in_window >= 1
    })
    .await;
    assert_eq!(seen.state, HealthState::Suspect);
    assert!(seen.rounds >= up.rounds);
    let passive = factor(&seen, "passive");
    assert!(!passive.ok && passive.error.as_deref().unwrap_or("").contains("lost session"));
    // Reports are handled before the next round, so once a round later every queued
    // report has been seen: still one failure.
    let r = seen.rounds;
    let after = wait_for(&mut m.health, Duration::from_secs(2), "next round", |h| h.rounds > r).await;
    assert_eq!(after.failures_in_window, 1, "{after:#?}");
    let passive_metric = r#"osprey_probe_failures_total{cluster="c1",member="primary",factor="passive"}"#;
    assert_eq!(metric_value(&m.metrics, passive_metric), Some(1.0));

    // Keep reporting: it counts again once an interval has passed, not before.
    let mut rx = m.health.clone();
    let second = loop {
        m.handle.passive_failure("worker 0: connect refused");
        match tokio::time::timeout(Duration::from_millis(50), rx.changed()).await {
            Ok(Ok(())) if rx.borrow().failures_in_window >= 2 => break rx.borrow().clone(),
            _ if first.elapsed() > Duration::from_secs(3) => panic!("second passive failure never counted"),
            _ => {}
        }
    };
    let gap = factor(&second, "passive")
        .at
        .duration_since(passive.at)
        .unwrap_or_default();
    println!(
        "passive failures counted {} ms apart (interval {} ms)",
        gap.as_millis(),
        cfg.interval_ms
    );
    assert!(
        gap >= Duration::from_millis(cfg.interval_ms) - Duration::from_millis(5),
        "{gap:?}"
    );
    assert_eq!(metric_value(&m.metrics, passive_metric), Some(2.0));

    // passive = false (SIGHUP): reports are ignored.
    m.cfg
        .send(HealthConfig {
            passive: false,
            ..cfg.clone()
        })
        .unwrap();
    let r = m.health.borrow().rounds;
    wait_for(
        &mut m.health,
        Duration::from_secs(2),
        "a round under passive=false",
        |h| h.rounds > r,
    )
    .await;
    let deadline = Instant::now() + Duration::from_millis(2 * cfg.interval_ms + 100);
    while Instant::now() < deadline {
        m.handle.passive_failure("ignored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = m.health.borrow().rounds;
    wait_for(
        &mut m.health,
        Duration::from_secs(2),
        "a round after the reports",
        |h| h.rounds > r,
    )
    .await;
    assert_eq!(metric_value(&m.metrics, passive_metric), Some(2.0));
    m.stop.cancel();
}

/// The monitor's cost: CPU of the monitor tasks (on a current-thread runtime, so that
/// `RUSAGE_THREAD` sees them and nothing else) and of the server, per member, at the
/// default interval and at 100 ms. Run with
/// `cargo test -p osprey-dispatcher --lib cluster::health::monitor::tests::cpu -- --ignored --nocapture`.
#[test]
#[ignore = "takes ~25 s; a measurement for docs/BENCHMARKS.md"]
fn cpu_per_member() {
    const MEMBERS: usize = 10;
    const SECONDS: u64 = 10;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sandbox = Sandbox::start(0).await.unwrap();
        let server_pid = sandbox.primary().pid().unwrap();
        for interval_ms in [500u64, 100] {
            let cfg = HealthConfig {
                interval_ms,
                window_ms: interval_ms * 6,
                ..HealthConfig::default()
            };
            let (_cfg_tx, cfg_rx) = watch::channel(cfg);
            let metrics = Arc::new(Metrics::new());
            let stop = CancellationToken::new();
            // MEMBERS monitors of the one server: each does what one member's would.
            let mut handles: Vec<_> = (0..MEMBERS)
                .map(|i| {
                    let mut t = target(sandbox.primary());
                    t.member = format!("m{i}");
                    spawn_monitor(t, cfg_rx.clone(), metrics.clone(), stop.clone()).health()
                })
                .collect();
            for h in &mut handles {
                wait_for(h, Duration::from_secs(5), "up", |h| h.state == HealthState::Up).await;
            }
            let (cpu0, srv0, wall0) = (thread_cpu(), process_cpu(server_pid), Instant::now());
            let rounds0: u64 = handles.iter().map(|h| h.borrow().rounds).sum();
            tokio::time::sleep(Duration::from_secs(SECONDS)).await;
            let (cpu, srv, wall) = (thread_cpu() - cpu0, process_cpu(server_pid) - srv0, wall0.elapsed());
            let rounds: u64 = handles.iter().map(|h| h.borrow().rounds).sum::<u64>() - rounds0;
            let threads = server_threads_connected(sandbox.primary()).await;
            stop.cancel();
            let per_member = |d: Duration| d.as_secs_f64() / wall.as_secs_f64() / MEMBERS as f64 * 100.0;
            println!(
                "interval {interval_ms} ms, {MEMBERS} members, {:.1} s: {rounds} rounds; monitor CPU {:.3} % of a core per member \
                 ({:.1} µs per round); server CPU {:.3} % per member; server Threads_connected {threads} (1 monitor session per member + this query)",
                wall.as_secs_f64(),
                per_member(cpu),
                cpu.as_secs_f64() * 1e6 / rounds as f64,
                per_member(srv),
            );
            for h in &mut handles {
                while h.changed().await.is_ok() {}
            }
        }
    });
}

fn thread_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// utime + stime of a process from /proc (clock ticks of 10 ms).
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

async fn server_threads_connected(instance: &Instance) -> u64 {
    let mut conn = instance.conn().await.unwrap();
    let row: Option<(String, u64)> = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
        .await
        .unwrap();
    let _ = conn.disconnect().await;
    row.map(|r| r.1).unwrap_or(0)
}

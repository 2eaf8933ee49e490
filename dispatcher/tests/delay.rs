//! Replica-delay detection (`cluster::delay`) against real MariaDB replication
//! (`osprey-sandbox`: a primary and two GTID + semi-sync replicas). The topology the
//! provider would publish is a watch each test sets itself, so that these tests exercise
//! the delay probe alone; timing figures are printed (`--nocapture`), asserted only as
//! properties with room for a loaded machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_dispatcher::cluster::delay::{self, DelayError, DelayHandle, DelayView, ProbeStatus};
use osprey_dispatcher::cluster::{ClusterConfig, ClusterStatus, ClusterView, Role};
use osprey_dispatcher::metrics::Metrics;
use osprey_sandbox::{Instance, Sandbox};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const PERIOD_MS: u64 = 200;
const THRESHOLD_MS: u64 = 1_000;
const DEADLINE: Duration = Duration::from_secs(30);
/// Room on top of a bound for a loaded 2-core machine (the figure itself is printed).
const SLACK: Duration = Duration::from_millis(1_500);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "osprey_dispatcher=info".into()),
        )
        .with_test_writer()
        .try_init();
}

fn config(sb: &Sandbox, delay: &str) -> ClusterConfig {
    let p = sb.primary();
    let mut toml = format!(
        "name = \"c1\"\nuser = \"{}\"\npassword = \"{}\"\nmonitor_user = \"{}\"\nmonitor_password = \"{}\"\n{delay}\n",
        p.user(),
        p.password(),
        p.monitor_user(),
        p.monitor_password(),
    );
    for i in sb.instances() {
        toml.push_str(&format!(
            "[[member]]\nname = \"{}\"\nhost = \"{}\"\nport = {}\n",
            i.name(),
            i.host(),
            i.port()
        ));
    }
    let c: ClusterConfig = toml::from_str(&toml).unwrap();
    c.validate().unwrap();
    c
}

fn delay_settings() -> String {
    format!("delay_period_ms = {PERIOD_MS}\ndelay_threshold_ms = {THRESHOLD_MS}\ndelay_database = \"osprey_hb\"")
}

/// The view a replication provider publishes for `primary` and the other members as replicas.
fn topology(cfg: &ClusterConfig, primary: &str) -> ClusterView {
    let mut v = ClusterView::starting(cfg, "replication");
    v.primary = Some(primary.to_owned());
    v.status = ClusterStatus::Ok;
    for m in &mut v.members {
        m.role = if m.name == primary {
            Role::Primary
        } else {
            Role::Replica
        };
    }
    v
}

struct Harness {
    handle: DelayHandle,
    topology: watch::Sender<ClusterView>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    _cfg: watch::Sender<Arc<ClusterConfig>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn start(sb: &Sandbox, source: &str) -> Harness {
    let cfg = config(sb, &delay_settings());
    let (topo_tx, topo_rx) = watch::channel(topology(&cfg, sb.primary().name()));
    let (cfg_tx, cfg_rx) = watch::channel(Arc::new(cfg));
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let handle = delay::spawn(cfg_rx, topo_rx, source.into(), metrics.clone(), shutdown.clone())
        .expect("the three delay settings enable the probe");
    Harness {
        handle,
        topology: topo_tx,
        metrics,
        shutdown,
        _cfg: cfg_tx,
    }
}

impl Harness {
    /// Waits (bounded) until `pred` holds for the view; returns it and the time taken. Polls
    /// as well as waking on each publish: `eligible` also turns false by the clock alone
    /// (a measurement that is no longer fresh), between two publishes.
    async fn wait(&self, what: &str, pred: impl Fn(&DelayView) -> bool) -> (DelayView, Duration) {
        let started = Instant::now();
        let mut rx = self.handle.view.clone();
        loop {
            {
                let v = rx.borrow_and_update();
                if pred(&v) {
                    return (v.clone(), started.elapsed());
                }
            }
            if started.elapsed() > DEADLINE {
                panic!("{what}: not within {DEADLINE:?}; last view: {:#?}", *rx.borrow());
            }
            let _ = tokio::time::timeout(Duration::from_millis(5), rx.changed()).await;
        }
    }

    async fn all_eligible(&self, members: &[&str]) -> Duration {
        self.wait("every replica eligible", |v| members.iter().all(|m| v.eligible(m)))
            .await
            .1
    }

    fn metric_line(&self, name: &str, member: &str) -> Option<String> {
        self.metrics
            .encode()
            .lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("member=\"{member}\"")))
            .map(str::to_owned)
    }
}

async fn admin(i: &Instance, sql: &str) {
    let mut c = i.admin_conn().await.unwrap();
    c.query_drop(sql).await.unwrap();
}

/// Writes on the primary every few ms until dropped: replication has something to apply.
fn write_load(primary: &Instance) -> tokio::task::JoinHandle<()> {
    let opts = primary.opts();
    tokio::spawn(async move {
        let mut c = mysql_async::Conn::new(opts).await.unwrap();
        c.query_drop("CREATE TABLE IF NOT EXISTS load_t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
            .await
            .unwrap();
        loop {
            if c.query_drop("INSERT INTO load_t (v) VALUES (1)").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

/// Sessions of the monitor account on `i` other than the one asking: the probe's.
async fn probe_sessions(i: &Instance) -> i64 {
    let mut c = i.admin_conn().await.unwrap();
    c.exec_first(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ? AND ID <> CONNECTION_ID()",
        (i.monitor_user(),),
    )
    .await
    .unwrap()
    .unwrap()
}

/// Waits (bounded) until the probe holds exactly one session on `i`.
async fn one_probe_session(i: &Instance) {
    let started = Instant::now();
    loop {
        let n = probe_sessions(i).await;
        if n == 1 {
            return;
        }
        assert!(started.elapsed() < DEADLINE, "{} probe sessions on {}", n, i.name());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn names(sb: &Sandbox) -> (String, String) {
    (sb.replicas()[0].name().to_owned(), sb.replicas()[1].name().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_leaves_the_read_pool_and_rejoins() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    let (r1, r2) = names(&sb);
    let h = start(&sb, "test-lag");
    let ready = h.all_eligible(&[&r1, &r2]).await;
    println!("both replicas eligible {} ms after start", ready.as_millis());
    let v = h.handle.view.borrow().clone();
    assert_eq!(v.primary.status, ProbeStatus::Ok, "{v:#?}");
    assert_eq!(v.primary.name.as_deref(), Some(sb.primary().name()));
    for r in &v.replicas {
        assert_eq!(r.delay_ms, Some(0), "a replica that keeps up shows no delay: {r:?}");
        assert!(r.gtid_applied.as_deref().is_some_and(|g| !g.is_empty()), "{r:?}");
        assert!(r.connection_id.is_some() && r.last_active.is_some(), "{r:?}");
        assert_eq!(h.handle.view.borrow().applied(&r.name), r.gtid_applied.as_deref());
    }

    let load = write_load(sb.primary());
    admin(&sb.replicas()[0], "STOP SLAVE SQL_THREAD").await;
    let stopped = Instant::now();
    // The other replica stays in the pool: counted over every published view (a round
    // starved on a loaded machine may time out and take it out for a period, no more).
    let watch_other = {
        let rx = h.handle.view.clone();
        let r2 = r2.clone();
        tokio::spawn(async move {
            let mut rx = rx;
            let (mut views, mut out) = (0u32, 0u32);
            while rx.changed().await.is_ok() {
                views += 1;
                if !rx.borrow().eligible(&r2) {
                    out += 1;
                }
            }
            (views, out)
        })
    };
    let (v, left) = h
        .wait("the lagging replica out of the read pool", |v| !v.eligible(&r1))
        .await;
    let row = v.row(&r1).unwrap().clone();
    let bound = Duration::from_millis(THRESHOLD_MS + 2 * PERIOD_MS);
    println!(
        "SQL thread stopped: out of the read pool after {} ms (bound threshold + 2 x period = {} ms); row {row:?}",
        left.as_millis(),
        bound.as_millis()
    );
    assert_eq!(row.status, ProbeStatus::Ok, "the probe itself works: {row:?}");
    assert!(row.delay_ms.is_some_and(|d| d > THRESHOLD_MS), "{row:?}");
    assert!(
        row.message.as_deref().is_some_and(|m| m.contains("over the threshold")),
        "{row:?}"
    );
    assert!(left <= bound + SLACK, "left after {left:?}");
    // The last value it applied was written up to a period before the stop.
    assert!(
        left >= Duration::from_millis(THRESHOLD_MS - PERIOD_MS),
        "cannot leave before the threshold: {left:?}"
    );
    // It keeps growing while the SQL thread stays stopped, and wall-clock delay grows too.
    let (v, _) = h
        .wait("delay grows", |v| {
            v.row(&r1)
                .and_then(|r| r.delay_ms)
                .is_some_and(|d| d >= THRESHOLD_MS * 2)
        })
        .await;
    let row = v.row(&r1).unwrap();
    assert!(row.wall_delay_ms.is_some_and(|w| w >= THRESHOLD_MS as i64), "{row:?}");
    assert!(h
        .metric_line("osprey_replica_delay_ineligible", &r1)
        .is_some_and(|l| l.ends_with(" 1")));
    assert!(h.metric_line("osprey_replica_delay_ms", &r1).is_some());
    println!(
        "delay after {} ms stopped: {:?} ms (wall {:?} ms)",
        stopped.elapsed().as_millis(),
        row.delay_ms,
        row.wall_delay_ms
    );

    admin(&sb.replicas()[0], "START SLAVE SQL_THREAD").await;
    let (_, rejoined) = h.wait("the replica back in the read pool", |v| v.eligible(&r1)).await;
    println!(
        "SQL thread started: back in the read pool after {} ms",
        rejoined.as_millis()
    );
    assert!(h
        .metric_line("osprey_replica_delay_ineligible", &r1)
        .is_some_and(|l| l.ends_with(" 0")));
    load.abort();
    drop(h);
    let (views, other_out) = watch_other.await.unwrap();
    println!("the replica that kept up: out of the read pool in {other_out} of {views} views");
    assert!(
        views >= 10 && other_out * 10 <= views,
        "out in {other_out} of {views} views"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_times_out_and_a_killed_one_errors() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    let (r1, r2) = names(&sb);
    let h = start(&sb, "test-faults");
    h.all_eligible(&[&r1, &r2]).await;

    sb.replicas()[0].stop();
    let (v, took) = h
        .wait("SIGSTOPped replica: timeout", |v| {
            v.row(&r1).is_some_and(|r| r.status == ProbeStatus::Timeout)
        })
        .await;
    println!("SIGSTOP: status timeout after {} ms", took.as_millis());
    assert!(!v.eligible(&r1), "{v:#?}");
    h.wait("the other replica in", |v| v.eligible(&r2) && !v.eligible(&r1))
        .await;
    assert!(v.row(&r1).unwrap().delay_ms.is_none());
    assert!(took <= Duration::from_millis(2 * PERIOD_MS) + SLACK, "{took:?}");
    sb.replicas()[0].cont();
    let (_, back) = h.wait("SIGCONT: eligible again", |v| v.eligible(&r1)).await;
    println!("SIGCONT: eligible again after {} ms", back.as_millis());
    // The connects that timed out while it was stopped left nothing behind.
    one_probe_session(&sb.replicas()[0]).await;

    sb.replicas()[1].kill();
    let (v, took) = h
        .wait("killed replica: error", |v| {
            v.row(&r2).is_some_and(|r| r.status == ProbeStatus::Error)
        })
        .await;
    println!(
        "kill -9: status error after {} ms: {:?}",
        took.as_millis(),
        v.row(&r2).unwrap().message
    );
    assert!(!v.eligible(&r2), "{v:#?}");
    h.wait("the other replica in", |v| v.eligible(&r1) && !v.eligible(&r2))
        .await;
    assert!(took <= Duration::from_millis(2 * PERIOD_MS) + SLACK, "{took:?}");
    assert!(h.metric_line("osprey_delay_probe_errors_total", &r2).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_gives_the_probe_a_new_connection() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    let (r1, r2) = names(&sb);
    let h = start(&sb, "test-reset");
    let (v, _) = h
        .wait("eligible with a connection id", |v| {
            v.eligible(&r1) && v.row(&r1).is_some_and(|r| r.connection_id.is_some())
        })
        .await;
    let before = v.row(&r1).unwrap().connection_id.unwrap();
    h.handle.reset(&r1).unwrap();
    let (v, took) = h
        .wait("a new connection id", |v| {
            v.row(&r1).and_then(|r| r.connection_id).is_some_and(|id| id != before) && v.eligible(&r1)
        })
        .await;
    println!(
        "reset: connection {before} -> {} in {} ms",
        v.row(&r1).unwrap().connection_id.unwrap(),
        took.as_millis()
    );
    h.wait("the other replica in", |v| v.eligible(&r2)).await;
    // The old session is gone: one session per member.
    one_probe_session(&sb.replicas()[0]).await;
    assert!(matches!(h.handle.reset("nobody"), Err(DelayError::NoSuchMember(..))));
    // The primary's session resets the same way, and the timestamp keeps growing.
    let primary = sb.primary().name().to_owned();
    let (before_id, before_ts) = (v.primary.connection_id.unwrap(), v.primary.logic_timestamp.unwrap());
    h.handle.reset(&primary).unwrap();
    let (v, _) = h
        .wait("a new primary session", |v| {
            v.primary.connection_id.is_some_and(|id| id != before_id) && v.primary.status == ProbeStatus::Ok
        })
        .await;
    assert!(v.primary.logic_timestamp.unwrap() > before_ts, "{:?}", v.primary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_primary_makes_the_delay_unknown() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    let (r1, r2) = names(&sb);
    let h = start(&sb, "test-primary");
    h.all_eligible(&[&r1, &r2]).await;

    sb.primary().stop();
    let (v, took) = h
        .wait("SIGSTOPped primary: replicas out", |v| {
            !v.eligible(&r1) && !v.eligible(&r2)
        })
        .await;
    println!(
        "primary SIGSTOPped: both replicas out of the read pool after {} ms (2 x period = {} ms); primary {:?}",
        took.as_millis(),
        2 * PERIOD_MS,
        v.primary
    );
    assert!(took <= Duration::from_millis(2 * PERIOD_MS) + SLACK, "{took:?}");
    let (v, _) = h
        .wait("delay unknown", |v| {
            v.replicas
                .iter()
                .all(|r| r.delay_ms.is_none() && r.message.as_deref().is_some_and(|m| m.starts_with("delay unknown")))
        })
        .await;
    assert_ne!(v.primary.status, ProbeStatus::Ok, "{:?}", v.primary);
    sb.primary().cont();
    let (_, back) = h
        .wait("primary back: replicas in", |v| v.eligible(&r1) && v.eligible(&r2))
        .await;
    println!("primary SIGCONTed: replicas back after {} ms", back.as_millis());

    // A read-only primary is not written to (the monitor account could, and that would be
    // an errant transaction): delay unknown, and its binary log does not move.
    admin(sb.primary(), "SET GLOBAL read_only = 1").await;
    let (v, _) = h
        .wait("read-only primary: replicas out", |v| {
            !v.eligible(&r1) && !v.eligible(&r2)
        })
        .await;
    assert!(
        v.primary.message.as_deref().is_some_and(|m| m.contains("read-only")),
        "{:?}",
        v.primary
    );
    let pos = |i: &Instance| {
        let opts = i.admin_opts();
        async move {
            let mut c = mysql_async::Conn::new(opts).await.unwrap();
            c.query_first::<String, _>("SELECT @@global.gtid_binlog_pos")
                .await
                .unwrap()
                .unwrap()
        }
    };
    let before = pos(sb.primary()).await;
    let rounds = v.rounds;
    h.wait("three more rounds", |v| v.rounds >= rounds + 3).await;
    assert_eq!(
        pos(sb.primary()).await,
        before,
        "a heartbeat was written into a read-only primary"
    );
    admin(sb.primary(), "SET GLOBAL read_only = 0").await;
    h.all_eligible(&[&r1, &r2]).await;
}

/// After a failover the probe writes to the new primary, the logical timestamp goes on
/// growing, and the old primary, now a replica, is probed as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_follows_a_new_primary() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    let (r1, r2) = names(&sb);
    let old = sb.primary().name().to_owned();
    let h = start(&sb, "test-follow");
    let (v, _) = h.wait("eligible", |v| v.eligible(&r1) && v.eligible(&r2)).await;
    let ts_before = v.primary.logic_timestamp.unwrap();

    // A switchover by hand: the old primary read-only, r1 caught up and promoted, the
    // others re-pointed at it.
    admin(sb.primary(), "SET GLOBAL read_only = 1").await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let new = &sb.replicas()[0];
    admin(new, "STOP SLAVE").await;
    admin(new, "RESET SLAVE ALL").await;
    admin(new, "SET GLOBAL read_only = 0").await;
    let point = format!(
        "CHANGE MASTER TO master_host='{}', master_port={}, master_user='{}', master_password='{}', master_use_gtid=current_pos",
        new.host(),
        new.port(),
        osprey_sandbox::REPL_USER,
        osprey_sandbox::REPL_PASSWORD
    );
    for i in [sb.primary(), &sb.replicas()[1]] {
        admin(i, "STOP SLAVE").await;
        admin(i, &point).await;
        admin(i, "START SLAVE").await;
    }
    let switched = Instant::now();
    let cfg = config(&sb, &delay_settings());
    h.topology.send_replace(topology(&cfg, &r1));

    let (v, took) = h
        .wait("written on the new primary, old primary and r2 eligible", |v| {
            v.primary.name.as_deref() == Some(r1.as_str())
                && v.primary.status == ProbeStatus::Ok
                && v.eligible(&old)
                && v.eligible(&r2)
        })
        .await;
    println!(
        "after the switch: writing to {r1} and both replicas eligible in {} ms ({} ms since the topology changed)",
        took.as_millis(),
        switched.elapsed().as_millis()
    );
    assert!(
        v.primary.logic_timestamp.unwrap() > ts_before,
        "{:?} vs {ts_before}",
        v.primary
    );
    assert!(v.row(&r1).is_none(), "the primary has no replica row");
    assert_eq!(v.row(&old).unwrap().delay_ms, Some(0), "{v:#?}");
}

#[test]
fn some_but_not_all_delay_settings_are_refused_naming_the_missing() {
    let base = "name = \"c\"\nuser = \"u\"\n[[member]]\nname = \"a\"\nhost = \"127.0.0.1\"\n";
    let parse = |extra: &str| -> ClusterConfig { toml::from_str(&format!("{extra}\n{base}")).unwrap() };
    assert!(parse("").validate().is_ok());
    assert!(parse("").delay().is_none());
    let e = parse("delay_period_ms = 500").validate().unwrap_err();
    assert!(
        e.contains("delay_threshold_ms") && e.contains("delay_database") && !e.contains("missing: delay_period_ms"),
        "{e}"
    );
    let e = parse("delay_period_ms = 50\ndelay_threshold_ms = 1000\ndelay_database = \"hb\"")
        .validate()
        .unwrap_err();
    assert!(e.contains("at least 100"), "{e}");
    let e = parse("delay_period_ms = 500\ndelay_threshold_ms = 1000\ndelay_database = \"hb`; DROP\"")
        .validate()
        .unwrap_err();
    assert!(e.contains("delay_database"), "{e}");
    let ok = parse("delay_period_ms = 500\ndelay_threshold_ms = 1000\ndelay_database = \"hb\"");
    ok.validate().unwrap();
    assert_eq!(ok.delay().unwrap().period_ms, 500);
    // Not enabled: no task.
    let (_c, cfg_rx) = watch::channel(Arc::new(parse("")));
    let (_t, topo_rx) = watch::channel(ClusterView::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        assert!(delay::spawn(
            cfg_rx,
            topo_rx,
            "s".into(),
            Arc::new(Metrics::new()),
            CancellationToken::new()
        )
        .is_none());
    });
}

/// `GET /delay`, `POST /delay/reset` and `osprey delay` against the dispatcher binary with a
/// `[[cluster]]` that enables delay detection. Needs `cargo build --bins` (the worker and
/// the CLI beside the dispatcher).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_and_the_cli_show_and_reset_the_probe() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    let (r1, _) = names(&sb);
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_osprey-dispatcher"));
    let cli = bin.with_file_name("osprey");
    assert!(
        bin.with_file_name("osprey-worker").exists() && cli.exists(),
        "run `cargo build --bins` first"
    );
    let dir = tempfile::tempdir().unwrap();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (client, admin_addr) = (free(), free());
    let p = sb.primary();
    let mut toml = format!(
        "[listen]\nclient = \"{client}\"\nadmin = \"{admin_addr}\"\nruntime_dir = \"{}\"\n\
         [auth]\nclient_tokens = [\"ct\"]\nadmin_token = \"at\"\n[pool]\nsize = 1\nworker_log = \"warn\"\n\
         [[cluster]]\nname = \"c1\"\nuser = \"{}\"\npassword = \"{}\"\nmonitor_user = \"{}\"\nmonitor_password = \"{}\"\n{}\n\
         [cluster.failover]\nlock = \"none\"\n",
        dir.path().display(),
        p.user(),
        p.password(),
        p.monitor_user(),
        p.monitor_password(),
        delay_settings(),
    );
    for i in sb.instances() {
        toml.push_str(&format!(
            "[[cluster.member]]\nname = \"{}\"\nhost = \"{}\"\nport = {}\n",
            i.name(),
            i.host(),
            i.port()
        ));
    }
    let path = dir.path().join("osprey.toml");
    std::fs::write(&path, &toml).unwrap();
    let mut child = tokio::process::Command::new(&bin)
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let started = Instant::now();
    let delay = loop {
        if let Ok((200, body)) = http(admin_addr, "GET", "/delay", Some("at"), None).await {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let rows = v["clusters"][0]["replicas"].as_array().cloned().unwrap_or_default();
            if rows.len() == 2 && rows.iter().all(|r| r["eligible"] == true) {
                break v;
            }
        }
        assert!(started.elapsed() < DEADLINE, "replicas not eligible in /delay");
        assert!(child.try_wait().unwrap().is_none(), "the dispatcher exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("/delay: {delay:#}");
    let c = &delay["clusters"][0];
    assert_eq!(c["enabled"], true);
    assert_eq!(
        c["source"].as_str().unwrap(),
        format!("{}:{}", hostname(), client.port())
    );
    let row = c["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == r1.as_str())
        .unwrap()
        .clone();
    for k in [
        "cluster",
        "name",
        "host",
        "delay_ms",
        "wall_delay_ms",
        "status",
        "message",
        "last_active",
        "connection_id",
        "gtid_applied",
        "eligible",
    ] {
        assert!(row.get(k).is_some(), "column {k} missing: {row}");
    }
    let before = row["connection_id"].as_u64().unwrap();

    // Errors, in the admin API's shapes.
    assert_eq!(http(admin_addr, "GET", "/delay", None, None).await.unwrap().0, 401);
    assert_eq!(
        http(admin_addr, "GET", "/delay?cluster=nope", Some("at"), None)
            .await
            .unwrap()
            .0,
        404
    );
    let (code, body) = http(
        admin_addr,
        "POST",
        "/delay/reset",
        Some("at"),
        Some(r#"{"member":"nobody"}"#),
    )
    .await
    .unwrap();
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("nobody"), "{body}");

    // The CLI: the table, then a reset.
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&cli)
            .args(["--admin", &admin_addr.to_string(), "--admin-token", "at"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "osprey {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = run(&["delay"]);
    println!("osprey delay:\n{table}");
    assert!(table.lines().any(|l| l.starts_with(&r1) && l.contains("ok")), "{table}");
    let said = run(&["delay", "reset", &r1, "--cluster", "c1"]);
    assert!(said.contains("reset"), "{said}");
    let started = Instant::now();
    loop {
        let (_, body) = http(admin_addr, "GET", "/delay?cluster=c1", Some("at"), None)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let id = v["clusters"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == r1.as_str())
            .and_then(|r| r["connection_id"].as_u64());
        if id.is_some_and(|id| id != before) {
            println!(
                "reset through the CLI: connection {before} -> {id:?} in {} ms",
                started.elapsed().as_millis()
            );
            break;
        }
        assert!(started.elapsed() < DEADLINE, "connection id still {before}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = http(admin_addr, "GET", "/metrics", Some("at"), None).await.unwrap().1;
    assert!(
        metrics.contains("osprey_replica_delay_ms{") && metrics.contains("osprey_replica_delay_ineligible{"),
        "{metrics}"
    );
    child.kill().await.unwrap();
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// A one-shot HTTP/1.1 request (the admin API answers with a Content-Length body).
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .map_err(|_| std::io::Error::other("admin API timed out"))??;
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

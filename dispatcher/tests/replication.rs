//! The `replication` topology provider against real MariaDB (`osprey-sandbox`: a primary and
//! two GTID + semi-sync replicas). The member health the monitors would publish is a watch
//! each test flips itself (to `Down` right after a real `kill -9` of the primary), so that
//! these tests exercise the provider alone; the monitors have their own tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_dispatcher::cluster::events::EventLog;
use osprey_dispatcher::cluster::replication::spawn_replication;
use osprey_dispatcher::cluster::{
    ClusterConfig, ClusterStatus, ClusterView, Command, HealthState, MemberHealth, ProviderHandle, Role, SemiSync,
};
use osprey_dispatcher::metrics::Metrics;
use osprey_sandbox::{Instance, Sandbox};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "osprey_dispatcher=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A cluster of the sandbox's instances. `member_extra` adds TOML lines to a member.
fn config(sb: &Sandbox, lock: &str, member_extra: &dyn Fn(&str) -> String) -> ClusterConfig {
    let c: ClusterConfig = toml::from_str(&config_toml(sb, lock, member_extra)).unwrap();
    c.validate().unwrap();
    c
}

fn config_toml(sb: &Sandbox, lock: &str, member_extra: &dyn Fn(&str) -> String) -> String {
    let p = sb.primary();
    let mut toml = format!(
        "name = \"c1\"\nuser = \"{}\"\npassword = \"{}\"\nmonitor_user = \"{}\"\nmonitor_password = \"{}\"\n\
         replication_user = \"{}\"\nreplication_password = \"{}\"\n\
         [health]\ninterval_ms = 100\nwindow_ms = 1000\n\
         [failover]\ncooldown_s = 0\nlock = \"{lock}\"\ncatchup_timeout_ms = 5000\nswitchover_timeout_ms = 10000\n",
        p.user(),
        p.password(),
        p.monitor_user(),
        p.monitor_password(),
        osprey_sandbox::REPL_USER,
        osprey_sandbox::REPL_PASSWORD,
    );
    for i in sb.instances() {
        toml.push_str(&format!(
            "[[member]]\nname = \"{}\"\nhost = \"{}\"\nport = {}\n{}\n",
            i.name(),
            i.host(),
            i.port(),
            member_extra(i.name())
        ));
    }
    toml
}

struct Harness {
    handle: ProviderHandle,
    health: BTreeMap<String, watch::Sender<MemberHealth>>,
    events: Arc<EventLog>,
    metrics: Arc<Metrics>,
    writes: watch::Sender<usize>,
    shutdown: CancellationToken,
    _cfg: watch::Sender<Arc<ClusterConfig>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn up() -> MemberHealth {
    MemberHealth {
        state: HealthState::Up,
        ..Default::default()
    }
}

fn spawn(cfg: ClusterConfig) -> Harness {
    let mut health = BTreeMap::new();
    let mut rx = Vec::new();
    for m in &cfg.members {
        let (tx, r) = watch::channel(up());
        health.insert(m.name.clone(), tx);
        rx.push((m.name.clone(), r));
    }
    let (cfg_tx, cfg_rx) = watch::channel(Arc::new(cfg));
    let (writes, writes_rx) = watch::channel(0usize);
    let events = Arc::new(EventLog::default());
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let handle = spawn_replication(cfg_rx, rx, writes_rx, events.clone(), metrics.clone(), shutdown.clone());
    Harness {
        handle,
        health,
        events,
        metrics,
        writes,
        shutdown,
        _cfg: cfg_tx,
    }
}

impl Harness {
    fn set_health(&self, member: &str, state: HealthState) {
        self.health[member].send_modify(|h| h.state = state);
    }

    async fn wait(&self, what: &str, pred: impl Fn(&ClusterView) -> bool) -> ClusterView {
        let mut rx = self.handle.view.clone();
        let r = tokio::time::timeout(DEADLINE, rx.wait_for(|v| pred(v))).await;
        match r {
            Ok(Ok(v)) => v.clone(),
            _ => panic!(
                "{what}: not within {DEADLINE:?}; last view: {:#?}",
                *self.handle.view.borrow()
            ),
        }
    }
}

impl Harness {
    /// The first logged switch of `kind` (it is logged after its last step).
    async fn event(&self, kind: &str) -> osprey_dispatcher::cluster::SwitchEvent {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(e) = self.events.list(None).into_iter().find(|e| e.kind == kind) {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "no {kind} event: {:#?}",
                self.events.list(None)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn role(v: &ClusterView, m: &str) -> Role {
    v.member(m).map(|m| m.role).unwrap_or_default()
}

async fn count_rows(i: &Instance) -> i64 {
    let mut c = i.admin_conn().await.unwrap();
    c.query_first("SELECT COUNT(*) FROM osprey.t").await.unwrap().unwrap()
}

async fn exec_admin(i: &Instance, sql: &str) {
    let mut c = i.admin_conn().await.unwrap();
    c.query_drop(sql).await.unwrap();
}

async fn setup_table(sb: &Sandbox, rows: i64) {
    let mut c = sb.primary().conn().await.unwrap();
    c.query_drop("CREATE TABLE t (id BIGINT PRIMARY KEY)").await.unwrap();
    for id in 1..=rows {
        c.exec_drop("INSERT INTO t VALUES (?)", (id,)).await.unwrap();
    }
}

/// `head`, then `repoint` and `detach` (side by side, either order), then `tail`.
fn assert_steps(names: &[&str], head: &[&str], tail: &[&str]) {
    let n = head.len();
    assert_eq!(names.len(), n + 2 + tail.len(), "{names:?}");
    assert_eq!(&names[..n], head, "{names:?}");
    let mut mid = names[n..n + 2].to_vec();
    mid.sort();
    assert_eq!(mid, ["detach", "repoint"], "{names:?}");
    assert_eq!(&names[n + 2..], tail, "{names:?}");
}

fn print_event(label: &str, ev: &osprey_dispatcher::cluster::SwitchEvent) {
    let steps: Vec<String> = ev
        .steps
        .iter()
        .map(|s| format!("{}{} @{:.1}ms", s.step, if s.ok { "" } else { "(failed)" }, s.at_ms))
        .collect();
    println!(
        "{label}: {} {:?} -> {:?} ok={} in {:.1} ms: {}",
        ev.kind,
        ev.old_primary,
        ev.new_primary,
        ev.ok,
        ev.duration_ms,
        steps.join(", ")
    );
}

/// Start: the topology comes from the servers. Kill -9 of the primary: the most advanced
/// replica (replica-1; replica-2's IO thread was stopped before the last rows) is promoted,
/// replica-2 re-pointed at it and catches up; every committed row is on the new primary.
/// Then the old primary comes back writable: it is fenced at once and rejoined as a replica.
#[tokio::test]
async fn kill_9_of_the_primary_promotes_the_most_advanced_replica_and_the_old_one_rejoins() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 50).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let (primary, r1, r2) = (sb.primary(), &sb.replicas()[0], &sb.replicas()[1]);
    let hook_out = sb.dir().join("on_switch.out");
    let mut cfg = config(&sb, "majority", &|_| String::new());
    cfg.failover.on_switch = Some(format!(
        "printf '%s %s %s %s %s' \"$OSPREY_CLUSTER\" \"$OSPREY_OLD_PRIMARY\" \"$OSPREY_NEW_PRIMARY\" \"$OSPREY_OLD_ADDR\" \"$OSPREY_NEW_ADDR\" > {}",
        hook_out.display()
    ));
    let h = spawn(cfg);

    let v = h
        .wait("topology derived", |v| {
            v.primary.as_deref() == Some("primary")
                && role(v, "replica-1") == Role::Replica
                && role(v, "replica-2") == Role::Replica
        })
        .await;
    assert_eq!(v.status, ClusterStatus::Ok);
    assert_eq!(v.semi_sync, Some(SemiSync::On));
    assert!(v.lock_held, "{:?}", v.lock_detail);
    assert_eq!(v.lock_detail.as_deref(), Some("held on 3 of 3"));
    assert_eq!(
        v.member("replica-1").unwrap().replicates_from.as_deref(),
        Some("primary")
    );
    let epoch0 = v.epoch;

    // replica-2 stops receiving; 50 more rows are acknowledged (semi-sync: by replica-1).
    exec_admin(r2, "STOP SLAVE IO_THREAD").await;
    let mut c = primary.conn().await.unwrap();
    for id in 51..=100 {
        c.exec_drop("INSERT INTO t VALUES (?)", (id,)).await.unwrap();
    }
    drop(c);
    // The provider sees replica-1 ahead (received) before the crash.
    h.wait("replica-1 ahead", |v| {
        v.member("replica-1")
            .and_then(|m| m.gtid_received.clone())
            .is_some_and(|g| g.ends_with("-101"))
    })
    .await;

    let t_kill = Instant::now();
    primary.kill();
    h.set_health("primary", HealthState::Down);
    let v = h
        .wait("replica-1 promoted", |v| v.primary.as_deref() == Some("replica-1"))
        .await;
    let to_publish = t_kill.elapsed();
    assert!(v.epoch > epoch0);
    let v = h
        .wait("replica-2 re-pointed", |v| {
            v.member("replica-2").is_some_and(|m| {
                m.role == Role::Replica
                    && m.replicates_from.as_deref() == Some("replica-1")
                    && m.io_running == Some(true)
            })
        })
        .await;
    assert_eq!(role(&v, "primary"), Role::Fenced);
    println!("kill -9 -> new primary published: {to_publish:?}");
    let failovers: Vec<_> = h
        .events
        .list(None)
        .into_iter()
        .filter(|e| e.kind == "failover")
        .collect();
    assert_eq!(failovers.len(), 1, "{failovers:#?}");
    let ev = &failovers[0];
    print_event("failover", ev);
    assert!(ev.ok);
    let names: Vec<_> = ev.steps.iter().map(|s| s.step).collect();
    assert_steps(
        &names,
        &["verify", "elect", "catch_up", "promote", "publish"],
        &["semi_sync", "fence"],
    );
    assert!(!ev.steps.last().unwrap().ok, "the dead primary cannot be fenced");

    assert_eq!(
        count_rows(r1).await,
        100,
        "every acknowledged row is on the new primary"
    );
    // The app account can write on the new primary; replica-2 gets everything from it.
    let mut c = r1.conn().await.unwrap();
    c.exec_drop("INSERT INTO t VALUES (?)", (101,)).await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    while count_rows(r2).await != 101 {
        assert!(Instant::now() < deadline, "replica-2 did not catch up from replica-1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The ops hook ran with the switch in its environment.
    let expected = format!(
        "c1 primary replica-1 127.0.0.1:{} 127.0.0.1:{}",
        primary.port(),
        r1.port()
    );
    let deadline = Instant::now() + DEADLINE;
    while std::fs::read_to_string(&hook_out).unwrap_or_default() != expected {
        assert!(
            Instant::now() < deadline,
            "on_switch: {:?}",
            std::fs::read_to_string(&hook_out)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Semi-sync again: the new primary is a semi-sync master and replica-2 acks.
    h.wait("semi-sync on the new primary", |v| v.semi_sync == Some(SemiSync::On))
        .await;
    let mut a = r1.admin_conn().await.unwrap();
    let clients: Option<(String, u64)> = a
        .query_first("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_clients'")
        .await
        .unwrap();
    assert_eq!(clients.map(|c| c.1), Some(1));
    let text = h.metrics.encode();
    assert!(
        text.contains("osprey_failovers_total{cluster=\"c1\",kind=\"failover\"} 1"),
        "{text}"
    );
    assert!(text.contains("osprey_member_role{cluster=\"c1\",member=\"replica-1\",role=\"primary\"} 1"));

    // The old primary restarts writable (as the sandbox starts it): fenced, then rejoined.
    let t_restart = Instant::now();
    primary.restart().await.unwrap();
    h.set_health("primary", HealthState::Up);
    let v = h
        .wait("old primary rejoined", |v| {
            v.member("primary").is_some_and(|m| {
                m.role == Role::Replica
                    && m.replicates_from.as_deref() == Some("replica-1")
                    && m.read_only == Some(true)
            })
        })
        .await;
    println!(
        "old primary restarted -> rejoined as replica: {:?}",
        t_restart.elapsed()
    );
    assert_eq!(v.primary.as_deref(), Some("replica-1"));
    let kinds: Vec<_> = h.events.list(None).iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&"fence") && kinds.contains(&"rejoin"), "{kinds:?}");
    let mut app = primary.conn().await.unwrap();
    let err = app.query_drop("INSERT INTO t VALUES (1000)").await.unwrap_err();
    assert!(
        matches!(err, mysql_async::Error::Server(ref e) if e.code == 1290),
        "{err:?}"
    );
    let deadline = Instant::now() + DEADLINE;
    while count_rows(primary).await != 101 {
        if Instant::now() >= deadline {
            let mut c = primary.admin_conn().await.unwrap();
            let row: Option<mysql_async::Row> = c.query_first("SHOW SLAVE STATUS").await.unwrap();
            panic!("the rejoined primary did not catch up: {row:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The primary is down to us (its member address refuses) but the replicas still receive
/// from it (IO thread running, heartbeats arriving): `unreachable`, no promotion. Once it
/// hangs (heartbeats stop), the failover goes ahead.
#[tokio::test]
async fn verify_reports_unreachable_when_only_our_path_is_broken() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let real = sb.primary().port();
    let mut cfg = config(&sb, "none", &|_| String::new());
    // We reach it through a dead address; the replicas through the real one.
    cfg.members[0].port = refused;
    cfg.members[0].replication_port = Some(real);
    let h = spawn(cfg);
    h.wait("replicas follow primary", |v| v.primary.as_deref() == Some("primary"))
        .await;
    h.set_health("primary", HealthState::Down);
    let v = h
        .wait("unreachable", |v| matches!(v.status, ClusterStatus::Unreachable(_)))
        .await;
    println!("status: {:?}", v.status);
    assert_eq!(v.primary, None, "write slots wait: nothing to target");
    // Stays so across several heartbeat windows (replica heartbeat 1 s, window 2.1 s).
    let until = Instant::now() + Duration::from_secs(5);
    let mut rx = h.handle.view.clone();
    while Instant::now() < until {
        let v = rx.borrow_and_update().clone();
        assert!(matches!(v.status, ClusterStatus::Unreachable(_)), "{:?}", v.status);
        for r in ["replica-1", "replica-2"] {
            assert_eq!(v.member(r).unwrap().read_only, Some(true), "{r} was promoted");
        }
        let _ = tokio::time::timeout_at(until.into(), rx.changed()).await;
    }
    assert!(h.events.list(None).iter().all(|e| e.kind != "failover"));

    // Now the primary hangs (SIGSTOP: the replicas' IO threads stay connected, but the
    // heartbeats stop): told from a quiet primary by the missing heartbeats, it is failed over.
    let t_stop = Instant::now();
    sb.primary().stop();
    let v = h
        .wait("promoted after the heartbeats stopped", |v| {
            v.primary.as_deref().is_some_and(|p| p.starts_with("replica-"))
        })
        .await;
    println!(
        "SIGSTOP of the primary -> {:?} promoted in {:?}",
        v.primary,
        t_stop.elapsed()
    );
    let ev = h.event("failover").await;
    print_event("failover of a hung primary", &ev);
    // Not before the heartbeats were missed (2 x 1 s period).
    assert!(t_stop.elapsed() >= Duration::from_secs(2), "{:?}", t_stop.elapsed());
}

/// Two providers on one cluster (majority lock): exactly one holds the lock; after kill -9
/// of the primary exactly one promotion happens and both views name the same primary.
#[tokio::test]
async fn two_dispatchers_promote_once_and_agree() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 20).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let a = spawn(config(&sb, "majority", &|_| String::new()));
    let b = spawn(config(&sb, "majority", &|_| String::new()));
    for h in [&a, &b] {
        h.wait("topology", |v| v.primary.as_deref() == Some("primary")).await;
    }
    // One of them ends up with the lock (a split backs off), never both.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (la, lb) = (a.handle.view.borrow().lock_held, b.handle.view.borrow().lock_held);
        assert!(!(la && lb), "both hold the lock");
        if la || lb {
            break;
        }
        assert!(Instant::now() < deadline, "nobody got the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (holder, other) = if a.handle.view.borrow().lock_held {
        (&a, &b)
    } else {
        (&b, &a)
    };
    println!(
        "holder: {:?}; other: {:?}",
        holder.handle.view.borrow().lock_detail,
        other.handle.view.borrow().lock_detail
    );
    assert!(other
        .handle
        .view
        .borrow()
        .lock_detail
        .as_deref()
        .unwrap()
        .starts_with("no majority"));

    sb.primary().kill();
    for h in [&a, &b] {
        h.set_health("primary", HealthState::Down);
    }
    let va = a
        .wait("a: new primary", |v| {
            v.primary.is_some() && v.primary.as_deref() != Some("primary")
        })
        .await;
    let vb = b
        .wait("b: new primary", |v| {
            v.primary.is_some() && v.primary.as_deref() != Some("primary")
        })
        .await;
    assert_eq!(va.primary, vb.primary);
    let kinds = |h: &Harness| h.events.list(None).iter().map(|e| e.kind).collect::<Vec<_>>();
    let promotions = [&a, &b]
        .iter()
        .map(|h| kinds(h).iter().filter(|k| **k == "failover").count())
        .sum::<usize>();
    assert_eq!(promotions, 1, "a: {:?}, b: {:?}", kinds(&a), kinds(&b));
    assert!(kinds(other).contains(&"followed"), "{:?}", kinds(other));
    // The servers agree: exactly one writable member.
    let mut writable = 0;
    for r in sb.replicas() {
        let mut c = r.admin_conn().await.unwrap();
        let ro: Option<i64> = c.query_first("SELECT @@read_only").await.unwrap();
        writable += i32::from(ro == Some(0));
    }
    assert_eq!(writable, 1);
}

/// Planned switchover while a writer writes through the view (waiting while there is no
/// primary, as the slot group does): zero errors, every acknowledged row on the new
/// primary, the old primary a replica of it.
#[tokio::test]
async fn switchover_under_writes_has_no_errors() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 1).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let h = spawn(config(&sb, "majority", &|_| String::new()));
    h.wait("topology", |v| v.primary.as_deref() == Some("primary") && v.lock_held)
        .await;

    let stop = CancellationToken::new();
    let writer = {
        let view = h.handle.view.clone();
        let writes = h.writes.clone();
        let stop = stop.clone();
        let opts: BTreeMap<String, mysql_async::Opts> =
            sb.instances().map(|i| (i.name().to_owned(), i.opts())).collect();
        tokio::spawn(async move {
            let (mut acked, mut errors, mut id) = (0i64, Vec::new(), 1i64);
            let mut conn: Option<(String, mysql_async::Conn)> = None;
            let mut view = view;
            while !stop.is_cancelled() {
                // In flight first, then look: a switch that saw zero cannot miss us.
                writes.send_modify(|n| *n += 1);
                let target = view.borrow_and_update().primary.clone();
                let Some(target) = target else {
                    writes.send_modify(|n| *n -= 1);
                    let _ = tokio::time::timeout(Duration::from_millis(100), view.changed()).await;
                    continue;
                };
                if conn.as_ref().map(|(n, _)| n != &target).unwrap_or(true) {
                    conn = Some((
                        target.clone(),
                        mysql_async::Conn::new(opts[&target].clone()).await.unwrap(),
                    ));
                }
                id += 1;
                let r = conn
                    .as_mut()
                    .unwrap()
                    .1
                    .exec_drop("INSERT INTO t VALUES (?)", (id,))
                    .await;
                writes.send_modify(|n| *n -= 1);
                match r {
                    Ok(()) => acked += 1,
                    Err(e) => {
                        errors.push(format!("{target}: {e}"));
                        conn = None;
                    }
                }
            }
            (acked, errors)
        })
    };
    // Let some writes go through first.
    let deadline = Instant::now() + DEADLINE;
    while count_rows(sb.primary()).await < 50 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (reply, rx) = tokio::sync::oneshot::channel();
    h.handle
        .commands
        .send(Command::Switchover {
            to: Some("replica-2".into()),
            reply,
        })
        .await
        .unwrap();
    let ev = rx.await.unwrap().expect("switchover");
    print_event("switchover", &ev);
    let names: Vec<_> = ev.steps.iter().map(|s| s.step).collect();
    assert_steps(
        &names,
        &["drain", "demote", "catch_up", "promote", "publish"],
        &["semi_sync"],
    );
    // Writes continue on the new primary.
    let r2 = &sb.replicas()[1];
    let before = count_rows(r2).await;
    let deadline = Instant::now() + DEADLINE;
    while count_rows(r2).await < before + 50 {
        assert!(Instant::now() < deadline, "no writes after the switchover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    let (acked, errors) = writer.await.unwrap();
    assert!(errors.is_empty(), "client errors: {errors:?}");
    assert_eq!(
        count_rows(r2).await,
        acked + 1,
        "every acknowledged row on the new primary"
    );
    let v = h
        .wait("old primary replicates from replica-2", |v| {
            v.member("primary")
                .is_some_and(|m| m.role == Role::Replica && m.replicates_from.as_deref() == Some("replica-2"))
                && v.member("replica-1")
                    .is_some_and(|m| m.replicates_from.as_deref() == Some("replica-2"))
        })
        .await;
    assert_eq!(v.primary.as_deref(), Some("replica-2"));
    println!("switchover: {acked} writes acknowledged, 0 errors");
}

/// A `no_promotion` replica is never elected, even when the tie-break would pick it.
#[tokio::test]
async fn a_no_promotion_replica_is_never_elected() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 10).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let h = spawn(config(&sb, "none", &|name| {
        if name == "replica-1" {
            "no_promotion = true".into()
        } else {
            String::new()
        }
    }));
    h.wait("topology", |v| v.primary.as_deref() == Some("primary")).await;
    sb.primary().kill();
    h.set_health("primary", HealthState::Down);
    let v = h
        .wait("promoted", |v| {
            v.primary.is_some() && v.primary.as_deref() != Some("primary")
        })
        .await;
    assert_eq!(v.primary.as_deref(), Some("replica-2"));
    h.wait("replica-1 follows replica-2", |v| {
        v.member("replica-1")
            .is_some_and(|m| m.replicates_from.as_deref() == Some("replica-2"))
    })
    .await;
    // And with replica-2 down too, nobody is: the status says why.
    sb.replicas()[1].kill();
    h.set_health("replica-2", HealthState::Down);
    let v = h
        .wait("no primary", |v| matches!(v.status, ClusterStatus::NoPrimary(_)))
        .await;
    let ClusterStatus::NoPrimary(why) = &v.status else {
        unreachable!()
    };
    assert!(why.contains("replica-1: no_promotion"), "{why}");
    assert_eq!(v.primary, None);
}

/// A dispatcher that died mid-switch left replica-1 promoted and replica-2 pointing at the
/// dead primary: a new provider takes replica-1 as primary and re-points replica-2.
#[tokio::test]
async fn a_half_done_switch_is_repaired_at_start() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 10).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    sb.primary().kill();
    let r1 = &sb.replicas()[0];
    exec_admin(r1, "STOP SLAVE").await;
    exec_admin(r1, "RESET SLAVE ALL").await;
    exec_admin(r1, "SET GLOBAL read_only = OFF").await;
    let h = spawn(config(&sb, "majority", &|_| String::new()));
    h.set_health("primary", HealthState::Down);
    let v = h
        .wait("repaired", |v| {
            v.primary.as_deref() == Some("replica-1")
                && v.member("replica-2")
                    .is_some_and(|m| m.replicates_from.as_deref() == Some("replica-1") && m.io_running == Some(true))
        })
        .await;
    assert!(
        v.lock_detail.as_deref().unwrap().starts_with("held on 2 of 3"),
        "{:?}",
        v.lock_detail
    );
    let kinds: Vec<_> = h.events.list(None).iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&"repair"), "{kinds:?}");
    assert!(!kinds.contains(&"failover"), "{kinds:?}");
}

/// Run by `a_dispatcher_killed_mid_failover_leaves_nothing_the_next_cannot_finish` in a
/// child process (it SIGKILLs itself at `OSPREY_FAULT_STOP_AFTER`); does nothing alone.
#[tokio::test]
#[ignore = "helper, run in a child process"]
async fn fault_helper() {
    let Ok(toml) = std::env::var("OSPREY_TEST_FAULT_CLUSTER") else {
        return;
    };
    let cfg: ClusterConfig = toml::from_str(&toml).unwrap();
    let h = spawn(cfg);
    h.set_health("primary", HealthState::Down);
    // Killed by the fault point long before this ends.
    h.wait("killed first", |v| v.primary.as_deref() == Some("never")).await;
}

/// A dispatcher SIGKILLed right after `catch_up` (nothing changed yet): the next one fails
/// over. Right after `promote` (replica-1 writable but still configured as a replica,
/// replica-2 pointing at the dead primary): the next one takes replica-1 (no second
/// promotion), resets its replication and re-points replica-2.
#[tokio::test]
async fn a_dispatcher_killed_mid_failover_leaves_nothing_the_next_cannot_finish() {
    use std::os::unix::process::ExitStatusExt;
    init_tracing();
    for step in ["catch_up", "promote"] {
        let sb = Sandbox::start(2).await.unwrap();
        setup_table(&sb, 10).await;
        sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
        sb.primary().kill();
        let status = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "fault_helper", "--nocapture"])
            .env("OSPREY_FAULT_STOP_AFTER", step)
            .env(
                "OSPREY_TEST_FAULT_CLUSTER",
                config_toml(&sb, "majority", &|_| String::new()),
            )
            .stdout(std::process::Stdio::null())
            .status();
        let status = tokio::time::timeout(DEADLINE, status).await.unwrap().unwrap();
        assert_eq!(status.signal(), Some(9), "after {step}: {status:?}");
        let mut c = sb.replicas()[0].admin_conn().await.unwrap();
        let ro: Option<i64> = c.query_first("SELECT @@read_only").await.unwrap();
        assert_eq!(ro == Some(0), step == "promote", "after {step}: replica-1 promoted?");

        let h = spawn(config(&sb, "majority", &|_| String::new()));
        h.set_health("primary", HealthState::Down);
        let v = h
            .wait("finished", |v| {
                v.primary.as_deref() == Some("replica-1")
                    && v.member("replica-1")
                        .is_some_and(|m| m.replicates_from.is_none() && m.io_running.is_none())
                    && v.member("replica-2").is_some_and(|m| {
                        m.replicates_from.as_deref() == Some("replica-1") && m.io_running == Some(true)
                    })
            })
            .await;
        assert_eq!(v.status, ClusterStatus::Ok);
        let kinds: Vec<_> = h.events.list(None).iter().map(|e| e.kind).collect();
        if step == "promote" {
            assert!(!kinds.contains(&"failover"), "after {step}: {kinds:?}");
            assert!(kinds.contains(&"repair"), "after {step}: {kinds:?}");
        } else {
            assert_eq!(kinds, ["failover"], "after {step}");
        }
        println!("killed after {step}: the next provider finished it ({kinds:?})");
        assert_eq!(count_rows(&sb.replicas()[1]).await, 10);
    }
}

/// At start two members are writable (replica-2 was promoted by hand, nobody follows it):
/// the one the replicas follow stays primary, the other is fenced, then rejoined (its
/// history is contained in the primary's).
#[tokio::test]
async fn two_writers_at_start_the_followed_one_wins_the_other_is_fenced_and_rejoined() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 10).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let r2 = &sb.replicas()[1];
    exec_admin(r2, "STOP SLAVE").await;
    exec_admin(r2, "RESET SLAVE ALL").await;
    exec_admin(r2, "SET GLOBAL read_only = OFF").await;
    let h = spawn(config(&sb, "majority", &|_| String::new()));
    let v = h
        .wait("replica-2 fenced and rejoined", |v| {
            v.primary.as_deref() == Some("primary")
                && v.member("replica-2").is_some_and(|m| {
                    m.role == Role::Replica
                        && m.replicates_from.as_deref() == Some("primary")
                        && m.read_only == Some(true)
                })
        })
        .await;
    assert_eq!(v.status, ClusterStatus::Ok);
    let kinds: Vec<_> = h.events.list(None).iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&"fence") && kinds.contains(&"rejoin"), "{kinds:?}");
    let err = r2
        .conn()
        .await
        .unwrap()
        .query_drop("INSERT INTO t VALUES (99)")
        .await
        .unwrap_err();
    assert!(
        matches!(err, mysql_async::Error::Server(ref e) if e.code == 1290),
        "{err:?}"
    );
}

/// Semi-sync falls back (no replica acks): the view and the metric say so. The primary then
/// dies with a commit no replica has; after the failover it returns with that commit in
/// its history: it stays read-only and out (`detached`, reason: diverged).
#[tokio::test]
async fn semi_sync_fallback_is_reported_and_a_diverged_old_primary_stays_out() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 10).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let (primary, r1) = (sb.primary(), &sb.replicas()[0]);
    let h = spawn(config(&sb, "none", &|_| String::new()));
    h.wait("semi-sync on", |v| {
        v.primary.as_deref() == Some("primary") && v.semi_sync == Some(SemiSync::On)
    })
    .await;
    for r in sb.replicas() {
        exec_admin(r, "STOP SLAVE IO_THREAD").await;
    }
    // Waits rpl_semi_sync_master_timeout (2 s), then commits asynchronously.
    primary
        .conn()
        .await
        .unwrap()
        .query_drop("INSERT INTO t VALUES (11)")
        .await
        .unwrap();
    let v = h.wait("fell back", |v| v.semi_sync == Some(SemiSync::FellBack)).await;
    let reason = v.member("primary").unwrap().reason.clone().unwrap_or_default();
    assert!(reason.contains("fell back"), "{reason}");
    assert!(h
        .metrics
        .encode()
        .contains("osprey_semi_sync{cluster=\"c1\",state=\"fell_back\"} 1"));

    primary.kill();
    h.set_health("primary", HealthState::Down);
    h.wait("promoted", |v| v.primary.as_deref() == Some("replica-1")).await;
    assert_eq!(count_rows(r1).await, 10, "row 11 was never acknowledged by a replica");
    primary.restart().await.unwrap();
    h.set_health("primary", HealthState::Up);
    let v = h
        .wait("old primary detached", |v| {
            v.member("primary")
                .is_some_and(|m| m.role == Role::Detached && m.read_only == Some(true))
        })
        .await;
    let m = v.member("primary").unwrap();
    println!("old primary: {:?}", m.reason);
    assert!(
        m.reason.as_deref().unwrap_or_default().contains("diverged"),
        "{:?}",
        m.reason
    );
    assert_eq!(v.primary.as_deref(), Some("replica-1"));
    assert!(h.events.list(None).iter().all(|e| e.kind != "rejoin"));
}

/// A switchover that cannot finish rolls back: writes that never drain (the old primary is
/// never touched), and a target that cannot catch up (the old primary is made writable
/// again). Either way the old primary is published again and takes writes.
#[tokio::test]
async fn a_switchover_that_cannot_finish_rolls_back() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 1).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let mut cfg = config(&sb, "majority", &|_| String::new());
    cfg.failover.switchover_timeout_ms = 1000;
    let h = spawn(cfg);
    h.wait("topology", |v| v.primary.as_deref() == Some("primary") && v.lock_held)
        .await;
    let switchover = |to: &str| {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let cmd = Command::Switchover {
            to: Some(to.to_owned()),
            reply,
        };
        let tx = h.handle.commands.clone();
        async move {
            tx.send(cmd).await.unwrap();
            rx.await.unwrap()
        }
    };

    h.writes.send_replace(1);
    let err = switchover("replica-1").await.unwrap_err();
    assert!(err.contains("in flight"), "{err}");
    h.writes.send_replace(0);
    let v = h
        .wait("old primary back", |v| v.primary.as_deref() == Some("primary"))
        .await;
    assert_eq!(v.status, ClusterStatus::Ok);
    primary_takes_a_write(sb.primary(), 2).await;

    exec_admin(&sb.replicas()[0], "STOP SLAVE IO_THREAD").await;
    primary_takes_a_write(sb.primary(), 3).await; // replica-1 never receives it
    let err = switchover("replica-1").await.unwrap_err();
    assert!(err.contains("did not catch up"), "{err}");
    h.wait("old primary back", |v| v.primary.as_deref() == Some("primary"))
        .await;
    primary_takes_a_write(sb.primary(), 4).await;
    let ev = h
        .events
        .list(None)
        .into_iter()
        .rfind(|e| e.kind == "switchover")
        .unwrap();
    print_event("rolled back", &ev);
    assert!(!ev.ok);
    assert!(ev.steps.iter().any(|s| s.step == "rollback" && s.ok), "{ev:?}");
    let mut c = sb.replicas()[0].admin_conn().await.unwrap();
    let ro: Option<i64> = c.query_first("SELECT @@read_only").await.unwrap();
    assert_eq!(ro, Some(1), "the target was not promoted");
}

async fn primary_takes_a_write(primary: &Instance, id: i64) {
    let mut c = primary.conn().await.unwrap();
    c.exec_drop("INSERT INTO t VALUES (?)", (id,)).await.unwrap();
}

/// Failovers in a row: each dead primary is restarted (a former replica comes back
/// read-only with no replication, the original primary writable) and rejoins.
#[tokio::test]
async fn failovers_in_a_row_and_each_old_primary_rejoins() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 5).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let h = spawn(config(&sb, "none", &|_| String::new()));
    h.wait("topology", |v| v.primary.as_deref() == Some("primary")).await;
    let mut primary = "primary".to_owned();
    for round in 0..3 {
        let inst = sb.instances().find(|i| i.name() == primary).unwrap();
        inst.kill();
        h.set_health(&primary, HealthState::Down);
        let old = primary.clone();
        let v = h
            .wait("promoted", |v| {
                v.primary.is_some() && v.primary.as_deref() != Some(old.as_str())
            })
            .await;
        let new = v.primary.clone().unwrap();
        inst.restart().await.unwrap();
        h.set_health(&old, HealthState::Up);
        h.wait("old primary rejoined", |v| {
            v.member(&old).is_some_and(|m| {
                m.role == Role::Replica
                    && m.replicates_from.as_deref() == Some(new.as_str())
                    && m.io_running == Some(true)
            })
        })
        .await;
        println!("round {round}: {old} -> {new}, {old} rejoined");
        primary = new;
    }
}

/// A dispatcher that does not hold the lock, while another one runs a switchover: once the
/// primary is read-only (demoted) and before the target is writable, the replicas still
/// follow the old primary. Its write slots must wait, not send writes to a read-only
/// server (each would fail with ER_OPTION_PREVENTS_STATEMENT).
#[tokio::test]
async fn a_read_only_primary_is_not_published_to_the_write_slots() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    // "Another dispatcher" holds the lock on a majority, so ours only follows.
    let mut holders = Vec::new();
    for i in sb.replicas() {
        let mut c = i.admin_conn().await.unwrap();
        let got: Option<i64> = c.query_first("SELECT GET_LOCK('osprey_failover_c1', 0)").await.unwrap();
        assert_eq!(got, Some(1));
        holders.push(c);
    }
    let h = spawn(config(&sb, "majority", &|_| String::new()));
    h.wait("primary published", |v| v.primary.as_deref() == Some("primary"))
        .await;
    assert!(!h.handle.view.borrow().lock_held);
    // The other dispatcher's switchover demotes the primary.
    exec_admin(sb.primary(), "SET GLOBAL read_only = ON").await;
    let v = h.wait("writes held", |v| v.primary.is_none()).await;
    println!("status while the primary is read-only: {:?}", v.status);
    // It reopens (a rolled-back switchover): writes go there again.
    exec_admin(sb.primary(), "SET GLOBAL read_only = OFF").await;
    h.wait("primary published again", |v| v.primary.as_deref() == Some("primary"))
        .await;
    drop(holders);
}

/// Semi-sync waits for one replica's ack. When the one that acked the last commit is
/// `no_promotion` and the electable one never received it, promoting that one loses an
/// acknowledged commit: the provider must not promote, and say why.
#[tokio::test]
async fn an_acknowledged_commit_only_a_no_promotion_replica_has_is_not_thrown_away() {
    init_tracing();
    let sb = Sandbox::start(2).await.unwrap();
    setup_table(&sb, 10).await;
    sb.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let h = spawn(config(&sb, "none", &|name| {
        if name == "replica-2" {
            "no_promotion = true".into()
        } else {
            String::new()
        }
    }));
    h.wait("topology", |v| v.primary.as_deref() == Some("primary")).await;
    // replica-1 stops receiving; the next commit is acked by replica-2 alone.
    exec_admin(&sb.replicas()[0], "STOP SLAVE IO_THREAD").await;
    let mut c = sb.primary().conn().await.unwrap();
    c.query_drop("INSERT INTO t VALUES (11)").await.unwrap();
    let ss: Option<(String, String)> = c
        .query_first("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_yes_tx'")
        .await
        .unwrap();
    println!("acknowledged by semi-sync: {ss:?}");
    drop(c);
    assert_eq!(count_rows(&sb.replicas()[1]).await, 11);
    sb.primary().kill();
    h.set_health("primary", HealthState::Down);
    let v = h
        .wait(
            "failover refused",
            |v| matches!(&v.status, ClusterStatus::NoPrimary(why) if why.contains("not promoting")),
        )
        .await;
    println!("status: {:?}", v.status);
    // Stays so over many rounds (100 ms): replica-1 is never made writable.
    let until = Instant::now() + Duration::from_secs(2);
    let mut rx = h.handle.view.clone();
    while Instant::now() < until {
        let v = rx.borrow_and_update().clone();
        assert_eq!(v.member("replica-1").unwrap().read_only, Some(true), "{:?}", v.status);
        assert_eq!(v.primary, None);
        let _ = tokio::time::timeout_at(until.into(), rx.changed()).await;
    }
    assert!(h.events.list(None).iter().all(|e| e.kind != "failover"));
}

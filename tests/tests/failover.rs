//! The failover fault table, against real MariaDB replication behind fault proxies,
//! with a writer running through Osprey during every fault:
//! primary killed, network cut, flapping network, a short blip (no switch), a replica
//! down (no switch), the old primary back (never a second writer), switchover under
//! load, two clusters at once, every member down, two dispatchers (one promotion), a
//! dispatcher killed mid-switch, and many failovers in a row with no acknowledged
//! write lost.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_client::ErrorCode;
use osprey_sandbox::Sandbox;
use osprey_tests::failover_rig::{
    assert_no_lost_writes, cluster_toml, cluster_view, dispatcher_config, wait_primary, Rig, Writer, FAST,
};
use osprey_tests::fault_proxy::Mode;
use osprey_tests::harness::{wait_for, Dispatcher};
use osprey_tests::pki::TestCa;
use serde_json::Value as Json;

async fn start(rig: &Rig, extra: &str) -> anyhow::Result<Dispatcher> {
    let d = Dispatcher::start_with(dispatcher_config(&rig.cluster_toml("main", extra), "")).await?;
    wait_primary(&d, None, Some("primary"), None, Duration::from_secs(20)).await?;
    Ok(d)
}

async fn events(d: &Dispatcher) -> anyhow::Result<Vec<Json>> {
    Ok(d.admin_get("/cluster/events").await?["events"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

fn kinds(events: &[Json], kind: &str) -> usize {
    events.iter().filter(|e| e["kind"] == kind).count()
}

/// The member that `replica` replicates from, per the dispatcher's view.
async fn source_of(d: &Dispatcher, replica: &str) -> Option<String> {
    let v = cluster_view(d, None).await.ok()?;
    v["members"].as_array()?.iter().find(|m| m["name"] == replica)?["replicates_from"]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_promotes_a_replica_and_loses_no_acknowledged_write() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(50, Duration::from_secs(20)).await?;

    let killed = Instant::now();
    rig.instance("primary").kill();
    let new = wait_primary(&d, None, None, Some("primary"), Duration::from_secs(15)).await?;
    writer.wait_progress(20, Duration::from_secs(15)).await?;
    let report = writer.stop().await?;

    let gap = report.first_ack_after(killed).expect("a write after the kill");
    println!(
        "write gap after kill -9: {gap:?}; new primary {new}; {} acked, {} in flight lost (dispatched), {} undispatched errors",
        report.acked.len(),
        report.dispatched_errors.len(),
        report.undispatched_errors.len()
    );
    assert!(
        report.undispatched_errors.is_empty(),
        "requests that never reached a database must wait through the switch: {:?}",
        report.undispatched_errors
    );
    assert!(report.dispatched_errors.len() <= 1, "{:?}", report.dispatched_errors);
    assert!(gap < Duration::from_secs(3), "write gap {gap:?}");
    let counted = assert_no_lost_writes(rig.instance(&new), &report).await?;
    assert!(counted > 50);

    // The other replica follows the new primary.
    let other = if new == "replica-1" { "replica-2" } else { "replica-1" };
    wait_for(Duration::from_secs(10), "the other replica re-pointed", || async {
        (source_of(&d, other).await.as_deref() == Some(new.as_str())).then_some(())
    })
    .await?;
    let ev = events(&d).await?;
    assert_eq!(kinds(&ev, "failover"), 1, "{ev:?}");
    let steps: Vec<&str> = ev[0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["step"].as_str())
        .collect();
    println!("failover steps: {:?}", ev[0]["steps"]);
    assert!(steps.contains(&"promote"), "{steps:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_cut_of_the_primary_switches_and_the_old_primary_is_fenced_when_it_returns() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(30, Duration::from_secs(20)).await?;

    let cut = Instant::now();
    rig.proxy("primary").set_mode(Mode::Blackhole);
    let new = wait_primary(&d, None, None, Some("primary"), Duration::from_secs(15)).await?;
    writer.wait_progress(20, Duration::from_secs(15)).await?;
    println!("write gap after the cut: {:?}", cut.elapsed());

    // The cut heals: the old primary, still writable on its own, must be fenced.
    rig.proxy("primary").set_mode(Mode::Pass);
    wait_for(Duration::from_secs(10), "old primary fenced read-only", || async {
        let mut c = rig.instance("primary").conn().await.ok()?;
        let ro: Option<u8> = c.query_first("SELECT @@global.read_only").await.ok()?;
        (ro == Some(1)).then_some(())
    })
    .await?;
    writer.wait_progress(20, Duration::from_secs(10)).await?;
    let report = writer.stop().await?;
    assert!(
        report.undispatched_errors.is_empty(),
        "{:?}",
        report.undispatched_errors
    );
    assert_no_lost_writes(rig.instance(&new), &report).await?;
    let v = cluster_view(&d, None).await?;
    assert_eq!(v["primary"], new.as_str());
    assert_eq!(v["write_pool"]["member"], new.as_str());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_network_still_triggers_the_switch() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(20, Duration::from_secs(20)).await?;
    // Blackholed for less than two probe intervals at a time: failures never come three
    // in a row, but three come within the 1 s window.
    rig.proxy("primary").set_mode(Mode::Flap {
        pass: Duration::from_millis(150),
        blackhole: Duration::from_millis(150),
    });
    let new = wait_primary(&d, None, None, Some("primary"), Duration::from_secs(20)).await?;
    rig.proxy("primary").set_mode(Mode::Blackhole);
    writer.wait_progress(20, Duration::from_secs(15)).await?;
    let report = writer.stop().await?;
    assert!(
        report.undispatched_errors.is_empty(),
        "{:?}",
        report.undispatched_errors
    );
    assert_no_lost_writes(rig.instance(&new), &report).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_blip_does_not_switch() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(20, Duration::from_secs(20)).await?;
    // A blip as a real network has it: packets held up (retransmitted), not lost. The
    // probes' 80 ms timeouts fail for ~150 ms — one or two rounds, below fail_threshold = 3
    // within the window — and every byte still arrives.
    rig.proxy("primary").set_mode(Mode::Latency(Duration::from_millis(200)));
    tokio::time::sleep(Duration::from_millis(150)).await;
    rig.proxy("primary").set_mode(Mode::Pass);
    // Several windows later, still the same primary, and writes flow.
    writer.wait_progress(50, Duration::from_secs(15)).await?;
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(2) {
        let v = cluster_view(&d, None).await?;
        assert_eq!(v["primary"], "primary", "a blip must not switch: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = writer.stop().await?;
    assert!(
        report.undispatched_errors.is_empty(),
        "{:?}",
        report.undispatched_errors
    );
    assert_eq!(kinds(&events(&d).await?, "failover"), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_down_is_no_failover() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(20, Duration::from_secs(20)).await?;
    rig.instance("replica-2").kill();
    wait_for(Duration::from_secs(10), "replica-2 marked down", || async {
        let v = cluster_view(&d, None).await.ok()?;
        let h = v["health"]
            .as_array()?
            .iter()
            .find(|h| h["member"] == "replica-2")?
            .clone();
        (h["state"] == "down").then_some(())
    })
    .await?;
    writer.wait_progress(50, Duration::from_secs(10)).await?;
    let v = cluster_view(&d, None).await?;
    assert_eq!(v["primary"], "primary");
    let report = writer.stop().await?;
    assert!(report.undispatched_errors.is_empty() && report.dispatched_errors.is_empty());
    assert_eq!(kinds(&events(&d).await?, "failover"), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_primary_comes_back_read_only_and_rejoins_as_a_replica() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(20, Duration::from_secs(20)).await?;
    rig.instance("primary").kill();
    let new = wait_primary(&d, None, None, Some("primary"), Duration::from_secs(15)).await?;
    writer.wait_progress(20, Duration::from_secs(15)).await?;
    // It restarts writable (nothing in its configuration says otherwise).
    rig.instance("primary").restart().await?;
    wait_for(Duration::from_secs(15), "old primary rejoined as a replica", || async {
        let v = cluster_view(&d, None).await.ok()?;
        let m = v["members"]
            .as_array()?
            .iter()
            .find(|m| m["name"] == "primary")?
            .clone();
        (m["role"] == "replica" && m["replicates_from"] == new.as_str()).then_some(())
    })
    .await?;
    writer.wait_progress(20, Duration::from_secs(10)).await?;
    let report = writer.stop().await?;
    let mut c = rig.instance("primary").conn().await?;
    let ro: u8 = c.query_first("SELECT @@global.read_only").await?.unwrap_or(0);
    assert_eq!(ro, 1, "the old primary never takes a write again");
    assert_eq!(cluster_view(&d, None).await?["write_pool"]["member"], new.as_str());
    assert_no_lost_writes(rig.instance(&new), &report).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchover_under_load_has_zero_client_errors() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(50, Duration::from_secs(20)).await?;
    let t = Instant::now();
    let (code, body) = d
        .admin_post("/cluster/switchover", serde_json::json!({ "to": "replica-1" }))
        .await?;
    println!("switchover answered in {:?}: {body}", t.elapsed());
    assert_eq!(code, 200, "{body}");
    wait_primary(&d, None, Some("replica-1"), None, Duration::from_secs(10)).await?;
    writer.wait_progress(50, Duration::from_secs(10)).await?;
    let report = writer.stop().await?;
    assert!(
        report.undispatched_errors.is_empty() && report.dispatched_errors.is_empty(),
        "a switchover costs no client error: {:?} {:?}",
        report.undispatched_errors,
        report.dispatched_errors
    );
    println!("longest write gap during the switchover: {:?}", report.longest_gap);
    assert_no_lost_writes(rig.instance("replica-1"), &report).await?;
    // The old primary replicates from the new one.
    wait_for(Duration::from_secs(10), "old primary replicating", || async {
        (source_of(&d, "primary").await.as_deref() == Some("replica-1")).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_whose_primaries_die_together_both_switch() -> anyhow::Result<()> {
    let a = Rig::start(2).await?;
    let b = Rig::start(2).await?;
    let clusters = format!("{}{}", a.cluster_toml("a", FAST), b.cluster_toml("b", FAST));
    let d = Dispatcher::start_with(dispatcher_config(&clusters, "")).await?;
    wait_primary(&d, Some("a"), Some("primary"), None, Duration::from_secs(20)).await?;
    wait_primary(&d, Some("b"), Some("primary"), None, Duration::from_secs(20)).await?;
    let wa = Writer::start(d.client_config(), Some("a")).await?;
    let wb = Writer::start(d.client_config(), Some("b")).await?;
    wa.wait_progress(20, Duration::from_secs(20)).await?;
    wb.wait_progress(20, Duration::from_secs(20)).await?;
    a.instance("primary").kill();
    b.instance("primary").kill();
    let na = wait_primary(&d, Some("a"), None, Some("primary"), Duration::from_secs(15)).await?;
    let nb = wait_primary(&d, Some("b"), None, Some("primary"), Duration::from_secs(15)).await?;
    wa.wait_progress(20, Duration::from_secs(15)).await?;
    wb.wait_progress(20, Duration::from_secs(15)).await?;
    let (ra, rb) = (wa.stop().await?, wb.stop().await?);
    assert!(ra.undispatched_errors.is_empty() && rb.undispatched_errors.is_empty());
    assert_no_lost_writes(a.instance(&na), &ra).await?;
    assert_no_lost_writes(b.instance(&nb), &rb).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_every_member_down_fails_at_once_and_recovers() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let client = d.client().await?;
    client.query("SELECT 1", &[]).await?;
    for i in rig.sandbox.instances() {
        i.kill();
    }
    wait_for(Duration::from_secs(10), "every member down", || async {
        let v = cluster_view(&d, None).await.ok()?;
        v["health"]
            .as_array()?
            .iter()
            .all(|h| h["state"] == "down")
            .then_some(())
    })
    .await?;
    let t = Instant::now();
    let err = client.query("SELECT 1", &[]).await.expect_err("no member can serve");
    println!("answer with every member down: {:?} in {:?}", err.code(), t.elapsed());
    assert_eq!(err.code(), ErrorCode::BackendUnavailable);
    assert!(!err.dispatched());
    assert!(t.elapsed() < Duration::from_secs(1), "at once, not after queue_timeout");
    for i in rig.sandbox.instances() {
        i.restart().await?;
    }
    wait_for(Duration::from_secs(30), "service back", || async {
        client.query("SELECT 1", &[]).await.ok().map(|_| ())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_on_one_cluster_promote_once() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let majority = FAST.replace("lock = \"none\"", "lock = \"majority\"");
    let d1 = start(&rig, &majority).await?;
    let d2 = start(&rig, &majority).await?;
    let w1 = Writer::start(d1.client_config(), None).await?;
    w1.wait_progress(20, Duration::from_secs(20)).await?;
    let held: Vec<bool> = vec![
        cluster_view(&d1, None).await?["lock_held"].as_bool().unwrap_or(false),
        cluster_view(&d2, None).await?["lock_held"].as_bool().unwrap_or(false),
    ];
    assert_eq!(
        held.iter().filter(|h| **h).count(),
        1,
        "exactly one lock holder: {held:?}"
    );
    rig.instance("primary").kill();
    let n1 = wait_primary(&d1, None, None, Some("primary"), Duration::from_secs(20)).await?;
    let n2 = wait_primary(&d2, None, None, Some("primary"), Duration::from_secs(20)).await?;
    assert_eq!(n1, n2, "both dispatchers write to the same new primary");
    let w2 = Writer::start(d2.client_config(), None).await?;
    w2.wait_progress(10, Duration::from_secs(10)).await?;
    w1.wait_progress(10, Duration::from_secs(10)).await?;
    let promotions = kinds(&events(&d1).await?, "failover") + kinds(&events(&d2).await?, "failover");
    assert_eq!(promotions, 1, "exactly one promotion");
    let r1 = w1.stop().await?;
    w2.stop().await?;
    assert_no_lost_writes(rig.instance(&n1), &r1).await?;
    // Only one writable member.
    let mut writable = 0;
    for i in rig.sandbox.instances().filter(|i| i.name() != "primary") {
        let mut c = i.conn().await?;
        let ro: u8 = c.query_first("SELECT @@global.read_only").await?.unwrap_or(1);
        writable += usize::from(ro == 0);
    }
    assert_eq!(writable, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_killed_mid_switch_is_repaired_by_the_next_one() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let config = dispatcher_config(&rig.cluster_toml("main", FAST), "");
    let d1 = Dispatcher::spawn_with_env(config.clone(), &[("OSPREY_FAULT_STOP_AFTER", "promote")])?;
    d1.wait_idle(4, Duration::from_secs(30)).await?;
    wait_primary(&d1, None, Some("primary"), None, Duration::from_secs(20)).await?;
    rig.instance("primary").kill();
    // The dispatcher promotes a replica, then dies before re-pointing the other one.
    let mut d1 = d1;
    d1.wait_exit(Duration::from_secs(20)).await?;
    let d2 = Dispatcher::start_with(dispatcher_config(&rig.cluster_toml("main", FAST), "")).await?;
    let new = wait_primary(&d2, None, None, Some("primary"), Duration::from_secs(20)).await?;
    let other = if new == "replica-1" { "replica-2" } else { "replica-1" };
    wait_for(Duration::from_secs(15), "the half-done switch finished", || async {
        (source_of(&d2, other).await.as_deref() == Some(new.as_str())).then_some(())
    })
    .await?;
    let client = d2.client().await?;
    client
        .execute("CREATE TABLE IF NOT EXISTS after_repair (id INT PRIMARY KEY)", &[])
        .await?;
    client.execute("INSERT INTO after_repair VALUES (1)", &[]).await?;
    let mut writable = 0;
    for i in rig.sandbox.instances().filter(|i| i.name() != "primary") {
        let mut c = i.conn().await?;
        let ro: u8 = c.query_first("SELECT @@global.read_only").await?.unwrap_or(1);
        writable += usize::from(ro == 0);
    }
    assert_eq!(writable, 1, "one primary, never two");
    Ok(())
}

/// Many failovers in a row, the old primary rejoining each time: every acknowledged
/// write is on the primary at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_failovers_lose_no_acknowledged_write() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let writer = Writer::start(d.client_config(), None).await?;
    writer.wait_progress(20, Duration::from_secs(20)).await?;
    let mut primary = "primary".to_string();
    let mut gaps = Vec::new();
    for round in 0..10 {
        let killed = Instant::now();
        rig.instance(&primary).kill();
        let new = wait_primary(&d, None, None, Some(&primary), Duration::from_secs(20)).await?;
        writer.wait_progress(10, Duration::from_secs(15)).await?;
        gaps.push(writer.last_ack().saturating_duration_since(killed));
        // Bring the old one back; it must rejoin as a replica before the next round.
        rig.instance(&primary).restart().await?;
        let old = primary.clone();
        wait_for(Duration::from_secs(20), "old primary rejoined", || async {
            let v = cluster_view(&d, None).await.ok()?;
            let m = v["members"]
                .as_array()?
                .iter()
                .find(|m| m["name"] == old.as_str())?
                .clone();
            (m["role"] == "replica" && m["io_running"] == true).then_some(())
        })
        .await?;
        println!("round {round}: {primary} -> {new}");
        primary = new;
    }
    let report = writer.stop().await?;
    let counted = assert_no_lost_writes(rig.instance(&primary), &report).await?;
    println!(
        "10 failovers: {counted} acknowledged writes all present; {} outcome-unknown, {} undispatched errors",
        report.dispatched_errors.len(),
        report.undispatched_errors.len()
    );
    assert!(
        report.undispatched_errors.is_empty(),
        "{:?}",
        report.undispatched_errors
    );
    Ok(())
}

/// `GET /delay` once `replicas` replicas are measured (`ok`, eligible, a delay, read after
/// `after_ms`, unix ms) against the heartbeat of `primary`.
async fn delay_measured(d: &Dispatcher, replicas: usize, primary: &str, after_ms: u64) -> Option<Json> {
    let v = d.admin_get("/delay").await.ok()?;
    let c = &v["clusters"][0];
    let measured = c["replicas"].as_array()?.iter().filter(|r| {
        r["status"] == "ok"
            && r["eligible"] == true
            && r["delay_ms"].is_u64()
            && r["last_active"].as_u64().is_some_and(|t| t > after_ms)
    });
    (c["primary"]["name"] == primary && c["primary"]["status"] == "ok" && measured.count() == replicas).then_some(v)
}

/// Issue 21, item 4: a cluster whose members refuse plain TCP (`require_secure_transport`)
/// is monitored, followed, failed over and delay-probed, because the dispatcher's own
/// connections (monitor, topology provider, failover, delay probe, slow log) use the
/// cluster's `ssl_mode` as the workers do. Before they did, the provider could not read a
/// single member: the monitor marked all three down, no primary was found, no worker
/// became idle, and `Dispatcher::start_with` timed out after 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_requires_secure_transport_is_monitored_fails_over_and_measures_delay() -> anyhow::Result<()> {
    let ca = TestCa::new("db")?;
    // The members are reached as 127.0.0.1: the name verify_identity checks.
    let leaf = ca.server("mariadb", &["127.0.0.1"])?;
    let sandbox = Sandbox::builder()
        .replicas(2)
        .tls(&leaf.cert_file, &leaf.key_file, &ca.cert_file)
        .start()
        .await?;
    // The replicas' IO threads go over TLS (kept by the failover's CHANGE MASTER TO, which
    // names only host, port and credentials); then every server refuses clear TCP. The
    // sandbox's own set-up ran in clear, before this.
    for r in sandbox.replicas() {
        let mut c = r.admin_conn().await?;
        c.query_drop("STOP SLAVE").await?;
        c.query_drop("CHANGE MASTER TO master_ssl=1").await?;
        c.query_drop("START SLAVE").await?;
    }
    sandbox.wait_replicas_caught_up(Duration::from_secs(20)).await?;
    for i in sandbox.instances() {
        i.admin_conn()
            .await?
            .query_drop("SET GLOBAL require_secure_transport=ON")
            .await?;
    }
    // The scene: the monitor account is refused in clear (MariaDB says only "Access
    // denied") and let in over TLS.
    let refused = sandbox.primary().admin_conn().await.expect_err("clear TCP is refused");
    assert!(refused.to_string().contains("1045"), "{refused}");
    let over_tls = mysql_async::OptsBuilder::from_opts(sandbox.primary().admin_opts())
        .ssl_opts(mysql_async::SslOpts::default().with_root_certs(vec![ca.cert_file.clone().into()]));
    mysql_async::Conn::new(over_tls).await?.disconnect().await?;

    // verify_identity: the chain to our CA and the name 127.0.0.1, on every connection.
    let tls = format!(
        "ssl_mode = \"verify_identity\"\nssl_ca = \"{}\"\n\
         delay_period_ms = 200\ndelay_threshold_ms = 1000\ndelay_database = \"osprey_hb\"\n{FAST}",
        ca.cert_file.display()
    );
    let members = sandbox.instances().map(|i| (i.name(), i.port()));
    let clusters = cluster_toml(sandbox.primary(), "main", &tls, members);
    // Any statement of 100 ms is slow (logged), none is blocked.
    let intercept = "[intercept]\nslow_threshold_ms = 100\nslow_count = 1000\n";
    let d = Dispatcher::start_with(dispatcher_config(&clusters, intercept)).await?;

    // The provider reads the topology and the monitor sees every member up.
    wait_primary(&d, None, Some("primary"), None, Duration::from_secs(20)).await?;
    wait_for(Duration::from_secs(10), "every member up", || async {
        let v = cluster_view(&d, None).await.ok()?;
        let h = v["health"].as_array()?.clone();
        (h.len() == 3 && h.iter().all(|h| h["state"] == "up")).then_some(())
    })
    .await?;
    // The delay probe measures both replicas.
    let before = wait_for(Duration::from_secs(10), "both replicas' delay measured", || {
        delay_measured(&d, 2, "primary", 0)
    })
    .await?;
    println!("/delay before the kill: {before}");

    let client = d.client().await?;
    client
        .query("CREATE TABLE IF NOT EXISTS tls_failover (id INT PRIMARY KEY)", &[])
        .await?;
    client.query("INSERT INTO tls_failover VALUES (1)", &[]).await?;

    let killed_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let killed = Instant::now();
    sandbox.primary().kill();
    let new = wait_primary(&d, None, None, Some("primary"), Duration::from_secs(15)).await?;
    println!("failover over TLS to {new} in {:?}", killed.elapsed());

    // Writes go on to the new primary (the workers were over TLS already) …
    client.query("INSERT INTO tls_failover VALUES (2)", &[]).await?;
    // … the other replica is re-pointed at it, over TLS, and its delay is measured
    // against the new primary's heartbeat: rows read after the kill.
    let other = if new == "replica-1" { "replica-2" } else { "replica-1" };
    wait_for(Duration::from_secs(10), "the other replica re-pointed", || async {
        (source_of(&d, other).await.as_deref() == Some(new.as_str())).then_some(())
    })
    .await?;
    let after = wait_for(Duration::from_secs(15), "the other replica's delay measured", || {
        delay_measured(&d, 1, &new, killed_ms)
    })
    .await?;
    println!("/delay after the failover: {after}");
    // The switch is logged once it is over (re-pointing included).
    let ev = wait_for(Duration::from_secs(10), "the failover event", || async {
        let ev = events(&d).await.ok()?;
        (kinds(&ev, "failover") > 0).then_some(ev)
    })
    .await?;
    assert_eq!(kinds(&ev, "failover"), 1, "{ev:?}");

    // The slow log writes to the new primary too (read back through the dispatcher).
    client.query("SELECT SLEEP(0.2)", &[]).await?;
    wait_for(
        Duration::from_secs(10),
        "the slow log row on the new primary",
        || async {
            let r = client
                .query(
                    "SELECT COUNT(*) FROM osprey.slow_log WHERE sample LIKE 'SELECT SLEEP%'",
                    &[],
                )
                .await
                .ok()?;
            (r.rows()[0].get::<i64>(0).ok()? >= 1).then_some(())
        },
    )
    .await?;
    Ok(())
}

/// Sessions at a switchover (issue 22): a session without a transaction ends at once
/// (SESSION_ABORTED, nothing lost); the switchover waits for an open transaction on the
/// old primary, which commits there and is on the new primary afterwards; then the
/// switch completes. Before, every pinned worker counted as a write in flight until its
/// session ended, so one idle session made each switchover roll back at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_ends_idle_sessions_and_waits_for_an_open_transaction() -> anyhow::Result<()> {
    let rig = Rig::start(2).await?;
    let d = start(&rig, FAST).await?;
    let client = d.client().await?;
    client
        .execute("CREATE TABLE sw_tx (id INT PRIMARY KEY, v INT) ENGINE=InnoDB", &[])
        .await?;
    let idle = client.session().await?;
    let tx = client.transaction().await?;
    tx.execute("INSERT INTO sw_tx VALUES (1, 10)", &[]).await?;
    let switch = async {
        let r = d
            .admin_post("/cluster/switchover", serde_json::json!({ "to": "replica-1" }))
            .await;
        (r, Instant::now())
    };
    let meanwhile = async {
        // The idle session ends at once; the switch waits for the transaction.
        let ended = wait_for(Duration::from_secs(5), "the idle session's abort", || async {
            idle.aborted()
        })
        .await?;
        assert_eq!(ended.code(), ErrorCode::SessionAborted, "{ended}");
        assert_eq!(ended.transaction_outcome(), None, "{ended}");
        tokio::time::sleep(Duration::from_millis(800)).await;
        tx.execute("UPDATE sw_tx SET v = 11 WHERE id = 1", &[]).await?;
        tx.commit().await?;
        anyhow::Ok(Instant::now())
    };
    let ((answer, switched), committed) = tokio::join!(switch, meanwhile);
    let (code, body) = answer?;
    assert_eq!(code, 200, "{body}");
    assert!(
        switched >= committed?,
        "the switchover answered only after the transaction committed"
    );
    wait_primary(&d, None, Some("replica-1"), None, Duration::from_secs(10)).await?;
    let mut conn = rig.instance("replica-1").conn().await?;
    let v: Option<i64> = conn.query_first("SELECT v FROM sw_tx WHERE id = 1").await?;
    assert_eq!(
        v,
        Some(11),
        "the transaction committed before the switch is on the new primary"
    );
    // New sessions go to the new primary.
    let after = client.session().await?;
    assert_eq!(after.member(), "replica-1");
    after.close().await?;
    Ok(())
}

/// The bank-transfer invariant (issue 22): 32 clients move money between 100 accounts in
/// interactive transactions (read both balances FOR UPDATE, decide, write both, log the
/// transfer, COMMIT), while two pinned workers are killed (-9) and the primary is killed
/// (a failover). At the end, on the new primary: the total is unchanged; every transfer
/// whose COMMIT was answered is there; every one whose session aborted with its
/// transaction rolled back (or that never reached a database) is not; those whose
/// outcome is unknown are either, and the total says no half of one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_transfers_keep_the_total_through_killed_workers_and_a_failover() -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use osprey_client::{params, TransactionOutcome};

    const ACCOUNTS: i64 = 100;
    const START: i64 = 1000;
    const CLIENTS: u64 = 32;
    let rig = Rig::start(2).await?;
    let d = Dispatcher::start_with(dispatcher_config(
        &rig.cluster_toml("main", FAST),
        "[pool]\nsize = 8\n[sessions]\nmax_per_group = 6\nopen_timeout_ms = 20000\n",
    ))
    .await?;
    wait_primary(&d, None, Some("primary"), None, Duration::from_secs(20)).await?;
    let client = d.client().await?;
    client
        .execute(
            "CREATE TABLE bank (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB",
            &[],
        )
        .await?;
    client
        .execute(
            "CREATE TABLE transfers (id BIGINT PRIMARY KEY, a INT, b INT, amount BIGINT) ENGINE=InnoDB",
            &[],
        )
        .await?;
    let rows: Vec<String> = (1..=ACCOUNTS).map(|i| format!("({i}, {START})")).collect();
    client
        .execute(format!("INSERT INTO bank VALUES {}", rows.join(",")), &[])
        .await?;

    #[derive(Default)]
    struct Outcomes {
        committed: Vec<i64>,
        rolled_back: Vec<i64>,
        unknown: Vec<i64>,
        errors: std::collections::BTreeMap<String, usize>,
    }
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..CLIENTS {
        let (client, outcomes, stop) = (client.clone(), outcomes.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0i64;
            let mut seed = t * 7919 + 17;
            let mut next = move |m: i64| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((seed >> 33) as i64).rem_euclid(m)
            };
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let id = (t as i64) * 1_000_000 + n;
                let a = next(ACCOUNTS) + 1;
                let b = (a + next(ACCOUNTS - 1)) % ACCOUNTS + 1;
                let amount = next(50) + 1;
                let result = async {
                    let tx = client.transaction().await?;
                    let (lo, hi) = (a.min(b), a.max(b));
                    let balances = tx
                        .query_as::<(i64, i64)>(
                            "SELECT id, balance FROM bank WHERE id IN (?, ?) ORDER BY id FOR UPDATE",
                            &params![lo, hi],
                        )
                        .await?;
                    let from = balances.iter().find(|(i, _)| *i == a).map_or(0, |(_, v)| *v);
                    if from < amount {
                        tx.rollback().await?;
                        return Ok(false);
                    }
                    tx.execute(
                        "UPDATE bank SET balance = balance - ? WHERE id = ?",
                        &params![amount, a],
                    )
                    .await?;
                    tx.execute(
                        "UPDATE bank SET balance = balance + ? WHERE id = ?",
                        &params![amount, b],
                    )
                    .await?;
                    tx.execute("INSERT INTO transfers VALUES (?, ?, ?, ?)", &params![id, a, b, amount])
                        .await?;
                    tx.commit().await?;
                    Ok::<bool, osprey_client::Error>(true)
                }
                .await;
                let mut o = outcomes.lock().unwrap();
                if let Err(e) = &result {
                    *o.errors.entry(format!("{} {:?}", e.code(), e.errno())).or_default() += 1;
                }
                match result {
                    Ok(true) => o.committed.push(id),
                    Ok(false) => {}
                    Err(e) => match e.transaction_outcome() {
                        Some(TransactionOutcome::Unknown) => o.unknown.push(id),
                        // Rolled back, or failed before a write: not there.
                        _ if e.code() != ErrorCode::OutcomeUnknown => o.rolled_back.push(id),
                        _ => o.unknown.push(id),
                    },
                }
            }
        }));
    }
    let progress = |n: usize| {
        let outcomes = outcomes.clone();
        wait_for(Duration::from_secs(30), "transfers committing", move || {
            let outcomes = outcomes.clone();
            async move { (outcomes.lock().unwrap().committed.len() >= n).then_some(()) }
        })
    };
    progress(50).await?;
    // Two pinned workers killed mid-transaction.
    for _ in 0..2 {
        let sessions = d.admin_get("/sessions").await?;
        let slot = sessions[0]["slot"].as_u64().expect("a pinned slot");
        let pid = d
            .worker_pids()
            .await?
            .into_iter()
            .find(|(s, _)| *s == slot)
            .and_then(|(_, p)| p)
            .expect("its pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        let before = outcomes.lock().unwrap().committed.len();
        progress(before + 30).await?;
    }
    // The primary dies.
    rig.instance("primary").kill();
    let new = wait_primary(&d, None, None, Some("primary"), Duration::from_secs(20)).await?;
    let before = outcomes.lock().unwrap().committed.len();
    progress(before + 50).await?;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let o = std::mem::take(&mut *outcomes.lock().unwrap());
    println!(
        "transfers: {} committed, {} rolled back or never sent, {} outcome unknown",
        o.committed.len(),
        o.rolled_back.len(),
        o.unknown.len()
    );
    println!("errors: {:?}", o.errors);
    assert!(!o.rolled_back.is_empty(), "the faults aborted some transactions");
    let mut conn = rig.instance(&new).conn().await?;
    use mysql_async::prelude::Queryable;
    let total: i64 = conn
        .query_first("SELECT CAST(SUM(balance) AS SIGNED) FROM bank")
        .await?
        .expect("a sum");
    assert_eq!(total, ACCOUNTS * START, "money was created or lost");
    let present: std::collections::HashSet<i64> = conn
        .query::<i64, _>("SELECT id FROM transfers")
        .await?
        .into_iter()
        .collect();
    let lost: Vec<_> = o.committed.iter().filter(|id| !present.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "committed transfers missing on the new primary: {lost:?}"
    );
    let ghosts: Vec<_> = o.rolled_back.iter().filter(|id| present.contains(id)).collect();
    assert!(
        ghosts.is_empty(),
        "transfers reported rolled back are there: {ghosts:?}"
    );
    let unknown_there = o.unknown.iter().filter(|id| present.contains(id)).count();
    println!("of the unknown, {unknown_there} committed");
    // The balances agree with the log: each account is START plus what it received minus
    // what it sent, over the transfers that are there.
    let log: Vec<(i64, i64, i64)> = conn.query("SELECT a, b, amount FROM transfers").await?;
    let mut expected = vec![START; ACCOUNTS as usize + 1];
    for (a, b, amount) in log {
        expected[a as usize] -= amount;
        expected[b as usize] += amount;
    }
    let balances: Vec<(i64, i64)> = conn.query("SELECT id, balance FROM bank ORDER BY id").await?;
    for (id, balance) in balances {
        assert_eq!(
            balance, expected[id as usize],
            "account {id} disagrees with the transfer log"
        );
    }
    Ok(())
}

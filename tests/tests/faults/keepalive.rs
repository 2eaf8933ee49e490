//! Risks: a link that goes silent (NAT/firewall drop, a frozen peer). Keepalive must find it
//! and close every loop it held.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use osprey_client::{Client, ClientConfig, ErrorCode, Origin};
use osprey_tests::fault_proxy::{FaultProxy, Mode};
use osprey_tests::harness::{process_alive, wait_for};

use crate::{assert_closed_loop, cluster, describe, ms, serial, slots, wait_busy, wait_replaced};

const KEEPALIVE: &str = "[pool]\nsize = 2\n[timeouts]\nkeepalive_interval_ms = 200\nkeepalive_timeout_ms = 800\n";

/// Test 1. Client ↔ dispatcher through a proxy that turns into a blackhole (both sockets
/// stay open, every byte is dropped): the dispatcher closes the connection within its
/// keepalive timeout and frees the worker of the in-flight `SELECT SLEEP(5)` (KILL QUERY:
/// same pid); the SDK declares the link dead, fails the in-flight non-idempotent request
/// with OUTCOME_UNKNOWN, and reconnects once the proxy passes again.
///
/// The SDK's `keepalive_timeout` is 2 s rather than the dispatcher's 0.8 s: otherwise the
/// SDK's own reconnection attempt (a new TCP connection through the proxy, which the
/// dispatcher counts until its handshake timeout) could race with the observation that the
/// dispatcher dropped the dead connection (`clients.connections` == 0). Its ping interval
/// matches (200 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_client_link_blackhole() {
    let _serial = serial().await;
    let c = cluster(KEEPALIVE).await;
    let d = &c.dispatcher;
    let proxy = FaultProxy::start(d.client_addr).await.expect("proxy");
    let mut cfg = ClientConfig::new(proxy.addr().to_string(), d.client_token.clone());
    cfg.keepalive_interval = Duration::from_millis(200);
    cfg.keepalive_timeout = Duration::from_millis(2000);
    cfg.connect_timeout = Duration::from_secs(1);
    cfg.backoff_max = Duration::from_millis(500);
    cfg.connection_wait = Duration::from_secs(15);
    let client = Client::connect(cfg).await.expect("connect through the proxy");
    client.query("SELECT 1", &[]).await.expect("first query");

    // An idle link is kept alive by PINGs: over several keepalive timeouts nothing breaks.
    let calm = Instant::now();
    while calm.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(client.stats().reconnects, 0, "an idle, healthy link was dropped");
    }
    // A busy link is kept alive too: a statement longer than both keepalive timeouts.
    let r = client
        .query("SELECT SLEEP(2.5), 1", &[])
        .await
        .unwrap_or_else(|e| panic!("a long statement through a healthy link: {}", describe(&e)));
    assert_eq!(r.rows()[0].get::<i64>(1).unwrap(), 1);
    assert_eq!(client.stats().reconnects, 0);
    let s = d.status().await.unwrap();
    assert_eq!(s["clients"]["connections"], 1, "{}", s["clients"]);

    let before = slots(d).await;
    let inflight = tokio::spawn({
        let client = client.clone();
        async move {
            let r = client.query("SELECT SLEEP(5)", &[]).await;
            (r, Instant::now())
        }
    });
    let busy = wait_busy(d, Duration::from_secs(5)).await;

    let t0 = Instant::now();
    proxy.set_mode(Mode::Blackhole);

    // The dispatcher drops the silent client: keepalive_timeout (0.8 s) + one tick (0.2 s).
    wait_for(
        Duration::from_secs(3),
        "the dispatcher to drop the silent client",
        || async {
            let s = d.status().await.ok()?;
            (s["clients"]["connections"].as_i64() == Some(0)).then_some(())
        },
    )
    .await
    .unwrap();
    let dropped_ms = ms(t0);
    // Its in-flight stream is closed on the dispatcher side (ERROR + END to nobody).
    wait_for(
        Duration::from_secs(3),
        "the lost client's stream to be closed",
        || async {
            let s = d.status().await.ok()?;
            (s["clients"]["open_streams"].as_i64() == Some(0) && s["streams"]["opened"] == s["streams"]["closed"])
                .then_some(())
        },
    )
    .await
    .unwrap();
    // The worker is freed by KILL QUERY (not killed: same pid), long before SLEEP(5) would have ended.
    let freed = wait_for(
        Duration::from_secs(3),
        "the worker of the lost stream to be idle",
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
    assert_eq!(freed.pid, busy.pid, "the worker was killed instead of cancelled");
    assert!(freed_ms < 3000, "worker freed after {freed_ms} ms");
    println!(
        "keepalive client link: dispatcher dropped the client after {dropped_ms} ms, worker idle after {freed_ms} ms"
    );

    // The SDK finds the dead link and fails the non-idempotent request: OUTCOME_UNKNOWN.
    let (r, at) = tokio::time::timeout(Duration::from_secs(5), inflight)
        .await
        .expect("the SDK must detect the dead link")
        .unwrap();
    let err = r.expect_err("the request cannot have succeeded");
    let sdk_ms = at.duration_since(t0).as_millis();
    println!(
        "keepalive client link: SDK reported {} after {sdk_ms} ms",
        describe(&err)
    );
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{}", describe(&err));
    assert_eq!(err.origin(), Origin::Client, "{}", describe(&err));
    assert!(err.dispatched(), "{}", describe(&err));
    assert!(sdk_ms < 4000, "SDK took {sdk_ms} ms");

    // The blackhole ends: the SDK reconnects and the next query succeeds.
    proxy.set_mode(Mode::Pass);
    let r = client
        .query("SELECT 42", &[])
        .await
        .unwrap_or_else(|e| panic!("after the blackhole: {}", describe(&e)));
    assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 42);
    assert!(client.stats().reconnects >= 1, "{:?}", client.stats());
    let s = assert_closed_loop(&c, &[&client], 2).await;
    let after = slots(d).await;
    assert_eq!(
        before.iter().map(|s| s.pid).collect::<Vec<_>>(),
        after.iter().map(|s| s.pid).collect::<Vec<_>>(),
        "no worker should have been replaced"
    );
    assert_eq!(s["clients"]["connections"], 1, "{}", s["clients"]);
}

/// Test 2. Dispatcher ↔ worker: an idle worker is SIGSTOPped. Within keepalive_timeout the
/// dispatcher declares its link dead, SIGKILLs it (gone from /proc) and refills the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_worker_link_stopped_worker() {
    let _serial = serial().await;
    let c = cluster(KEEPALIVE).await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let before = slots(d).await;
    let victim = before[0].clone();
    let pid = victim.pid.expect("pid");
    // A busy worker is not mistaken for a dead one: it keeps its link alive while a
    // statement longer than keepalive_timeout (0.8 s) runs.
    let r = client
        .query("SELECT SLEEP(2), 1", &[])
        .await
        .unwrap_or_else(|e| panic!("a long statement on a worker: {}", describe(&e)));
    assert_eq!(r.rows()[0].get::<i64>(1).unwrap(), 1);
    assert_eq!(
        slots(d).await.iter().map(|s| s.pid).collect::<Vec<_>>(),
        before.iter().map(|s| s.pid).collect::<Vec<_>>()
    );
    let respawns0 = d.status().await.unwrap()["pool"]["respawns"].as_u64().unwrap();

    let t0 = Instant::now();
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
    // The link is declared dead: the slot leaves `idle`.
    wait_for(
        Duration::from_secs(3),
        "the stopped worker's slot to leave idle",
        || async {
            let s = slots(d).await.into_iter().find(|s| s.slot == victim.slot)?;
            (s.state != "idle" || s.pid != Some(pid)).then_some(())
        },
    )
    .await
    .unwrap();
    let dead_ms = ms(t0);
    let fresh = wait_replaced(d, victim.slot, pid, Duration::from_secs(10)).await;
    let replaced_ms = ms(t0);
    println!(
        "keepalive worker link: stopped worker {pid} declared dead after {dead_ms} ms, slot {} refilled by pid {:?} after {replaced_ms} ms",
        victim.slot, fresh.pid
    );
    // keepalive_timeout 800 ms + a 200 ms tick, with margin for a loaded machine.
    assert!(dead_ms < 2000, "declared dead after {dead_ms} ms");
    wait_for(Duration::from_secs(2), "the stopped worker to be gone", || async {
        (!process_alive(pid) && !std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await
    .expect("the stopped worker was SIGKILLed and reaped");
    let respawns1 = d.status().await.unwrap()["pool"]["respawns"].as_u64().unwrap();
    assert_eq!(respawns1, respawns0 + 1);
    // The other slot is untouched.
    let after = slots(d).await;
    for (b, a) in before.iter().zip(&after).filter(|(b, _)| b.slot != victim.slot) {
        assert_eq!(b.pid, a.pid, "slot {} was disturbed", b.slot);
    }
    for i in 0..6 {
        client.query(format!("SELECT {i}"), &[]).await.unwrap();
    }
    assert_closed_loop(&c, &[&client], 2).await;
}

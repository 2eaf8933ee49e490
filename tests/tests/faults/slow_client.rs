//! Risk: a client that stops reading pins a worker (and dispatcher memory) forever.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use osprey_tests::harness::{rss_kib, wait_for};

use crate::raw::{request, Raw};
use crate::{assert_closed_loop, cluster, describe, ms, serial, slots};

/// Test 7. A raw client asks for ~200 MB of rows and never reads: within a few seconds
/// (client_write_timeout 1 s once the socket buffers are full) the dispatcher cuts it off
/// and the worker goes back to idle through KILL QUERY (same pid), while a normal client's
/// queries keep succeeding throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_client_is_cut_off() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\n[limits]\nclient_write_timeout_ms = 1000\nclient_write_queue = 16\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let rss0 = rss_kib(d.pid()).unwrap();

    // The normal client, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let normal = tokio::spawn({
        let (client, stop, ok) = (client.clone(), stop.clone(), ok.clone());
        async move {
            let mut worst = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let r = client.query("SELECT 'still here'", &[]).await;
                if let Err(e) = r {
                    panic!("the normal client failed: {}", describe(&e));
                }
                worst = worst.max(t.elapsed());
                ok.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            worst
        }
    });

    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    let t0 = Instant::now();
    raw.send(request(1, "SELECT REPEAT('x', 1000) FROM seq_1_to_200000"))
        .await;
    // The big request runs on a worker: the slot that stays busy with the same request
    // count (the normal client's requests are short).
    let busy = wait_for(Duration::from_secs(5), "the big request on a worker", || async {
        let b = slots(d).await.into_iter().find(|s| s.state == "busy")?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = slots(d).await.into_iter().find(|s| s.slot == b.slot)?;
        (again.state == "busy" && again.requests == b.requests).then_some(b)
    })
    .await
    .unwrap();

    // Cut off: only the normal client stays connected.
    wait_for(Duration::from_secs(10), "the stopped client to be cut off", || async {
        let s = d.status().await.ok()?;
        (s["clients"]["connections"].as_i64() == Some(1)).then_some(())
    })
    .await
    .unwrap();
    let cut_ms = ms(t0);
    let freed = wait_for(
        Duration::from_secs(5),
        "the worker of the stopped client to be idle",
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
    let rss1 = rss_kib(d.pid()).unwrap();
    assert_eq!(freed.pid, busy.pid, "the worker was killed instead of cancelled");
    assert!(cut_ms < 8000, "cut off after {cut_ms} ms");
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 0.0);

    // A few more normal requests after the cut-off, then stop the normal client.
    let n = ok.load(Ordering::SeqCst);
    wait_for(Duration::from_secs(5), "more normal requests", || async {
        (ok.load(Ordering::SeqCst) >= n + 5).then_some(())
    })
    .await
    .unwrap();
    stop.store(true, Ordering::SeqCst);
    let worst = normal.await.unwrap();
    println!(
        "stopped client: cut off after {cut_ms} ms, worker idle after {freed_ms} ms; \
         normal client: {} queries ok, slowest {worst:?}; dispatcher RSS {rss0} KiB -> {rss1} KiB",
        ok.load(Ordering::SeqCst)
    );
    // The stopped client's socket is closed by the dispatcher: after what was buffered, EOF.
    let Raw { rd, wr } = raw;
    let mut sock = rd.into_inner().reunite(wr.into_inner()).unwrap();
    let buffered = crate::raw::read_to_close(&mut sock, Duration::from_secs(10))
        .await
        .expect("the dispatcher closed the stopped client's connection");
    println!("stopped client: {buffered} bytes were in flight when it was cut off");
    drop(sock);
    assert_closed_loop(&c, &[&client], 2).await;
}

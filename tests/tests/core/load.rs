//! Tests 5 and 8: recycling under load, live resize under load.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_client::{Client, Value};
use osprey_tests::harness::{process_alive, wait_for};

use crate::{assert_closed_loop, client, cluster, describe};

async fn point_table(c: &osprey_tests::harness::Cluster) {
    let mut db = c.sandbox.primary().conn().await.unwrap();
    db.query_drop("CREATE TABLE point (id INT PRIMARY KEY, v INT NOT NULL)")
        .await
        .unwrap();
    db.query_drop("INSERT INTO point SELECT seq, seq * 7 FROM seq_1_to_100")
        .await
        .unwrap();
}

/// One point select, checked.
async fn point_select(client: &Client, i: u64) -> Result<(), String> {
    let id = (i % 100 + 1) as i64;
    let r = client
        .query("SELECT v FROM point WHERE id = ?", &[Value::Int(id)])
        .await
        .map_err(|e| describe(&e))?;
    match r.rows().first().map(|row| row.get::<i64>(0)) {
        Some(Ok(v)) if v == id * 7 => Ok(()),
        other => Err(format!("id {id}: got {other:?}")),
    }
}

fn counter(s: &serde_json::Value, name: &str) -> u64 {
    s["pool"][name].as_u64().unwrap_or_else(|| panic!("pool.{name} in {s}"))
}

/// Test 5: 20 000 point selects from 64 tasks over a pool of 8 whose workers retire
/// every 50 requests: no client sees an error, and the workers really were recycled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycling_under_load_is_invisible_to_clients() {
    const TOTAL: u64 = 20_000;
    const MAX_REQUESTS: u64 = 50;
    const SIZE: u64 = 8;
    // `pool.pipeline_depth`: the default.
    const PIPELINE_DEPTH: u64 = 8;
    let c = cluster(&format!("[pool]\nsize = {SIZE}\nmax_requests = {MAX_REQUESTS}\n")).await;
    point_table(&c).await;
    let clients: Vec<Client> = futures::future::join_all((0..4).map(|_| client(&c))).await;
    let before = c.dispatcher.status().await.unwrap();

    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let client = clients[t % clients.len()].clone();
            let (next, errors) = (next.clone(), errors.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= TOTAL {
                        break;
                    }
                    if let Err(e) = point_select(&client, i).await {
                        errors.lock().unwrap().push(format!("request {i}: {e}"));
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "{} client-visible errors, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );

    c.dispatcher
        .wait_idle(SIZE as usize, Duration::from_secs(20))
        .await
        .expect("pool back to full size");
    let refs: Vec<&Client> = clients.iter().collect();
    let after = assert_closed_loop(&c, &refs).await;
    let recycles = counter(&after, "recycles") - counter(&before, "recycles");
    let respawns = counter(&after, "respawns") - counter(&before, "respawns");
    println!(
        "{TOTAL} requests in {elapsed:.2?} ({:.0}/s); recycles {recycles}, respawns {respawns}, fatal_exits {}",
        TOTAL as f64 / elapsed.as_secs_f64(),
        counter(&after, "fatal_exits")
    );
    // A worker asks to retire after its 50th request. By then its link may have written
    // the next `pipeline_depth` requests to it (prefetch: the current one and those behind,
    // written as the 50th ended), which it must still serve, so one worker life serves at
    // most 50 + depth requests (with depth 1: one REQUEST crossing the QUIT_REQUEST).
    // 20 000 requests therefore need at least ceil(20000/54) = 371 lives, of which at most
    // 8 (the workers alive at the end) have not retired.
    let bound = TOTAL.div_ceil(MAX_REQUESTS + PIPELINE_DEPTH) - SIZE;
    assert!(recycles >= bound, "recycles {recycles} < {bound}");
    // Every retired worker was replaced (the pool is full and idle again, so no retired
    // worker is still on its way out), and no worker died or was refused for another reason.
    assert_eq!(respawns, recycles, "respawns {respawns} != recycles {recycles}");
    assert_eq!(counter(&after, "fatal_exits"), 0);
    let served: u64 = clients.iter().map(|c| c.stats().streams_opened).sum();
    assert_eq!(served, TOTAL, "one stream per request, no retries");
}

/// Test 8: resize 4 -> 8 -> 2 while 16 tasks query continuously; no client errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_under_load() {
    let c = cluster("[pool]\nsize = 4\n").await;
    let d = &c.dispatcher;
    point_table(&c).await;
    let clients: Vec<Client> = futures::future::join_all((0..2).map(|_| client(&c))).await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let client = clients[t as usize % clients.len()].clone();
            let (stop, done, errors) = (stop.clone(), done.clone(), errors.clone());
            tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::SeqCst) {
                    // A little work on the server so that workers are busy when retired.
                    let r = client
                        .query(
                            "SELECT v, SLEEP(0.005) FROM point WHERE id = ?",
                            &[Value::Int((i % 100 + 1) as i64)],
                        )
                        .await;
                    match r {
                        Ok(r) if r.rows()[0].get::<i64>(0).ok() == Some((i % 100 + 1) as i64 * 7) => {}
                        Ok(r) => errors.lock().unwrap().push(format!("wrong row {:?}", r.rows())),
                        Err(e) => errors.lock().unwrap().push(describe(&e)),
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    i += 16;
                }
            })
        })
        .collect();
    let slots = |n: u64| {
        let d = &d;
        move || async move {
            let s = d.status().await.ok()?;
            let p = &s["pool"];
            let live = p["idle"].as_u64()? + p["busy"].as_u64()?;
            (p["slots"].as_u64()? == n && live == n).then_some(s)
        }
    };
    wait_for(Duration::from_secs(5), "load running", || async {
        (done.load(Ordering::SeqCst) >= 50).then_some(())
    })
    .await
    .unwrap();

    let t = Instant::now();
    d.resize(8).await.unwrap();
    let s = wait_for(Duration::from_secs(15), "8 live workers", slots(8))
        .await
        .unwrap();
    println!(
        "grew to 8 in {:?} ({} requests so far)",
        t.elapsed(),
        done.load(Ordering::SeqCst)
    );
    let eight: HashSet<u64> = s["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["pid"].as_u64())
        .collect();
    assert_eq!(eight.len(), 8);
    let mark = done.load(Ordering::SeqCst);
    wait_for(Duration::from_secs(5), "load continues at 8", || async {
        (done.load(Ordering::SeqCst) >= mark + 50).then_some(())
    })
    .await
    .unwrap();

    let t = Instant::now();
    d.resize(2).await.unwrap();
    let s = wait_for(Duration::from_secs(15), "exactly 2 slots", slots(2))
        .await
        .unwrap();
    println!(
        "shrank to 2 in {:?} ({} requests so far)",
        t.elapsed(),
        done.load(Ordering::SeqCst)
    );
    assert_eq!(s["pool"]["size"], 2, "{}", s["pool"]);
    let two: HashSet<u64> = s["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["pid"].as_u64())
        .collect();
    let mark = done.load(Ordering::SeqCst);
    wait_for(Duration::from_secs(5), "load continues at 2", || async {
        (done.load(Ordering::SeqCst) >= mark + 50).then_some(())
    })
    .await
    .unwrap();
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "{} client errors, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    // The retired workers' processes are gone.
    wait_for(Duration::from_secs(10), "retired workers to exit", || async {
        eight
            .iter()
            .chain(two.iter())
            .filter(|p| !two.contains(p))
            .all(|p| !process_alive(*p as u32))
            .then_some(())
    })
    .await
    .unwrap();
    d.wait_idle(2, Duration::from_secs(5)).await.unwrap();
    println!("{} requests during the resizes", done.load(Ordering::SeqCst));
    let refs: Vec<&Client> = clients.iter().collect();
    let s = assert_closed_loop(&c, &refs).await;
    assert_eq!(s["pool"]["fatal_exits"], 0);
}

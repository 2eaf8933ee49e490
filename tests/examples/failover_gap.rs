//! Measures the write gap of a failover: kill -9 of the primary to the first
//! acknowledged write on the new one, split into detection (kill to the start of the
//! switch, as the switch log stamps it), election + promotion (to the end of the
//! `promote` step) and re-targeting (to the first acknowledged write), over several
//! runs, for a grid of (`interval_ms`, `fail_threshold`).
//!
//! ```sh
//! cargo build --workspace --bins && \
//! cargo run -p osprey-tests --example failover_gap -- --runs 10 --grid 500:3,100:3
//! ```
//! One rig (a primary and two replicas behind fault proxies, semi-sync) per grid point;
//! each run kills the primary, waits for the switch and for writes on the new one, then
//! restarts the killed member (it rejoins as a replica) before the next run.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use osprey_tests::failover_rig::{cluster_view, dispatcher_config, wait_primary, Rig, Writer};
use osprey_tests::harness::{wait_for, Dispatcher};

struct Run {
    detection: f64,
    promotion: f64,
    retarget: f64,
    total: f64,
}

fn unix_ms(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let runs: usize = arg("--runs").map_or(Ok(10), |s| s.parse())?;
    let grid: Vec<(u64, u32)> = arg("--grid")
        .unwrap_or_else(|| "500:3,100:3".into())
        .split(',')
        .map(|p| {
            let (i, k) = p.split_once(':').expect("INTERVAL:THRESHOLD");
            (i.parse().expect("interval"), k.parse().expect("threshold"))
        })
        .collect();
    println!("| interval_ms | fail_threshold | runs | detection ms (median) | election+promotion ms | re-targeting ms | write gap ms median | max |");
    println!("|---|---|---|---|---|---|---|---|");
    for (interval, threshold) in grid {
        let window = interval * (u64::from(threshold) * 2).max(4);
        let health = format!(
            "[cluster.health]\ninterval_ms = {interval}\nwindow_ms = {window}\nfail_threshold = {threshold}\n\
             [cluster.failover]\ncooldown_s = 0\nlock = \"none\"\n"
        );
        let rig = Rig::start(2).await?;
        let d = Dispatcher::start_with(dispatcher_config(&rig.cluster_toml("main", &health), "")).await?;
        wait_primary(&d, None, Some("primary"), None, Duration::from_secs(20)).await?;
        let writer = Writer::start(d.client_config(), None).await?;
        writer.wait_progress(20, Duration::from_secs(20)).await?;
        let mut primary = "primary".to_string();
        let mut results = Vec::new();
        for _ in 0..runs {
            let events_before = d.admin_get("/cluster/events").await?["events"]
                .as_array()
                .map_or(0, |e| e.len());
            let killed_wall = SystemTime::now();
            let killed = Instant::now();
            rig.instance(&primary).kill();
            let new = wait_primary(&d, None, None, Some(&primary), Duration::from_secs(30)).await?;
            wait_for(
                Duration::from_secs(30),
                "a write acknowledged after the kill",
                || async { (writer.last_ack() > killed).then_some(()) },
            )
            .await?;
            let total = writer.last_ack().saturating_duration_since(killed).as_secs_f64() * 1e3;
            // The switch is logged once all its steps ended (re-pointing comes after the
            // new primary is published): wait for it.
            let event = wait_for(Duration::from_secs(15), "the failover in the switch log", || async {
                let events = d.admin_get("/cluster/events").await.ok()?;
                events["events"]
                    .as_array()
                    .and_then(|e| e.get(events_before..))
                    .and_then(|e| e.iter().find(|e| e["kind"] == "failover"))
                    .cloned()
            })
            .await?;
            let started = event["started"].as_f64().unwrap_or(0.0);
            let promote = event["steps"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["step"] == "promote"))
                .and_then(|s| s["at_ms"].as_f64())
                .unwrap_or(0.0);
            let detection = (started - unix_ms(killed_wall)).max(0.0);
            results.push(Run {
                detection,
                promotion: promote,
                retarget: (total - detection - promote).max(0.0),
                total,
            });
            rig.instance(&primary).restart().await?;
            let old = primary.clone();
            wait_for(Duration::from_secs(30), "old primary rejoined", || async {
                let v = cluster_view(&d, None).await.ok()?;
                let m = v["members"]
                    .as_array()?
                    .iter()
                    .find(|m| m["name"] == old.as_str())?
                    .clone();
                (m["role"] == "replica").then_some(())
            })
            .await?;
            primary = new;
        }
        let mut det: Vec<f64> = results.iter().map(|r| r.detection).collect();
        let mut pro: Vec<f64> = results.iter().map(|r| r.promotion).collect();
        let mut ret: Vec<f64> = results.iter().map(|r| r.retarget).collect();
        let mut tot: Vec<f64> = results.iter().map(|r| r.total).collect();
        let max = tot.iter().cloned().fold(0.0, f64::max);
        println!(
            "| {interval} | {threshold} | {runs} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            median(&mut det),
            median(&mut pro),
            median(&mut ret),
            median(&mut tot),
            max
        );
        let report = writer.stop().await?;
        let lost = osprey_tests::failover_rig::assert_no_lost_writes(rig.instance(&primary), &report).await;
        eprintln!(
            "  {} acknowledged writes, lost: {}, outcome-unknown: {}, undispatched errors: {}",
            report.acked.len(),
            if lost.is_ok() { "0".into() } else { format!("{lost:?}") },
            report.dispatched_errors.len(),
            report.undispatched_errors.len()
        );
    }
    Ok(())
}

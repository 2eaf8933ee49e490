//! Dispatcher memory checks: RSS while holding many idle client connections, and
//! RSS growth while one client streams a large result.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use osprey_client::{Client, ClientConfig, Request};

use crate::procs::Dispatcher;

/// `VmRSS` of a process, KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

fn config(d: &Dispatcher) -> ClientConfig {
    let mut cfg = ClientConfig::new(d.client_addr.to_string(), d.client_token.clone());
    cfg.name = "osprey-bench-memory".into();
    cfg
}

/// Opens `n` client connections (one `Client` each, HELLO done), lets them sit idle,
/// and reports the dispatcher's RSS before and while holding them.
pub async fn idle_connections(d: &Dispatcher, n: usize) -> anyhow::Result<serde_json::Value> {
    let before = rss_kib(d.pid())?;
    let started = Instant::now();
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let c = Client::connect(config(d))
            .await
            .with_context(|| format!("connection {i}"))?;
        clients.push(c);
    }
    let opened_in = started.elapsed();
    // Every connection must still work (one round trip each on a sample).
    for c in clients.iter().step_by((n / 50).max(1)) {
        c.query("SELECT 1", &[]).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let holding = rss_kib(d.pid())?;
    drop(clients);
    let per_conn = (holding.saturating_sub(before)) as f64 * 1024.0 / n as f64;
    println!(
        "idle connections: {n} opened in {:.1} s; dispatcher RSS {:.1} MiB before, {:.1} MiB holding them \
         ({:.1} KiB per connection)",
        opened_in.as_secs_f64(),
        before as f64 / 1024.0,
        holding as f64 / 1024.0,
        per_conn / 1024.0
    );
    Ok(serde_json::json!({
        "connections": n, "rss_before_kib": before, "rss_holding_kib": holding,
        "bytes_per_connection": per_conn.round(),
    }))
}

/// Streams `rows` rows of ~200 bytes through one client, reading slowly enough that
/// backpressure matters, and reports the dispatcher's peak RSS growth.
pub async fn stream_rows(d: &Dispatcher, rows: u64) -> anyhow::Result<serde_json::Value> {
    let client = Client::connect(config(d)).await?;
    let before = rss_kib(d.pid())?;
    let mut peak = before;
    let sql = format!("SELECT seq, REPEAT('x', 200) FROM seq_1_to_{rows}");
    let started = std::time::Instant::now();
    let mut stream = client.stream(Request::sql(sql));
    let mut got = 0u64;
    while let Some(item) = stream.next().await {
        if let osprey_client::StreamItem::Row(_) = item? {
            got += 1;
            if got.is_multiple_of(10_000) {
                peak = peak.max(rss_kib(d.pid())?);
            }
        }
    }
    anyhow::ensure!(got == rows, "streamed {got} rows, expected {rows}");
    let secs = started.elapsed().as_secs_f64();
    let growth = peak.saturating_sub(before);
    println!(
        "streaming {rows} rows: {:.0} ms ({:.0} rows/s); dispatcher RSS {:.1} MiB before, peak {:.1} MiB (+{:.1} MiB)",
        secs * 1000.0,
        rows as f64 / secs,
        before as f64 / 1024.0,
        peak as f64 / 1024.0,
        growth as f64 / 1024.0
    );
    Ok(serde_json::json!({
        "rows": rows,
        "ms": secs * 1000.0,
        "rss_before_kib": before,
        "rss_peak_kib": peak,
        "growth_kib": growth
    }))
}

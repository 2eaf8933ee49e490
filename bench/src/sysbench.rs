//! `--sysbench TESTS`: sysbench's own OLTP tests through the MySQL protocol, side by side:
//! straight at the primary (`direct`), through HAProxy in TCP mode (`haproxy`) and
//! through Osprey's MySQL port (`osprey`, `--workers` workers), alternated `--pairs` times
//! so that a ratio is read over several pairs (worst and median), never one lucky run.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use osprey_sandbox::Instance;

use crate::cpu::{self, Snapshot, Watched};
use crate::stats::median;

/// One sysbench run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SbRun {
    pub test: String,
    pub threads: usize,
    pub target: &'static str,
    pub pair: usize,
    pub qps: f64,
    pub tps: f64,
    pub avg_ms: f64,
    pub p95_ms: f64,
    pub errors: u64,
    /// CPU µs per query of the proxy in between (the dispatcher and its workers; HAProxy).
    pub proxy_cpu_us: Option<f64>,
    pub mariadb_cpu_us: Option<f64>,
}

pub struct Endpoint {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub user: String,
    pub password: String,
}

fn args(test: &str, e: &Endpoint, db: &str, threads: usize, secs: f64, command: &str) -> Vec<String> {
    vec![
        test.to_string(),
        format!("--mysql-host={}", e.addr.ip()),
        format!("--mysql-port={}", e.addr.port()),
        format!("--mysql-user={}", e.user),
        format!("--mysql-password={}", e.password),
        format!("--mysql-db={db}"),
        "--tables=4".into(),
        "--table-size=10000".into(),
        format!("--threads={threads}"),
        format!("--time={}", secs.ceil() as u64),
        "--report-interval=0".into(),
        "--db-ps-mode=auto".into(),
        command.to_string(),
    ]
}

fn sysbench(args: &[String]) -> anyhow::Result<String> {
    let out = Command::new("sysbench")
        .args(args)
        .output()
        .context("running sysbench")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || text.contains("FATAL") {
        bail!(
            "sysbench {}: {}{}",
            args.join(" "),
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}

fn figure(out: &str, label: &str, field: usize) -> f64 {
    out.lines()
        .find(|l| l.trim_start().starts_with(label))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| {
            v.split(|c: char| c.is_whitespace() || c == '(')
                .filter(|s| !s.is_empty())
                .nth(field)
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Creates the tables once, straight on the primary.
pub fn prepare(primary: &Endpoint, db: &str) -> anyhow::Result<()> {
    sysbench(&args("oltp_read_write", primary, db, 4, 1.0, "cleanup")).ok();
    sysbench(&args("oltp_read_write", primary, db, 4, 1.0, "prepare"))?;
    Ok(())
}

/// Runs every (test, threads) over `pairs` alternated rounds of `endpoints`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    tests: &[String],
    threads: &[usize],
    pairs: usize,
    secs: f64,
    endpoints: &[Endpoint],
    db: &str,
    primary: &Instance,
    dispatcher: Option<u32>,
    haproxy: Option<u32>,
) -> anyhow::Result<Vec<SbRun>> {
    let mut runs = Vec::new();
    for test in tests {
        for &n in threads {
            for pair in 0..pairs {
                // Alternate the order: the first of a pair never always gets the warm cache.
                let order: Vec<&Endpoint> = if pair % 2 == 0 {
                    endpoints.iter().collect()
                } else {
                    endpoints.iter().rev().collect()
                };
                for e in order {
                    let watched = Watched {
                        dispatcher: (e.name == "osprey").then_some(dispatcher).flatten(),
                        mariadb: primary.pid(),
                        haproxy: (e.name == "haproxy").then_some(haproxy).flatten(),
                    };
                    let before = Snapshot::take(&watched);
                    let out = sysbench(&args(test, e, db, n, secs, "run"))?;
                    let after = Snapshot::take(&watched);
                    let c = cpu::delta(&before, &after);
                    let queries = figure(&out, "queries:", 0).max(1.0);
                    let per = |s: Option<f64>| s.map(|s| s * 1e6 / queries);
                    let proxy = match e.name {
                        "osprey" => per(Some(
                            c.dispatcher.map_or(0.0, |u| u.cpu_s()) + c.workers.map_or(0.0, |u| u.cpu_s()),
                        )),
                        "haproxy" => per(c.haproxy.map(|u| u.cpu_s())),
                        _ => None,
                    };
                    let r = SbRun {
                        test: test.clone(),
                        threads: n,
                        target: e.name,
                        pair,
                        qps: figure(&out, "queries:", 1),
                        tps: figure(&out, "transactions:", 1),
                        avg_ms: figure(&out, "avg:", 0),
                        p95_ms: figure(&out, "95th percentile:", 0),
                        errors: figure(&out, "ignored errors:", 0) as u64,
                        proxy_cpu_us: proxy,
                        mariadb_cpu_us: per(c.mariadb.map(|u| u.cpu_s())),
                    };
                    eprintln!(
                        "sysbench {test} threads={n} pair={pair} {}: {:.0} q/s, avg {:.2} ms, p95 {:.2} ms, ignored errors {}",
                        e.name, r.qps, r.avg_ms, r.p95_ms, r.errors
                    );
                    runs.push(r);
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }
    Ok(runs)
}

/// The table: per (test, threads) the median q/s of each target, and Osprey's ratios to
/// the others per pair, worst and median.
pub fn print(runs: &[SbRun]) {
    let mut keys: Vec<(String, usize)> = runs.iter().map(|r| (r.test.clone(), r.threads)).collect();
    keys.dedup();
    println!();
    println!(
        "| test | threads | direct q/s | haproxy q/s | osprey q/s | osprey/direct worst · median | osprey/haproxy worst · median | p95 ms direct · haproxy · osprey | proxy CPU µs/query haproxy · osprey |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (test, threads) in keys {
        let of = |t: &str| -> Vec<&SbRun> {
            runs.iter()
                .filter(|r| r.test == test && r.threads == threads && r.target == t)
                .collect()
        };
        let (d, h, o) = (of("direct"), of("haproxy"), of("osprey"));
        let med = |v: &[&SbRun], f: fn(&SbRun) -> f64| median(&v.iter().map(|r| f(r)).collect::<Vec<_>>());
        let ratios = |base: &[&SbRun]| -> (f64, f64) {
            let r: Vec<f64> = o
                .iter()
                .filter_map(|x| base.iter().find(|b| b.pair == x.pair).map(|b| x.qps / b.qps))
                .collect();
            let worst = r.iter().copied().fold(f64::INFINITY, f64::min);
            (worst, median(&r))
        };
        let (dw, dm) = ratios(&d);
        let (hw, hm) = ratios(&h);
        let cpu = |v: &[&SbRun]| median(&v.iter().filter_map(|r| r.proxy_cpu_us).collect::<Vec<_>>());
        println!(
            "| {test} | {threads} | {:.0} | {:.0} | {:.0} | {dw:.2} · {dm:.2} | {hw:.2} · {hm:.2} | {:.2} · {:.2} · {:.2} | {:.0} · {:.0} |",
            med(&d, |r| r.qps),
            med(&h, |r| r.qps),
            med(&o, |r| r.qps),
            med(&d, |r| r.p95_ms),
            med(&h, |r| r.p95_ms),
            med(&o, |r| r.p95_ms),
            cpu(&h),
            cpu(&o),
        );
    }
}

//! Results: the JSON record, the table and the headline ratios.

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::cpu::CpuSeconds;
use crate::workload::{TaskOut, Workload};
use crate::{Args, Target};

/// CPU µs per query of each process; `null` where the process is not on the target's path.
#[derive(Debug, Clone, Serialize)]
pub struct CpuPerQuery {
    pub loadgen: Option<f64>,
    pub dispatcher: Option<f64>,
    pub workers: Option<f64>,
    pub mariadb: Option<f64>,
    pub haproxy: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub target: &'static str,
    pub workload: &'static str,
    pub clients: usize,
    pub qps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub errors: u64,
    /// Queries completed without error in the window.
    pub queries: u64,
    /// Length of the timed window, seconds.
    pub window_s: f64,
    /// 1-minute load average at the end of the window (includes this run's own processes).
    pub load1: f64,
    /// Cores used by processes outside this benchmark during the window (noise).
    pub background_cores: f64,
    /// Cores stolen by the hypervisor during the window.
    pub steal_cores: f64,
    pub cpu_us_per_query: CpuPerQuery,
}

impl RunResult {
    pub fn new(
        target: Target,
        wl: Workload,
        clients: usize,
        window_s: f64,
        load1: f64,
        out: &TaskOut,
        cpu: &CpuSeconds,
    ) -> RunResult {
        let q = |p: f64| if out.ok == 0 { 0 } else { out.hist.value_at_quantile(p) };
        RunResult {
            target: target.name(),
            workload: wl.name(),
            clients,
            qps: out.ok as f64 / window_s,
            p50_us: q(0.50),
            p99_us: q(0.99),
            p999_us: q(0.999),
            errors: out.errors,
            queries: out.ok,
            window_s,
            load1,
            background_cores: (cpu.background / window_s * 100.0).round() / 100.0,
            steal_cores: (cpu.steal / window_s * 100.0).round() / 100.0,
            cpu_us_per_query: per_query(target, cpu, out.ok),
        }
    }
}

/// CPU µs per query of the processes on `target`'s path.
fn per_query(target: Target, cpu: &CpuSeconds, queries: u64) -> CpuPerQuery {
    let us = |s: Option<f64>| s.filter(|_| queries > 0).map(|s| s * 1e6 / queries as f64);
    let osprey = matches!(target, Target::Osprey | Target::OspreyD1 | Target::OspreyTls);
    CpuPerQuery {
        loadgen: us(Some(cpu.loadgen)),
        dispatcher: us(cpu.dispatcher.filter(|_| osprey)),
        workers: us(cpu.workers.filter(|_| osprey)),
        mariadb: us(cpu.mariadb),
        haproxy: us(cpu.haproxy.filter(|_| target == Target::Haproxy)),
    }
}

fn cmd_output(cmd: &str, args: &[&str]) -> Option<String> {
    let o = std::process::Command::new(cmd).args(args).output().ok()?;
    String::from_utf8(o.stdout).ok()
}

fn cpu_model() -> String {
    let from_lscpu = cmd_output("lscpu", &[]).and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("Model name:"))
            .map(|l| l["Model name:".len()..].trim().to_owned())
    });
    from_lscpu
        .or_else(|| {
            std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

pub fn machine(args: &Args, mariadb: &str, haproxy: Option<String>, load_start: &str, load_end: &str) -> Json {
    let mem_gib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let kb: f64 = s
            .lines()
            .find(|l| l.starts_with("MemTotal:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some((kb / 1024.0 / 1024.0 * 10.0).round() / 10.0)
    });
    json!({
        "cpu_model": cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "mem_gib": mem_gib,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "mariadb": mariadb,
        "haproxy": haproxy,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "workers": args.workers,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rows": args.rows,
    })
}

fn opt(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".into(),
    }
}

pub fn print_table(results: &[RunResult]) {
    println!();
    println!(
        "{:<16} {:<13} {:>7} {:>9} {:>8} {:>8} {:>8} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>8}",
        "target",
        "workload",
        "clients",
        "q/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "errors",
        "loadgen",
        "disp",
        "workers",
        "mariadb",
        "haproxy",
        "bg cores"
    );
    println!("{:82} | CPU µs per query, by process (loadgen = this tool)", "");
    for r in results {
        let c = &r.cpu_us_per_query;
        println!(
            "{:<16} {:<13} {:>7} {:>9.0} {:>8} {:>8} {:>8} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>8.2}",
            r.target,
            r.workload,
            r.clients,
            r.qps,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.errors,
            opt(c.loadgen),
            opt(c.dispatcher),
            opt(c.workers),
            opt(c.mariadb),
            opt(c.haproxy),
            r.background_cores,
        );
    }
}

fn find<'a>(results: &'a [RunResult], target: &str, wl: &str, clients: usize) -> Option<&'a RunResult> {
    results
        .iter()
        .find(|r| r.target == target && r.workload == wl && r.clients == clients)
}

fn ratio(results: &[RunResult], a: &str, b: &str, wl: &str, clients: usize) -> String {
    match (find(results, a, wl, clients), find(results, b, wl, clients)) {
        (Some(x), Some(y)) if y.qps > 0.0 => format!("{:.2}  ({:.0} / {:.0} q/s)", x.qps / y.qps, x.qps, y.qps),
        _ => "n/a".into(),
    }
}

pub fn print_headlines(results: &[RunResult]) {
    const P: &str = "point-select";
    println!();
    println!("headline (point-select):");
    println!(
        "  osprey/direct          throughput, C=64:   {}",
        ratio(results, "osprey", "direct", P, 64)
    );
    println!(
        "  osprey/direct          throughput, C=1000: {}",
        ratio(results, "osprey", "direct", P, 1000)
    );
    println!(
        "  osprey/direct-unpooled throughput, C=1000: {}",
        ratio(results, "osprey", "direct-unpooled", P, 1000)
    );
    println!(
        "  osprey/haproxy         throughput, C=64:   {}",
        ratio(results, "osprey", "haproxy", P, 64)
    );
    for c in [1, 64] {
        if find(results, "osprey-tls", P, c).is_some() {
            println!(
                "  osprey-tls/osprey      throughput, C={c:<4} {}",
                ratio(results, "osprey-tls", "osprey", P, c)
            );
        }
    }
    let disp = find(results, "osprey", P, 64).and_then(|r| r.cpu_us_per_query.dispatcher);
    println!("  dispatcher CPU per request, C=64:          {} µs", opt(disp));
    match (find(results, "osprey", P, 1), find(results, "direct", P, 1)) {
        (Some(o), Some(d)) => println!(
            "  added p50 latency, C=1 (osprey - direct):  {} µs  ({} - {})",
            o.p50_us as i64 - d.p50_us as i64,
            o.p50_us,
            d.p50_us
        ),
        _ => println!("  added p50 latency, C=1 (osprey - direct):  n/a"),
    }
}

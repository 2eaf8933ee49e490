//! Results: the JSON record, the tables and the headline ratios.

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::cpu::{Delta, Usage};
use crate::wakeup::WakeupCost;
use crate::workload::{TaskOut, Workload};
use crate::{Args, Target};

/// CPU µs per query of each process group (user + system); `null` where the group is not
/// on the target's path.
#[derive(Debug, Clone, Serialize)]
pub struct CpuPerQuery {
    pub loadgen: Option<f64>,
    pub dispatcher: Option<f64>,
    pub workers: Option<f64>,
    pub mariadb: Option<f64>,
    pub haproxy: Option<f64>,
}

/// What one process group spent per query.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GroupPerQuery {
    pub user_us: f64,
    pub system_us: f64,
    /// The group's threads blocked and were woken again: about one per sleep.
    pub voluntary_cs: f64,
    /// The group's threads were preempted while runnable.
    pub involuntary_cs: f64,
}

/// Per query, by process group (`null` where not on the target's path), and the machine's
/// context switches per query (every process, this run's and anyone else's).
#[derive(Debug, Clone, Serialize)]
pub struct PerQuery {
    pub loadgen: Option<GroupPerQuery>,
    pub dispatcher: Option<GroupPerQuery>,
    pub workers: Option<GroupPerQuery>,
    pub mariadb: Option<GroupPerQuery>,
    pub haproxy: Option<GroupPerQuery>,
    pub machine_cs: Option<f64>,
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
    pub per_query: PerQuery,
}

impl RunResult {
    pub fn new(
        target: Target,
        wl: Workload,
        clients: usize,
        window_s: f64,
        load1: f64,
        out: &TaskOut,
        usage: &Delta,
    ) -> RunResult {
        let q = |p: f64| if out.ok == 0 { 0 } else { out.hist.value_at_quantile(p) };
        let per_query = per_query(target, usage, out.ok);
        let total = |g: Option<GroupPerQuery>| g.map(|g| g.user_us + g.system_us);
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
            background_cores: (usage.background / window_s * 100.0).round() / 100.0,
            steal_cores: (usage.steal / window_s * 100.0).round() / 100.0,
            cpu_us_per_query: CpuPerQuery {
                loadgen: total(per_query.loadgen),
                dispatcher: total(per_query.dispatcher),
                workers: total(per_query.workers),
                mariadb: total(per_query.mariadb),
                haproxy: total(per_query.haproxy),
            },
            per_query,
        }
    }
}

/// Usage per query of the groups on `target`'s path.
fn per_query(target: Target, usage: &Delta, queries: u64) -> PerQuery {
    let n = queries as f64;
    let per = |u: Option<Usage>| {
        u.filter(|_| queries > 0).map(|u| GroupPerQuery {
            user_us: u.user_s * 1e6 / n,
            system_us: u.system_s * 1e6 / n,
            voluntary_cs: u.voluntary as f64 / n,
            involuntary_cs: u.involuntary as f64 / n,
        })
    };
    let osprey = matches!(target, Target::Osprey | Target::OspreyD1 | Target::OspreyTls);
    PerQuery {
        loadgen: per(Some(usage.loadgen)),
        dispatcher: per(usage.dispatcher.filter(|_| osprey)),
        workers: per(usage.workers.filter(|_| osprey)),
        mariadb: per(usage.mariadb),
        haproxy: per(usage.haproxy.filter(|_| target == Target::Haproxy)),
        machine_cs: (queries > 0).then(|| usage.machine_ctxt as f64 / n),
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

pub fn machine(
    args: &Args,
    wakeup: Option<&WakeupCost>,
    mariadb: &str,
    haproxy: Option<String>,
    load_start: &str,
    load_end: &str,
) -> Json {
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
        "wakeup": wakeup,
    })
}

fn opt(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".into(),
    }
}

/// Context switches per query: two decimals (they are around 1).
fn cs(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    }
}

/// The header of the text report: the machine's wake-up cost.
pub fn print_header(wakeup: Option<&WakeupCost>) {
    println!();
    match wakeup {
        Some(w) => println!("{}", w.text()),
        None => println!("wake-up cost: not measured (--wakeup-rounds 0)"),
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

type GroupOf = fn(&PerQuery) -> Option<GroupPerQuery>;

const GROUPS: [(&str, GroupOf); 5] = [
    ("loadgen", |p| p.loadgen),
    ("dispatcher", |p| p.dispatcher),
    ("workers", |p| p.workers),
    ("mariadb", |p| p.mariadb),
    ("haproxy", |p| p.haproxy),
];

/// Per query, by process group: user and system CPU µs, voluntary and involuntary context
/// switches; and the whole machine's context switches. Groups on no run's path are left out.
pub fn print_per_query(results: &[RunResult]) {
    let groups: Vec<(&str, GroupOf)> = GROUPS
        .into_iter()
        .filter(|(_, g)| results.iter().any(|r| g(&r.per_query).is_some()))
        .collect();
    println!();
    println!(
        "per query, by process group: CPU µs in user (usr) and system (sys) mode, context switches \
         voluntary (vol: blocked, then woken) and involuntary (inv: preempted); machine = every \
         process's context switches (/proc/stat ctxt)"
    );
    let mut head = format!("{:<16} {:<13} {:>7} {:>9}", "", "", "", "");
    let mut sub = format!("{:<16} {:<13} {:>7} {:>9}", "target", "workload", "clients", "q/s");
    for (name, _) in &groups {
        head.push_str(&format!(" | {name:<23}"));
        sub.push_str(&format!(" | {:>5} {:>5} {:>5} {:>5}", "usr", "sys", "vol", "inv"));
    }
    head.push_str(" | machine");
    sub.push_str(&format!(" | {:>7}", "cs"));
    println!("{head}");
    println!("{sub}");
    for r in results {
        let mut line = format!("{:<16} {:<13} {:>7} {:>9.0}", r.target, r.workload, r.clients, r.qps);
        for (_, g) in &groups {
            let g = g(&r.per_query);
            line.push_str(&format!(
                " | {:>5} {:>5} {:>5} {:>5}",
                opt(g.map(|g| g.user_us)),
                opt(g.map(|g| g.system_us)),
                cs(g.map(|g| g.voluntary_cs)),
                cs(g.map(|g| g.involuntary_cs)),
            ));
        }
        line.push_str(&format!(" | {:>7}", cs(r.per_query.machine_cs)));
        println!("{line}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_query_splits_and_filters_by_path() {
        let usage = Delta {
            loadgen: Usage {
                user_s: 0.010,
                system_s: 0.005,
                voluntary: 1000,
                involuntary: 10,
            },
            dispatcher: Some(Usage {
                user_s: 0.02,
                ..Usage::default()
            }),
            haproxy: Some(Usage::default()),
            machine_ctxt: 4000,
            ..Delta::default()
        };
        let p = per_query(Target::Osprey, &usage, 1000);
        let l = p.loadgen.expect("loadgen");
        assert!(
            (l.user_us - 10.0).abs() < 1e-9 && (l.system_us - 5.0).abs() < 1e-9,
            "{l:?}"
        );
        assert_eq!((l.voluntary_cs, l.involuntary_cs), (1.0, 0.01));
        assert!((p.dispatcher.expect("disp").user_us - 20.0).abs() < 1e-9);
        assert!(p.haproxy.is_none(), "haproxy is not on osprey's path");
        assert!(p.workers.is_none(), "not watched");
        assert_eq!(p.machine_cs, Some(4.0));
        let p = per_query(Target::Haproxy, &usage, 1000);
        assert!(p.dispatcher.is_none() && p.haproxy.is_some());
        let p = per_query(Target::Direct, &usage, 0);
        assert!(p.loadgen.is_none() && p.machine_cs.is_none());
    }
}

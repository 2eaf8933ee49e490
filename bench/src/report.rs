//! Results: the JSON record, the tables, the ratios over the rounds and the headline.

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::cpu::{Delta, Usage};
use crate::stats::{self, Spread};
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
    /// The round (`--pairs`), from 0; odd rounds run the targets in reverse order.
    pub pair: usize,
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
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        target: Target,
        wl: Workload,
        clients: usize,
        pair: usize,
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
            pair,
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
        "pairs": args.rounds(),
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
        "{:<16} {:<13} {:>7} {:>3} {:>9} {:>8} {:>8} {:>8} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>8}",
        "target",
        "workload",
        "clients",
        "rnd",
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
    println!("{:86} | CPU µs per query, by process (loadgen = this tool)", "");
    for r in results {
        let c = &r.cpu_us_per_query;
        println!(
            "{:<16} {:<13} {:>7} {:>3} {:>9.0} {:>8} {:>8} {:>8} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>8.2}",
            r.target,
            r.workload,
            r.clients,
            r.pair,
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
    let mut head = format!("{:<16} {:<13} {:>7} {:>3} {:>9}", "", "", "", "", "");
    let mut sub = format!(
        "{:<16} {:<13} {:>7} {:>3} {:>9}",
        "target", "workload", "clients", "rnd", "q/s"
    );
    for (name, _) in &groups {
        head.push_str(&format!(" | {name:<23}"));
        sub.push_str(&format!(" | {:>5} {:>5} {:>5} {:>5}", "usr", "sys", "vol", "inv"));
    }
    head.push_str(" | machine");
    sub.push_str(&format!(" | {:>7}", "cs"));
    println!("{head}");
    println!("{sub}");
    for r in results {
        let mut line = format!(
            "{:<16} {:<13} {:>7} {:>3} {:>9.0}",
            r.target, r.workload, r.clients, r.pair, r.qps
        );
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

/// The ratios of q/s reported over the rounds.
pub const RATIOS: [(&str, &str); 3] = [("osprey", "direct"), ("osprey", "haproxy"), ("haproxy", "direct")];

/// One ratio of q/s over the rounds of one (workload, clients) cell.
#[derive(Debug, Clone, Serialize)]
pub struct RatioSummary {
    pub workload: &'static str,
    pub clients: usize,
    /// `osprey/direct`, `osprey/haproxy` or `haproxy/direct`.
    pub ratio: String,
    #[serde(flatten)]
    pub spread: Spread,
}

/// Per round, `a`'s q/s over `b`'s in that round, in round order; rounds where either is
/// missing are skipped.
fn per_round(results: &[RunResult], a: &str, b: &str, wl: &str, clients: usize) -> Vec<f64> {
    results
        .iter()
        .filter(|x| x.target == a && x.workload == wl && x.clients == clients)
        .filter_map(|x| {
            let y = results
                .iter()
                .find(|y| y.target == b && y.workload == wl && y.clients == clients && y.pair == x.pair)?;
            Some(x.qps / y.qps)
        })
        .collect()
}

/// The (workload, clients) cells in run order.
fn cells(results: &[RunResult]) -> Vec<(&'static str, usize)> {
    let mut out: Vec<(&'static str, usize)> = Vec::new();
    for r in results {
        if !out.contains(&(r.workload, r.clients)) {
            out.push((r.workload, r.clients));
        }
    }
    out
}

pub fn ratios(results: &[RunResult]) -> Vec<RatioSummary> {
    let mut out = Vec::new();
    for (wl, clients) in cells(results) {
        for (a, b) in RATIOS {
            if let Some(spread) = Spread::of(&per_round(results, a, b, wl, clients)) {
                out.push(RatioSummary {
                    workload: wl,
                    clients,
                    ratio: format!("{a}/{b}"),
                    spread,
                });
            }
        }
    }
    out
}

/// The ratios of q/s, each as the median over the rounds and its range (worst..best).
pub fn print_ratios(ratios: &[RatioSummary], rounds: usize) {
    if ratios.is_empty() {
        return;
    }
    let names: Vec<String> = RATIOS
        .iter()
        .map(|(a, b)| format!("{a}/{b}"))
        .filter(|n| ratios.iter().any(|r| &r.ratio == n))
        .collect();
    println!();
    if rounds > 1 {
        println!("q/s ratios over {rounds} rounds (target order reversed every other round): median (worst..best)");
    } else {
        println!("q/s ratios, one round (--pairs N for a median and a range over N rounds)");
    }
    let mut head = format!("{:<13} {:>7}", "workload", "clients");
    for n in &names {
        head.push_str(&format!("   {n:<20}"));
    }
    println!("{}", head.trim_end());
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for r in ratios {
        if seen.contains(&(r.workload, r.clients)) {
            continue;
        }
        seen.push((r.workload, r.clients));
        let mut line = format!("{:<13} {:>7}", r.workload, r.clients);
        for n in &names {
            let cell = ratios
                .iter()
                .find(|x| x.workload == r.workload && x.clients == r.clients && &x.ratio == n)
                .map_or_else(|| "n/a".to_owned(), |x| x.spread.text());
            line.push_str(&format!("   {cell:<20}"));
        }
        println!("{}", line.trim_end());
    }
}

/// The runs of one target in one cell, every round.
fn runs<'a>(results: &'a [RunResult], target: &str, wl: &str, clients: usize) -> Vec<&'a RunResult> {
    results
        .iter()
        .filter(|r| r.target == target && r.workload == wl && r.clients == clients)
        .collect()
}

fn ratio(results: &[RunResult], a: &str, b: &str, wl: &str, clients: usize) -> String {
    let med = |t: &str| stats::median(&runs(results, t, wl, clients).iter().map(|r| r.qps).collect::<Vec<_>>());
    match Spread::of(&per_round(results, a, b, wl, clients)) {
        Some(s) => format!("{}  ({:.0} / {:.0} q/s, median)", s.text(), med(a), med(b)),
        None => "n/a".into(),
    }
}

pub fn print_headlines(results: &[RunResult]) {
    const P: &str = "point-select";
    println!();
    println!("headline (point-select; over several rounds: median (worst..best)):");
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
        if !runs(results, "osprey-tls", P, c).is_empty() {
            println!(
                "  osprey-tls/osprey      throughput, C={c:<4} {}",
                ratio(results, "osprey-tls", "osprey", P, c)
            );
        }
    }
    let disp: Vec<f64> = runs(results, "osprey", P, 64)
        .iter()
        .filter_map(|r| r.cpu_us_per_query.dispatcher)
        .collect();
    let disp = (!disp.is_empty()).then(|| stats::median(&disp));
    println!("  dispatcher CPU per request, C=64:          {} µs", opt(disp));
    let added: Vec<(u64, u64)> = runs(results, "osprey", P, 1)
        .iter()
        .filter_map(|o| {
            let d = runs(results, "direct", P, 1).into_iter().find(|d| d.pair == o.pair)?;
            Some((o.p50_us, d.p50_us))
        })
        .collect();
    let med = |f: fn(&(u64, u64)) -> u64| stats::median(&added.iter().map(|x| f(x) as f64).collect::<Vec<_>>());
    let diffs: Vec<f64> = added.iter().map(|&(o, d)| o as f64 - d as f64).collect();
    match added.len() {
        0 => println!("  added p50 latency, C=1 (osprey - direct):  n/a"),
        1 => println!(
            "  added p50 latency, C=1 (osprey - direct):  {} µs  ({} - {})",
            added[0].0 as i64 - added[0].1 as i64,
            added[0].0,
            added[0].1
        ),
        _ => println!(
            "  added p50 latency, C=1 (osprey - direct):  {:.0} µs ({:.0}..{:.0})  (median p50 {:.0} - {:.0})",
            stats::median(&diffs),
            diffs.iter().copied().fold(f64::INFINITY, f64::min),
            diffs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            med(|x| x.0),
            med(|x| x.1),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(target: Target, clients: usize, pair: usize, qps: f64) -> RunResult {
        let mut out = TaskOut::new();
        out.ok = qps as u64;
        let mut r = RunResult::new(
            target,
            Workload::PointSelect,
            clients,
            pair,
            1.0,
            0.0,
            &out,
            &Delta::default(),
        );
        r.qps = qps;
        r
    }

    #[test]
    fn ratios_pair_each_round_with_its_own_round() {
        let results = vec![
            run(Target::Direct, 64, 0, 100.0),
            run(Target::Osprey, 64, 0, 80.0),
            run(Target::Haproxy, 64, 0, 90.0),
            run(Target::Haproxy, 64, 1, 60.0),
            run(Target::Osprey, 64, 1, 75.0),
            run(Target::Direct, 64, 1, 50.0),
            run(Target::Direct, 64, 2, 100.0),
            run(Target::Osprey, 64, 2, 90.0),
            // A cell with no haproxy.
            run(Target::Direct, 1, 0, 10.0),
            run(Target::Osprey, 1, 0, 5.0),
        ];
        let r = ratios(&results);
        let get = |c: usize, n: &str| r.iter().find(|x| x.clients == c && x.ratio == n).map(|x| &x.spread);
        let od = get(64, "osprey/direct").expect("osprey/direct");
        assert_eq!(od.rounds, vec![0.8, 1.5, 0.9]);
        assert_eq!((od.median, od.worst, od.best), (0.9, 0.8, 1.5));
        // Round 2 has no haproxy: two rounds.
        assert_eq!(
            get(64, "osprey/haproxy").expect("o/h").rounds,
            vec![80.0 / 90.0, 75.0 / 60.0]
        );
        assert_eq!(get(64, "haproxy/direct").expect("h/d").rounds, vec![0.9, 1.2]);
        assert_eq!(get(1, "osprey/direct").expect("C=1").text(), "0.50");
        assert!(get(1, "osprey/haproxy").is_none());
        // Cells in run order, ratios in RATIOS order.
        let order: Vec<(usize, &str)> = r.iter().map(|x| (x.clients, x.ratio.as_str())).collect();
        assert_eq!(
            order,
            vec![
                (64, "osprey/direct"),
                (64, "osprey/haproxy"),
                (64, "haproxy/direct"),
                (1, "osprey/direct")
            ]
        );
    }

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

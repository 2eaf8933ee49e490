//! `osprey-bench`: one workload, several ways to reach one MariaDB, side by side in one run
//! on one machine.
//!
//! Targets:
//! * `direct`: a `mysql_async::Pool` of `--workers` connections in this process;
//! * `direct-unpooled`: one `mysql_async::Conn` per client task;
//! * `osprey`: the client SDK (one `Client` per 256 client tasks, multiplexed) → a real
//!   `osprey-dispatcher` → `--workers` `osprey-worker`s;
//! * `osprey-tls`: the same as `osprey` with TLS between the SDK and a second dispatcher
//!   (`[listen.tls]`, a certificate made at start), for an A/B of TLS's cost in one run;
//! * `haproxy`: a `mysql_async::Pool` of `--workers` connections through HAProxy (TCP mode).
//!
//! Each (workload, clients, target) runs `--warmup` seconds, then is measured for
//! `--duration` seconds: queries/s, latency percentiles (HdrHistogram) and, per query, each
//! process group's user and system CPU time and context switches, and the machine's (over
//! the timed window only). `--pairs N` runs each (workload, clients) cell N times, the
//! targets' order reversed every other round, and reports each ratio's median and range.
//! The header gives the machine's wake-up cost, measured at the start.
//! See docs/BENCHMARKS.md.

mod cpu;
mod memory;
mod procs;
mod procstat;
mod report;
mod stats;
mod sysbench;
mod tls;
mod wakeup;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use osprey_client::{Client, ClientConfig};
use osprey_sandbox::Sandbox;

use crate::cpu::{Snapshot, Watched};
use crate::report::RunResult;
use crate::workload::{Handle, TaskOut, Workload};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    Direct,
    DirectUnpooled,
    Osprey,
    /// Osprey with `pool.pipeline_depth = 1` (no prefetch): its own dispatcher and workers.
    OspreyD1,
    OspreyTls,
    Haproxy,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::DirectUnpooled => "direct-unpooled",
            Target::Osprey => "osprey",
            Target::OspreyD1 => "osprey-d1",
            Target::OspreyTls => "osprey-tls",
            Target::Haproxy => "haproxy",
        }
    }
}

/// Side-by-side benchmark: direct mysql_async vs Osprey vs HAProxy against one sandbox MariaDB.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Targets to drive, in this order for every (workload, clients) pair.
    #[arg(long, value_delimiter = ',', default_value = "direct,direct-unpooled,osprey,haproxy")]
    targets: Vec<Target>,
    /// Workloads.
    #[arg(long, value_delimiter = ',', default_value = "point-select,range-select,insert,mix")]
    workloads: Vec<Workload>,
    /// Concurrent client tasks (closed loop, one request in flight each).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256,1000")]
    clients: Vec<usize>,
    /// Database connections: pool size for direct/haproxy, worker count for osprey.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Timed window per run, seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Untimed warm-up before each window, seconds.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Rows in sbtest1.
    #[arg(long, default_value_t = 100_000)]
    rows: u32,
    /// Run HAProxy with `busy-polling` (its threads poll without sleeping: no wake-up
    /// cost, a whole core each). Off by default, as in HAProxy.
    #[arg(long)]
    haproxy_busy_polling: bool,
    /// Osprey `Client`s (connections to the dispatcher) per run; 0 = one per 256 client tasks.
    #[arg(long, default_value_t = 0)]
    osprey_connections: usize,
    /// After the runs, hold this many idle client connections and report the dispatcher's RSS (0 = skip).
    #[arg(long, default_value_t = 0)]
    idle_connections: usize,
    /// After the runs, stream a result of this many rows through osprey and report the
    /// dispatcher's RSS growth (0 = skip).
    #[arg(long, default_value_t = 0)]
    stream_rows: u64,
    /// The dispatcher's `[backend] session_reset`: `auto` (reset only after requests that may
    /// leave session state) or `always` (reset after every request).
    #[arg(long, default_value = "auto", value_parser = ["auto", "always"])]
    session_reset: String,
    /// Replicas in the sandbox; with any, osprey fronts them as a cluster with the
    /// read/write split on (`--workers` read slots per replica beside the write slots).
    /// The direct and HAProxy targets keep going to the primary.
    #[arg(long, default_value_t = 0)]
    replicas: usize,
    /// The dispatchers' `pool.pipeline_depth` (absent: the dispatcher's default); the
    /// `osprey-d1` target always runs with 1.
    #[arg(long)]
    pipeline_depth: Option<usize>,
    /// sysbench tests to run instead of the workloads (e.g. `oltp_point_select,oltp_read_write`):
    /// through direct, HAProxy and Osprey's MySQL port, threads from `--clients`.
    #[arg(long, value_delimiter = ',')]
    sysbench: Vec<String>,
    /// Rounds per (workload, clients) cell: each round runs every target once, in
    /// `--targets` order in even rounds and reversed in odd ones, so that no target always
    /// runs first (or right after a given one). The ratios of q/s (osprey/direct,
    /// osprey/haproxy, haproxy/direct) are printed as the median over the rounds and the
    /// range, worst..best, each round's ratio taken within that round. Default: 1 (one run
    /// per target, no range), 3 with `--sysbench`.
    #[arg(long)]
    pairs: Option<usize>,
    /// Round trips of the wake-up cost measurement at the start (two threads ping-ponging
    /// a byte over a socketpair; `perf bench sched pipe` too if `perf` is on PATH); 0 = skip.
    #[arg(long, default_value_t = 20_000)]
    wakeup_rounds: u64,
    /// Directory holding osprey-dispatcher and osprey-worker (default: next to this binary).
    #[arg(long, env = "OSPREY_BIN_DIR")]
    bin_dir: Option<PathBuf>,
}

impl Args {
    /// `--pairs`, or its default for the mode.
    pub fn rounds(&self) -> usize {
        self.pairs.unwrap_or(if self.sysbench.is_empty() { 1 } else { 3 })
    }
}

/// Everything the runs share.
struct Ctx {
    args: Args,
    sandbox: Sandbox,
    dispatcher: Option<procs::Dispatcher>,
    tls_dispatcher: Option<procs::Dispatcher>,
    d1_dispatcher: Option<procs::Dispatcher>,
    pki: Option<tls::BenchPki>,
    haproxy: Option<procs::Haproxy>,
    watched: Watched,
    wakeup: Option<wakeup::WakeupCost>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.clients.is_empty() || args.clients.contains(&0) {
        bail!("--clients must list positive numbers");
    }
    if args.workers == 0 {
        bail!("--workers must be at least 1");
    }
    if args.rows < 200 {
        bail!("--rows must be at least 200");
    }
    if args.pairs == Some(0) {
        bail!("--pairs must be at least 1");
    }
    // Before anything of ours runs: the wake-up cost of the machine as it is.
    let wakeup = match args.wakeup_rounds {
        0 => None,
        n => {
            eprintln!("measuring the wake-up cost ({n} round trips) ...");
            let w = wakeup::measure(n).context("measuring the wake-up cost")?;
            eprintln!("{}", w.text());
            Some(w)
        }
    };
    // The main future runs on this thread (block_on), so children spawned from it with
    // PR_SET_PDEATHSIG live as long as the process.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(args, wakeup))
}

async fn run(args: Args, wakeup: Option<wakeup::WakeupCost>) -> anyhow::Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let max_clients = *args.clients.iter().max().expect("non-empty");
    let mut targets = args.targets.clone();
    targets.dedup();

    let haproxy_bin = procs::haproxy_binary();
    if targets.contains(&Target::Haproxy) && haproxy_bin.is_none() {
        eprintln!("haproxy is not installed: skipping the haproxy target");
        targets.retain(|t| *t != Target::Haproxy);
    }
    let bin_dir = if targets
        .iter()
        .any(|t| matches!(t, Target::Osprey | Target::OspreyD1 | Target::OspreyTls))
    {
        Some(procs::bin_dir(args.bin_dir.as_deref())?)
    } else {
        None
    };

    // Room for 1000 unpooled connections plus the pools and workers of the other targets.
    let max_connections = (max_clients + 4 * args.workers + 100).max(2000) as u32;
    eprintln!("starting the MariaDB sandbox (max_connections={max_connections}) ...");
    let sandbox = Sandbox::builder()
        .replicas(args.replicas)
        .semi_sync(false)
        .max_connections(max_connections)
        .start()
        .await
        .context("starting the MariaDB sandbox")?;
    let primary = sandbox.primary();
    let mariadb_version = workload::load(primary, args.rows).await?;

    let dispatcher = match &bin_dir {
        Some(dir) if targets.contains(&Target::Osprey) => {
            eprintln!(
                "starting osprey-dispatcher from {} with {} workers ...",
                dir.display(),
                args.workers
            );
            Some(
                procs::Dispatcher::start(
                    dir,
                    primary,
                    sandbox.replicas(),
                    args.workers,
                    max_clients,
                    &args.session_reset,
                    None,
                    args.pipeline_depth,
                )
                .await?,
            )
        }
        _ => None,
    };
    let d1_dispatcher = match &bin_dir {
        Some(dir) if targets.contains(&Target::OspreyD1) => {
            eprintln!("starting an osprey-dispatcher with pipeline_depth = 1 ...");
            Some(
                procs::Dispatcher::start(
                    dir,
                    primary,
                    sandbox.replicas(),
                    args.workers,
                    max_clients,
                    &args.session_reset,
                    None,
                    Some(1),
                )
                .await?,
            )
        }
        _ => None,
    };
    let pki = match targets.contains(&Target::OspreyTls) {
        true => Some(tls::BenchPki::new()?),
        false => None,
    };
    let tls_dispatcher = match (&bin_dir, &pki) {
        (Some(dir), Some(pki)) => {
            eprintln!("starting a TLS osprey-dispatcher with {} workers ...", args.workers);
            Some(
                procs::Dispatcher::start(
                    dir,
                    primary,
                    &[],
                    args.workers,
                    max_clients,
                    &args.session_reset,
                    Some(pki),
                    args.pipeline_depth,
                )
                .await?,
            )
        }
        _ => None,
    };
    let haproxy = match (&haproxy_bin, targets.contains(&Target::Haproxy)) {
        (Some(bin), true) => Some(procs::Haproxy::start(bin, primary.port(), args.haproxy_busy_polling).await?),
        _ => None,
    };
    let watched = Watched {
        dispatcher: dispatcher.as_ref().map(procs::Dispatcher::pid),
        mariadb: primary.pid(),
        haproxy: haproxy.as_ref().map(procs::Haproxy::pid),
    };
    let ctx = Ctx {
        args,
        sandbox,
        dispatcher,
        tls_dispatcher,
        d1_dispatcher,
        pki,
        haproxy,
        watched,
        wakeup,
    };

    if !ctx.args.sysbench.is_empty() {
        return run_sysbench(&ctx);
    }
    let rounds = ctx.args.rounds();
    let mut results = Vec::new();
    for &wl in &ctx.args.workloads {
        for &clients in &ctx.args.clients {
            for pair in 0..rounds {
                // Reverse the order every other round: the first target of a round does
                // not always get the warm caches, or the last the tired machine.
                let order: Vec<Target> = match pair % 2 {
                    0 => targets.clone(),
                    _ => targets.iter().rev().copied().collect(),
                };
                for target in order {
                    eprintln!(
                        "run: target={} workload={} clients={clients} round={pair}",
                        target.name(),
                        wl.name()
                    );
                    let r = run_one(&ctx, target, wl, clients, pair)
                        .await
                        .with_context(|| format!("{} / {} / {clients} clients", target.name(), wl.name()))?;
                    eprintln!(
                        "     {:.0} q/s, p50 {} µs, p99 {} µs, errors {}",
                        r.qps, r.p50_us, r.p99_us, r.errors
                    );
                    results.push(r);
                }
            }
        }
    }

    let mut memory = serde_json::Map::new();
    if let Some(d) = &ctx.dispatcher {
        if ctx.args.stream_rows > 0 {
            memory.insert("stream".into(), memory::stream_rows(d, ctx.args.stream_rows).await?);
        }
        if ctx.args.idle_connections > 0 {
            memory.insert(
                "idle".into(),
                memory::idle_connections(d, ctx.args.idle_connections).await?,
            );
        }
    }

    let load_end = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let machine = report::machine(
        &ctx.args,
        ctx.wakeup.as_ref(),
        &mariadb_version,
        ctx.haproxy.as_ref().map(|h| h.version.clone()),
        load_start.trim(),
        load_end.trim(),
    );
    let ratios = report::ratios(&results);
    report::print_header(ctx.wakeup.as_ref());
    report::print_table(&results);
    report::print_per_query(&results);
    report::print_ratios(&ratios, rounds);
    if let Some(path) = &ctx.args.json {
        let doc = serde_json::json!({
            "machine": machine,
            "command": command,
            "results": results,
            "ratios": ratios,
            "memory": memory,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    println!();
    println!(
        "machine: {}, {} cores; load average at start: {}; at end: {}",
        machine["cpu_model"].as_str().unwrap_or("?"),
        machine["cores"],
        load_start.trim(),
        load_end.trim()
    );
    report::print_headlines(&results);
    Ok(())
}

/// `--sysbench`: direct, HAProxy and Osprey's MySQL port, alternated.
fn run_sysbench(ctx: &Ctx) -> anyhow::Result<()> {
    let primary = ctx.sandbox.primary();
    let db = primary.database().to_string();
    let direct = sysbench::Endpoint {
        name: "direct",
        addr: std::net::SocketAddr::new([127, 0, 0, 1].into(), primary.port()),
        user: primary.user().to_string(),
        password: primary.password().to_string(),
    };
    eprintln!("sysbench prepare (4 tables of 10 000 rows) on the primary ...");
    sysbench::prepare(&direct, &db)?;
    let mut endpoints = vec![];
    if let Some(h) = &ctx.haproxy {
        endpoints.push(sysbench::Endpoint {
            name: "haproxy",
            addr: std::net::SocketAddr::new([127, 0, 0, 1].into(), h.port),
            user: primary.user().to_string(),
            password: primary.password().to_string(),
        });
    }
    endpoints.insert(0, direct);
    if let Some(d) = &ctx.dispatcher {
        endpoints.push(sysbench::Endpoint {
            name: "osprey",
            addr: d.mysql_addr,
            user: procs::MYSQL_USER.into(),
            password: procs::MYSQL_PASSWORD.into(),
        });
    }
    let runs = sysbench::run(
        &ctx.args.sysbench,
        &ctx.args.clients,
        ctx.args.rounds(),
        ctx.args.duration,
        &endpoints,
        &db,
        primary,
        ctx.watched.dispatcher,
        ctx.watched.haproxy,
    )?;
    report::print_header(ctx.wakeup.as_ref());
    sysbench::print(&runs);
    if let Some(path) = &ctx.args.json {
        let doc = serde_json::json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "wakeup": ctx.wakeup,
            "sysbench": runs,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")?;
    }
    Ok(())
}

fn pool_opts(base: Opts, size: usize) -> Opts {
    let constraints = PoolConstraints::new(size, size).expect("min <= max");
    // No COM_RESET_CONNECTION when a connection goes back to the pool: it would cost a
    // round trip per query and drop the prepared-statement cache.
    let pool = PoolOpts::default()
        .with_constraints(constraints)
        .with_reset_connection(false);
    OptsBuilder::from_opts(base).pool_opts(pool).into()
}

fn haproxy_opts(ctx: &Ctx, port: u16) -> Opts {
    OptsBuilder::from_opts(ctx.sandbox.primary().opts())
        .tcp_port(port)
        .prefer_socket(false)
        .into()
}

/// Opens the handles the client tasks use; returns them and what to close afterwards.
async fn handles(ctx: &Ctx, target: Target, clients: usize) -> anyhow::Result<(Vec<Handle>, Option<Pool>)> {
    let primary = ctx.sandbox.primary();
    let w = ctx.args.workers;
    Ok(match target {
        Target::Direct | Target::Haproxy => {
            let base = if target == Target::Haproxy {
                haproxy_opts(ctx, ctx.haproxy.as_ref().context("haproxy not started")?.port)
            } else {
                primary.opts()
            };
            let pool = Pool::new(pool_opts(base, w));
            // Open the pool's connections before the clock starts.
            let conns: Vec<Conn> = futures::stream::iter(0..w)
                .map(|_| pool.get_conn())
                .buffer_unordered(w)
                .try_collect()
                .await?;
            drop(conns);
            ((0..clients).map(|_| Handle::Pool(pool.clone())).collect(), Some(pool))
        }
        Target::DirectUnpooled => {
            let opts = primary.opts();
            let conns: Vec<Conn> = futures::stream::iter(0..clients)
                .map(|_| Conn::new(opts.clone()))
                .buffer_unordered(32)
                .try_collect()
                .await?;
            (conns.into_iter().map(Handle::Conn).collect(), None)
        }
        Target::Osprey | Target::OspreyD1 | Target::OspreyTls => {
            let d = match target {
                Target::OspreyTls => ctx.tls_dispatcher.as_ref(),
                Target::OspreyD1 => ctx.d1_dispatcher.as_ref(),
                _ => ctx.dispatcher.as_ref(),
            }
            .context("dispatcher not started")?;
            let n = match ctx.args.osprey_connections {
                0 => clients.div_ceil(256),
                n => n.min(clients),
            };
            let mut cs = Vec::with_capacity(n);
            for _ in 0..n {
                let mut cfg = ClientConfig::new(d.client_addr.to_string(), d.client_token.clone());
                cfg.name = "osprey-bench".into();
                cfg.max_waiting = cfg.max_waiting.max(clients * 2);
                if target == Target::OspreyTls {
                    cfg.tls = ctx.pki.as_ref().map(tls::BenchPki::client_config);
                }
                cs.push(Client::connect(cfg).await?);
            }
            ((0..clients).map(|i| Handle::Client(cs[i % n].clone())).collect(), None)
        }
    })
}

async fn run_one(ctx: &Ctx, target: Target, wl: Workload, clients: usize, pair: usize) -> anyhow::Result<RunResult> {
    if wl.writes() {
        let mut c = ctx.sandbox.primary().conn().await?;
        c.query_drop("TRUNCATE TABLE sbtest_insert").await?;
        c.disconnect().await?;
    }
    let (hs, pool) = handles(ctx, target, clients).await?;
    let phase = Arc::new(AtomicU8::new(workload::WARMUP));
    let rows = ctx.args.rows;
    let tasks: Vec<_> = hs
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            let seed = 0x9e37_79b9_7f4a_7c15u64 ^ ((i as u64 + 1) << 20) ^ clients as u64;
            tokio::spawn(workload::client_task(h, wl, rows, seed, phase.clone()))
        })
        .collect();

    tokio::time::sleep(Duration::from_secs_f64(ctx.args.warmup)).await;
    // The TLS target's CPU figures are those of its own dispatcher and workers.
    let watched = match target {
        Target::OspreyD1 => Watched {
            dispatcher: ctx.d1_dispatcher.as_ref().map(procs::Dispatcher::pid),
            ..ctx.watched.clone()
        },
        Target::OspreyTls => Watched {
            dispatcher: ctx.tls_dispatcher.as_ref().map(procs::Dispatcher::pid),
            ..ctx.watched.clone()
        },
        _ => ctx.watched.clone(),
    };
    // Queries are counted from t0 to the end of the window exactly; the usage window holds
    // it and the two snapshots (a few ms with many threads to read), so the usage per
    // query errs high, never low.
    let before = Snapshot::take(&watched);
    phase.store(workload::MEASURE, Ordering::SeqCst);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(ctx.args.duration)).await;
    phase.store(workload::STOP, Ordering::SeqCst);
    let elapsed = t0.elapsed().as_secs_f64();
    let after = Snapshot::take(&watched);
    let load1 = cpu::load1();
    let usage = cpu::delta(&before, &after);

    let joined = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(tasks))
        .await
        .context("client tasks did not finish within 120 s of the end of the window")?;
    let mut total = TaskOut::new();
    let mut conns = Vec::new();
    for j in joined {
        let (out, h) = j.context("client task panicked")?;
        total.merge(out);
        if let Handle::Conn(c) = h {
            conns.push(c);
        }
    }
    futures::stream::iter(conns)
        .for_each_concurrent(64, |c| async move {
            let _ = c.disconnect().await;
        })
        .await;
    if let Some(pool) = pool {
        let _ = pool.disconnect().await;
    }
    for e in &total.first_errors {
        eprintln!("     error: {e}");
    }

    Ok(RunResult::new(
        target, wl, clients, pair, elapsed, load1, &total, &usage,
    ))
}

//! `osprey-dispatcher` binary: flags, logging, then [`osprey_dispatcher::server::run`].

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use osprey_dispatcher::config::Config;
use osprey_dispatcher::server::{run, Options};

/// Osprey dispatcher: multiplexed SQL requests to a supervised pool of worker
/// processes. With no `[backend]` configured it starts a local MariaDB sandbox.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML config file (see docs/CONFIG.md). Every key has a default.
    #[arg(long, short = 'c', env = "OSPREY_CONFIG")]
    config: Option<PathBuf>,
    /// Client listener address (overrides listen.client).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Admin HTTP listener address (overrides listen.admin).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Number of worker slots (overrides pool.size).
    #[arg(long)]
    pool_size: Option<usize>,
    /// Runtime directory for the worker socket and credentials (overrides listen.runtime_dir).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// Runtime threads (default: one per four CPUs, at least one; 1 = a
    /// single-threaded runtime). The dispatcher needs ~20 us of CPU per request
    /// on one thread; more threads add cross-thread wake-ups and only pay off
    /// when one core is not enough.
    #[arg(long, env = "OSPREY_THREADS")]
    threads: Option<usize>,
    /// Validate the config and exit.
    #[arg(long)]
    check_config: bool,
}

// mimalloc: the hot path allocates many small, short-lived buffers (frames, rows, SQL
// texts); glibc malloc took ~7 % of a worker's CPU under load (perf), mimalloc's
// per-thread free lists make those cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(a) = args.listen {
        config.listen.client = a;
    }
    if let Some(a) = args.admin {
        config.listen.admin = a;
    }
    if let Some(n) = args.pool_size {
        config.pool.size = n;
    }
    if let Some(d) = args.runtime_dir {
        config.listen.runtime_dir = Some(d);
    }
    config.validate()?;
    if args.check_config {
        // The file limit this process would run with (the soft one raised to the hard one).
        let limit = osprey_dispatcher::fds::raise_nofile_limit().context("reading RLIMIT_NOFILE")?;
        let budget = osprey_dispatcher::fds::FdBudget::plan(&config, limit.soft)?;
        eprintln!(
            "file limit {}, reserve {}, max_client_connections {}",
            budget.limit, budget.reserve, budget.max_client_connections
        );
        // The certificate files too: a rotation can be checked before SIGHUP.
        if let Some(tls) = &config.listen.tls {
            osprey_dispatcher::client::tls::load(tls).context("[listen.tls]")?;
        }
        println!("config ok");
        return Ok(());
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = match args.threads.unwrap_or((cpus / 4).max(1)) {
        // One thread: no cross-thread wake-ups (futex) or work stealing at all.
        0 | 1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
    .context("tokio runtime")?;
    runtime.block_on(run(Options {
        config,
        config_path: args.config,
    }))
}

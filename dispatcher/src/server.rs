//! Start-up, the accept loops, signals and the graceful drain.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use osprey_protocol::local::{runtime_dir, Credentials};
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{watch, Semaphore};
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admin::{self, AdminState};
use crate::client::listen;
use crate::client::tls::ServerTls;
use crate::cluster::events::EventLog;
use crate::cluster::health::{spawn_monitor, MonitorHandle, MonitorTarget};
use crate::cluster::reads::Reads;
use crate::cluster::ClusterView;
use crate::cluster::{
    galera, group_replication, manager, ClusterConfig, ClusterRuntime, FailoverConfig, HealthConfig, Topology,
};
use crate::config::{self, Config};
use crate::ctx::Ctx;
use crate::embedded::{self, Embedded};
use crate::fds::{self, AcceptErrors, FdBudget};
use crate::metrics::Metrics;
use crate::policy::{Limit, Policy, SlowLogTarget};
use crate::pool::supervisor::Supervisor;
use crate::pool::SlotGroup;
use crate::secrets::random_token;

/// How long workers get to finish the quit handshake at shutdown before they are killed.
const WORKER_QUIT_LIMIT: Duration = Duration::from_secs(10);

pub struct Options {
    pub config: Config,
    pub config_path: Option<PathBuf>,
}

pub async fn run(opts: Options) -> anyhow::Result<()> {
    let Options { config, config_path } = opts;
    config.validate()?;
    // Before anything opens a descriptor or starts a process (children inherit the limit).
    let fd_budget = fds::start(&config)?;

    // With neither [backend] nor [[cluster]], bring up a local MariaDB sandbox (a
    // primary and two replicas): the embedded default for a first run. It lives (and
    // dies) with this process.
    let (clusters, _sandbox) = resolve_clusters(&config).await?;

    // One policy for every cluster; its slow log goes to the first cluster's primary
    // (`slow_log_target`, filled in once that cluster's provider runs).
    let intercept = config.intercept_config();
    let (slow_log_target, slow_log_rx) = watch::channel(None);
    let (policy, _slow_log_writer) = Policy::new(
        intercept.settings(),
        config.throttle.settings(),
        throttle_limits(&config),
        intercept.slow_log_settings().map(|s| (s, slow_log_rx)),
    );
    let mut metrics = Metrics::new();
    policy.register_metrics(&mut metrics.registry);
    let metrics = Arc::new(metrics);
    let dir = config.listen.runtime_dir.clone().unwrap_or_else(runtime_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating runtime dir {}", dir.display()))?;
    let (mysql_config, mysql_line) = mysql_setup(&config);
    let (client_tokens, admin_token) = tokens(&config, &dir, &mysql_line)?;
    if let Some(sandbox) = &_sandbox {
        embedded::write_members_file(sandbox, &dir);
    }

    let worker_binary = match &config.pool.worker_binary {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("osprey-worker"),
    };
    if !worker_binary.exists() {
        bail!(
            "worker binary {} not found (set pool.worker_binary)",
            worker_binary.display()
        );
    }

    // Read before binding: a bad certificate stops the start while the old dispatcher
    // (on a zero-downtime restart) still serves.
    let tls = match &config.listen.tls {
        Some(t) => Some(ServerTls::new(t).context("loading [listen.tls]")?),
        None => {
            if !config.listen.client.ip().is_loopback() {
                warn!(
                    client = %config.listen.client,
                    "client listener is not on loopback and has no [listen.tls]: tokens and data cross the network in clear"
                );
            }
            None
        }
    };

    let mysql_tls = match &config.mysql.tls {
        Some(t) => Some(ServerTls::new(t).context("loading [mysql.tls]")?),
        None => None,
    };
    let socket_path = dir.join(format!("worker-{}.sock", std::process::id()));
    let worker_listener = listen::bind_worker_socket(&socket_path)
        .with_context(|| format!("binding worker socket {}", socket_path.display()))?;
    let client_listener = listen::bind_tcp(config.listen.client, 1024)
        .with_context(|| format!("binding client listener {}", config.listen.client))?;
    // A backlog deep enough that a connection flood queues rather than has its SYNs
    // dropped (the kernel's retry comes a second later): the operator's connection is
    // in that queue too, and the accept loop gets through it in milliseconds.
    let admin_listener = listen::bind_tcp(config.listen.admin, 1024)
        .with_context(|| format!("binding admin listener {}", config.listen.admin))?;
    let mysql_listener = match mysql_config.listen {
        // The embedded default's port is a convenience: taken by something else (another
        // proxy on 6033), the tour goes on without it.
        Some(addr) if config.mysql.listen.is_none() => match listen::bind_tcp(addr, 1024) {
            Ok(l) => Some(l),
            Err(e) => {
                warn!(%addr, "the embedded default's MySQL port is not available ({e}); set [mysql] listen");
                None
            }
        },
        Some(addr) => Some(
            listen::bind_tcp(addr, 1024)
                .with_context(|| format!("binding the MySQL listener {addr} ([mysql] listen)"))?,
        ),
        None => None,
    };

    let initial = config.initial_pool_size();
    let mut groups: Vec<Arc<SlotGroup>> = clusters
        .iter()
        .enumerate()
        .map(|(i, (c, _))| SlotGroup::with_base(i as u32, 0, config.queue_limits(), c.name.clone(), metrics.clone()))
        .collect();
    // After the write groups (group i = cluster i): one read group per member of each
    // cluster with the read/write split.
    let mut reads: Vec<Option<(Arc<Reads>, usize)>> = Vec::new();
    for (i, (c, single)) in clusters.iter().enumerate() {
        if !c.read_split || *single {
            reads.push(None);
            continue;
        }
        let member_groups: Vec<Arc<SlotGroup>> = c
            .members
            .iter()
            .map(|m| {
                let g = SlotGroup::read_group(
                    groups.len() as u32,
                    config.queue_limits(),
                    c.name.clone(),
                    m.name.clone(),
                    metrics.clone(),
                );
                groups.push(g.clone());
                g
            })
            .collect();
        let r = Reads::new(c, member_groups, &groups[i], metrics.clone());
        reads.push(Some((Arc::new(r), config.replica_size())));
    }
    let events = Arc::new(EventLog::default());
    // Monitors and providers stop once the workers have quit (end of `run`).
    let cluster_stop = CancellationToken::new();
    let _stop_clusters = cluster_stop.clone().drop_guard();
    let runtimes: Vec<Arc<ClusterRuntime>> = clusters
        .into_iter()
        .zip(&groups)
        .zip(reads)
        .map(|(((c, single), pool), reads)| {
            start_cluster(
                c,
                single,
                &config,
                pool.clone(),
                reads,
                &events,
                &metrics,
                &cluster_stop,
            )
        })
        .collect();
    if let Some(first) = runtimes.first() {
        tokio::spawn(follow_slow_log_target(
            first.provider.view.clone(),
            first.config(),
            slow_log_target,
        ));
    }
    let ctx = Arc::new(Ctx::new(
        config.clone(),
        groups,
        runtimes,
        events,
        metrics,
        policy,
        client_tokens,
        admin_token,
        random_token(),
    ));
    let supervisor = Supervisor::new(ctx.workers.clone(), worker_binary, socket_path.clone());
    supervisor.resize(initial);
    supervisor.follow_read_sizes();
    tokio::spawn(supervisor.clone().run_elastic());
    for group in &ctx.groups {
        tokio::spawn(group.clone().run_reaper());
    }

    let admin_task = tokio::spawn({
        let state = AdminState {
            ctx: ctx.clone(),
            supervisor: supervisor.clone(),
            fds: fd_budget,
        };
        admin::serve(admin_listener, state, ctx.abort.clone())
    });
    tokio::spawn(accept_workers(ctx.clone(), worker_listener));
    // The descriptors left for clients, SDK and MySQL alike: the workers' and the admin
    // port's reserve holds whichever port fills up.
    let client_fds = Arc::new(Semaphore::new(fd_budget.max_client_connections));
    let clients_task = tokio::spawn(accept_clients(
        ctx.clone(),
        client_listener,
        client_fds.clone(),
        fd_budget.max_client_connections,
        tls.clone(),
    ));
    let mysql_task = mysql_listener.map(|listener| {
        let front = Arc::new(crate::mysql::Front::new(
            mysql_config.clone(),
            mysql_tls.clone(),
            ctx.metrics.clone(),
            config.limits.max_pending_handshakes,
        ));
        tokio::spawn(crate::mysql::accept(ctx.clone(), front, listener, client_fds))
    });
    if !mysql_line.is_empty() && mysql_task.is_some() {
        info!("MySQL port ready for any MySQL client: {mysql_line}");
    }
    tokio::spawn(signals(
        ctx.clone(),
        supervisor.clone(),
        config_path,
        fd_budget,
        tls.clone(),
        mysql_tls.clone(),
    ));

    info!(
        client = %config.listen.client,
        mysql = ?mysql_config.listen,
        tls = tls.is_some(),
        admin = %config.listen.admin,
        ui = %format_args!("http://{}/ui", config.listen.admin),
        clusters = %ctx.clusters.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(","),
        slots = initial,
        max_client_connections = fd_budget.max_client_connections,
        runtime_dir = %dir.display(),
        "osprey dispatcher ready"
    );

    // systemd (Type=notify): ready once every listener is bound.
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);

    ctx.draining.cancelled().await;
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    info!("draining: no new connections, GOAWAY to clients, in-flight requests finish");
    // Closing the listener hands new connections to a dispatcher bound beside us.
    clients_task.abort();
    if let Some(t) = &mysql_task {
        t.abort();
    }
    let drain_deadline = Instant::now() + Duration::from_millis(ctx.config.timeouts.drain_timeout_ms);
    let connections = || ctx.metrics.client_connections.get() + ctx.metrics.mysql.connections.get();
    while connections() > 0 && Instant::now() < drain_deadline && !ctx.abort.is_cancelled() {
        sleep(Duration::from_millis(20)).await;
    }
    if connections() > 0 {
        warn!(
            open = ctx.metrics.streams_open.get(),
            "drain_timeout passed; failing what is left"
        );
    }
    // Slot groups first: workers killed by the requests that the abort fails must not be respawned.
    for group in &ctx.groups {
        group.shutdown();
    }
    ctx.abort.cancel();
    if !supervisor.wait_all(WORKER_QUIT_LIMIT).await {
        warn!("workers did not quit in time; killing them");
        supervisor.abort_all();
    }
    let _ = admin_task.await;
    let _ = std::fs::remove_file(&socket_path);
    info!("dispatcher stopped");
    Ok(())
}

/// Configured tokens, or generated ones written to the local credentials file.
fn tokens(config: &Config, dir: &std::path::Path, mysql_line: &str) -> anyhow::Result<(Vec<String>, String)> {
    let mut client_tokens = config.auth.client_tokens.clone();
    let mut admin_token = config.auth.admin_token.clone();
    let generated = client_tokens.is_empty() || admin_token.is_none() || !mysql_line.is_empty();
    if client_tokens.is_empty() {
        client_tokens.push(random_token());
    }
    let admin_token = admin_token.get_or_insert_with(random_token).clone();
    if generated {
        let creds = Credentials {
            client_token: client_tokens[0].clone(),
            admin_token: admin_token.clone(),
            mysql: mysql_line.to_string(),
        };
        creds
            .store(dir)
            .with_context(|| format!("writing {}", Credentials::path(dir).display()))?;
        info!(file = %Credentials::path(dir).display(), "generated tokens written");
    }
    Ok((client_tokens, admin_token))
}

/// The MySQL front end's settings in force: as configured, or for the embedded default
/// (and a `listen` without users) a generated user on 127.0.0.1:6033; with the
/// ready-to-paste `mariadb` line for a generated user (empty otherwise).
fn mysql_setup(config: &Config) -> (crate::config::MysqlConfig, String) {
    let mut m = config.mysql.clone();
    let embedded = config.backend.is_none() && config.clusters.is_empty();
    if embedded && m.listen.is_none() {
        m.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 6033)));
    }
    let Some(listen) = m.listen else {
        return (m, String::new());
    };
    if !m.users.is_empty() {
        return (m, String::new());
    }
    let password = random_token()[..24].to_string();
    m.users.push(crate::config::MysqlUser {
        name: "osprey".into(),
        native_hash: Some(osprey_protocol::mysql_auth::native_hash(&password)),
        sha2_hash: Some(osprey_protocol::mysql_auth::sha2_hash(&password)),
        cluster: None,
        schema: None,
        max_connections: None,
    });
    let line = format!("mariadb -h{} -P{} -uosprey -p{password}", listen.ip(), listen.port());
    (m, line)
}

/// `limit`: the client descriptors (`max_connections` of them), shared with the MySQL port.
async fn accept_clients(
    ctx: Arc<Ctx>,
    listener: TcpListener,
    limit: Arc<Semaphore>,
    max_connections: usize,
    tls: Option<Arc<ServerTls>>,
) {
    let mut errors = AcceptErrors::new("client");
    let mut over_cap = fds::LogThrottle::default();
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                errors.failed(&e, &ctx.metrics).await;
                continue;
            }
        };
        match limit.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(crate::client::connection::serve(
                    ctx.clone(),
                    socket,
                    tls.clone(),
                    permit,
                ));
            }
            Err(_) => {
                ctx.metrics.client_rejected.inc();
                if let Some(closed) = over_cap.event() {
                    warn!(%peer, closed, max_connections, "max_client_connections reached; closing new connections");
                }
            }
        }
    }
}

async fn accept_workers(ctx: Arc<Ctx>, listener: UnixListener) {
    let mut errors = AcceptErrors::new("worker");
    loop {
        match listener.accept().await {
            Ok((socket, _)) => {
                tokio::spawn(crate::pool::link::serve(ctx.workers.clone(), socket));
            }
            Err(e) => errors.failed(&e, &ctx.metrics).await,
        }
    }
}

async fn signals(
    ctx: Arc<Ctx>,
    supervisor: Arc<Supervisor>,
    config_path: Option<PathBuf>,
    fds: FdBudget,
    tls: Option<Arc<ServerTls>>,
    mysql_tls: Option<Arc<ServerTls>>,
) {
    let (Ok(mut term), Ok(mut int), Ok(mut quit), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::quit()),
        signal(SignalKind::hangup()),
    ) else {
        error!("cannot install signal handlers");
        return;
    };
    // The pool size of the file as last read: a SIGHUP applies the file's size only when
    // it changed, so that a reload for another reason (a certificate rotation) leaves a
    // pool resized through the admin API, or grown by the elastic loop, as it is.
    let mut file_size = ctx.config.initial_pool_size();
    loop {
        tokio::select! {
            _ = term.recv() => stop_signal(&ctx, "SIGTERM"),
            _ = int.recv() => stop_signal(&ctx, "SIGINT"),
            _ = quit.recv() => {
                warn!("SIGQUIT: fast shutdown");
                abort(&ctx);
            }
            _ = hup.recv() => reload(
                &ctx,
                &supervisor,
                config_path.as_deref(),
                &fds,
                (tls.as_deref(), mysql_tls.as_deref()),
                &mut file_size,
            ),
        }
    }
}

/// First SIGTERM/SIGINT drains; a second one while draining stops at once.
fn stop_signal(ctx: &Ctx, name: &str) {
    if ctx.draining.is_cancelled() {
        warn!("{name} again: failing in-flight requests and stopping now");
        abort(ctx);
    } else {
        info!("{name}: graceful drain");
        ctx.draining.cancel();
    }
}

/// Stops at once: the pool stops first, so that workers killed by failing
/// requests are not respawned.
fn abort(ctx: &Ctx) {
    for group in &ctx.groups {
        group.shutdown();
    }
    ctx.draining.cancel();
    ctx.abort.cancel();
}

/// SIGHUP: re-read the config file, apply the pool size if it changed since `file_size`
/// was read, and load the TLS files again. A file whose client cap or pool would eat the
/// file-descriptor reserve is refused whole.
fn reload(
    ctx: &Ctx,
    supervisor: &Arc<Supervisor>,
    path: Option<&std::path::Path>,
    fds: &FdBudget,
    (tls, mysql_tls): (Option<&ServerTls>, Option<&ServerTls>),
    file_size: &mut usize,
) {
    let Some(path) = path else {
        // (TLS is configured only in a file, so there is no certificate to reload either.)
        warn!("SIGHUP: no --config file to reload");
        return;
    };
    let checked = Config::load(path).map_err(anyhow::Error::from).and_then(|new| {
        fds.check_reload(&ctx.config, &new)?;
        Ok(new)
    });
    match checked {
        Ok(new) => {
            let size = new.initial_pool_size();
            if new.pool.min.is_some() != ctx.config.pool.min.is_some() {
                warn!("SIGHUP: switching between fixed and elastic pool needs a restart");
            }
            if new.replica_size() != ctx.config.replica_size() {
                warn!("SIGHUP: pool.replica_size needs a restart; the read slots keep their size");
            }
            if (new.pool.pipeline_depth, new.pool.pipeline_hold_ms)
                != (ctx.config.pool.pipeline_depth, ctx.config.pool.pipeline_hold_ms)
            {
                warn!("SIGHUP: pool.pipeline_depth and pool.pipeline_hold_ms need a restart; kept as they are");
            }
            if size != *file_size && size != ctx.pool.target_size() {
                info!(size, "SIGHUP: resizing pool");
                supervisor.resize(size);
            }
            *file_size = size;
            for group in &ctx.groups {
                group.set_limits(new.queue_limits());
            }
            reload_clusters(ctx, &new);
            let intercept = new.intercept_config();
            // (Turning interception off and on again keeps the writer started at boot.)
            let slow_log = intercept.slow_log_settings();
            if slow_log.is_some() && slow_log != ctx.config.intercept_config().slow_log_settings() {
                warn!(
                    "SIGHUP: slow-log settings (intercept.slow_log*) need a restart; the rest of [intercept] applies"
                );
            }
            ctx.policy
                .reload(intercept.settings(), new.throttle.settings(), throttle_limits(&new));
            info!("SIGHUP: [intercept], [throttle] and the members' max_qps applied (limits set through the admin API are replaced)");
            match (tls, &new.listen.tls) {
                (Some(tls), Some(files)) => reload_tls(tls, files),
                (None, None) => {}
                _ => warn!("SIGHUP: turning TLS on or off needs a restart; ignored"),
            }
            match (mysql_tls, &new.mysql.tls) {
                (Some(tls), Some(files)) => reload_tls(tls, files),
                (None, None) => {}
                _ => warn!("SIGHUP: turning the MySQL port's TLS on or off needs a restart; ignored"),
            }
            let listen_sans_tls = |l: &config::Listen| config::Listen { tls: None, ..l.clone() };
            if new.backend != ctx.config.backend
                || cluster_shape(&new) != cluster_shape(&ctx.config)
                || listen_sans_tls(&new.listen) != listen_sans_tls(&ctx.config.listen)
                || new.auth != ctx.config.auth
                || new.admin != ctx.config.admin
                || new.limits.max_client_connections != ctx.config.limits.max_client_connections
            {
                warn!(
                    "SIGHUP: backend, cluster names, members and credentials, listen, auth, admin and \
                     limits.max_client_connections changes need a restart; ignored"
                );
            }
        }
        Err(e) => error!("SIGHUP: config not reloaded: {e}"),
    }
}

/// The members' throttle limits of `config`, keyed `cluster/member`.
fn throttle_limits(config: &Config) -> Vec<(String, Limit)> {
    config
        .throttle_limits()
        .into_iter()
        .map(|(cluster, member, limit)| (Ctx::throttle_key(&cluster, &member), limit))
        .collect()
}

/// Points the slow log at the cluster's primary as the topology provider names it (its
/// host and port from the cluster's config, the application account), `None` while
/// there is none. Ends when the provider or the slow log stops.
async fn follow_slow_log_target(
    mut view: watch::Receiver<ClusterView>,
    config: watch::Receiver<Arc<ClusterConfig>>,
    target: watch::Sender<Option<SlowLogTarget>>,
) {
    loop {
        let next = {
            let v = view.borrow_and_update();
            let c = config.borrow();
            v.primary.as_ref().and_then(|p| {
                c.members.iter().find(|m| &m.name == p).map(|m| SlowLogTarget {
                    host: m.host.clone(),
                    port: m.port,
                    user: c.user.clone(),
                    password: c.password.clone(),
                    tls: c.tls(),
                })
            })
        };
        target.send_if_modified(|t| {
            let changed = *t != next;
            *t = next;
            changed
        });
        tokio::select! {
            r = view.changed() => if r.is_err() { return },
            _ = target.closed() => return,
        }
    }
}

/// New connections get the new certificate; open ones keep the session they have.
fn reload_tls(tls: &ServerTls, files: &config::ListenTls) {
    match tls.reload(files) {
        Ok(()) => info!(cert = %files.cert_file.display(), "SIGHUP: TLS certificate reloaded"),
        Err(e) => error!("SIGHUP: TLS files refused, the certificate in use stays: {e}"),
    }
}

/// The clusters to front, each with whether it stands for a single `[backend]`; the
/// sandbox when the embedded default is used.
async fn resolve_clusters(config: &Config) -> anyhow::Result<(Vec<(ClusterConfig, bool)>, Option<Embedded>)> {
    if let Some(b) = &config.backend {
        return Ok((vec![(b.as_cluster(), true)], None));
    }
    if !config.clusters.is_empty() {
        return Ok((config.clusters.iter().map(|c| (c.clone(), false)).collect(), None));
    }
    let (cluster, sandbox) = embedded::start().await?;
    Ok((vec![(cluster, false)], Some(sandbox)))
}

/// Starts the monitors and the topology provider of one cluster, and the follower
/// that points `pool` at its primary.
#[allow(clippy::too_many_arguments)]
fn start_cluster(
    cluster: ClusterConfig,
    single: bool,
    config: &Config,
    pool: Arc<SlotGroup>,
    reads: Option<(Arc<Reads>, usize)>,
    events: &Arc<EventLog>,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> Arc<ClusterRuntime> {
    let cluster = Arc::new(cluster);
    let (config_tx, mut config_rx) = watch::channel(cluster.clone());
    // The monitors follow the health settings of the cluster's config (SIGHUP).
    let (health_tx, health_rx) = watch::channel(cluster.health.clone());
    tokio::spawn(async move {
        while config_rx.changed().await.is_ok() {
            let health = config_rx.borrow_and_update().health.clone();
            health_tx.send_if_modified(|h| std::mem::replace(h, health.clone()) != health);
        }
    });
    let (user, password) = cluster.monitor_credentials();
    let monitors: Vec<(String, MonitorHandle)> = cluster
        .members
        .iter()
        .map(|m| {
            let target = MonitorTarget {
                cluster: cluster.name.clone(),
                member: m.name.clone(),
                host: m.host.clone(),
                port: m.port,
                user: user.clone(),
                password: password.clone(),
                tls: cluster.tls(),
            };
            let handle = spawn_monitor(target, health_rx.clone(), metrics.clone(), stop.clone());
            (m.name.clone(), handle)
        })
        .collect();
    let sink_monitors = monitors.clone();
    let sink: crate::pool::group::PassiveSink = Arc::new(move |member: &str, why: &'static str| {
        if let Some((_, m)) = sink_monitors.iter().find(|(n, _)| n == member) {
            m.passive_failure(why);
        }
    });
    pool.set_passive_sink(sink.clone());
    // Read workers that cannot reach their replica are a signal about it too.
    for g in reads.iter().flat_map(|(r, _)| r.groups()) {
        g.set_passive_sink(sink.clone());
    }
    let health: Vec<_> = monitors.iter().map(|(n, m)| (n.clone(), m.health())).collect();
    let cfg = config_tx.subscribe();
    let delay_metrics = metrics.clone();
    let (events, metrics, stop_p) = (events.clone(), metrics.clone(), stop.clone());
    let provider = match (single, cluster.topology) {
        (true, _) => manager::spawn_static(&cluster, events, stop_p),
        (false, Topology::Galera) => galera::spawn_galera(cfg, health.clone(), events, metrics, stop_p),
        (false, Topology::GroupReplication) => {
            group_replication::spawn_group_replication(cfg, health.clone(), events, metrics, stop_p)
        }
        (false, Topology::Replication) => crate::cluster::replication::spawn_replication(
            cfg,
            health.clone(),
            pool.busy_watch(),
            events,
            metrics,
            stop_p,
        ),
    };
    let rt = ClusterRuntime::start(
        config_tx,
        config.pool.clone(),
        health,
        provider,
        pool,
        reads,
        !single,
        stop.clone(),
    );
    let source = crate::cluster::delay::default_source(config.listen.client);
    if let Some(d) = crate::cluster::delay::spawn(
        rt.config(),
        rt.provider.view.clone(),
        source,
        delay_metrics,
        stop.clone(),
    ) {
        if rt.reads.is_some() {
            tokio::spawn(crate::cluster::manager::follow_delay(
                rt.clone(),
                d.view.clone(),
                stop.clone(),
            ));
        }
        let _ = rt.delay.set(d);
    }
    rt
}

/// What of the clusters a SIGHUP cannot change (names, topology, members, credentials).
fn cluster_shape(config: &Config) -> Vec<ClusterConfig> {
    config
        .clusters
        .iter()
        .map(|c| ClusterConfig {
            health: HealthConfig::default(),
            failover: FailoverConfig::default(),
            ..c.clone()
        })
        .collect()
}

/// SIGHUP: health and failover settings apply live.
fn reload_clusters(ctx: &Ctx, new: &Config) {
    for c in &new.clusters {
        if let Some(rt) = ctx.clusters.iter().find(|r| r.name == c.name) {
            let current = rt.config().borrow().clone();
            if current.health != c.health || current.failover != c.failover {
                info!(cluster = %c.name, "SIGHUP: health and failover settings applied");
                rt.reconfigure(Arc::new(ClusterConfig {
                    health: c.health.clone(),
                    failover: c.failover.clone(),
                    ..(*current).clone()
                }));
            }
        }
    }
}

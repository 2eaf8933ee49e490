//! Worker processes: one task per slot spawns the real `osprey-worker` binary,
//! watches it, kills it when told, and refills the slot when it exits — at once
//! after a normal exit, with exponential back-off when the slot crash-loops.
//! It also runs the elastic sizing loop.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};
use tracing::{error, info, warn, Instrument};

use crate::pool::env::WorkerEnv;
use crate::pool::{SlotGroup, Spawn};

/// Worker exit codes (see the worker's crate docs).
const EXIT_FATAL_DB: i32 = 2;
const EXIT_BACKEND_UNAVAILABLE: i32 = 3;
/// A worker that dies abnormally sooner than this after its start counts as crash-looping.
const HEALTHY_LIFETIME: Duration = Duration::from_secs(5);

pub struct Supervisor {
    env: Arc<WorkerEnv>,
    worker_binary: PathBuf,
    socket_path: PathBuf,
    tasks: std::sync::Mutex<JoinSet<()>>,
}

impl Supervisor {
    pub fn new(env: Arc<WorkerEnv>, worker_binary: PathBuf, socket_path: PathBuf) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            env,
            worker_binary,
            socket_path,
            tasks: std::sync::Mutex::new(JoinSet::new()),
        })
    }

    /// Sets the number of slots: starts tasks for new slots; extra slots retire
    /// through the quit handshake (their tasks end when the process exits).
    /// Sets the number of write slots of every cluster (read groups follow their
    /// cluster's wish instead: [`Supervisor::follow_read_sizes`]).
    pub fn resize(self: &Arc<Self>, size: usize) {
        for pool in self.env.groups.clone() {
            if pool.read_member().is_none() {
                self.resize_group(&pool, size);
            }
        }
    }

    /// Keeps each read group at the size its cluster's follower asks for
    /// (`pool.replica_size` while its member is a replica, 0 otherwise).
    pub fn follow_read_sizes(self: &Arc<Self>) {
        for pool in self.env.groups.clone() {
            if pool.read_member().is_none() {
                continue;
            }
            let sup = self.clone();
            let draining = self.env.draining.clone();
            tokio::spawn(async move {
                let mut wanted = pool.wanted_size();
                loop {
                    let size = *wanted.borrow_and_update();
                    if size != pool.target_size() {
                        sup.resize_group(&pool, size);
                    }
                    tokio::select! {
                        r = wanted.changed() => if r.is_err() { return },
                        _ = draining.cancelled() => return,
                    }
                }
            });
        }
    }

    /// Sets the number of slots of one group: starts tasks for new slots; extra slots
    /// retire through the quit handshake (their tasks end when the process exits).
    pub fn resize_group(self: &Arc<Self>, pool: &Arc<SlotGroup>, size: usize) {
        // Held across choosing the new indices and registering them, so that two
        // resizes (admin, SIGHUP, elastic loop) cannot pick the same free index.
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let created = pool.resize(size);
        info!(
            cluster = pool.cluster(),
            size,
            new_slots = created.len(),
            "pool resized"
        );
        for index in created {
            let (kill_tx, kill_rx) = mpsc::unbounded_channel();
            pool.add_slot(index, kill_tx);
            let sup = self.clone();
            let pool = pool.clone();
            let span = tracing::info_span!("slot", cluster = pool.cluster(), slot = index);
            tasks.spawn(async move { sup.run_slot(pool, index, kill_rx).await }.instrument(span));
        }
    }

    /// Waits until every slot task has ended (after `SlotGroup::shutdown`).
    pub async fn wait_all(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let finished = {
                let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
                while tasks.try_join_next().is_some() {}
                tasks.is_empty()
            };
            if finished {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills every worker at once (second signal, or the quit handshake took too long).
    pub fn abort_all(&self) {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).abort_all();
    }

    async fn run_slot(
        self: Arc<Self>,
        pool: Arc<SlotGroup>,
        index: u32,
        mut kill_rx: mpsc::UnboundedReceiver<&'static str>,
    ) {
        let cfg = &self.env.pool;
        let min_backoff = Duration::from_millis(cfg.respawn_backoff_min_ms);
        let max_backoff = Duration::from_millis(cfg.respawn_backoff_max_ms);
        let mut backoff = min_backoff;
        let mut first = true;
        let mut target = pool.target_changes();
        loop {
            // Kill requests aimed at the previous process are stale now (drained before
            // the new generation exists, so a kill for the new one cannot be lost).
            while kill_rx.try_recv().is_ok() {}
            target.borrow_and_update();
            let generation = match pool.begin_spawn(index) {
                Spawn::Go(generation) => generation,
                Spawn::Gone => return,
                Spawn::NoTarget => {
                    tokio::select! {
                        _ = target.changed() => {}
                        _ = self.env.draining.cancelled() => return,
                    }
                    continue;
                }
            };
            if !first {
                self.env.metrics.respawns.inc();
            }
            first = false;
            let started = Instant::now();
            let status = match self.spawn(&pool, index, generation).await {
                Ok(child) => {
                    let pid = child.id().unwrap_or(0);
                    info!(pid, generation, "worker started");
                    self.watch(&pool, child, index, generation, &mut kill_rx).await
                }
                Err(e) => {
                    error!("cannot start worker {}: {e}", self.worker_binary.display());
                    None
                }
            };
            let code = status.and_then(|s| s.code());
            if code == Some(EXIT_FATAL_DB) {
                self.env.metrics.fatal_exits.inc();
                pool.report_passive(index, generation, "a worker lost its database session");
            }
            if code == Some(EXIT_BACKEND_UNAVAILABLE) {
                pool.report_passive(index, generation, "a worker could not open its database session");
            }
            if !pool.process_exited(index, generation) {
                info!(?status, "slot retired");
                return;
            }
            let crashed = code != Some(0);
            if crashed && (started.elapsed() < HEALTHY_LIFETIME || code == Some(EXIT_BACKEND_UNAVAILABLE)) {
                warn!(
                    ?status,
                    backoff_ms = backoff.as_millis() as u64,
                    "worker crash-looping; backing off"
                );
                // A new target (failover, switchover) or the end of a hold (the member
                // is back) ends the back-off: the member is likely up, and writes are
                // waiting for these workers. A drain does not: a slot that cannot start
                // its worker would retry without pause until the process exits. The end
                // of the drain does (the group is shut down by then: the slot is gone),
                // or the process would wait out the back-off before it exits.
                let retargeted = tokio::select! {
                    _ = sleep(backoff) => false,
                    _ = self.env.abort.cancelled() => false,
                    _ = target.changed() => true,
                };
                backoff = if retargeted {
                    min_backoff
                } else {
                    (backoff * 2).min(max_backoff)
                };
            } else {
                if crashed {
                    warn!(?status, "worker exited abnormally; respawning");
                }
                backoff = min_backoff;
            }
        }
    }

    /// Starts the worker process of `index` and records its pid in the pool *before*
    /// handing it the secret: the worker can register as soon as it has the secret, and
    /// its registration is checked against that pid.
    async fn spawn(&self, pool: &SlotGroup, index: u32, generation: u64) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.worker_binary);
        cmd.arg("--socket")
            .arg(&self.socket_path)
            .arg("--slot")
            .arg(index.to_string())
            .env("RUST_LOG", &self.env.pool.worker_log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Own process group: a Ctrl-C or a signal to the dispatcher's group must
            // not reach workers; their lifecycle is the quit handshake.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Workers die with the dispatcher. PDEATHSIG fires when the *thread*
                // that forked exits; we spawn from runtime threads (the main thread with
                // the single-threaded runtime), which live as long as the dispatcher
                // (never from spawn_blocking threads).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        pool.set_pid(index, generation, child.id().unwrap_or(0));
        // The secret goes over a pipe: not visible in ps or /proc/PID/environ.
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(self.env.secret.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
        }
        Ok(child)
    }

    async fn watch(
        &self,
        pool: &SlotGroup,
        mut child: Child,
        index: u32,
        generation: u64,
        kill_rx: &mut mpsc::UnboundedReceiver<&'static str>,
    ) -> Option<ExitStatus> {
        // The same budget the worker link allows: register, then open the database session.
        let connect = pool.settings_for(index, generation).map_or(0, |s| s.connect_timeout_ms);
        let budget = self.env.pool.register_timeout_ms + connect;
        let register_deadline = Instant::now() + Duration::from_millis(budget);
        let mut checking_registration = true;
        loop {
            tokio::select! {
                status = child.wait() => return status.ok(),
                Some(why) = kill_rx.recv() => {
                    warn!(pid = child.id(), "killing worker: {why}");
                    let _ = child.start_kill();
                }
                _ = tokio::time::sleep_until(register_deadline), if checking_registration => {
                    checking_registration = false;
                    if !pool.is_ready(index, generation) {
                        warn!(pid = child.id(), "worker did not register in time; killing it");
                        let _ = child.start_kill();
                    }
                }
            }
        }
    }

    /// Elastic mode: grow while requests wait, shrink after sustained idleness.
    pub async fn run_elastic(self: Arc<Self>) {
        let (Some(min), Some(max)) = (self.env.pool.min, self.env.pool.max) else {
            return;
        };
        let shrink_after = Duration::from_secs(self.env.pool.shrink_after_s.max(1));
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let groups: Vec<Arc<SlotGroup>> = self
            .env
            .groups
            .iter()
            .filter(|g| g.read_member().is_none())
            .cloned()
            .collect();
        let mut idle_since: Vec<Option<Instant>> = vec![None; groups.len()];
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.env.draining.cancelled() => return,
            }
            for (pool, idle_since) in groups.iter().zip(idle_since.iter_mut()) {
                let size = pool.target_size();
                // Requests that wait through a hold (switch, member down) are not load:
                // more slots for a member that cannot serve would only crash-loop.
                if pool.queue_depth() > 0 && pool.is_dispatching() {
                    *idle_since = None;
                    if size < max {
                        self.resize_group(pool, size + 1);
                    }
                } else if pool.idle_count() > 0 && size > min {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= shrink_after {
                        self.resize_group(pool, size - 1);
                        *idle_since = Some(Instant::now());
                    }
                } else {
                    *idle_since = None;
                }
            }
        }
    }
}

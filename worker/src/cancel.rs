//! Which streams are open, which one is executing, and stopping it: a `CANCEL` from the
//! dispatcher or a request's own timeout turns into `KILL QUERY` on a side connection.
//!
//! Shared between the link reader (which acts on `CANCEL` while a query runs), the
//! executor, and the tasks of request timers and `KILL QUERY`. The lock is never held
//! across an `.await`.

use foldhash::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::session::Killer;

/// Pause after the first `KILL QUERY` before checking whether the statement ended; it
/// doubles up to [`RETRY_MAX`] while the statement keeps running.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_millis(200);

/// Why a stream is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `CANCEL` from the dispatcher.
    Cancelled,
    /// The request's `timeout_ms` elapsed.
    TimedOut,
}

#[derive(Default)]
struct Inner {
    /// Streams received and not yet ended, with the stop asked for them (if any).
    open: HashMap<u32, Option<StopReason>>,
    /// The stream whose statement is on the database connection right now.
    running: Option<u32>,
    /// The running statement's text as sent, when statements are pipelined behind it:
    /// a stop then kills it by its `QUERY_ID` (looked up by this text), never a neighbour.
    running_sql: Option<Arc<str>>,
    /// Streams whose statements are written to the database behind the running one
    /// (pipelined), not yet started.
    written: HashSet<u32>,
    /// The `KILL QUERY` task of the running stream, and the signal that the stream ended.
    kill: Option<(JoinHandle<()>, Arc<Notify>)>,
    killer: Option<Arc<Killer>>,
}

#[derive(Clone, Default)]
pub struct Tracker(Arc<Mutex<Inner>>);

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the map inconsistent in a way that
        // matters more than the panic itself; keep going with the data.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The database session is open: stops now have something to kill.
    pub fn set_killer(&self, killer: Killer) {
        self.lock().killer = Some(Arc::new(killer));
    }

    /// A `REQUEST` arrived on `stream`.
    pub fn opened(&self, stream: u32) {
        self.lock().open.entry(stream).or_insert(None);
    }

    /// Asks to stop `stream`. Ignored for streams that are not open or already stopping.
    /// If it is executing, `KILL QUERY` is sent from a side connection, again and again
    /// until the stream's statement has ended: a `KILL QUERY` that reaches the server
    /// just before the statement starts is lost (the server clears it when the next
    /// command begins), and the statement would run its full course.
    pub fn stop(&self, stream: u32, reason: StopReason) {
        let mut inner = self.lock();
        let Some(slot) = inner.open.get_mut(&stream) else {
            return;
        };
        if slot.is_some() {
            return;
        }
        *slot = Some(reason);
        if inner.running == Some(stream) {
            self.spawn_kill(&mut inner, stream, reason);
        }
    }

    fn spawn_kill(&self, inner: &mut Inner, stream: u32, reason: StopReason) {
        if let Some(killer) = inner.killer.clone() {
            info!(stream, ?reason, "stopping the running statement (KILL QUERY)");
            let ended = Arc::new(Notify::new());
            let task = tokio::spawn(kill_until_ended(self.clone(), stream, killer, ended.clone()));
            inner.kill = Some((task, ended));
        }
    }

    /// `stream`'s statement is about to be written to the database behind the running
    /// one (pipelined); `Err` if a stop was asked before (then it is not written).
    pub fn write_ahead(&self, stream: u32) -> Result<(), StopReason> {
        let mut inner = self.lock();
        match *inner.open.entry(stream).or_insert(None) {
            Some(reason) => Err(reason),
            None => {
                inner.written.insert(stream);
                Ok(())
            }
        }
    }

    /// The pipelined `stream` (written with [`Tracker::write_ahead`], or the first one,
    /// started with [`Tracker::start`]) is now the one the database runs, as `sql`. A
    /// stop asked while it waited behind another is acted on now. Returns that stop.
    pub fn advance(&self, stream: u32, sql: Arc<str>) -> Option<StopReason> {
        let mut inner = self.lock();
        inner.written.remove(&stream);
        inner.running = Some(stream);
        inner.running_sql = Some(sql);
        let stop = inner.open.get(&stream).copied().flatten();
        if let Some(reason) = stop {
            if inner.kill.is_none() {
                self.spawn_kill(&mut inner, stream, reason);
            }
        }
        stop
    }

    /// Whether a stop was asked for the running `stream` (nothing more is then written
    /// behind it, so that a plain `KILL QUERY` cannot hit a neighbour).
    pub fn stopping(&self, stream: u32) -> bool {
        self.reason(stream).is_some()
    }

    /// What a `KILL` for the running `stream` must aim at: `Some(text)` when statements
    /// are written behind it (kill by query id), `None` for the whole session's query.
    fn kill_target(&self, stream: u32) -> Option<Arc<str>> {
        let inner = self.lock();
        if inner.running != Some(stream) || inner.written.is_empty() {
            return None;
        }
        inner.running_sql.clone()
    }

    /// The dispatcher takes `stream` back (it wrote it ahead of time, see
    /// `CANCEL_RECLAIM`): stopped if it has not started, so that it is answered as never
    /// run; ignored if it is executing or has ended.
    pub fn reclaim(&self, stream: u32) {
        let mut inner = self.lock();
        // Written to the database (the dispatcher got STARTED, or soon will): it runs on.
        if inner.running == Some(stream) || inner.written.contains(&stream) {
            return;
        }
        if let Some(slot @ None) = inner.open.get_mut(&stream) {
            *slot = Some(StopReason::Cancelled);
        }
    }

    /// `stream` was answered without running (taken back while queued): forgotten.
    pub fn forget(&self, stream: u32) {
        let mut inner = self.lock();
        if inner.running != Some(stream) {
            inner.open.remove(&stream);
        }
    }

    /// Whether `stream`'s request is still executing.
    fn running(&self, stream: u32) -> bool {
        self.lock().running == Some(stream)
    }

    /// The executor starts `stream`; `Err` if a stop was asked before it started.
    pub fn start(&self, stream: u32) -> Result<(), StopReason> {
        let mut inner = self.lock();
        let state = *inner.open.entry(stream).or_insert(None);
        match state {
            Some(reason) => Err(reason),
            None => {
                inner.running = Some(stream);
                Ok(())
            }
        }
    }

    /// The stop asked for `stream`, if any.
    pub fn reason(&self, stream: u32) -> Option<StopReason> {
        self.lock().open.get(&stream).copied().flatten()
    }

    /// Waits for a `KILL QUERY` in flight (so it cannot hit the next statement).
    /// False: the kill did not finish in time; one may still reach the session, whose
    /// state is then unknown (the caller gives the session up).
    pub async fn settle(&self) -> bool {
        let kill = self.lock().kill.take();
        if let Some((mut k, ended)) = kill {
            // No more attempts: the one in flight, if any, is waited for.
            ended.notify_one();
            if tokio::time::timeout(Duration::from_secs(10), &mut k).await.is_err() {
                k.abort();
                warn!("KILL QUERY did not finish within 10 s; abandoned");
                return false;
            }
        }
        true
    }

    /// `stream` has ended (its `END` is sent or about to be). No new `KILL QUERY` can start
    /// for it afterwards, and the one in flight (if any) is waited for.
    pub async fn finish(&self, stream: u32) -> bool {
        {
            let mut inner = self.lock();
            inner.open.remove(&stream);
            inner.written.remove(&stream);
            if inner.running == Some(stream) {
                inner.running = None;
                inner.running_sql = None;
            }
        }
        self.settle().await
    }
}

/// Sends `KILL QUERY` until `stream` stops running, with a growing pause between
/// attempts. A second one is needed when the first was lost (it reached the server before
/// the statement started: the server clears a pending kill when a command begins), or when
/// the kill is pending but its wake-up missed the statement (seen with `SLEEP`: the
/// processlist shows `Killed / User sleep` and the statement runs its full time). The
/// server's view of the session is logged with each retry. The executor settles this task
/// once the statement has returned, which ends it between attempts. One side connection
/// serves every attempt.
async fn kill_until_ended(tracker: Tracker, stream: u32, killer: Arc<Killer>, ended: Arc<Notify>) {
    let mut side = None;
    let mut pause = RETRY_FIRST;
    let mut kills = 0u32;
    loop {
        kills += 1;
        match tracker.kill_target(stream) {
            // Statements are pipelined behind it: `KILL QUERY` would stop whichever runs
            // when it lands; the query id stops this one only.
            Some(sql) => match killer.query_id(&mut side, &sql).await {
                Ok(Some(id)) => {
                    if let Err(e) = killer.kill_query(&mut side, Some(id)).await {
                        warn!(stream, kills, query_id = id, error = %e, "KILL QUERY ID failed");
                    }
                }
                // Not (or no longer) running on the server: look again after the pause.
                Ok(None) => debug!(stream, kills, "the statement is not in the processlist"),
                Err(e) => warn!(stream, kills, error = %e, "processlist query failed"),
            },
            None => {
                if let Err(e) = killer.kill_query(&mut side, None).await {
                    warn!(stream, kills, error = %e, "KILL QUERY failed");
                }
            }
        }
        tokio::select! {
            _ = ended.notified() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        if !tracker.running(stream) {
            break;
        }
        let state = killer.command(&mut side).await;
        debug!(stream, kills, ?state, "statement still running after KILL QUERY; again");
        pause = (pause * 2).min(RETRY_MAX);
    }
    if kills > 1 {
        info!(stream, kills, "statement stopped after repeated KILL QUERY");
    }
    // Not awaited here: the executor waits for this task before it answers.
    tokio::spawn(crate::session::close_side(side));
}

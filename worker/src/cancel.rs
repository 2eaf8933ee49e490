//! Which streams are open, which one is executing, and stopping it: a `CANCEL` from the
//! dispatcher or a request's own timeout turns into `KILL QUERY` on a side connection.
//!
//! Shared between the link reader (which acts on `CANCEL` while a query runs), the
//! executor, and the tasks of request timers and `KILL QUERY`. The lock is never held
//! across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::session::Killer;

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
    /// The `KILL QUERY` in flight for the running stream.
    kill: Option<JoinHandle<()>>,
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
    /// If it is executing, `KILL QUERY` is sent from a side connection.
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
            if let Some(killer) = inner.killer.clone() {
                info!(stream, ?reason, "stopping the running statement (KILL QUERY)");
                inner.kill = Some(tokio::spawn(async move {
                    if let Err(e) = killer.kill_query().await {
                        warn!(error = %e, "KILL QUERY failed");
                    }
                }));
            }
        }
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
        if let Some(mut k) = kill {
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
            if inner.running == Some(stream) {
                inner.running = None;
            }
        }
        self.settle().await
    }
}

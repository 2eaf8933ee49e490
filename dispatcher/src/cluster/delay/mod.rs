//! Replica-delay detection, as DBLE does it, with the gaps closed.
//!
//! One task per cluster. Every `delay_period_ms` it writes an increasing logical
//! timestamp into this dispatcher's row (`source`) of `<delay_database>.osprey_heartbeat`
//! on the primary, and reads the row back from each replica, all in parallel, each call
//! bounded by the round (4/5 of a period). A replica's delay is
//! `(acked − replica_ts) × delay_period_ms`, where `acked` is the last value the primary
//! acknowledged *before* the round began: a replica that keeps up reads that value and
//! shows 0, whatever the clocks say.
//!
//! Where DBLE keeps replicas in the read pool as "no delay" while the primary cannot be
//! written, here the delay is then unknown: a replica is eligible only while its reading
//! and the primary's last acknowledged write are both younger than two periods
//! ([`view::judge`]), and [`DelayView::eligible`] re-checks that freshness when asked, so a
//! stalled probe takes its replicas out by itself.
//!
//! The probe follows the topology provider's [`ClusterView`]: it writes to whoever is
//! primary now and reads from the members whose role is `replica`. After a failover the
//! first write to the new primary continues from `max(our next value, the row's + 1)`, so
//! the logical timestamp only grows. Writes are guarded by `WHERE @@global.read_only = 0`:
//! the monitor account may bypass `read_only` (`READ_ONLY ADMIN`), and a heartbeat written
//! into a demoted or fenced primary would be an errant transaction that diverges its GTID
//! history from the new primary's.
//!
//! Bounded: one session per member (the cluster's monitor account), a timeout on every
//! call (a session whose call timed out is dropped: it is out of step), a fixed number of
//! rows, nothing kept per round.

mod probe;
pub mod view;

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use view::{DelayRow, DelayView, HeartbeatView, ProbeStatus};

use crate::cluster::{ClusterConfig, ClusterView};
use crate::metrics::Metrics;

/// The heartbeat table's name, in `delay_database`.
pub const TABLE: &str = "osprey_heartbeat";

/// Resets waiting for the probe; one per member is plenty (it acts between rounds).
const RESET_QUEUE: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum DelayError {
    #[error("cluster {0} has no member {1}")]
    NoSuchMember(String, String),
    #[error("the delay probe of cluster {0} is not running")]
    Stopped(String),
    #[error("the delay probe of cluster {0} has too many resets queued; try again")]
    Busy(String),
}

/// How the router, the admin API and read-your-writes reach a cluster's delay probe.
#[derive(Debug, Clone)]
pub struct DelayHandle {
    /// Published after every round.
    pub view: watch::Receiver<DelayView>,
    cluster: String,
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    resets: mpsc::Sender<String>,
}

impl DelayHandle {
    /// Closes `member`'s probe session; the next round opens a new one (a new connection
    /// id). Never waits: the probe acts between rounds.
    pub fn reset(&self, member: &str) -> Result<(), DelayError> {
        if self.cfg.borrow().member(member).is_none() {
            return Err(DelayError::NoSuchMember(self.cluster.clone(), member.to_owned()));
        }
        self.resets.try_send(member.to_owned()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => DelayError::Busy(self.cluster.clone()),
            mpsc::error::TrySendError::Closed(_) => DelayError::Stopped(self.cluster.clone()),
        })
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// See [`DelayView::eligible`].
    pub fn eligible(&self, member: &str) -> bool {
        self.view.borrow().eligible(member)
    }
}

/// The `source` of a dispatcher whose clients connect to `client`: `hostname:port`, the
/// same across restarts (one row per dispatcher, not one per process).
pub fn default_source(client: std::net::SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| client.ip().to_string());
    format!("{host}:{}", client.port())
}

/// Starts the cluster's delay probe; `None` when its config does not enable it (the three
/// `delay_*` settings). `source` names this dispatcher's heartbeat row (e.g. its client
/// address), so that dispatchers sharing a cluster do not overwrite each other's.
/// Settings changes through `cfg` apply from the next round.
pub fn spawn(
    cfg: watch::Receiver<Arc<ClusterConfig>>,
    topology: watch::Receiver<ClusterView>,
    source: String,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Option<DelayHandle> {
    let cluster = cfg.borrow().clone();
    let settings = cluster.delay()?;
    let (view_tx, view_rx) = watch::channel(DelayView {
        cluster: cluster.name.clone(),
        source: source.clone(),
        period_ms: settings.period_ms,
        threshold_ms: settings.threshold_ms,
        database: settings.database.clone(),
        ..Default::default()
    });
    let (reset_tx, reset_rx) = mpsc::channel(RESET_QUEUE);
    let span = tracing::info_span!("delay", cluster = %cluster.name);
    let task = probe::Probe::new(cfg.clone(), topology, source, metrics, view_tx);
    tokio::spawn(task.run(reset_rx, shutdown).instrument(span));
    Some(DelayHandle {
        view: view_rx,
        cluster: cluster.name.clone(),
        cfg,
        resets: reset_tx,
    })
}

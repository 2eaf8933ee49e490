//! What the providers that follow the backend's own choice of writer (`galera`,
//! `group_replication`) share: one monitor-account connection per member for their status
//! queries, and publishing a view (epoch, the `followed` switch event, the writer gauge).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use crate::backend_conn::{ConnectError, Connector};
use crate::cluster::config::{ClusterConfig, MemberConfig};
use crate::cluster::events::EventLog;
use crate::cluster::view::{ClusterView, SwitchEvent, SwitchStep};
use crate::metrics::MemberLabel;

/// Why a status query to a member gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("connect timed out after {0:?}")]
    ConnectTimeout(Duration),
    #[error("connect failed: {0}")]
    Connect(#[source] mysql_async::Error),
    #[error("status query timed out after {0:?}")]
    QueryTimeout(Duration),
    #[error("status query failed: {0}")]
    Query(#[source] mysql_async::Error),
}

impl ProbeError {
    /// The member did not answer in time: it may be slow rather than gone.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ProbeError::ConnectTimeout(_) | ProbeError::QueryTimeout(_))
    }
}

/// One member's status connection (monitor credentials, the cluster's TLS, TCP only). It
/// is dropped on any error or timeout and made again on the next round, so a round never
/// waits on a connection that a previous round left in an unknown state.
pub struct MemberConn {
    connector: Connector,
    conn: Option<Conn>,
}

impl MemberConn {
    pub fn new(cluster: &ClusterConfig, member: &MemberConfig) -> MemberConn {
        MemberConn {
            connector: cluster.monitor_connector(member),
            conn: None,
        }
    }

    /// Runs `sql` (text protocol) and returns its rows as optional strings, connecting
    /// first when needed. Both steps are bounded; the caller picks timeouts below its
    /// interval, so one slow member never delays the next round.
    pub async fn rows(
        &mut self,
        sql: &str,
        connect_timeout: Duration,
        query_timeout: Duration,
    ) -> Result<Vec<Vec<Option<String>>>, ProbeError> {
        let conn = match self.conn.as_mut() {
            Some(conn) => conn,
            None => {
                let conn = self.connector.connect(connect_timeout).await.map_err(|e| match e {
                    ConnectError::Timeout(after) => ProbeError::ConnectTimeout(after),
                    ConnectError::Mysql(e) => ProbeError::Connect(e),
                })?;
                self.conn.insert(conn)
            }
        };
        let result = tokio::time::timeout(query_timeout, conn.query::<mysql_async::Row, _>(sql)).await;
        match result {
            Ok(Ok(rows)) => Ok(rows.into_iter().map(row_strings).collect()),
            Ok(Err(e)) => {
                // A server error leaves the session usable; anything else does not.
                if e.is_fatal() {
                    self.conn = None;
                }
                Err(ProbeError::Query(e))
            }
            Err(_) => {
                // Dropping the connection mid-query is the only way out; it is not reused.
                self.conn = None;
                Err(ProbeError::QueryTimeout(query_timeout))
            }
        }
    }
}

fn row_strings(row: mysql_async::Row) -> Vec<Option<String>> {
    row.unwrap()
        .into_iter()
        .map(|v| match v {
            Value::NULL => None,
            Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            Value::Int(i) => Some(i.to_string()),
            Value::UInt(u) => Some(u.to_string()),
            other => Some(other.as_sql(true)),
        })
        .collect()
}

fn same_but_last_seen(a: &ClusterView, b: &ClusterView) -> bool {
    let strip = |v: &ClusterView| {
        let mut v = v.clone();
        v.members.iter_mut().for_each(|m| m.last_seen = None);
        v
    };
    strip(a) == strip(b)
}

/// Timeouts of one round: the configured ones, capped below the interval so that a round
/// always ends before the next one is due.
pub fn round_timeouts(cluster: &ClusterConfig) -> (Duration, Duration) {
    let h = &cluster.health;
    let cap = Duration::from_millis((h.interval_ms * 9 / 10).max(1));
    (h.connect_timeout().min(cap), h.ping_timeout().min(cap))
}

/// Publishes views for one cluster: bumps the epoch when the writer changes, logs the
/// change, and keeps the writer gauge.
pub struct Publisher {
    pub view_tx: watch::Sender<ClusterView>,
    pub events: Arc<EventLog>,
    pub gauge: Family<MemberLabel, Gauge>,
    /// Members whose gauge was set, so that a member dropped from the config gets 0.
    gauged: Vec<String>,
}

/// Why the writer moved, for the switch log.
pub struct Move<'a> {
    pub kind: &'static str,
    pub detail: Option<String>,
    /// When the round that saw the reason began (the event's duration runs from there).
    pub seen_at: Instant,
    pub started: SystemTime,
    pub steps: &'a [(&'static str, Instant, bool, Option<String>)],
}

impl Publisher {
    pub fn new(view_tx: watch::Sender<ClusterView>, events: Arc<EventLog>, gauge: Family<MemberLabel, Gauge>) -> Self {
        Publisher {
            view_tx,
            events,
            gauge,
            gauged: Vec::new(),
        }
    }

    pub fn current(&self) -> ClusterView {
        self.view_tx.borrow().clone()
    }

    /// Sends `next` if it differs from the current view. When its primary differs, bumps the
    /// epoch and, unless this is the first writer ever chosen, logs a switch event built
    /// from `why`. Returns the event logged.
    pub fn publish(&mut self, mut next: ClusterView, why: Option<Move<'_>>) -> Option<SwitchEvent> {
        let prev = self.view_tx.borrow().clone();
        let mut event = None;
        next.epoch = prev.epoch;
        if next.primary != prev.primary {
            next.epoch = prev.epoch + 1;
            let first_pick = prev.primary.is_none() && prev.epoch == 0;
            if let (false, Some(why)) = (first_pick, why) {
                let ms = |t: Instant| t.saturating_duration_since(why.seen_at).as_secs_f64() * 1e3;
                let mut steps: Vec<SwitchStep> = why
                    .steps
                    .iter()
                    .map(|(step, at, ok, detail)| SwitchStep {
                        step,
                        at_ms: ms(*at),
                        ok: *ok,
                        detail: detail.clone(),
                    })
                    .collect();
                let now = Instant::now();
                steps.push(SwitchStep {
                    step: "retarget",
                    at_ms: ms(now),
                    ok: true,
                    detail: next.primary.clone(),
                });
                let e = SwitchEvent {
                    cluster: next.name.clone(),
                    kind: why.kind,
                    old_primary: prev.primary.clone(),
                    new_primary: next.primary.clone(),
                    started: why.started,
                    duration_ms: ms(now),
                    ok: next.primary.is_some(),
                    steps,
                    detail: why.detail,
                };
                self.events.push(e.clone());
                event = Some(e);
            }
            tracing::info!(
                cluster = %next.name,
                old = ?prev.primary,
                new = ?next.primary,
                epoch = next.epoch,
                "writer changed"
            );
        }
        self.set_gauges(&next);
        if same_but_last_seen(&next, &prev) {
            // Only the members' last_seen moved: readers see it, waiters are not woken
            // every round for it.
            self.view_tx.send_if_modified(|v| {
                *v = next;
                false
            });
        } else {
            self.view_tx.send_replace(next);
        }
        event
    }

    fn set_gauges(&mut self, view: &ClusterView) {
        for m in &view.members {
            let label = MemberLabel {
                cluster: view.name.clone(),
                member: m.name.clone(),
            };
            let is_writer = view.primary.as_deref() == Some(m.name.as_str());
            self.gauge.get_or_create(&label).set(i64::from(is_writer));
        }
        for gone in self.gauged.iter().filter(|g| view.member(g).is_none()) {
            let label = MemberLabel {
                cluster: view.name.clone(),
                member: gone.clone(),
            };
            self.gauge.get_or_create(&label).set(0);
        }
        self.gauged = view.members.iter().map(|m| m.name.clone()).collect();
    }
}

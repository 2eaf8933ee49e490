//! What the delay probe publishes (`GET /delay`, the router's eligibility), and the pure
//! rule that turns one replica's last measurement into a verdict.

use std::time::{Duration, Instant};

use serde::Serialize;

/// DBLE's heartbeat status of one probe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    /// No measurement yet (no session yet, no heartbeat row replicated yet, or no
    /// primary write acknowledged yet to compare with).
    #[default]
    Init,
    Ok,
    /// The connect or the statement failed.
    Error,
    /// The probe did not answer within its budget (about one period).
    Timeout,
}

/// One replica, with DBLE's columns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DelayRow {
    pub cluster: String,
    /// The member.
    pub name: String,
    /// `host:port`.
    pub host: String,
    /// Logical delay: `(primary_ts − replica_ts) × delay_period_ms`, independent of clocks.
    /// `None` while unknown (no measurement, or the primary's heartbeat write is not fresh).
    pub delay_ms: Option<u64>,
    /// pt-heartbeat's measure: the replica's `UTC_TIMESTAMP(6)` minus the row's
    /// `real_timestamp` (the primary's clock when it wrote it). Depends on both clocks and
    /// includes the row's age (up to one period).
    pub wall_delay_ms: Option<i64>,
    pub status: ProbeStatus,
    pub message: Option<String>,
    /// Unix ms of the last successful read (as `/cluster`'s `last_seen`).
    pub last_active: Option<u64>,
    /// The probe session's `CONNECTION_ID()` (changes after `POST /delay/reset`).
    pub connection_id: Option<u32>,
    /// The logical timestamp the replica has applied (`logic_timestamp` of our row).
    pub logic_timestamp: Option<u64>,
    /// The replica's `@@gtid_slave_pos`, read in the same statement as the heartbeat row.
    /// A position only grows, so an old reading is a lower bound of what it has applied.
    pub gtid_applied: Option<String>,
    /// In the read pool as far as delay goes, at the time of publishing; see
    /// [`DelayView::eligible`] for the answer now.
    pub eligible: bool,
    /// The measurement counts until then (about two periods after it was taken).
    #[serde(skip)]
    pub fresh_until: Option<Instant>,
}

/// The heartbeat writer on the primary.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HeartbeatView {
    /// The primary it writes to (`None`: the cluster has none now).
    pub name: Option<String>,
    pub host: Option<String>,
    pub status: ProbeStatus,
    pub message: Option<String>,
    /// The last logical timestamp the primary acknowledged.
    pub logic_timestamp: Option<u64>,
    /// Unix ms of that acknowledgement.
    pub last_active: Option<u64>,
    pub connection_id: Option<u32>,
}

/// One cluster's delay detection, as its probe last published it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DelayView {
    pub cluster: String,
    /// This dispatcher's row in the heartbeat table.
    pub source: String,
    pub period_ms: u64,
    pub threshold_ms: u64,
    pub database: String,
    pub primary: HeartbeatView,
    /// Every configured member but the primary, in configuration order.
    pub replicas: Vec<DelayRow>,
    /// Probe rounds so far.
    pub rounds: u64,
}

impl DelayView {
    pub fn row(&self, member: &str) -> Option<&DelayRow> {
        self.replicas.iter().find(|r| r.name == member)
    }

    /// Whether `member` may serve reads as far as its delay goes, now: its probe is ok, its
    /// delay is at most the threshold, and the measurement is still fresh. A view that is
    /// no longer updated (the probe stalled or stopped) expires on its own.
    pub fn eligible(&self, member: &str) -> bool {
        self.row(member)
            .is_some_and(|r| r.eligible && r.fresh_until.is_some_and(|t| Instant::now() < t))
    }

    /// The GTID position `member` had applied at its last reading (a lower bound).
    pub fn applied(&self, member: &str) -> Option<&str> {
        self.row(member).and_then(|r| r.gtid_applied.as_deref())
    }
}

/// What the probe knows of the primary's heartbeat writes, for judging replicas.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrimaryAck {
    /// When the primary last acknowledged a write.
    pub at: Option<Instant>,
}

/// One replica's last reading.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    /// When it was taken (successfully).
    pub at: Option<Instant>,
    /// `acked − replica_ts` at that time, in periods; `None` when nothing was acknowledged
    /// yet to compare with, or the replica has no row yet.
    pub lag_periods: Option<u64>,
}

/// The verdict on one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub delay_ms: Option<u64>,
    pub eligible: bool,
    pub fresh_until: Option<Instant>,
    /// Why it is not eligible, when its own status does not say it.
    pub why: Option<String>,
}

/// Eligible only while the probe is ok, the delay is at most `threshold_ms`, and both the
/// replica's reading and the primary's last acknowledged write are younger than two
/// periods. A primary that cannot be written makes the delay unknown, not zero (where
/// DBLE would keep such replicas in the read pool).
pub(crate) fn judge(
    status: ProbeStatus,
    reading: Reading,
    primary: PrimaryAck,
    period_ms: u64,
    threshold_ms: u64,
    now: Instant,
) -> Verdict {
    let window = Duration::from_millis(period_ms.saturating_mul(2));
    let fresh_until = match (reading.at, primary.at) {
        (Some(r), Some(p)) => Some(r.min(p) + window),
        _ => None,
    };
    let primary_fresh = primary.at.is_some_and(|p| now < p + window);
    let delay_ms = match (status, reading.lag_periods) {
        (ProbeStatus::Ok, Some(lag)) if primary_fresh => Some(lag.saturating_mul(period_ms)),
        _ => None,
    };
    let why = match (status, delay_ms) {
        (ProbeStatus::Ok, None) if !primary_fresh => Some(match primary.at {
            Some(p) => format!(
                "delay unknown: the primary's last heartbeat write was acknowledged {} ms ago",
                now.saturating_duration_since(p).as_millis()
            ),
            None => "delay unknown: no heartbeat write acknowledged by the primary yet".into(),
        }),
        (ProbeStatus::Ok, None) => Some("delay unknown: no heartbeat row read yet".into()),
        (ProbeStatus::Ok, Some(d)) if d > threshold_ms => {
            Some(format!("delay {d} ms over the threshold {threshold_ms} ms"))
        }
        _ => None,
    };
    let fresh = fresh_until.is_some_and(|t| now < t);
    let eligible = status == ProbeStatus::Ok && fresh && delay_ms.is_some_and(|d| d <= threshold_ms);
    Verdict {
        delay_ms,
        eligible,
        fresh_until,
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 200;

    fn at(now: Instant, ms_ago: u64) -> Option<Instant> {
        Some(now - Duration::from_millis(ms_ago))
    }

    #[test]
    fn a_fresh_reading_under_the_threshold_is_eligible() {
        let now = Instant::now();
        let v = judge(
            ProbeStatus::Ok,
            Reading {
                at: at(now, 50),
                lag_periods: Some(1),
            },
            PrimaryAck { at: at(now, 100) },
            P,
            1000,
            now,
        );
        assert_eq!(v.delay_ms, Some(200));
        assert!(v.eligible, "{v:?}");
        assert_eq!(v.fresh_until, at(now, 100).map(|t| t + Duration::from_millis(2 * P)));
    }

    #[test]
    fn over_the_threshold_is_not_eligible_and_equal_is() {
        let now = Instant::now();
        let r = |lag| {
            judge(
                ProbeStatus::Ok,
                Reading {
                    at: at(now, 10),
                    lag_periods: Some(lag),
                },
                PrimaryAck { at: at(now, 10) },
                P,
                1000,
                now,
            )
        };
        assert!(r(5).eligible);
        let over = r(6);
        assert!(!over.eligible);
        assert_eq!(over.delay_ms, Some(1200));
        assert!(over.why.unwrap().contains("over the threshold"));
    }

    #[test]
    fn a_stale_primary_write_makes_the_delay_unknown_not_zero() {
        let now = Instant::now();
        let v = judge(
            ProbeStatus::Ok,
            Reading {
                at: at(now, 10),
                lag_periods: Some(0),
            },
            PrimaryAck { at: at(now, 2 * P + 1) },
            P,
            1000,
            now,
        );
        assert_eq!(v.delay_ms, None);
        assert!(!v.eligible);
        assert!(v.why.unwrap().starts_with("delay unknown"));
    }

    #[test]
    fn no_acknowledged_write_or_no_reading_is_not_eligible() {
        let now = Instant::now();
        let none = judge(
            ProbeStatus::Ok,
            Reading {
                at: at(now, 10),
                lag_periods: None,
            },
            PrimaryAck { at: None },
            P,
            1000,
            now,
        );
        assert!(!none.eligible && none.delay_ms.is_none() && none.fresh_until.is_none());
        let unread = judge(
            ProbeStatus::Init,
            Reading {
                at: None,
                lag_periods: None,
            },
            PrimaryAck { at: at(now, 10) },
            P,
            1000,
            now,
        );
        assert!(!unread.eligible);
    }

    #[test]
    fn a_failing_probe_is_not_eligible_whatever_it_read_before() {
        let now = Instant::now();
        for status in [ProbeStatus::Error, ProbeStatus::Timeout, ProbeStatus::Init] {
            let v = judge(
                status,
                Reading {
                    at: at(now, 10),
                    lag_periods: Some(0),
                },
                PrimaryAck { at: at(now, 10) },
                P,
                1000,
                now,
            );
            assert!(!v.eligible && v.delay_ms.is_none(), "{status:?}: {v:?}");
        }
    }

    #[test]
    fn an_old_reading_expires_in_the_view() {
        let now = Instant::now();
        let row = DelayRow {
            cluster: "c".into(),
            name: "r1".into(),
            host: "h:1".into(),
            delay_ms: Some(0),
            wall_delay_ms: None,
            status: ProbeStatus::Ok,
            message: None,
            last_active: None,
            connection_id: None,
            logic_timestamp: None,
            gtid_applied: Some("0-1-5".into()),
            eligible: true,
            fresh_until: Some(now - Duration::from_millis(1)),
        };
        let mut view = DelayView {
            replicas: vec![row],
            ..Default::default()
        };
        assert!(!view.eligible("r1"), "expired");
        view.replicas[0].fresh_until = Some(now + Duration::from_secs(5));
        assert!(view.eligible("r1"));
        assert!(!view.eligible("nobody"));
        assert_eq!(view.applied("r1"), Some("0-1-5"));
    }
}

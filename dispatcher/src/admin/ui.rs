//! The live operations page (issue 24): `GET /ui` and its assets, embedded in the binary
//! (plain HTML, CSS and JavaScript; the page draws its pictures and charts as SVG), and
//! `GET /ui/events`, the Server-Sent Events feed the page lives on.
//!
//! The shell and its assets hold no data and are served without the token; the page asks
//! for the admin token, keeps it in the tab's session storage and sends it as
//! `Authorization: Bearer` with the feed and every action. Actions call the ordinary admin
//! routes (`/cluster/switchover`, `/cluster/maintenance`, `/pool/size`,
//! `/digests/{id}/unblock`), so they log what those routes log.
//!
//! The feed sends one `snapshot` event (JSON: `/status`, `/cluster`, `/delay`, the last
//! switch events, `/digests`, `/throttle`, the slow log's counters, and the traffic since
//! the previous snapshot) at once, then every [`PERIOD`], and sooner (not closer than
//! [`MIN_GAP`]) when a cluster's primary, status or a member's role or health state
//! changes. A snapshot is built only when the connection asks for the next piece of the
//! body, that is when hyper has written the last one out: a reader that does not keep up
//! skips snapshots, and what a connection holds is one snapshot at most (in hyper's
//! bounded write buffer) beside the socket's own buffer. The connection counts against
//! `admin.max_connections` like any other; each snapshot moves bytes, so the idle timeout
//! does not end a feed that is read, and does end one whose reader stopped reading (no
//! byte moves once the socket's buffer is full).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::policy::{throttle_of, top_of};
use super::views::{delay_of, reports_of, status_of, AdminState};
use crate::cluster::view::{ClusterStatus, ClusterView, MemberHealth, Role};
use crate::metrics::{Metrics, TrafficCounts};

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// A snapshot at least this often.
pub const PERIOD: Duration = Duration::from_secs(1);
/// Snapshots brought forward by a cluster change come no closer together than this.
pub const MIN_GAP: Duration = Duration::from_millis(200);
/// Switch events a snapshot carries (the newest).
const EVENTS_SHOWN: usize = 20;
/// Rows of each top-digest list a snapshot carries.
const TOP_SHOWN: usize = 10;

/// Scripts only from this origin, no inline script, nothing fetched from elsewhere, no
/// framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// `/ui` and its assets (no token: they hold no data).
pub fn pages() -> Router {
    Router::new()
        .route("/ui", get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }))
        .route("/ui/", get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }))
        .route(
            "/ui/app.js",
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// `GET /ui/events` (token required, by the router): the snapshot feed.
/// The live feed's path: its connections are held apart ([`crate::admin::admission`]).
pub const EVENTS_PATH: &str = "/ui/events";

pub async fn events(State(state): State<AdminState>) -> Response {
    let feed = Feed::new(state);
    let stream = futures::stream::unfold(feed, |mut feed| async move {
        feed.wait().await;
        let frame = feed.frame();
        Some((Ok::<_, Infallible>(frame), feed))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// One connection's feed: when the last snapshot went, and the counters it was built from.
struct Feed {
    state: AdminState,
    views: Vec<watch::Receiver<ClusterView>>,
    health: Vec<watch::Receiver<MemberHealth>>,
    last: Option<Instant>,
    sent: u64,
    meter: TrafficMeter,
}

impl Feed {
    fn new(state: AdminState) -> Feed {
        let views = state.ctx.clusters.iter().map(|c| c.provider.view.clone()).collect();
        let health = state
            .ctx
            .clusters
            .iter()
            .flat_map(|c| c.health.iter().map(|(_, h)| h.clone()))
            .collect();
        Feed {
            state,
            views,
            health,
            last: None,
            sent: 0,
            meter: TrafficMeter::default(),
        }
    }

    /// Until the next snapshot is due: at once for the first, then [`PERIOD`] after the
    /// last, or [`MIN_GAP`] after it when a cluster changed meanwhile.
    async fn wait(&mut self) {
        let Some(last) = self.last else { return };
        let due = tokio::time::Instant::from_std(last + PERIOD);
        let mut changes: Vec<Pin<Box<dyn Future<Output = bool> + Send + '_>>> = Vec::new();
        for v in &mut self.views {
            changes.push(Box::pin(changed(v, view_shape)));
        }
        for h in &mut self.health {
            changes.push(Box::pin(changed(h, |h: &MemberHealth| h.state)));
        }
        let any_change = async move {
            // A sender gone (a provider stopped) says nothing: keep waiting on the others.
            while !changes.is_empty() {
                let (changed, _, rest) = futures::future::select_all(changes).await;
                if changed {
                    return;
                }
                changes = rest;
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = any_change => tokio::time::sleep_until(tokio::time::Instant::from_std(last + MIN_GAP)).await,
        }
    }

    /// The next SSE event: `event: snapshot`, one line of JSON.
    fn frame(&mut self) -> Bytes {
        let now = Instant::now();
        let snapshot = self.snapshot(now);
        self.last = Some(now);
        self.sent += 1;
        // A Value always serializes.
        let json = serde_json::to_string(&snapshot).unwrap_or_else(|_| "{}".into());
        Bytes::from(format!("event: snapshot\nid: {}\ndata: {json}\n\n", self.sent))
    }

    fn snapshot(&mut self, now: Instant) -> Value {
        let ctx = &self.state.ctx;
        let mut events = ctx.events.list(None);
        let events = events.split_off(events.len().saturating_sub(EVENTS_SHOWN));
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        json!({
            "at_ms": at_ms,
            "period_ms": PERIOD.as_millis() as u64,
            "status": status_of(ctx, &self.state.fds),
            "clusters": reports_of(ctx, None),
            "delay": delay_of(ctx, None),
            "events": events,
            "digests": top_of(ctx, TOP_SHOWN),
            "throttle": throttle_of(ctx),
            "slow_log": ctx.policy.slow_log().map(|l| {
                let mut v = serde_json::to_value(l.status()).unwrap_or_default();
                v["latest"] = serde_json::to_value(l.latest()).unwrap_or_default();
                v
            }),
            "traffic": self.meter.read(&ctx.metrics, now),
        })
    }
}

/// What of a cluster's view brings a snapshot forward when it changes.
fn view_shape(v: &ClusterView) -> (Option<String>, ClusterStatus, Vec<Role>, Vec<bool>) {
    (
        v.primary.clone(),
        v.status.clone(),
        v.members.iter().map(|m| m.role).collect(),
        v.members.iter().map(|m| m.maintenance).collect(),
    )
}

/// Resolves `true` once `key` of the watched value differs from what it is now, `false`
/// when the sender is gone.
async fn changed<T, K: PartialEq>(rx: &mut watch::Receiver<T>, key: impl Fn(&T) -> K) -> bool {
    let before = key(&rx.borrow_and_update());
    loop {
        if rx.changed().await.is_err() {
            return false;
        }
        if key(&rx.borrow_and_update()) != before {
            return true;
        }
    }
}

/// Rates between one snapshot's counters and the next one's.
#[derive(Default)]
struct TrafficMeter {
    last: Option<(Instant, TrafficCounts)>,
}

impl TrafficMeter {
    /// The totals now, and since the last reading: requests/s, failed requests/s by
    /// outcome, p50 and p99 latency (ms); the same for each slot group that served any
    /// (`groups`: cluster, role, member). The first reading has no rates (`null`).
    fn read(&mut self, metrics: &Metrics, now: Instant) -> Value {
        let counts = metrics.traffic();
        let last = self.last.as_ref();
        let secs = last.map(|(then, _)| now.duration_since(*then).as_secs_f64().max(0.001));
        let mut out = rates(&counts, last.map(|(_, b)| b), secs);
        let groups: Vec<Value> = counts
            .groups
            .iter()
            .map(|((cluster, role, member), g)| {
                let before = last.and_then(|(_, b)| b.groups.get(&(cluster.clone(), role.clone(), member.clone())));
                let mut v = rates(g, before.or(last.map(|_| &EMPTY)), secs);
                v["cluster"] = cluster.clone().into();
                v["role"] = role.clone().into();
                v["member"] = member.clone().into();
                v
            })
            .collect();
        out["groups"] = groups.into();
        self.last = Some((now, counts));
        out
    }
}

/// A group first seen in this reading counted from nothing.
static EMPTY: TrafficCounts = TrafficCounts {
    outcomes: Vec::new(),
    latency: Vec::new(),
    groups: std::collections::BTreeMap::new(),
};

/// Totals of `counts`, and with the reading `before` (taken `secs` earlier) the rates.
fn rates(counts: &TrafficCounts, before: Option<&TrafficCounts>, secs: Option<f64>) -> Value {
    let total = |c: &TrafficCounts| c.outcomes.iter().map(|(_, n)| n).sum::<u64>();
    let failed = |c: &TrafficCounts| -> u64 { c.outcomes.iter().filter(|(o, _)| o != "ok").map(|(_, n)| n).sum() };
    let mut out = json!({
        "requests": total(counts),
        "failed": failed(counts),
        "rps": null, "eps": null, "errors": {}, "p50_ms": null, "p99_ms": null,
    });
    let (Some(before), Some(secs)) = (before, secs) else {
        return out;
    };
    let rate = |n: u64| (n as f64 / secs * 100.0).round() / 100.0;
    out["rps"] = rate(total(counts).saturating_sub(total(before))).into();
    out["eps"] = rate(failed(counts).saturating_sub(failed(before))).into();
    let mut errors = serde_json::Map::new();
    for (outcome, n) in counts.outcomes.iter().filter(|(o, _)| o != "ok") {
        let was = before
            .outcomes
            .iter()
            .find(|(o, _)| o == outcome)
            .map_or(0, |(_, n)| *n);
        if *n > was {
            errors.insert(outcome.clone(), rate(n - was).into());
        }
    }
    out["errors"] = errors.into();
    out["p50_ms"] = quantile_ms(&before.latency, &counts.latency, 0.50).into();
    out["p99_ms"] = quantile_ms(&before.latency, &counts.latency, 0.99).into();
    out
}

/// The `q` quantile (ms) of the requests that ended between two readings of the latency
/// histogram (cumulative buckets), interpolated within its bucket; `None` when none ended.
fn quantile_ms(before: &[(f64, u64)], now: &[(f64, u64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, u64)> = now
        .iter()
        .map(|&(le, n)| {
            let was = before.iter().find(|(b, _)| *b == le).map_or(0, |(_, n)| *n);
            (le, n.saturating_sub(was))
        })
        .collect();
    let total = delta.last()?.1;
    if total == 0 {
        return None;
    }
    let target = q * total as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for &(le, n) in &delta {
        if n as f64 >= target {
            if !le.is_finite() {
                return Some(lower * 1000.0);
            }
            let within = (n - below).max(1) as f64;
            let v = lower + (le - lower) * ((target - below as f64) / within).clamp(0.0, 1.0);
            return Some((v * 1000.0 * 1000.0).round() / 1000.0);
        }
        (lower, below) = (le, n);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_buckets_filled_since_the_last_reading() {
        let before = [(0.001, 10), (0.002, 10), (0.004, 10), (f64::INFINITY, 10)];
        // Since then: 50 under 1 ms, 48 in (1, 2] ms, 2 in (2, 4] ms.
        let now = [(0.001, 60), (0.002, 108), (0.004, 110), (f64::INFINITY, 110)];
        let p50 = quantile_ms(&before, &now, 0.5).unwrap();
        assert!((p50 - 1.0).abs() < 1e-9, "{p50}");
        let p99 = quantile_ms(&before, &now, 0.99).unwrap();
        assert!(p99 > 2.0 && p99 <= 4.0, "{p99}");
        assert_eq!(quantile_ms(&now, &now, 0.5), None, "nothing ended: no quantile");
        // Past the last finite bound: that bound (a floor), not infinity.
        let over = [(0.001, 0), (f64::INFINITY, 5)];
        assert_eq!(quantile_ms(&[], &over, 0.99), Some(1.0));
    }
}

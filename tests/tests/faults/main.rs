//! One fault test per robustness risk (issue "Robustness"), with a real MariaDB, the real
//! `osprey-dispatcher` and its real `osprey-worker` processes, real signals and a real
//! fault-injecting TCP proxy. Every scenario ends with the closed-loop check: the
//! dispatcher's streams opened == closed with none open, the SDK clients' own counters
//! balanced, and every slot idle again.
//!
//! The tests of this file run one at a time ([`serial`]): their timing assertions (a slot
//! freed "within 1 s", a link declared dead "within keepalive_timeout") must not compete for
//! the two cores with another cluster of the same file.
//!
//! Run: `cargo build --bins && cargo test -p osprey-tests --test faults -- --nocapture`
//! (the figures — respawn counts, RSS, cut-off times — are printed).

mod admin_flood;
mod bad_input;
mod cancel;
mod database;
mod fairness;
mod fd_limits;
mod flow_control;
mod hangs;
mod keepalive;
mod malformed;
mod pipeline;
mod raw;
mod slow_client;
mod spec_rules;
mod stream_ids;
mod worker_socket;

use std::time::{Duration, Instant};

use osprey_client::{Client, Error};
use osprey_tests::harness::{wait_for, Cluster, Dispatcher};
use serde_json::Value as Json;

/// How long the closed loop may take to settle after a scenario.
pub const SETTLE: Duration = Duration::from_secs(10);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held for the whole of a test: the tests of this file run one at a time.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// Starts a cluster (one MariaDB primary, one dispatcher) with `overrides` on top of the
/// harness defaults.
pub async fn cluster(overrides: &str) -> Cluster {
    Cluster::start(overrides).await.expect("cluster starts")
}

/// An SDK error with all its fields, for assertion messages.
pub fn describe(e: &Error) -> String {
    format!(
        "{:?}/{:?} errno={:?} dispatched={} msg={}",
        e.origin(),
        e.code(),
        e.errno(),
        e.dispatched(),
        e.message()
    )
}

/// One slot as the admin status shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotInfo {
    pub slot: u64,
    pub pid: Option<u32>,
    pub state: String,
    pub requests: u64,
    pub db_connection_id: Option<u64>,
}

pub fn slots_of(status: &Json) -> Vec<SlotInfo> {
    status["slots"]
        .as_array()
        .expect("status.slots")
        .iter()
        .map(|s| SlotInfo {
            slot: s["slot"].as_u64().expect("slot index"),
            pid: s["pid"].as_u64().map(|p| p as u32),
            state: s["state"].as_str().unwrap_or("").to_owned(),
            requests: s["requests"].as_u64().unwrap_or(0),
            db_connection_id: s["db_connection_id"].as_u64(),
        })
        .collect()
}

pub async fn slots(d: &Dispatcher) -> Vec<SlotInfo> {
    slots_of(&d.status().await.expect("admin status"))
}

/// Waits until exactly one slot is busy and returns it.
pub async fn wait_busy(d: &Dispatcher, limit: Duration) -> SlotInfo {
    wait_for(limit, "one busy slot", || async {
        let s = d.status().await.ok()?;
        let busy: Vec<_> = slots_of(&s).into_iter().filter(|s| s.state == "busy").collect();
        (busy.len() == 1 && busy[0].pid.is_some()).then(|| busy[0].clone())
    })
    .await
    .expect("a busy slot")
}

/// Waits until `slot` is idle with a worker other than `old_pid`; returns the new slot view.
pub async fn wait_replaced(d: &Dispatcher, slot: u64, old_pid: u32, limit: Duration) -> SlotInfo {
    wait_for(
        limit,
        &format!("slot {slot} idle with a worker other than pid {old_pid}"),
        || async {
            slots(d)
                .await
                .into_iter()
                .find(|s| s.slot == slot && s.state == "idle" && s.pid.is_some_and(|p| p != old_pid))
        },
    )
    .await
    .expect("slot refilled")
}

/// A counter or gauge from `/metrics` (first sample whose name and labels match `series`).
pub async fn metric(d: &Dispatcher, series: &str) -> f64 {
    let text = d.metrics().await.expect("metrics");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse::<f64>().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// The closed-loop check after a fault scenario: the dispatcher's streams opened ==
/// closed with none open, every client's `streams_opened == streams_closed`, and all `n`
/// slots idle. Waits up to [`SETTLE`]. Returns the final admin status.
pub async fn assert_closed_loop(c: &Cluster, clients: &[&Client], n: usize) -> Json {
    let d = &c.dispatcher;
    d.wait_closed_loop(clients, SETTLE).await.expect("closed loop");
    let s = d.wait_idle(n, SETTLE).await.expect("every slot idle again");
    // Counters again, now that the slots are idle (nothing may have been reopened).
    assert_eq!(
        s["streams"]["opened"], s["streams"]["closed"],
        "streams: {}",
        s["streams"]
    );
    assert_eq!(s["clients"]["open_streams"], 0, "clients: {}", s["clients"]);
    for cl in clients {
        let st = cl.stats();
        assert_eq!(st.streams_opened, st.streams_closed, "client stats {st:?}");
        assert_eq!(st.in_flight, 0, "client stats {st:?}");
    }
    s
}

/// Milliseconds since `t`, for printing.
pub fn ms(t: Instant) -> u128 {
    t.elapsed().as_millis()
}

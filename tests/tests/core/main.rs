//! End to end: a real MariaDB sandbox, the real `osprey-dispatcher` with its real
//! `osprey-worker` processes, and the client SDK (or raw frames where the SDK would hide
//! what is tested). Each test starts its own cluster; pools are kept small to spare CPU.
//!
//! Every fault test ends by checking the closed loop: the dispatcher's streams opened ==
//! closed with none open, and the clients' own counters balance.

mod big;
mod faults;
mod load;
mod session;
mod transactions;
mod types;

use std::time::Duration;

use osprey_client::{Client, Error};
use osprey_tests::harness::Cluster;

/// How long the closed loop may take to settle after a test's last request.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Starts a cluster with `overrides` (TOML merged on top of the harness defaults).
pub async fn cluster(overrides: &str) -> Cluster {
    Cluster::start(overrides).await.expect("cluster starts")
}

/// A SDK client of the cluster's dispatcher.
pub async fn client(c: &Cluster) -> Client {
    c.dispatcher.client().await.expect("client connects")
}

/// Asserts the closed loop on the dispatcher and on `clients` (waits up to [`SETTLE`]).
pub async fn assert_closed_loop(c: &Cluster, clients: &[&Client]) -> serde_json::Value {
    let s = c
        .dispatcher
        .wait_closed_loop(clients, SETTLE)
        .await
        .expect("closed loop");
    for cl in clients {
        let st = cl.stats();
        assert_eq!(st.streams_opened, st.streams_closed, "client stats {st:?}");
        assert!(st.streams_opened > 0, "the client was used: {st:?}");
    }
    assert_eq!(s["streams"]["opened"], s["streams"]["closed"], "{s}");
    assert_eq!(s["clients"]["open_streams"], 0, "{s}");
    s
}

/// Formats an SDK error with all its fields, for assertion messages.
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

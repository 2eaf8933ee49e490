//! The operations surface: the admin HTTP API (the metrics it serves live on the ground
//! floor, `crate::metrics`, since every module counts into them).
//!
//! Imports point one way: `http.rs` (the routes and the server) takes from `ui.rs` (the
//! operations page) and `policy.rs` (digests, throttle); all three take from `views.rs`
//! (the state their handlers share, and the JSON both the API and the page show), which
//! takes from none of them.

pub mod admission;
pub mod http;
pub mod policy;
pub mod ui;
pub mod views;

pub use http::*;
pub use views::{status_of, AdminState, Clients, ClusterSummary, Fds, Status, Streams};

//! The Osprey dispatcher: accepts clients, supervises a pool of worker
//! processes (one database connection each), relays requests to them and
//! serves the admin API. A newcomer starts at `docs/ARCHITECTURE.md`.

pub mod admin;
pub mod admit;
pub mod backend_conn;
pub mod client;
pub mod cluster;
pub mod config;
pub mod ctx;
pub mod embedded;
pub mod fds;
pub mod metrics;
pub mod mysql;
pub mod policy;
pub mod pool;
pub mod request;
pub mod secrets;
pub mod server;

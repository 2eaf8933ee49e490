//! The Osprey dispatcher: accepts clients, supervises a pool of worker
//! processes (one database connection each), relays requests to them and
//! serves the admin API. See `docs/` and `../shared/DESIGN.md`.

pub mod admin;
pub mod client_conn;
pub mod config;
pub mod ctx;
pub mod fds;
pub mod job;
pub mod listen;
pub mod metrics;
pub mod pool;
pub mod relay;
pub mod server;
pub mod streams;
pub mod supervisor;
pub mod tls;
pub mod wait_queue;
pub mod worker_link;

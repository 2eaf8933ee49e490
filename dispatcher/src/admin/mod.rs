//! The operations surface: the admin HTTP API and the Prometheus metrics.

pub mod admission;
pub mod http;
pub mod metrics;
pub mod policy;

pub use http::*;

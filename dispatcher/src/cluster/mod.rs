//! Clusters and their members: topology providers, the health model and its
//! accumulator, failover and switchover.

pub mod config;

pub use config::*;

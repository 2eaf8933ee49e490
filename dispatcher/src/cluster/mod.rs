//! Clusters and their members: topology providers, the health model and its
//! accumulator, failover and switchover, replica-delay detection.
//!
//! Per cluster: one monitor task per member (`health/`) publishes a
//! [`MemberHealth`]; one topology provider task (`replication`, `galera`,
//! `group_replication`) reads those and the servers' own state, decides (or follows)
//! who the primary is and publishes a [`ClusterView`]; the slot groups
//! (`crate::pool`) re-target their workers when the view's primary changes.

pub mod config;
pub mod delay;
pub mod events;
pub mod follow;
pub mod galera;
pub mod group_replication;
pub mod health;
pub mod manager;
pub mod reads;
pub mod replication;
pub mod view;

pub use config::*;
pub use manager::{ClusterReport, ClusterRuntime};
pub use view::*;

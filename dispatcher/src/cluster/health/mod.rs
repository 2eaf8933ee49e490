//! The health model: per member one monitor task probes on several factors and feeds
//! an [`Accumulator`], whose verdict it publishes as a
//! [`MemberHealth`](crate::cluster::view::MemberHealth).

pub mod accumulator;
pub mod monitor;

pub use accumulator::Accumulator;
pub use monitor::{spawn_monitor, MonitorHandle, MonitorTarget};

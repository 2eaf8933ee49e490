//! Worker processes and the slots they fill: the slot group (assignment, wait
//! queue), the supervisor that spawns and respawns processes, the link task per
//! registered worker, and the relay of a request's frames.

pub mod config;
pub mod env;
pub mod group;
pub mod link;
pub mod relay;
pub mod stash;
pub mod supervisor;
pub mod wait_queue;

pub use config::PoolConfig;
pub use env::{LinkBounds, WorkerEnv};
pub use group::*;

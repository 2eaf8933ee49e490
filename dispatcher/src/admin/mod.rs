//! The operations surface: the admin HTTP API (the metrics it serves live on the ground
//! floor, `crate::metrics`, since every module counts into them).

pub mod admission;
pub mod http;
pub mod policy;
pub mod ui;

pub use http::*;

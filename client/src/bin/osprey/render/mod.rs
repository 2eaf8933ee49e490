//! How the admin API's answers are shown: text for a terminal, one renderer per answer,
//! each returning the text it would print.

pub mod clusters;
pub mod delay;
pub mod digests;
pub mod events;
pub mod sessions;
pub mod status;
pub mod table;
pub mod throttle;

//! The subcommands: what each asks of the dispatcher (the SDK for `sql`, the admin API for
//! the others) and which renderer shows the answer.

pub mod cluster;
pub mod delay;
pub mod digests;
pub mod mysql_password;
pub mod pool;
pub mod sessions;
pub mod shell;
pub mod sql;
pub mod status;
pub mod throttle;

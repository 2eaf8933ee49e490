//! The topology provider for `topology = "replication"`: MariaDB GTID replication with
//! semi-sync. It derives the topology from the servers, fails over when the primary is
//! down (verify → elect → catch up → promote → publish → re-point → fence), runs planned
//! switchovers, keeps a replaced primary read-only and rejoins it, and coordinates
//! several dispatchers through a majority `GET_LOCK`.
//!
//! - `gtid`: positions and how they compare;
//! - `facts`: what one member says about itself;
//! - `elect`: pure decisions on facts (derive the primary, repair, verify, elect);
//! - `steps`: the statements of a switch;
//! - `lock`: the failover lock on a majority of members;
//! - `provider`: the task: observe, derive, publish;
//! - `repair`, `failover`, `switchover`: what the lock holder changes;
//! - `record`: the timed steps of a switch, the ops hook.
//!
//! # Fault injection (tests only)
//! `OSPREY_FAULT_STOP_AFTER=<step>` makes the dispatcher SIGKILL itself right after that
//! step of a failover or switchover, to test a switch a crashed dispatcher left half done.
//! Steps, in order — failover: `verify`, `elect`, `catch_up`, `promote` (SQL thread
//! stopped, writable), `publish` (the view names it), `repoint` (the other replicas) and
//! `detach` (its own replication reset) side by side, `semi_sync` (semi-sync master on,
//! when the old primary had it), `fence` (the old primary); switchover: `drain`, `demote`,
//! `catch_up`, `promote`, `publish`, `repoint`/`detach`, `semi_sync`.

mod elect;
mod facts;
mod failover;
mod gtid;
mod lock;
mod provider;
mod record;
mod repair;
mod steps;
mod switchover;

use std::time::Duration;

use mysql_async::Conn;

pub use elect::{derive, elect, Derived};
pub use facts::{MemberFacts, SlaveFacts};
pub use gtid::Gtid;
pub use lock::lock_name;
pub use provider::spawn_replication;

use crate::backend_conn::ConnectError;
use crate::cluster::{ClusterConfig, MemberConfig};

#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    #[error("{member}: {source}")]
    Mysql {
        member: String,
        #[source]
        source: mysql_async::Error,
    },
    #[error("{member}: {what} did not finish within {after:?}")]
    Timeout {
        member: String,
        what: String,
        after: Duration,
    },
    #[error("{0}: {1}")]
    Unexpected(String, String),
}

impl ReplError {
    pub(crate) fn mysql(member: &str, source: mysql_async::Error) -> ReplError {
        ReplError::Mysql {
            member: member.to_owned(),
            source,
        }
    }
}

/// A new connection to `member` with the monitor account and the cluster's TLS, over
/// TCP (never the socket: a fault proxy in front must see it), bounded by `timeout`.
pub(crate) async fn connect(
    cluster: &ClusterConfig,
    member: &MemberConfig,
    timeout: Duration,
) -> Result<Conn, ReplError> {
    match cluster.monitor_connector(member).connect(timeout).await {
        Ok(conn) => Ok(conn),
        Err(ConnectError::Mysql(e)) => Err(ReplError::mysql(&member.name, e)),
        Err(ConnectError::Timeout(_)) => Err(ReplError::Timeout {
            member: member.name.clone(),
            what: "connect".into(),
            after: timeout,
        }),
    }
}

/// Test-only: SIGKILL this process right after `step` when `OSPREY_FAULT_STOP_AFTER` names it.
pub(crate) fn fault_point(step: &str) {
    if std::env::var("OSPREY_FAULT_STOP_AFTER").is_ok_and(|s| s == step) {
        tracing::error!(step, "OSPREY_FAULT_STOP_AFTER: killing the dispatcher");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

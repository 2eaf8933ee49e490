//! The crate's error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while starting, driving or stopping a sandbox.
///
/// Errors about a server carry the instance name (`primary`, `replica-1`, ...) and, where the
/// server itself is the likely culprit, the tail of its error log.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A MariaDB binary (`mariadbd` or `mariadb-install-db`) was not found.
    #[error(
        "MariaDB is not installed: `{binary}` not found (searched {}); \
         install it with `apt-get install -y mariadb-server`",
        display_paths(searched)
    )]
    NotInstalled {
        /// The binary that was looked for.
        binary: String,
        /// The directories that were searched.
        searched: Vec<PathBuf>,
    },

    /// `mariadb-install-db` failed while preparing the template data directory.
    #[error("mariadb-install-db failed ({status}); output tail:\n{output_tail}")]
    InstallDb {
        /// Exit status as text.
        status: String,
        /// The last lines of its combined output.
        output_tail: String,
    },

    /// `mariadbd` exited while it was being started.
    #[error("{instance}: mariadbd exited during startup ({status}); error log tail:\n{log_tail}")]
    Exited {
        /// Instance name.
        instance: String,
        /// Exit status as text.
        status: String,
        /// The last lines of the server's error log.
        log_tail: String,
    },

    /// The server did not become ready (TCP login with the app account, replication running)
    /// before the deadline.
    #[error("{instance}: not ready after {timeout:?}: {reason}; error log tail:\n{log_tail}")]
    NotReady {
        /// Instance name.
        instance: String,
        /// The deadline that passed.
        timeout: Duration,
        /// What was still missing (last connection error, replication state, ...).
        reason: String,
        /// The last lines of the server's error log.
        log_tail: String,
    },

    /// No port could be bound for the instance after several attempts.
    #[error("{instance}: could not start on a free port after {attempts} attempts; error log tail:\n{log_tail}")]
    NoFreePort {
        /// Instance name.
        instance: String,
        /// Ports tried.
        attempts: usize,
        /// The last lines of the server's error log.
        log_tail: String,
    },

    /// Replicas did not reach the primary's GTID position in time.
    #[error("replicas not caught up with the primary (gtid_binlog_pos {primary_pos:?}) after {timeout:?}: {detail}")]
    NotCaughtUp {
        /// The primary's `@@gtid_binlog_pos` that was waited for.
        primary_pos: String,
        /// The deadline that passed.
        timeout: Duration,
        /// Per replica: its `@@gtid_slave_pos` or the error seen.
        detail: String,
    },

    /// A replication operation was called on the primary.
    #[error("{instance} is not a replica")]
    NotAReplica {
        /// Instance name.
        instance: String,
    },

    /// The operation needs a running server, and this one is not running.
    #[error("{instance} is not running")]
    NotRunning {
        /// Instance name.
        instance: String,
    },

    /// A MySQL protocol or server error while talking to an instance.
    #[error("{instance}: {source}")]
    Mysql {
        /// Instance name.
        instance: String,
        /// The driver error.
        #[source]
        source: mysql_async::Error,
    },

    /// A file system or process error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl SandboxError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        SandboxError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn mysql(instance: &str, source: mysql_async::Error) -> Self {
        SandboxError::Mysql {
            instance: instance.to_owned(),
            source,
        }
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

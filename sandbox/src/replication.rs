//! GTID replication between the sandbox's instances: set-up, state checks, catching up.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use tokio::time::Instant;

use crate::instance::{Instance, Role};
use crate::{SandboxError, REPL_PASSWORD, REPL_USER};

const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The replication threads' state from `SHOW SLAVE STATUS`.
#[derive(Debug, Clone, Default)]
pub(crate) struct SlaveState {
    pub(crate) io_running: String,
    pub(crate) sql_running: String,
    pub(crate) last_io_error: String,
    pub(crate) last_sql_error: String,
}

impl SlaveState {
    fn unanswered() -> Self {
        SlaveState {
            io_running: "?".into(),
            sql_running: "? (the server did not answer)".into(),
            ..Default::default()
        }
    }

    fn describe(&self) -> String {
        format!(
            "Slave_IO_Running={} Slave_SQL_Running={} Last_IO_Error={:?} Last_SQL_Error={:?}",
            self.io_running, self.sql_running, self.last_io_error, self.last_sql_error
        )
    }
}

/// Points `replica` at the primary by GTID and starts replicating.
pub(crate) async fn configure(replica: &Instance, primary_port: u16) -> Result<(), SandboxError> {
    let mut conn = replica.admin_conn().await?;
    let sql = format!(
        "CHANGE MASTER TO master_host='127.0.0.1', master_port={primary_port}, \
         master_user='{REPL_USER}', master_password='{REPL_PASSWORD}', \
         master_use_gtid=slave_pos, master_connect_retry=1, master_heartbeat_period=1"
    );
    run(&mut conn, replica, &sql).await?;
    run(&mut conn, replica, "START SLAVE").await?;
    let _ = conn.disconnect().await;
    Ok(())
}

/// Waits until the replica's SQL thread runs and its IO thread runs (or, with
/// `allow_connecting`, is trying to connect to a primary that may be down, or has no
/// replication configured at all because it was promoted).
pub(crate) async fn wait_running(
    replica: &Instance,
    deadline: Instant,
    allow_connecting: bool,
) -> Result<(), SandboxError> {
    loop {
        // A stopped server accepts the connection and never answers: bound each probe.
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(500));
        let state = tokio::time::timeout(budget, read_state(replica)).await;
        let last = match state.unwrap_or_else(|_| Ok(Some(SlaveState::unanswered()))) {
            Ok(Some(state)) => {
                let io_ok = state.io_running == "Yes" || (allow_connecting && state.io_running == "Connecting");
                if io_ok && state.sql_running == "Yes" {
                    return Ok(());
                }
                state.describe()
            }
            // A restarted replica that a failover promoted has no replication any more
            // (RESET SLAVE ALL): nothing to wait for.
            Ok(None) if allow_connecting => return Ok(()),
            Ok(None) => "SHOW SLAVE STATUS is empty (replication not configured)".to_owned(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(SandboxError::NotReady {
                instance: replica.name().to_owned(),
                timeout: replica.ready_timeout(),
                reason: format!("replication not running: {last}"),
                log_tail: replica.log_tail(),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until the primary sees `count` semi-synchronous replicas, so that the first commit
/// after start-up already waits for an ack instead of timing out into asynchronous mode.
pub(crate) async fn wait_semi_sync_clients(
    primary: &Instance,
    count: usize,
    deadline: Instant,
) -> Result<(), SandboxError> {
    let mut conn = primary.conn().await?;
    loop {
        let clients: Option<(String, u64)> = conn
            .query_first("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_clients'")
            .await
            .map_err(|e| SandboxError::mysql(primary.name(), e))?;
        let seen = clients.map(|(_, n)| n).unwrap_or(0);
        if seen >= count as u64 {
            let _ = conn.disconnect().await;
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SandboxError::NotReady {
                instance: primary.name().to_owned(),
                timeout: primary.ready_timeout(),
                reason: format!("{seen} of {count} semi-sync replicas connected"),
                log_tail: primary.log_tail(),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

pub(crate) async fn break_replication(replica: &Instance) -> Result<(), SandboxError> {
    ensure_replica(replica)?;
    let mut conn = replica.admin_conn().await?;
    run(&mut conn, replica, "STOP SLAVE").await?;
    let _ = conn.disconnect().await;
    tracing::info!(instance = %replica.name(), "replication stopped");
    Ok(())
}

pub(crate) async fn repair_replication(replica: &Instance) -> Result<(), SandboxError> {
    ensure_replica(replica)?;
    let mut conn = replica.admin_conn().await?;
    run(&mut conn, replica, "START SLAVE").await?;
    let _ = conn.disconnect().await;
    tracing::info!(instance = %replica.name(), "replication started");
    wait_running(replica, Instant::now() + replica.ready_timeout(), false).await
}

/// Waits until every replica has applied the primary's current `@@gtid_binlog_pos`
/// (`MASTER_GTID_WAIT` on each replica: per replication domain, the replica's
/// `@@gtid_slave_pos` has the same or a higher sequence number).
pub(crate) async fn wait_caught_up(
    primary: &Instance,
    replicas: &[Instance],
    timeout: Duration,
) -> Result<(), SandboxError> {
    let deadline = Instant::now() + timeout;
    let target = match tokio::time::timeout(timeout, primary_position(primary)).await {
        Ok(pos) => pos?,
        Err(_) => {
            return Err(SandboxError::NotCaughtUp {
                primary_pos: String::new(),
                timeout,
                detail: "the primary did not answer SELECT @@gtid_binlog_pos".into(),
            })
        }
    };
    if target.is_empty() {
        return Ok(());
    }
    let results = futures::future::join_all(replicas.iter().map(|r| replica_reaches(r, &target, deadline))).await;
    let failures: Vec<String> = replicas
        .iter()
        .zip(results)
        .filter_map(|(r, res)| res.err().map(|why| format!("{}: {why}", r.name())))
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(SandboxError::NotCaughtUp {
            primary_pos: target,
            timeout,
            detail: failures.join("; "),
        })
    }
}

async fn primary_position(primary: &Instance) -> Result<String, SandboxError> {
    let mut conn = primary.conn().await?;
    let pos: Option<String> = conn
        .query_first("SELECT @@gtid_binlog_pos")
        .await
        .map_err(|e| SandboxError::mysql(primary.name(), e))?;
    let _ = conn.disconnect().await;
    Ok(pos.unwrap_or_default())
}

/// `Ok` once `replica` reached `target`; otherwise a description of where it is.
async fn replica_reaches(replica: &Instance, target: &str, deadline: Instant) -> Result<(), String> {
    let attempt = async {
        let mut conn = replica.conn().await.map_err(|e| e.to_string())?;
        let wait_secs = deadline.saturating_duration_since(Instant::now()).as_secs_f64();
        let outcome: Option<Option<i64>> = conn
            .exec_first("SELECT MASTER_GTID_WAIT(?, ?)", (target, wait_secs))
            .await
            .map_err(|e| e.to_string())?;
        if outcome.flatten() == Some(0) {
            let _ = conn.disconnect().await;
            return Ok(());
        }
        let pos: Option<String> = conn
            .query_first("SELECT @@gtid_slave_pos")
            .await
            .map_err(|e| e.to_string())?;
        let _ = conn.disconnect().await;
        Err(format!("at gtid_slave_pos {:?}", pos.unwrap_or_default()))
    };
    // A SIGSTOPped replica would accept the TCP connection and never answer.
    let budget = deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(500);
    tokio::time::timeout(budget, attempt)
        .await
        .unwrap_or_else(|_| Err("did not answer".into()))
}

/// The replica's replication threads, `None` when replication is not configured.
pub(crate) async fn read_state(replica: &Instance) -> Result<Option<SlaveState>, SandboxError> {
    let mut conn = replica.admin_conn().await?;
    let row: Option<Row> = conn
        .query_first("SHOW SLAVE STATUS")
        .await
        .map_err(|e| SandboxError::mysql(replica.name(), e))?;
    let _ = conn.disconnect().await;
    Ok(row.map(|row| {
        let text = |col: &str| {
            row.get_opt::<Option<String>, _>(col)
                .and_then(Result::ok)
                .flatten()
                .unwrap_or_default()
        };
        SlaveState {
            io_running: text("Slave_IO_Running"),
            sql_running: text("Slave_SQL_Running"),
            last_io_error: text("Last_IO_Error"),
            last_sql_error: text("Last_SQL_Error"),
        }
    }))
}

fn ensure_replica(instance: &Instance) -> Result<(), SandboxError> {
    if instance.role() == Role::Replica {
        Ok(())
    } else {
        Err(SandboxError::NotAReplica {
            instance: instance.name().to_owned(),
        })
    }
}

async fn run(conn: &mut Conn, instance: &Instance, sql: &str) -> Result<(), SandboxError> {
    conn.query_drop(sql)
        .await
        .map_err(|e| SandboxError::mysql(instance.name(), e))
}

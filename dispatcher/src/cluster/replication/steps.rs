//! The statements of a switch, one member each: catch up, promote, re-point, fence,
//! reopen. Each runs on a connection the caller opened (monitor account) and bounds.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::ReplError;
use crate::cluster::{ClusterConfig, MemberConfig};

/// `'text'` for an SQL statement that takes no placeholders (`CHANGE MASTER TO`).
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

async fn run(conn: &mut Conn, member: &str, sql: &str) -> Result<(), ReplError> {
    conn.query_drop(sql).await.map_err(|e| ReplError::mysql(member, e))
}

/// Waits until `member` has applied `gtid` (`MASTER_GTID_WAIT`), at most `timeout`.
pub async fn catch_up(mut conn: Conn, member: &str, gtid: &str, timeout: Duration) -> Result<(), ReplError> {
    if gtid.is_empty() {
        return Ok(());
    }
    // Its SQL thread may have been stopped without an error (a dispatcher that died inside
    // `promote`): it would never reach `gtid`. A running one only gets a note.
    run(&mut conn, member, "START SLAVE SQL_THREAD").await?;
    let r: Option<Option<i64>> = conn
        .exec_first("SELECT MASTER_GTID_WAIT(?, ?)", (gtid, timeout.as_secs_f64()))
        .await
        .map_err(|e| ReplError::mysql(member, e))?;
    match r.flatten() {
        Some(0) => Ok(()),
        _ => Err(ReplError::Timeout {
            member: member.to_owned(),
            what: format!("applying {gtid}"),
            after: timeout,
        }),
    }
}

/// Makes `member` writable: its SQL thread stops (nothing more is applied), the IO thread
/// is left for [`detach`] after the new primary is published, because stopping an IO
/// thread whose master hangs or is cut off takes MariaDB 2 s (its kill loop waits 2 s per
/// attempt; seen on 10.11 with the master SIGSTOPped), and that must not be in the write gap.
pub async fn promote(mut conn: Conn, member: &str) -> Result<(), ReplError> {
    run(&mut conn, member, "STOP SLAVE SQL_THREAD").await?;
    run(&mut conn, member, "SET GLOBAL read_only = OFF").await
}

/// Ends replication on a promoted member for good (runs beside the re-pointing).
pub async fn detach(mut conn: Conn, member: &str) -> Result<(), ReplError> {
    run(&mut conn, member, "SET GLOBAL rpl_semi_sync_slave_enabled = OFF").await?;
    run(&mut conn, member, "STOP SLAVE").await?;
    run(&mut conn, member, "RESET SLAVE ALL").await
}

/// Makes the new primary a semi-sync master. Only once the replicas were re-pointed:
/// enabled while none is connected, each commit would wait `rpl_semi_sync_master_timeout`.
pub async fn semi_sync_master(mut conn: Conn, member: &str) -> Result<(), ReplError> {
    run(&mut conn, member, "SET GLOBAL rpl_semi_sync_master_enabled = ON").await
}

/// Makes `member` a read-only GTID replica of `to`. `was_primary`: its own writes are in its
/// binary log, not in `gtid_slave_pos`, so that position starts from its binary log.
/// `semi_sync`: it acks as a semi-sync replica (the cluster runs semi-sync).
pub async fn repoint(
    mut conn: Conn,
    member: &str,
    to: &MemberConfig,
    cluster: &ClusterConfig,
    was_primary: bool,
    semi_sync: bool,
) -> Result<(), ReplError> {
    run(&mut conn, member, "SET GLOBAL read_only = ON").await?;
    stop_slave(&mut conn, member).await?;
    run(&mut conn, member, "SET GLOBAL rpl_semi_sync_master_enabled = OFF").await?;
    let slave_side = if semi_sync { "ON" } else { "OFF" };
    run(
        &mut conn,
        member,
        &format!("SET GLOBAL rpl_semi_sync_slave_enabled = {slave_side}"),
    )
    .await?;
    if was_primary {
        run(&mut conn, member, "SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos").await?;
    }
    let (host, port) = to.replication_addr();
    let hb = cluster.failover.replication_heartbeat_ms as f64 / 1000.0;
    let mut sql = format!(
        "CHANGE MASTER TO master_host = {}, master_port = {port}, master_use_gtid = slave_pos, \
         master_connect_retry = 1, master_heartbeat_period = {hb:.3}",
        quote(&host)
    );
    if let (Some(u), Some(p)) = (&cluster.replication_user, &cluster.replication_password) {
        sql.push_str(&format!(", master_user = {}, master_password = {}", quote(u), quote(p)));
    }
    run(&mut conn, member, &sql).await?;
    run(&mut conn, member, "START SLAVE").await
}

async fn stop_slave(conn: &mut Conn, member: &str) -> Result<(), ReplError> {
    run(conn, member, "STOP SLAVE").await
}

/// Makes `member` read-only and kills the application's connections on it (not
/// replication threads, not this connection, not the holder of the failover lock).
/// Returns how many were killed.
pub async fn fence(mut conn: Conn, member: &str, cluster: &ClusterConfig, lock_name: &str) -> Result<usize, ReplError> {
    fence_on(&mut conn, member, cluster, lock_name).await
}

/// A switchover's first step: [`fence`] the primary, then read the position the target
/// must reach (nothing can be committed after it now).
pub async fn demote(
    mut conn: Conn,
    member: &str,
    cluster: &ClusterConfig,
    lock_name: &str,
) -> Result<String, ReplError> {
    fence_on(&mut conn, member, cluster, lock_name).await?;
    let pos: Option<String> = conn
        .query_first("SELECT @@gtid_binlog_pos")
        .await
        .map_err(|e| ReplError::mysql(member, e))?;
    Ok(pos.unwrap_or_default())
}

async fn fence_on(conn: &mut Conn, member: &str, cluster: &ClusterConfig, lock_name: &str) -> Result<usize, ReplError> {
    let mut killed = kill_app_connections(conn, member, cluster, lock_name).await?;
    // `read_only = ON` waits for running commits; the kill above ended them.
    run(conn, member, "SET GLOBAL read_only = ON").await?;
    // Sessions that logged in meanwhile can no longer write, but would keep reading
    // from a stale primary.
    killed += kill_app_connections(conn, member, cluster, lock_name).await?;
    Ok(killed)
}

async fn kill_app_connections(
    conn: &mut Conn,
    member: &str,
    cluster: &ClusterConfig,
    lock_name: &str,
) -> Result<usize, ReplError> {
    let ids: Vec<u64> = conn
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ? AND ID <> CONNECTION_ID() \
             AND COMMAND NOT IN ('Binlog Dump', 'Binlog Dump GTID', 'Daemon', 'Slave_IO', 'Slave_SQL') \
             AND ID <> IFNULL(IS_USED_LOCK(?), 0)",
            (&cluster.user, lock_name),
        )
        .await
        .map_err(|e| ReplError::mysql(member, e))?;
    let mut n = 0;
    for id in ids {
        match conn.query_drop(format!("KILL CONNECTION {id}")).await {
            Ok(()) => n += 1,
            // 1094: gone meanwhile.
            Err(mysql_async::Error::Server(e)) if e.code == 1094 => {}
            Err(e) => return Err(ReplError::mysql(member, e)),
        }
    }
    Ok(n)
}

/// Makes `member` writable again (a switchover rolled back, or a crashed one repaired).
pub async fn reopen(mut conn: Conn, member: &str) -> Result<(), ReplError> {
    run(&mut conn, member, "SET GLOBAL read_only = OFF").await
}

#[cfg(test)]
mod tests {
    #[test]
    fn quotes_for_sql() {
        assert_eq!(super::quote("h'x\\"), "'h''x\\\\'");
    }
}

//! What one member says about itself: writable or not, its GTID positions, whom it
//! replicates from and whether that works, and its semi-sync master state. Read on the
//! provider's own connection to that member, once per round.

use std::time::Instant;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use super::gtid::Gtid;
use super::ReplError;
use crate::cluster::ClusterConfig;

/// One member's replication status (`SHOW ALL SLAVES STATUS`, the default connection).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlaveFacts {
    pub master_host: String,
    pub master_port: u16,
    /// `Slave_IO_Running`: `Yes`, `No` or `Connecting`.
    pub io_state: String,
    pub sql_running: bool,
    /// `Gtid_IO_Pos`: what the IO thread received.
    pub gtid_io_pos: String,
    pub last_io_error: String,
    pub last_sql_error: String,
    pub heartbeat_period_s: f64,
    /// `Slave_received_heartbeats`: grows while a quiet primary is alive.
    pub received_heartbeats: u64,
}

impl SlaveFacts {
    pub fn io_running(&self) -> bool {
        self.io_state == "Yes"
    }
}

/// What a member reported in one round.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberFacts {
    pub read_only: bool,
    pub server_id: u32,
    pub gtid_binlog_pos: String,
    pub gtid_binlog_state: String,
    pub gtid_slave_pos: String,
    pub gtid_current_pos: String,
    pub semi_sync_master_enabled: bool,
    /// `Rpl_semi_sync_master_status`: on, or fallen back to asynchronous.
    pub semi_sync_master_on: bool,
    pub semi_sync_master_clients: u64,
    pub slave: Option<SlaveFacts>,
    /// The member `slave.master_host:port` names (by `replication_addr()` or `host:port`).
    pub replicates_from: Option<String>,
    pub seen_at: Instant,
}

impl MemberFacts {
    /// Received position (the IO thread's, or applied when that is further: after a
    /// restart `Gtid_IO_Pos` may lag `gtid_slave_pos`).
    pub fn received(&self) -> Gtid {
        let io = self
            .slave
            .as_ref()
            .map(|s| Gtid::parse(&s.gtid_io_pos))
            .unwrap_or_default();
        io.merge(&self.applied())
    }

    pub fn applied(&self) -> Gtid {
        Gtid::parse(&self.gtid_slave_pos)
    }

    pub fn binlog_pos(&self) -> Gtid {
        Gtid::parse(&self.gtid_binlog_pos)
    }

    pub fn binlog_state(&self) -> Gtid {
        Gtid::parse(&self.gtid_binlog_state)
    }

    /// Replication configured from someone (threads running or not).
    pub fn is_replica(&self) -> bool {
        self.slave.is_some()
    }
}

const FACTS_SQL: &str = "SELECT @@read_only, @@server_id, @@gtid_binlog_pos, @@gtid_binlog_state, \
     @@gtid_slave_pos, @@gtid_current_pos, @@rpl_semi_sync_master_enabled, \
     (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_STATUS'), \
     (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS')";

type FactsRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Reads one member's facts. The caller bounds the time (a stopped server never answers).
pub async fn observe(conn: &mut Conn, member: &str, cluster: &ClusterConfig) -> Result<MemberFacts, ReplError> {
    let err = |e| ReplError::mysql(member, e);
    let row: Option<FactsRow> = conn.query_first(FACTS_SQL).await.map_err(err)?;
    let (ro, sid, binlog, state, slave_pos, current, ss_enabled, ss_status, ss_clients) =
        row.ok_or_else(|| ReplError::Unexpected(member.to_owned(), "no row for the facts query".into()))?;
    let s = |v: Option<String>| v.unwrap_or_default();
    // `SHOW ALL SLAVES STATUS`, not `SHOW SLAVE STATUS`: only the former has the
    // heartbeat columns (MariaDB 10.11). The default (unnamed) connection is the one used.
    let rows: Vec<Row> = conn.query("SHOW ALL SLAVES STATUS").await.map_err(err)?;
    let slave = rows
        .iter()
        .find(|r| {
            r.get_opt::<Option<String>, _>("Connection_name")
                .and_then(Result::ok)
                .flatten()
                .unwrap_or_default()
                .is_empty()
        })
        .map(parse_slave);
    let replicates_from = slave
        .as_ref()
        .and_then(|sl| member_at(cluster, &sl.master_host, sl.master_port));
    Ok(MemberFacts {
        read_only: flag(ro.as_deref()),
        server_id: s(sid).parse().unwrap_or(0),
        gtid_binlog_pos: s(binlog),
        gtid_binlog_state: s(state),
        gtid_slave_pos: s(slave_pos),
        gtid_current_pos: s(current),
        semi_sync_master_enabled: flag(ss_enabled.as_deref()),
        semi_sync_master_on: ss_status.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("ON")),
        semi_sync_master_clients: s(ss_clients).parse().unwrap_or(0),
        slave,
        replicates_from,
        seen_at: Instant::now(),
    })
}

fn flag(v: Option<&str>) -> bool {
    matches!(v, Some("1") | Some("ON") | Some("on"))
}

fn parse_slave(row: &Row) -> SlaveFacts {
    let text = |col: &str| -> String {
        row.get_opt::<Option<String>, _>(col)
            .and_then(Result::ok)
            .flatten()
            .unwrap_or_default()
    };
    SlaveFacts {
        master_host: text("Master_Host"),
        master_port: text("Master_Port").parse().unwrap_or(0),
        io_state: text("Slave_IO_Running"),
        sql_running: text("Slave_SQL_Running") == "Yes",
        gtid_io_pos: text("Gtid_IO_Pos"),
        last_io_error: text("Last_IO_Error"),
        last_sql_error: text("Last_SQL_Error"),
        heartbeat_period_s: text("Slave_heartbeat_period").parse().unwrap_or(0.0),
        received_heartbeats: text("Slave_received_heartbeats").parse().unwrap_or(0),
    }
}

/// The member a replica's `Master_Host:Master_Port` designates.
pub fn member_at(cluster: &ClusterConfig, host: &str, port: u16) -> Option<String> {
    cluster
        .members
        .iter()
        .find(|m| m.replication_addr() == (host.to_owned(), port))
        .or_else(|| cluster.members.iter().find(|m| m.host == host && m.port == port))
        .map(|m| m.name.clone())
}

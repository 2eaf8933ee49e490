//! The failover lock held on a majority of the members (`GET_LOCK`, as MaxScale's
//! cooperative monitoring does): only its holder changes the topology.
//!
//! One dedicated connection per member takes `GET_LOCK(name, 0)`. The lock lives as long
//! as that connection: a dispatcher that dies (or loses its path to a member) releases it
//! there without anyone's help. Held = a strict majority of all configured members granted
//! it. Two dispatchers that each got a minority both back off, releasing what they hold,
//! and retry after a random number of rounds, so that one of them ends with the majority.

use std::collections::BTreeMap;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use rand::Rng;

use super::{connect, ReplError};
use crate::cluster::{ClusterConfig, LockMode};

/// The lock's name for a cluster (at most 64 characters, MariaDB's limit).
pub fn lock_name(cluster: &str) -> String {
    // By characters: `String::truncate` at byte 64 panics inside a multi-byte character.
    format!("osprey_failover_{cluster}").chars().take(64).collect()
}

/// The `wait_timeout` of a lock connection. The lock lives as long as its session, and a
/// dispatcher whose host dies or is cut off never closes it: with the account's default
/// (`wait_timeout` = 8 h here) nobody else could take the lock, and fail over, for hours.
/// The holder queries every connection each round, so the session only has to outlive the
/// longest stretch without a round: one whole switch (its catch-up or switchover budget and
/// the bounded steps after it: promote, re-point/detach, semi-sync, fence).
pub(super) fn session_timeout(cluster: &ClusterConfig) -> Duration {
    let connect = cluster.health.connect_timeout();
    let wait = Duration::from_millis(
        cluster
            .failover
            .catchup_timeout_ms
            .max(cluster.failover.switchover_timeout_ms),
    );
    let steps = connect * 4 + Duration::from_secs(5 + 5 + 5 + 2);
    let rounds = Duration::from_millis(cluster.health.interval_ms) * 2;
    wait + connect + steps + rounds
}

#[derive(Debug, Default)]
pub struct MajorityLock {
    /// Members where we hold it, with the connection that holds it.
    held: BTreeMap<String, Conn>,
    /// Connections to members where another dispatcher holds it: asked again next round
    /// without a new login each time.
    spare: BTreeMap<String, Conn>,
    /// Rounds to wait before trying again after a back-off.
    backoff: u32,
    pub detail: String,
}

impl MajorityLock {
    /// One round: check the connections that hold it, try to take it where we do not.
    /// Returns whether a majority is held now.
    pub async fn round(&mut self, cluster: &ClusterConfig, timeout: Duration) -> bool {
        if cluster.failover.lock == LockMode::None {
            self.detail = "lock = none".into();
            return true;
        }
        let name = lock_name(&cluster.name);
        let total = cluster.members.len();
        let need = total / 2 + 1;
        let wait_s = session_timeout(cluster).as_secs() + 1;
        self.check_held(&name, timeout).await;
        if self.backoff > 0 {
            self.backoff -= 1;
            self.detail = format!("backing off: {} of {total}", self.held.len());
            return self.held.len() >= need;
        }
        let missing: Vec<_> = cluster
            .members
            .iter()
            .filter(|m| !self.held.contains_key(&m.name))
            .collect();
        let tries = missing.iter().map(|m| {
            let name = name.clone();
            let spare = self.spare.remove(&m.name);
            async move {
                let attempt = async {
                    let mut conn = match spare {
                        Some(c) => c,
                        None => {
                            let mut c = connect(cluster, m, timeout).await?;
                            c.query_drop(format!("SET SESSION wait_timeout = {wait_s}"))
                                .await
                                .map_err(|e| ReplError::mysql(&m.name, e))?;
                            c
                        }
                    };
                    let got: Option<Option<i64>> = conn
                        .exec_first("SELECT GET_LOCK(?, 0)", (name.as_str(),))
                        .await
                        .map_err(|e| ReplError::mysql(&m.name, e))?;
                    Ok::<_, ReplError>((got.flatten(), conn))
                };
                (m.name.clone(), tokio::time::timeout(timeout, attempt).await)
            }
        });
        let mut taken_elsewhere = 0;
        for (m, r) in futures::future::join_all(tries).await {
            match r {
                Ok(Ok((Some(1), conn))) => {
                    self.held.insert(m, conn);
                }
                Ok(Ok((Some(_), conn))) => {
                    taken_elsewhere += 1;
                    self.spare.insert(m, conn);
                }
                _ => {}
            }
        }
        let n = self.held.len();
        if n >= need {
            self.detail = format!("held on {n} of {total}");
            return true;
        }
        self.detail = format!("no majority: {n} of {total}");
        if n > 0 && taken_elsewhere > 0 {
            // Split with another dispatcher: give ours back so that one of us can win.
            self.release().await;
            self.backoff = rand::rng().random_range(1..=3);
            self.detail = format!("no majority: {n} of {total} (split with another dispatcher: released, backing off)");
        }
        false
    }

    /// Checks, without trying to take more, that a majority is still held: a switch asks
    /// again right before it changes a server, since the round that granted the lock.
    pub async fn confirm(&mut self, cluster: &ClusterConfig, timeout: Duration) -> bool {
        if cluster.failover.lock == LockMode::None {
            return true;
        }
        self.check_held(&lock_name(&cluster.name), timeout).await;
        let (n, total) = (self.held.len(), cluster.members.len());
        if n > total / 2 {
            true
        } else {
            self.detail = format!("no majority: {n} of {total} (lost during a switch)");
            false
        }
    }

    /// Keeps the connections that still hold the lock; a broken one means it is gone there.
    async fn check_held(&mut self, name: &str, timeout: Duration) {
        let held = std::mem::take(&mut self.held);
        let checks = held.into_iter().map(|(m, mut conn)| async move {
            let q = conn.exec_first::<Option<i64>, _, _>("SELECT IS_USED_LOCK(?) = CONNECTION_ID()", (name,));
            let ok = matches!(tokio::time::timeout(timeout, q).await, Ok(Ok(Some(Some(1)))));
            (m, ok.then_some(conn))
        });
        for (m, conn) in futures::future::join_all(checks).await {
            if let Some(conn) = conn {
                self.held.insert(m, conn);
            }
        }
    }

    /// Gives the lock back everywhere (shutdown, back-off).
    pub async fn release(&mut self) {
        for (_, conn) in std::mem::take(&mut self.held) {
            let _ = tokio::time::timeout(Duration::from_millis(500), conn.disconnect()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use osprey_sandbox::Sandbox;

    use super::*;

    #[test]
    fn the_lock_name_is_cut_by_characters() {
        let n = lock_name(&format!("x{}", "é".repeat(60)));
        assert_eq!(n.chars().count(), 64);
        assert_eq!(lock_name("c1"), "osprey_failover_c1");
    }

    /// A holder whose host died (or was cut off) never closes its sessions: the server must
    /// end them itself, soon enough for another dispatcher to take over.
    #[tokio::test]
    async fn a_lock_whose_holder_vanished_is_free_again_after_the_session_timeout() {
        let sb = Sandbox::start(0).await.unwrap();
        let p = sb.primary();
        let toml = format!(
            "name = \"c'1\"\nuser = \"{}\"\npassword = \"{}\"\nmonitor_user = \"{}\"\nmonitor_password = \"{}\"\n\
             [health]\ninterval_ms = 100\nwindow_ms = 1000\n\
             [failover]\ncatchup_timeout_ms = 100\nswitchover_timeout_ms = 100\n\
             [[member]]\nname = \"{}\"\nhost = \"{}\"\nport = {}\n",
            p.user(),
            p.password(),
            p.monitor_user(),
            p.monitor_password(),
            p.name(),
            p.host(),
            p.port()
        );
        let cluster: ClusterConfig = toml::from_str(&toml).unwrap();
        let t = Duration::from_secs(2);
        let mut a = MajorityLock::default();
        assert!(a.round(&cluster, t).await, "{}", a.detail);
        // A quoted cluster name: the holder still sees that it holds it.
        assert!(a.confirm(&cluster, t).await, "{}", a.detail);
        // The holder's host vanishes: its sockets stay open, nothing more comes on them.
        for (_, c) in std::mem::take(&mut a.held) {
            std::mem::forget(c);
        }
        let mut b = MajorityLock::default();
        assert!(!b.round(&cluster, t).await);
        let bound = session_timeout(&cluster) + Duration::from_secs(3);
        let start = Instant::now();
        while !b.round(&cluster, t).await {
            assert!(
                start.elapsed() < bound,
                "still held by the vanished holder after {:?}: {}",
                start.elapsed(),
                b.detail
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("taken over after {:?} (bound {bound:?})", start.elapsed());
    }
}

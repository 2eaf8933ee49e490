//! Planned switchover: no primary published (writes wait) → drain → demote → catch up →
//! promote → publish → re-point/detach → semi-sync; a failure midway rolls back.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::elect;
use super::lock::lock_name;
use super::provider::Provider;
use super::record::{on_member, Recorder};
use super::steps;
use crate::cluster::{ClusterConfig, ClusterStatus, SwitchEvent};

impl Provider {
    pub(super) async fn switchover(&mut self, to: Option<String>) -> Result<SwitchEvent, String> {
        let cluster = self.cluster();
        if !self.lock_held {
            return Err(format!(
                "this dispatcher does not hold the failover lock ({})",
                self.lock.detail
            ));
        }
        self.observe_all(&cluster).await;
        let old = self.primary.clone().ok_or("no primary to switch from")?;
        if self.facts.get(&old).is_none_or(|f| f.read_only) {
            return Err(format!("the primary {old} does not answer or is not writable"));
        }
        let target = match to {
            Some(t) => {
                let f = self
                    .facts
                    .get(&t)
                    .ok_or_else(|| format!("{t} does not answer or is not a member"))?;
                if t == old {
                    return Err(format!("{t} is the primary already"));
                }
                if f.replicates_from.as_deref() != Some(old.as_str())
                    || !f.slave.as_ref().is_some_and(|s| s.sql_running)
                {
                    return Err(format!("{t} does not replicate from {old}"));
                }
                t
            }
            None => elect::elect(&cluster, &self.facts, &self.health_map(), Some(&old), false)?,
        };
        let mut rec = Recorder::new();
        let deadline = Instant::now() + Duration::from_millis(cluster.failover.switchover_timeout_ms);
        tracing::warn!(old = %old, new = %target, "switchover");
        // No primary: the write slot group stops dispatching, new requests wait.
        self.set_primary(None);
        self.status = ClusterStatus::Switching(format!("switchover: {old} -> {target}"));
        self.publish(&cluster);

        let drained = wait_zero(&mut self.writes, deadline).await;
        rec.step(
            "drain",
            drained,
            (!drained).then(|| "writes still in flight".to_owned()),
        );
        if !drained {
            return Err(self
                .rollback(
                    &cluster,
                    rec,
                    &old,
                    &target,
                    false,
                    "writes still in flight at the timeout".into(),
                )
                .await);
        }
        if !self.lock.confirm(&cluster, cluster.health.connect_timeout()).await {
            self.lock_held = false;
            let why = format!("the failover lock was lost: {}", self.lock.detail);
            return Err(self.rollback(&cluster, rec, &old, &target, false, why).await);
        }
        let lock = lock_name(&cluster.name);
        let budget = deadline.saturating_duration_since(Instant::now());
        let demote = on_member(&cluster, &old, budget, |c| steps::demote(c, &old, &cluster, &lock)).await;
        let pos = match demote {
            Ok(p) => p,
            Err(e) => {
                rec.step("demote", false, Some(e.to_string()));
                return Err(self
                    .rollback(&cluster, rec, &old, &target, true, format!("demoting {old}: {e}"))
                    .await);
            }
        };
        rec.step("demote", true, Some(pos.clone()));
        let budget = deadline.saturating_duration_since(Instant::now());
        let r = on_member(&cluster, &target, budget + Duration::from_millis(500), |c| {
            steps::catch_up(c, &target, &pos, budget)
        })
        .await;
        if let Err(e) = r {
            rec.step("catch_up", false, Some(e.to_string()));
            return Err(self
                .rollback(
                    &cluster,
                    rec,
                    &old,
                    &target,
                    true,
                    format!("{target} did not catch up: {e}"),
                )
                .await);
        }
        rec.step("catch_up", true, None);
        let semi = self.facts.get(&old).is_some_and(|f| f.semi_sync_master_enabled);
        let r = on_member(
            &cluster,
            &target,
            cluster.health.connect_timeout() + Duration::from_secs(5),
            |c| steps::promote(c, &target),
        )
        .await;
        if let Err(e) = r {
            rec.step("promote", false, Some(e.to_string()));
            // It may have stopped replicating already: make it a replica of the old one again.
            let _ = self
                .repoint_all(&cluster, std::slice::from_ref(&target), &old, &[])
                .await;
            return Err(self
                .rollback(&cluster, rec, &old, &target, true, format!("promoting {target}: {e}"))
                .await);
        }
        rec.step("promote", true, None);
        self.set_primary(Some(target.clone()));
        self.replaced.insert(old.clone());
        self.replaced.remove(&target);
        self.status = ClusterStatus::Ok;
        self.publish(&cluster);
        rec.step("publish", true, None);
        let others: Vec<String> = self.facts.keys().filter(|n| **n != target).cloned().collect();
        self.settle(&cluster, &mut rec, &target, &others, &[old.as_str()], semi)
            .await;
        let ev = rec.finish(&cluster.name, "switchover", Some(&old), Some(&target), true, None);
        self.finish_switch(&cluster, ev.clone());
        Ok(ev)
    }

    /// Undoes a switchover that stopped midway: the old primary writable again and
    /// published. Returns the reason, and logs the failed switch.
    async fn rollback(
        &mut self,
        cluster: &ClusterConfig,
        mut rec: Recorder,
        old: &str,
        target: &str,
        reopen: bool,
        why: String,
    ) -> String {
        if reopen {
            let r = on_member(
                cluster,
                old,
                cluster.health.connect_timeout() + Duration::from_secs(2),
                |c| steps::reopen(c, old),
            )
            .await;
            rec.step("rollback", r.is_ok(), r.err().map(|e| e.to_string()));
        }
        self.set_primary(Some(old.to_owned()));
        self.status = ClusterStatus::Ok;
        self.publish(cluster);
        let ev = rec.finish(
            &cluster.name,
            "switchover",
            Some(old),
            Some(target),
            false,
            Some(why.clone()),
        );
        self.count(&cluster.name, "switchover_failed");
        self.events.push(ev);
        why
    }
}

async fn wait_zero(w: &mut watch::Receiver<usize>, deadline: Instant) -> bool {
    let wait = w.wait_for(|n| *n == 0);
    matches!(tokio::time::timeout_at(deadline.into(), wait).await, Ok(Ok(_)))
}

//! The failover: the primary is down by its monitor and does not answer us.
//! verify → elect → catch up → promote → publish → re-point/detach → semi-sync → fence.

use std::time::{Duration, Instant};

use tracing::Instrument;

use super::elect;
use super::lock::lock_name;
use super::provider::Provider;
use super::record::{describe, on_member, run_hook, Recorder};
use super::{steps, ReplError};
use crate::cluster::{ClusterConfig, ClusterStatus, SemiSync, SwitchEvent};

impl Provider {
    /// The primary is down by its monitor and does not answer us.
    pub(super) async fn primary_down(&mut self, cluster: &ClusterConfig, old: &str) {
        if !self.lock_held {
            self.status = ClusterStatus::NoPrimary(format!(
                "primary {old} down; waiting for the failover lock holder ({})",
                self.lock.detail
            ));
            return;
        }
        if !cluster.failover.auto {
            self.status = ClusterStatus::NoPrimary(format!("primary {old} down; failover.auto = false"));
            return;
        }
        if let Some(t) = self.last_switch {
            let cooldown = Duration::from_secs(cluster.failover.cooldown_s);
            if t.elapsed() < cooldown {
                self.status = ClusterStatus::NoPrimary(format!(
                    "primary {old} down; cooldown, {} s left",
                    (cooldown - t.elapsed()).as_secs()
                ));
                return;
            }
        }
        self.failover(cluster, old).await;
    }

    async fn failover(&mut self, cluster: &ClusterConfig, old: &str) {
        let mut rec = Recorder::new();
        let interval = Duration::from_millis(cluster.health.interval_ms);
        if cluster.failover.verify {
            let receiving: Vec<String> = self
                .facts
                .iter()
                .filter(|(n, f)| {
                    f.replicates_from.as_deref() == Some(old)
                        && elect::is_receiving(
                            f,
                            self.progress.get(*n),
                            elect::receive_window(f, interval),
                            Instant::now(),
                        )
                })
                .map(|(n, _)| n.clone())
                .collect();
            if !receiving.is_empty() {
                self.status = ClusterStatus::Unreachable(format!(
                    "{old} is down to this dispatcher but {} still receive from it: no promotion",
                    receiving.join(", ")
                ));
                return;
            }
        }
        rec.step("verify", true, None);
        let new = match elect::elect(cluster, &self.facts, &self.health_map(), Some(old), false) {
            Ok(n) => n,
            Err(why) => {
                self.status = ClusterStatus::NoPrimary(format!("primary {old} down; {why}"));
                return;
            }
        };
        let ahead = elect::ahead_of(&self.facts, old, &new);
        if !ahead.is_empty() {
            let who: Vec<String> = ahead.iter().map(|(m, pos)| format!("{m} received {pos}")).collect();
            self.status = ClusterStatus::NoPrimary(format!(
                "primary {old} down; not promoting {new}: {} and cannot be promoted, so acknowledged \
                 commits could be lost (make it electable, or repair by hand)",
                who.join(", ")
            ));
            return;
        }
        let f = &self.facts[&new];
        let detail = format!(
            "received {}, applied {}",
            f.slave.as_ref().map(|s| s.gtid_io_pos.as_str()).unwrap_or(""),
            f.gtid_slave_pos
        );
        rec.step("elect", true, Some(detail));
        tracing::warn!(old, new = %new, "failover");
        self.status = ClusterStatus::Switching(format!("failover: {old} -> {new}"));
        self.publish(cluster);

        let catchup = Duration::from_millis(cluster.failover.catchup_timeout_ms);
        let target = self.facts[&new]
            .slave
            .as_ref()
            .map(|s| s.gtid_io_pos.clone())
            .unwrap_or_default();
        let budget = catchup + cluster.health.connect_timeout();
        let r = on_member(cluster, &new, budget, |c| steps::catch_up(c, &new, &target, catchup)).await;
        if let Err(e) = r {
            // Promoting now would drop what it received and did not apply (possibly
            // acknowledged commits): try again next round instead.
            rec.step("catch_up", false, Some(e.to_string()));
            self.status = ClusterStatus::NoPrimary(format!("failover to {new} stopped: {e}; retrying"));
            let ev = rec.finish(
                &cluster.name,
                "failover",
                Some(old),
                Some(&new),
                false,
                Some(e.to_string()),
            );
            self.count(&cluster.name, "failover_failed");
            self.events.push(ev);
            return;
        }
        rec.step("catch_up", true, Some(target.clone()));
        if !self.lock.confirm(cluster, cluster.health.connect_timeout()).await {
            self.lock_held = false;
            self.status = ClusterStatus::NoPrimary(format!("failover to {new} stopped: {}", self.lock.detail));
            return;
        }
        let semi = !matches!(self.semi_sync, Some(SemiSync::Off) | None);
        let r = on_member(
            cluster,
            &new,
            cluster.health.connect_timeout() + Duration::from_secs(5),
            |c| steps::promote(c, &new),
        )
        .await;
        if let Err(e) = r {
            rec.step("promote", false, Some(e.to_string()));
            self.status = ClusterStatus::NoPrimary(format!("promoting {new} failed: {e}; retrying"));
            let ev = rec.finish(
                &cluster.name,
                "failover",
                Some(old),
                Some(&new),
                false,
                Some(e.to_string()),
            );
            self.count(&cluster.name, "failover_failed");
            self.events.push(ev);
            return;
        }
        rec.step("promote", true, None);
        self.set_primary(Some(new.clone()));
        self.replaced.insert(old.to_owned());
        // It may itself have been replaced once (and rejoined since).
        self.replaced.remove(&new);
        self.status = ClusterStatus::Ok;
        if let Some(f) = self.facts.get_mut(&new) {
            f.read_only = false;
            f.slave = None;
            f.replicates_from = None;
        }
        self.publish(cluster);
        rec.step("publish", true, None);

        let others: Vec<String> = self.facts.keys().filter(|n| **n != new && *n != old).cloned().collect();
        self.settle(cluster, &mut rec, &new, &others, &[], semi).await;

        let lock = lock_name(&cluster.name);
        let r = on_member(
            cluster,
            old,
            cluster.health.connect_timeout() + Duration::from_secs(2),
            |c| steps::fence(c, old, cluster, &lock),
        )
        .await;
        rec.step(
            "fence",
            r.is_ok(),
            Some(match &r {
                Ok(n) => format!("read-only, {n} connections killed"),
                Err(e) => format!("not reachable ({e}); fenced on sight when it returns"),
            }),
        );
        let ev = rec.finish(&cluster.name, "failover", Some(old), Some(&new), true, None);
        self.finish_switch(cluster, ev);
    }

    /// After publishing `new`: re-points `others` at it while its own replication is reset
    /// (both may take 2 s each against a hung old primary, so side by side), then turns
    /// semi-sync on. Steps `repoint`, `detach` (, `semi_sync`).
    pub(super) async fn settle(
        &self,
        cluster: &ClusterConfig,
        rec: &mut Recorder,
        new: &str,
        others: &[String],
        was_primary: &[&str],
        semi: bool,
    ) {
        let t0 = rec.t0;
        let timeout = cluster.health.connect_timeout() + Duration::from_secs(5);
        let repoint = async {
            let r = self.repoint_all(cluster, others, new, was_primary).await;
            (r, t0.elapsed())
        };
        let detach = async {
            let r = on_member(cluster, new, timeout, |c| steps::detach(c, new)).await;
            (r, t0.elapsed())
        };
        let ((rp, rp_at), (dt, dt_at)) = tokio::join!(repoint, detach);
        let mut done = vec![
            ("repoint", rp_at, rp.iter().all(|(_, r)| r.is_ok()), Some(describe(&rp))),
            ("detach", dt_at, dt.is_ok(), dt.err().map(|e| e.to_string())),
        ];
        done.sort_by_key(|d| d.1);
        for (step, at, ok, detail) in done {
            rec.step_at(step, at, ok, detail);
        }
        if semi {
            let r = on_member(cluster, new, timeout, |c| steps::semi_sync_master(c, new)).await;
            rec.step("semi_sync", r.is_ok(), r.err().map(|e| e.to_string()));
        }
    }

    /// Re-points `members` at `to` in parallel; `was_primary` ones start from their binlog.
    pub(super) async fn repoint_all(
        &self,
        cluster: &ClusterConfig,
        members: &[String],
        to: &str,
        was_primary: &[&str],
    ) -> Vec<(String, Result<(), ReplError>)> {
        let Some(to_cfg) = cluster.member(to) else {
            return Vec::new();
        };
        let timeout = cluster.health.connect_timeout() + Duration::from_secs(5);
        let semi = !matches!(self.semi_sync, Some(SemiSync::Off) | None);
        let jobs = members.iter().map(|m| {
            let wp = was_primary.contains(&m.as_str());
            async move {
                let r = on_member(cluster, m, timeout, |c| steps::repoint(c, m, to_cfg, cluster, wp, semi)).await;
                (m.clone(), r)
            }
        });
        futures::future::join_all(jobs).await
    }

    /// Logs a successful switch, starts the cooldown and the ops hook.
    pub(super) fn finish_switch(&mut self, cluster: &ClusterConfig, ev: SwitchEvent) {
        let (kind, old, new) = (
            ev.kind,
            ev.old_primary.clone().unwrap_or_default(),
            ev.new_primary.clone().unwrap_or_default(),
        );
        let (old, new) = (old.as_str(), new.as_str());
        self.last_switch = Some(Instant::now());
        self.metrics.failover_duration.observe(ev.duration_ms / 1000.0);
        self.count(&cluster.name, kind);
        self.events.push(ev);
        if let Some(cmd) = &cluster.failover.on_switch {
            let addr = |n: &str| {
                cluster
                    .member(n)
                    .map(|m| format!("{}:{}", m.host, m.port))
                    .unwrap_or_default()
            };
            let env = [
                ("OSPREY_CLUSTER", cluster.name.clone()),
                ("OSPREY_OLD_PRIMARY", old.to_owned()),
                ("OSPREY_NEW_PRIMARY", new.to_owned()),
                ("OSPREY_OLD_ADDR", addr(old)),
                ("OSPREY_NEW_ADDR", addr(new)),
            ];
            let timeout = Duration::from_millis(cluster.failover.on_switch_timeout_ms);
            tokio::spawn(run_hook(cmd.clone(), env, timeout).in_current_span());
        }
    }
}

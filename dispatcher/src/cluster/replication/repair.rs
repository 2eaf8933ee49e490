//! Lock holder only, every round: fence a second writer, reopen a primary a stopped
//! switchover left read-only, re-point replicas a stopped failover left behind, reset an
//! undetached primary, and rejoin returning members (or say why not).

use std::time::Duration;

use super::elect::Derived;
use super::facts::MemberFacts;
use super::lock::lock_name;
use super::provider::Provider;
use super::record::{on_member, Recorder};
use super::steps;
use crate::cluster::{ClusterConfig, HealthState};

impl Provider {
    /// Lock holder only: two writers, a stopped switch, returning members.
    pub(super) async fn maintain(&mut self, cluster: &ClusterConfig, d: &Derived) {
        let lock = lock_name(&cluster.name);
        let timeout = cluster.health.connect_timeout() + Duration::from_secs(2);
        for x in &d.extra_writers {
            let mut rec = Recorder::new();
            let r = on_member(cluster, x, timeout, |c| steps::fence(c, x, cluster, &lock)).await;
            let ok = r.is_ok();
            rec.step(
                "fence",
                ok,
                Some(
                    r.as_ref()
                        .map(|n| format!("{n} connections killed"))
                        .unwrap_or_else(|e| e.to_string()),
                ),
            );
            if ok && d.primary.as_deref() != Some(x.as_str()) {
                self.replaced.insert(x.clone());
                if let Some(f) = self.facts.get_mut(x) {
                    f.read_only = true;
                }
            }
            let ev = rec.finish(
                &cluster.name,
                "fence",
                Some(x),
                d.primary.as_deref(),
                ok,
                Some(format!("{x} was writable beside the primary")),
            );
            self.count(&cluster.name, "fence");
            self.events.push(ev);
        }
        let Some(primary) = d.primary.clone() else { return };
        if let Some(p) = &d.reopen {
            if self.health_of(p) != HealthState::Down {
                let mut rec = Recorder::new();
                let r = on_member(cluster, p, timeout, |c| steps::reopen(c, p)).await;
                rec.step("reopen", r.is_ok(), r.as_ref().err().map(ToString::to_string));
                if r.is_ok() {
                    // Published as serving in this very round, not one round later.
                    if let Some(f) = self.facts.get_mut(p) {
                        f.read_only = false;
                    }
                }
                let ev = rec.finish(
                    &cluster.name,
                    "repair",
                    Some(p),
                    Some(p),
                    r.is_ok(),
                    Some("the primary was left read-only".into()),
                );
                self.count(&cluster.name, "repair");
                self.events.push(ev);
            }
        }
        let Some(pcfg) = cluster.member(&primary).cloned() else {
            return;
        };
        let semi = self.facts.get(&primary).is_some_and(|f| f.semi_sync_master_enabled);
        if d.undetached {
            let mut rec = Recorder::new();
            let r = on_member(cluster, &primary, timeout, |c| steps::detach(c, &primary)).await;
            rec.step("detach", r.is_ok(), r.as_ref().err().map(ToString::to_string));
            let ev = rec.finish(
                &cluster.name,
                "repair",
                None,
                Some(&primary),
                r.is_ok(),
                Some(format!("{primary} was promoted but still had replication configured")),
            );
            self.count(&cluster.name, "repair");
            self.events.push(ev);
        }
        if !self.facts.contains_key(&primary) {
            return;
        }
        for s in &d.strays {
            let mut rec = Recorder::new();
            let r = on_member(cluster, s, timeout, |c| {
                steps::repoint(c, s, &pcfg, cluster, false, semi)
            })
            .await;
            rec.step("repoint", r.is_ok(), r.as_ref().err().map(ToString::to_string));
            let ev = rec.finish(
                &cluster.name,
                "repair",
                None,
                Some(&primary),
                r.is_ok(),
                Some(format!("{s} still pointed at a replaced or dead member")),
            );
            self.count(&cluster.name, "repair");
            self.events.push(ev);
        }
        if !cluster.failover.auto_rejoin {
            return;
        }
        let pstate = self.facts[&primary].binlog_state();
        let candidates: Vec<(String, MemberFacts)> = self
            .facts
            .iter()
            .filter(|(n, f)| **n != primary && f.read_only && !f.is_replica() && !d.extra_writers.contains(n))
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect();
        for (x, f) in candidates {
            if !pstate.contains_history(&f.binlog_pos()) {
                let why = format!(
                    "diverged: its gtid_binlog_pos {} is not in {primary}'s history; not rejoined",
                    f.gtid_binlog_pos
                );
                if self.reasons.get(&x) != Some(&why) {
                    tracing::warn!(member = %x, "{why}");
                }
                self.reasons.insert(x, why);
                continue;
            }
            let mut rec = Recorder::new();
            let r = on_member(cluster, &x, timeout, |c| {
                steps::repoint(c, &x, &pcfg, cluster, true, semi)
            })
            .await;
            rec.step("repoint", r.is_ok(), r.as_ref().err().map(ToString::to_string));
            if r.is_ok() {
                self.reasons.remove(&x);
            }
            let ev = rec.finish(
                &cluster.name,
                "rejoin",
                Some(&x),
                Some(&primary),
                r.is_ok(),
                Some(format!("{x} rejoined as a replica of {primary}")),
            );
            self.count(&cluster.name, "rejoin");
            self.events.push(ev);
        }
    }
}

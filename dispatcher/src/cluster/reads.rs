//! The read side of the read/write split: one read slot group per member, sized while
//! the member is a replica (`pool.replica_size`) and empty while it is the primary, and
//! the choice of a replica for each read.
//!
//! The cluster's follower ([`crate::cluster::ClusterRuntime`]) calls [`Reads::update`]
//! on every change of topology, health, maintenance or delay; a read asks
//! [`Reads::pick`]. A member serves reads while it is a replica, is not down, is not in
//! maintenance and (delay detection on) its delay is measured, fresh and under the
//! threshold. A read group that stops serving hands the reads waiting in it to the write
//! group (`read_fallback = "primary"`), so a read that never reached a worker moves on
//! instead of failing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use osprey_protocol::GtidPos;
use serde::Serialize;

use crate::cluster::config::worker_settings;
use crate::cluster::config::{ClusterConfig, ReadFallback};
use crate::cluster::delay::{DelayView, ProbeStatus};
use crate::cluster::view::{ClusterView, HealthState, Role};
use crate::metrics::{FallbackLabel, MemberLabel, Metrics, RouteLabel};
use crate::pool::PoolConfig;
use crate::pool::{PoolView, SlotGroup};

/// What the delay probe says of each member, as far as reads care.
#[derive(Debug, Clone, Default)]
pub struct ReadGate {
    /// Member → `Ok(())` when its delay allows reads, `Err(why)` when it does not.
    pub delay: BTreeMap<String, Result<(), String>>,
    /// Member → GTID position it had applied at its last measurement.
    pub applied: BTreeMap<String, String>,
}

impl ReadGate {
    /// The delay probe's view now (a view no longer updated expires on its own).
    pub fn from_delay(view: &DelayView) -> ReadGate {
        let mut gate = ReadGate::default();
        for r in &view.replicas {
            let verdict = if view.eligible(&r.name) {
                Ok(())
            } else {
                Err(match (r.status, r.delay_ms) {
                    (ProbeStatus::Ok, Some(d)) if d > view.threshold_ms => {
                        format!("delay {d} ms over the {} ms threshold", view.threshold_ms)
                    }
                    (ProbeStatus::Ok, _) => "delay unknown (no fresh measurement)".to_owned(),
                    (ProbeStatus::Init, _) => "no delay measurement yet".to_owned(),
                    (status, _) => format!(
                        "delay probe {}: {}",
                        if status == ProbeStatus::Timeout {
                            "timed out"
                        } else {
                            "failed"
                        },
                        r.message.as_deref().unwrap_or("")
                    ),
                })
            };
            gate.delay.insert(r.name.clone(), verdict);
            if let Some(a) = &r.gtid_applied {
                gate.applied.insert(r.name.clone(), a.clone());
            }
        }
        gate
    }
}

/// Where a read goes.
pub enum ReadChoice {
    Replica(Arc<SlotGroup>),
    /// To the primary, and why (a metrics label).
    Primary(&'static str),
    /// `read_fallback = "error"` and no replica can serve it.
    Refuse(String),
}

/// One member that serves reads now.
struct Serving {
    member: String,
    pool: Arc<SlotGroup>,
    /// What it is known to have applied (a lower bound: positions only grow).
    applied: GtidPos,
}

/// `GET /cluster`: one member's read slots.
#[derive(Debug, Serialize)]
pub struct ReadPoolReport {
    pub member: String,
    pub serving: bool,
    /// Why it does not serve reads, if it does not.
    pub reason: Option<String>,
    pub applied: Option<String>,
    /// The read slots themselves.
    pub slots: PoolView,
}

pub struct Reads {
    cluster: String,
    /// One read group per member, in configuration order.
    groups: Vec<(String, Arc<SlotGroup>)>,
    serving: RwLock<Arc<Vec<Serving>>>,
    reasons: RwLock<BTreeMap<String, String>>,
    /// Spreads ties in "least outstanding" over the replicas.
    turn: AtomicUsize,
    fallback: ReadFallback,
    metrics: Arc<Metrics>,
}

impl Reads {
    /// `groups`: the read group of each member, in configuration order; `write`: the
    /// cluster's write group, the fallback of reads that cannot stay on a replica.
    pub fn new(
        cluster: &ClusterConfig,
        groups: Vec<Arc<SlotGroup>>,
        write: &Arc<SlotGroup>,
        metrics: Arc<Metrics>,
    ) -> Reads {
        let groups: Vec<(String, Arc<SlotGroup>)> =
            cluster.members.iter().map(|m| m.name.clone()).zip(groups).collect();
        if cluster.read_fallback == ReadFallback::Primary {
            for (_, g) in &groups {
                g.set_fallback(write.clone());
            }
        }
        Reads {
            cluster: cluster.name.clone(),
            groups,
            serving: RwLock::new(Arc::new(Vec::new())),
            reasons: RwLock::new(BTreeMap::new()),
            turn: AtomicUsize::new(0),
            fallback: cluster.read_fallback,
            metrics,
        }
    }

    pub fn groups(&self) -> impl Iterator<Item = &Arc<SlotGroup>> {
        self.groups.iter().map(|(_, g)| g)
    }

    /// Re-derives which members serve reads. `health`: member → state; `gate`: the delay
    /// probe's verdicts (`None`: delay detection off).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &self,
        config: &ClusterConfig,
        pool_config: &PoolConfig,
        replica_size: usize,
        view: &ClusterView,
        health: &BTreeMap<String, HealthState>,
        maintenance: &BTreeSet<String>,
        gate: Option<&ReadGate>,
    ) {
        let mut serving = Vec::new();
        let mut reasons = BTreeMap::new();
        for (member, group) in &self.groups {
            let seen = view.members.iter().find(|m| &m.name == member);
            let role = seen.map(|m| m.role).unwrap_or_default();
            let primary = view.primary.as_deref() == Some(member.as_str()) || role == Role::Primary;
            let replica = !primary && role == Role::Replica;
            // Read slots stay through a replica's short spells as unknown (unreachable)
            // or detached (re-pointed during a failover): warm sessions serve again at
            // once. The primary and a fenced former primary have none.
            let keep = !primary && role != Role::Fenced;
            group.want_size(if keep { replica_size } else { 0 });
            let down = health.get(member) == Some(&HealthState::Down);
            if down {
                // Reads in flight on a dead or cut-off member would hang until
                // request_timeout: they end now (WORKER_LOST, outcome unknown).
                group.abandon_member(member);
            }
            let why = if primary {
                Some("the primary".to_owned())
            } else if down {
                Some("down".to_owned())
            } else if !replica {
                Some(match seen {
                    Some(_) => format!("not a replica ({})", role.name()),
                    None => "not seen yet".to_owned(),
                })
            } else if maintenance.contains(member) {
                Some("in maintenance".to_owned())
            } else {
                match gate.map(|g| g.delay.get(member)) {
                    None => None,
                    Some(Some(Ok(()))) => None,
                    Some(Some(Err(why))) => Some(why.clone()),
                    Some(None) => Some("no delay measurement yet".to_owned()),
                }
            };
            let cfg = config.member(member);
            // Warm sessions on every replica, serving or not: one that comes back under
            // the delay threshold serves at once.
            if let (true, Some(m)) = (keep, cfg) {
                if why.is_none() || group.target_member().as_deref() != Some(member.as_str()) {
                    group.set_target(member, worker_settings(config, m, pool_config));
                }
            }
            let label = MemberLabel {
                cluster: self.cluster.clone(),
                member: member.clone(),
            };
            match why {
                Some(why) => {
                    self.metrics.reads.eligible.get_or_create(&label).set(0);
                    group.set_unavailable(format!("{member} serves no reads: {why}"));
                    reasons.insert(member.clone(), why);
                }
                None => {
                    self.metrics.reads.eligible.get_or_create(&label).set(1);
                    // Two lower bounds of one growing position (the topology provider's
                    // round and the delay probe's): their merge is one too.
                    let mut applied = GtidPos::new();
                    let known = [
                        seen.and_then(|m| m.gtid_applied.as_deref()),
                        gate.and_then(|g| g.applied.get(member).map(String::as_str)),
                    ];
                    for p in known.into_iter().flatten().filter_map(|t| GtidPos::parse(t).ok()) {
                        applied.merge(&p);
                    }
                    serving.push(Serving {
                        member: member.clone(),
                        pool: group.clone(),
                        applied,
                    });
                }
            }
        }
        *self.serving.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(serving);
        *self.reasons.write().unwrap_or_else(|e| e.into_inner()) = reasons;
    }

    /// The read group for a read: among the serving replicas (those known to have
    /// applied `causal`, when given), the one with the fewest requests running and
    /// waiting. No waiting on a replica to catch up: one that has the caller's writes
    /// serves at once, else the primary does.
    pub fn pick(&self, causal: Option<&str>) -> ReadChoice {
        let serving = self.serving.read().unwrap_or_else(|e| e.into_inner()).clone();
        // (REQUEST validation refused a malformed one.)
        let want = causal.and_then(|c| GtidPos::parse(c).ok()).filter(|g| !g.is_empty());
        let n = serving.len();
        let start = if n > 1 {
            self.turn.fetch_add(1, Ordering::Relaxed) % n
        } else {
            0
        };
        let mut best: Option<(&Serving, usize)> = None;
        for k in 0..n {
            let s = &serving[(start + k) % n];
            if want.as_ref().is_some_and(|w| !s.applied.dominates(w)) {
                continue;
            }
            // No registered worker yet (just became a replica, its sessions fail):
            // another replica, or the primary, serves instead of a wait.
            let Some(load) = s.pool.outstanding() else { continue };
            if best.is_none_or(|(_, b)| load < b) {
                best = Some((s, load));
            }
        }
        if let Some((s, _)) = best {
            self.metrics
                .reads
                .by_member
                .get_or_create(&MemberLabel {
                    cluster: self.cluster.clone(),
                    member: s.member.clone(),
                })
                .inc();
            return ReadChoice::Replica(s.pool.clone());
        }
        let reason = if n > 0 { "causal" } else { "no_replica" };
        self.fallen_back(reason);
        match (self.fallback, reason) {
            // A read that must see the caller's writes is always welcome on the primary.
            (ReadFallback::Primary, _) | (ReadFallback::Error, "causal") => ReadChoice::Primary(reason),
            (ReadFallback::Error, _) => ReadChoice::Refuse(format!(
                "cluster {}: no replica serves reads ({}) and read_fallback = \"error\"",
                self.cluster,
                self.reasons_text()
            )),
        }
    }

    /// Counts one routing decision (`why`: the classifier's reason, or `force_primary`,
    /// `batch`, `read_only`).
    pub fn decided(&self, replica: bool, why: &'static str) {
        self.metrics
            .reads
            .decisions
            .get_or_create(&RouteLabel {
                cluster: self.cluster.clone(),
                route: if replica { "replica" } else { "primary" },
                why,
            })
            .inc();
    }

    /// Counts a read that went to the primary (or was refused) for want of a replica.
    pub fn fallen_back(&self, reason: &'static str) {
        self.metrics
            .reads
            .fallbacks
            .get_or_create(&FallbackLabel {
                cluster: self.cluster.clone(),
                reason,
            })
            .inc();
    }

    pub fn fallback(&self) -> ReadFallback {
        self.fallback
    }

    fn reasons_text(&self) -> String {
        let r = self.reasons.read().unwrap_or_else(|e| e.into_inner());
        if r.is_empty() {
            return "none configured".into();
        }
        r.iter()
            .map(|(m, why)| format!("{m}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub fn report(&self) -> Vec<ReadPoolReport> {
        let serving = self.serving.read().unwrap_or_else(|e| e.into_inner()).clone();
        let reasons = self.reasons.read().unwrap_or_else(|e| e.into_inner()).clone();
        self.groups
            .iter()
            .map(|(member, g)| {
                let s = serving.iter().find(|s| &s.member == member);
                ReadPoolReport {
                    member: member.clone(),
                    serving: s.is_some(),
                    reason: reasons.get(member).cloned(),
                    applied: s.filter(|s| !s.applied.is_empty()).map(|s| s.applied.to_string()),
                    slots: g.view().0,
                }
            })
            .collect()
    }
}

//! What the admin API and the operations page both show, and the state their handlers
//! share: [`AdminState`], and the JSON of `/status` ([`status_of`]), `/cluster`
//! ([`reports_of`]) and `/delay` ([`delay_of`]), which the routes of `http.rs` answer and
//! the snapshots of `ui.rs` carry. It imports neither of them.

use std::sync::Arc;

use crate::cluster::manager::ClusterReport;
use crate::cluster::ClusterStatus;
use crate::ctx::Ctx;
use crate::fds::{self, FdBudget};
use crate::pool::supervisor::Supervisor;

#[derive(Clone)]
pub struct AdminState {
    pub ctx: Arc<Ctx>,
    pub supervisor: Arc<Supervisor>,
    /// The file-descriptor plan: a resize must keep its reserve.
    pub fds: FdBudget,
}

pub use osprey_admin_api::ClusterSummary;
pub use osprey_admin_api::{Clients, Fds, Status, Streams};

/// A cluster's status in `/status`: the provider's own, spelled as `/cluster` spells it.
impl From<&ClusterStatus> for osprey_admin_api::ClusterStatus {
    fn from(status: &ClusterStatus) -> Self {
        use osprey_admin_api::ClusterStatus as Api;
        match status {
            ClusterStatus::Starting => Api::Starting,
            ClusterStatus::Ok => Api::Ok,
            ClusterStatus::Switching(detail) => Api::Switching(detail.clone()),
            ClusterStatus::Unreachable(detail) => Api::Unreachable(detail.clone()),
            ClusterStatus::NoPrimary(detail) => Api::NoPrimary(detail.clone()),
        }
    }
}

pub fn status_of(ctx: &Ctx, budget: &FdBudget) -> Status {
    let (pool, _) = ctx.pool.view();
    let mut slots = Vec::new();
    let mut groups = Vec::new();
    for g in &ctx.groups {
        let (mut view, s) = g.view();
        view.max_sessions = ctx.config.sessions.cap(view.size);
        groups.push(view);
        slots.extend(s);
    }
    let clusters = ctx
        .clusters
        .iter()
        .map(|c| {
            let v = c.provider.view.borrow();
            ClusterSummary {
                name: c.name.clone(),
                topology: v.topology.to_owned(),
                primary: v.primary.clone(),
                status: (&v.status).into(),
                epoch: v.epoch,
            }
        })
        .collect();
    Status {
        groups,
        clusters,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        uptime_s: ctx.started.elapsed().as_secs_f64(),
        draining: ctx.draining.is_cancelled(),
        pool,
        slots,
        clients: Clients {
            connections: ctx.metrics.client_connections.get(),
            open_streams: ctx.metrics.streams_open.get(),
            mysql_connections: ctx.clients.count("mysql") as i64,
            mysql_pinned: ctx
                .groups
                .iter()
                .flat_map(|g| g.sessions.sessions())
                .filter(|s| ctx.clients.get(s.conn).is_some_and(|c| c.protocol == "mysql"))
                .count() as i64,
        },
        streams: Streams {
            opened: ctx.metrics.streams_opened.get(),
            closed: ctx.metrics.streams_closed.get(),
        },
        fds: Fds {
            limit: budget.limit,
            reserve: budget.reserve,
            max_client_connections: budget.max_client_connections,
            open: fds::open_count(),
            admin_connections: ctx.metrics.admin_connections.get(),
        },
    }
}

/// The clusters of `GET /cluster` (all, or the one named).
pub(super) fn reports_of(ctx: &Ctx, cluster: Option<&str>) -> Vec<ClusterReport> {
    ctx.clusters
        .iter()
        .filter(|c| cluster.is_none_or(|n| n == c.name))
        .map(|c| c.report())
        .collect()
}

/// The clusters of `GET /delay` (all, or the one named).
pub(super) fn delay_of(ctx: &Ctx, cluster: Option<&str>) -> Vec<serde_json::Value> {
    ctx.clusters
        .iter()
        .filter(|c| cluster.is_none_or(|n| n == c.name))
        .map(|c| match c.delay.get() {
            Some(d) => {
                let mut view = d.view.borrow().clone();
                let now: Vec<bool> = view.replicas.iter().map(|r| view.eligible(&r.name)).collect();
                for (r, eligible) in view.replicas.iter_mut().zip(now) {
                    r.eligible = eligible;
                }
                let mut v = serde_json::to_value(view).unwrap_or_default();
                v["enabled"] = true.into();
                v
            }
            None => serde_json::json!({ "cluster": c.name, "enabled": false }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::mpsc;

    use super::*;
    use crate::cluster::events::EventLog;
    use crate::metrics::Metrics;
    use crate::policy::{Limit, Policy};
    use crate::pool::wait_queue::QueueLimits;
    use crate::pool::SlotGroup;

    /// `/status` as the dispatcher builds it (`status_of`: a write group with a starting
    /// slot, a read group with none) reads back into the shared types, which the `osprey`
    /// CLI renders, and writes the same JSON again.
    #[test]
    fn status_reads_back_with_the_shared_types() {
        let metrics = Arc::new(Metrics::new());
        let write = SlotGroup::new(2, QueueLimits::uncapped(64), "c1".into(), metrics.clone());
        let (kill, _) = mpsc::unbounded_channel();
        write.add_slot(0, kill);
        let read = SlotGroup::read_group(1, QueueLimits::uncapped(64), "c1".into(), "r1".into(), metrics.clone());
        let (policy, _) = Policy::new(
            Default::default(),
            Default::default(),
            std::iter::empty::<(String, Limit)>(),
            None,
        );
        let ctx = Ctx::new(
            toml::from_str("").unwrap(),
            vec![write, read],
            Vec::new(),
            Arc::new(EventLog::default()),
            metrics,
            policy,
            Vec::new(),
            "admin".into(),
            "secret".into(),
        );
        let budget = FdBudget {
            limit: 1024,
            reserve: 100,
            max_client_connections: 924,
        };
        let json = serde_json::to_value(status_of(&ctx, &budget)).unwrap();
        assert_eq!(json["slots"][0]["state"], "starting");
        assert_eq!(json["slots"][0]["pid"], serde_json::Value::Null);
        assert_eq!(json["groups"][0]["role"], "write");
        assert_eq!(json["groups"][0]["member"], serde_json::Value::Null);
        assert_eq!(json["groups"][1]["role"], "read");
        assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
        let back: Status = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(serde_json::to_value(&back).unwrap(), json);
    }

    /// `/status` spells a cluster's status as `/cluster` does (the provider's own type).
    #[test]
    fn cluster_status_is_spelled_as_the_providers() {
        for status in [
            ClusterStatus::Starting,
            ClusterStatus::Ok,
            ClusterStatus::Switching("switchover to r1".into()),
            ClusterStatus::Unreachable("the replicas still receive from it".into()),
            ClusterStatus::NoPrimary("cooldown".into()),
        ] {
            let shared = osprey_admin_api::ClusterStatus::from(&status);
            assert_eq!(
                serde_json::to_string(&shared).unwrap(),
                serde_json::to_string(&status).unwrap()
            );
        }
    }
}

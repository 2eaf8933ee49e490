//! Which Galera node takes the writes: pure functions on what the probes saw, so that every
//! rule is tested without a server.
//!
//! Rules:
//! - A node is eligible when its probe answered (or its last answer is kept, below), it is
//!   in a Primary component
//!   (`wsrep_cluster_status = Primary`), Synced (`wsrep_local_state = 4`), `wsrep_ready = ON`,
//!   and its monitor does not say Down. Anything else takes no requests (`detached`, with the
//!   reason).
//! - The writer is the eligible node with the lowest `priority`, then the lowest
//!   `wsrep_local_index`, then the first in the config.
//! - No needless moves: the current writer stays while it is eligible, even when the order
//!   above now prefers another node (indexes are reassigned at every view change).
//! - One exception, decided so: a node whose configured `priority` is strictly lower than the
//!   writer's takes the writes back once it has been eligible for `recover_successes` rounds
//!   in a row (priority says where writes belong; the streak keeps a flapping node from
//!   pulling them back and forth). Equal priorities never fail back. A writer chosen by a
//!   switchover is pinned: it keeps the writes while eligible, whatever the priorities.
//! - A probe that times out (a node slow to answer on a busy host, or hung, or a network that
//!   eats packets) is not yet an answer: the node keeps its last status, and so its role
//!   (writes, reads), until the `fail_threshold`-th probe in a row times out, so
//!   `fail_threshold - 1` are borne (as ProxySQL's
//!   `monitor_galera_healthcheck_max_timeout_count`). Such a node is *late*: it keeps the
//!   writes if it has them, but is not given them (no election, failback or switchover on
//!   a status that old). A refused or dropped connection, an error or a status that says
//!   not Synced takes the node out at once.

use crate::cluster::view::MemberHealth;

/// Galera's `wsrep_local_state` of a node in sync with the group.
pub const SYNCED: u32 = 4;

/// The status variables one probe reads.
pub const STATUS_SQL: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN \
    ('wsrep_cluster_status', 'wsrep_local_state', 'wsrep_local_state_comment', \
     'wsrep_local_index', 'wsrep_cluster_size', 'wsrep_ready')";

/// One node's answer to [`STATUS_SQL`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStatus {
    pub cluster_status: String,
    pub local_state: u32,
    pub local_state_comment: String,
    pub local_index: Option<u32>,
    pub cluster_size: u32,
    pub ready: bool,
}

impl NodeStatus {
    /// From `(Variable_name, Value)` rows. Missing variables (a server without Galera, or
    /// with `wsrep_on = OFF`) leave the node not Synced and not ready.
    pub fn from_rows(rows: &[Vec<Option<String>>]) -> NodeStatus {
        let get = |name: &str| {
            rows.iter()
                .find(|r| {
                    r.first()
                        .and_then(|k| k.as_deref())
                        .is_some_and(|k| k.eq_ignore_ascii_case(name))
                })
                .and_then(|r| r.get(1).cloned().flatten())
                .unwrap_or_default()
        };
        NodeStatus {
            cluster_status: get("wsrep_cluster_status"),
            local_state: get("wsrep_local_state").trim().parse().unwrap_or(0),
            local_state_comment: get("wsrep_local_state_comment"),
            local_index: get("wsrep_local_index").trim().parse().ok(),
            cluster_size: get("wsrep_cluster_size").trim().parse().unwrap_or(0),
            ready: get("wsrep_ready").eq_ignore_ascii_case("ON"),
        }
    }

    /// Why this node may not take requests; `None` when it may.
    pub fn not_eligible_because(&self) -> Option<String> {
        if self.cluster_status.is_empty() {
            return Some("no wsrep status: Galera is not running on this server".into());
        }
        if self.cluster_status != "Primary" {
            return Some(format!("not in a Primary component ({})", self.cluster_status));
        }
        if self.local_state != SYNCED {
            let comment = if self.local_state_comment.is_empty() {
                "?"
            } else {
                self.local_state_comment.as_str()
            };
            return Some(format!("not Synced ({comment}, state {})", self.local_state));
        }
        if !self.ready {
            return Some("wsrep_ready is OFF".into());
        }
        None
    }
}

/// What the provider knows of one configured member this round.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub name: String,
    pub priority: u32,
    /// Position in the config: the last tie-breaker.
    pub order: usize,
    /// `Ok(status)` when the probe answered, `Err(why)` when it did not.
    pub probe: Result<NodeStatus, String>,
    /// The monitor says the member is Down.
    pub health_down: bool,
    /// Rounds in a row this member was electable (eligible and on time; this one included).
    pub eligible_streak: u32,
    /// This round's probe timed out and `probe` is the last answer, kept (see
    /// [`through_timeout`]): why, for the member's view.
    pub late: Option<String>,
}

impl Candidate {
    pub fn new(
        name: &str,
        priority: u32,
        order: usize,
        probe: Result<NodeStatus, String>,
        health: Option<&MemberHealth>,
    ) -> Self {
        Candidate {
            name: name.to_owned(),
            priority,
            order,
            probe,
            health_down: health.is_some_and(|h| h.state == crate::cluster::view::HealthState::Down),
            eligible_streak: 0,
            late: None,
        }
    }

    /// May be given the writes this round: eligible, and answered this round.
    pub fn electable(&self) -> bool {
        self.eligible() && self.late.is_none()
    }

    /// Why it takes no requests; `None` when it is eligible.
    pub fn reason(&self) -> Option<String> {
        match &self.probe {
            Err(e) => Some(format!("unreachable: {e}")),
            Ok(_) if self.health_down => Some("health: down".into()),
            Ok(s) => s.not_eligible_because(),
        }
    }

    /// What its member view says: why it takes no requests, or why it is late.
    pub fn note(&self) -> Option<String> {
        self.reason().or_else(|| self.late.clone())
    }

    pub fn eligible(&self) -> bool {
        self.reason().is_none()
    }

    fn rank(&self) -> (u32, u32, usize) {
        let index = self.probe.as_ref().ok().and_then(|s| s.local_index).unwrap_or(u32::MAX);
        (self.priority, index, self.order)
    }
}

/// The best electable candidate by (priority, local index, config order), skipping `except`.
pub fn best<'a>(candidates: &'a [Candidate], except: Option<&str>) -> Option<&'a Candidate> {
    candidates
        .iter()
        .filter(|c| c.electable() && Some(c.name.as_str()) != except)
        .min_by_key(|c| c.rank())
}

/// The writer after this round (see the module rules). `pinned`: the current writer was
/// chosen by a switchover.
pub fn choose(current: Option<&str>, pinned: bool, candidates: &[Candidate], failback_after: u32) -> Option<String> {
    let best = best(candidates, None);
    // A late writer is still eligible: it keeps the writes.
    let cur = current.and_then(|c| candidates.iter().find(|x| x.name == c && x.eligible()));
    match (cur, best) {
        (None, best) => best.map(|b| b.name.clone()),
        (Some(cur), None) => Some(cur.name.clone()),
        (Some(cur), Some(best)) => {
            let failback = !pinned && best.priority < cur.priority && best.eligible_streak >= failback_after.max(1);
            Some(if failback { best.name.clone() } else { cur.name.clone() })
        }
    }
}

/// This round's probe of one node, through the timeout rule (module rules): `probe` is what
/// it gave (`Err` with the error's text), `timeouts_in_a_row` how many probes in a row have
/// now timed out (0 when this one did not), `last` the node's last answer since it last
/// failed otherwise. Returns the status to judge the node on, and `Some(why)` when that is
/// the kept one.
pub fn through_timeout(
    probe: Result<NodeStatus, String>,
    timeouts_in_a_row: u32,
    limit: u32,
    last: Option<&NodeStatus>,
) -> (Result<NodeStatus, String>, Option<String>) {
    match (probe, last) {
        (Err(why), Some(last)) if timeouts_in_a_row > 0 && timeouts_in_a_row < limit => (
            Ok(last.clone()),
            Some(format!(
                "late: {why} ({timeouts_in_a_row} in a row; out at {limit}); its last status is kept"
            )),
        ),
        (probe, _) => (probe, None),
    }
}

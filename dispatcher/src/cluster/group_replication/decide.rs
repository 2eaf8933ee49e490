//! Who the group's writer is, from what the members report of the group: a pure function
//! on `performance_schema.replication_group_members` rows, so that every case is tested
//! without a server (MySQL, hence Group Replication, cannot be installed here).
//!
//! Rules:
//! - Every reachable member reports its view of the group. A report counts only when its
//!   reporter is `ONLINE` in it and the reachable members of that view (`ONLINE` or
//!   `RECOVERING`, not `UNREACHABLE`) are a majority of it: a member cut off in a minority
//!   still shows itself `ONLINE` but cannot commit, so its view is not believed.
//! - The primary of a view is its `ONLINE` member with role `PRIMARY` (multi-primary mode,
//!   several: the current writer if among them, else the lowest `priority`, then config
//!   order). The counting reports vote; the primary named by more of them than any other
//!   wins (a tie keeps the current writer if it is among the tied, else no primary until
//!   the views agree).
//! - Each member's state is the one most of the winning reports give it (a tie counts as
//!   not `ONLINE`); only an `ONLINE` member takes requests, and the primary must be one.
//! - Rows whose `MEMBER_HOST:MEMBER_PORT` match no configured member are reported, never
//!   followed: writes cannot go to a server Osprey has no member for.

use std::collections::HashMap;

use crate::cluster::config::MemberConfig;

/// The statement each member answers.
pub const MEMBERS_SQL: &str = "SELECT MEMBER_HOST, MEMBER_PORT, MEMBER_STATE, MEMBER_ROLE \
    FROM performance_schema.replication_group_members";

/// One row of `replication_group_members`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRow {
    pub host: String,
    pub port: Option<u16>,
    pub state: String,
    pub role: String,
}

impl GroupRow {
    pub fn new(host: &str, port: u16, state: &str, role: &str) -> GroupRow {
        GroupRow {
            host: host.into(),
            port: Some(port),
            state: state.into(),
            role: role.into(),
        }
    }

    fn addr(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        }
    }

    fn reachable(&self) -> bool {
        matches!(self.state.as_str(), "ONLINE" | "RECOVERING")
    }
}

/// Rows of [`MEMBERS_SQL`] (text protocol strings). Rows without a host are skipped;
/// MySQL 5.7 has no `MEMBER_ROLE` (NULL): such a group is treated as having no PRIMARY.
pub fn parse_rows(rows: &[Vec<Option<String>>]) -> Vec<GroupRow> {
    rows.iter()
        .filter_map(|r| {
            let col = |i: usize| r.get(i).cloned().flatten();
            let host = col(0).filter(|h| !h.is_empty())?;
            Some(GroupRow {
                host,
                port: col(1).and_then(|p| p.trim().parse().ok()),
                state: col(2).unwrap_or_default().to_ascii_uppercase(),
                role: col(3).unwrap_or_default().to_ascii_uppercase(),
            })
        })
        .collect()
}

/// What one configured member answered this round.
#[derive(Debug, Clone)]
pub struct Report {
    /// The configured member that was asked.
    pub reporter: String,
    /// Its rows, or why it did not answer.
    pub rows: Result<Vec<GroupRow>, String>,
}

/// The decision for one configured member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    pub name: String,
    /// `MEMBER_STATE` by the believed view; `None` when it is not in it.
    pub state: Option<String>,
    pub role: Option<String>,
    /// Takes requests (`ONLINE` in the believed view).
    pub serves: bool,
    /// Why not, when it does not.
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDecision {
    pub primary: Option<String>,
    pub members: Vec<MemberState>,
    /// Why there is no primary (or what looks wrong), for the cluster status.
    pub problem: Option<String>,
    /// `host:port` of rows that match no configured member.
    pub unknown: Vec<String>,
}

/// A configured member's name for a row, by host (case-insensitive) and port.
fn member_for<'a>(members: &'a [MemberConfig], row: &GroupRow) -> Option<&'a MemberConfig> {
    let host_matches = |m: &&MemberConfig| m.host.eq_ignore_ascii_case(&row.host);
    match row.port {
        Some(port) => members.iter().filter(host_matches).find(|m| m.port == port),
        // No port in the row: only an unambiguous host match will do.
        None => {
            let mut it = members.iter().filter(host_matches);
            match (it.next(), it.next()) {
                (Some(m), None) => Some(m),
                _ => None,
            }
        }
    }
}

/// One counting report, keyed by configured member name (unknown rows kept apart).
struct View {
    states: HashMap<String, (String, String)>,
    online: usize,
}

pub fn decide(members: &[MemberConfig], reports: &[Report], current: Option<&str>) -> GroupDecision {
    let mut unknown: Vec<String> = Vec::new();
    let mut views: Vec<View> = Vec::new();
    let mut discarded: Vec<String> = Vec::new();
    for report in reports {
        let Ok(rows) = &report.rows else { continue };
        let mut states = HashMap::new();
        for row in rows {
            match member_for(members, row) {
                Some(m) => {
                    states.insert(m.name.clone(), (row.state.clone(), row.role.clone()));
                }
                None => {
                    let addr = row.addr();
                    if !unknown.contains(&addr) {
                        unknown.push(addr);
                    }
                }
            }
        }
        let own_online = states.get(&report.reporter).is_some_and(|(s, _)| s == "ONLINE");
        let reachable = rows.iter().filter(|r| r.reachable()).count();
        let majority = reachable * 2 > rows.len();
        if own_online && majority {
            let online = rows.iter().filter(|r| r.state == "ONLINE").count();
            views.push(View { states, online });
        } else {
            discarded.push(report.reporter.clone());
        }
    }
    unknown.sort();

    if views.is_empty() {
        let errors: Vec<String> = reports
            .iter()
            .filter_map(|r| r.rows.as_ref().err().map(|e| format!("{}: {e}", r.reporter)))
            .collect();
        let problem = if errors.len() == reports.len() {
            format!("no member answered ({})", errors.join("; "))
        } else {
            format!(
                "no ONLINE member sees a majority of its group (asked: {})",
                discarded.join(", ")
            )
        };
        return GroupDecision {
            primary: None,
            members: members
                .iter()
                .map(|m| not_serving(m, reports, "not in a majority view of the group"))
                .collect(),
            problem: Some(problem),
            unknown,
        };
    }

    // Each counting view names its primary (`Err(addr)`: a PRIMARY that is no member of ours).
    let view_primary = |v: &View| -> Option<String> {
        let mut primaries: Vec<&MemberConfig> = members
            .iter()
            .filter(|m| {
                v.states
                    .get(&m.name)
                    .is_some_and(|(s, r)| s == "ONLINE" && r == "PRIMARY")
            })
            .collect();
        if let Some(cur) = current.and_then(|c| primaries.iter().find(|m| m.name == c)) {
            return Some(cur.name.clone());
        }
        primaries.sort_by_key(|m| (m.priority, members.iter().position(|x| x.name == m.name)));
        primaries.first().map(|m| m.name.clone())
    };
    let mut votes: Vec<(Option<String>, usize)> = Vec::new();
    for v in &views {
        let p = view_primary(v);
        match votes.iter_mut().find(|(q, _)| *q == p) {
            Some((_, n)) => *n += 1,
            None => votes.push((p, 1)),
        }
    }
    let top = votes.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let tied: Vec<&Option<String>> = votes.iter().filter(|(_, n)| *n == top).map(|(p, _)| p).collect();
    let winner: Option<Option<String>> = if tied.len() == 1 {
        Some(tied[0].clone())
    } else {
        current
            .and_then(|c| tied.iter().find(|p| p.as_deref() == Some(c)))
            .map(|p| (*p).clone())
    };
    let Some(winner) = winner else {
        return GroupDecision {
            primary: None,
            members: member_states(members, reports, &views),
            problem: Some(format!(
                "the members disagree on the primary ({}); waiting for their views to agree",
                votes
                    .iter()
                    .map(|(p, n)| format!("{}: {n}", p.as_deref().unwrap_or("none")))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            unknown,
        };
    };
    let agreeing: Vec<View> = views.into_iter().filter(|v| view_primary(v) == winner).collect();
    let states = member_states(members, reports, &agreeing);
    let serving = |name: &str| states.iter().any(|m| m.name == name && m.serves);
    let (primary, problem) = match winner {
        Some(p) if serving(&p) => (Some(p), None),
        Some(p) => (
            None,
            Some(format!("the group's PRIMARY {p} is not ONLINE in the majority view")),
        ),
        None => {
            let foreign = agreeing.iter().any(|v| v.online > 0) && !unknown.is_empty();
            let problem = if foreign {
                format!(
                    "no ONLINE PRIMARY among the configured members (rows for unknown members: {})",
                    unknown.join(", ")
                )
            } else {
                "the group has no ONLINE PRIMARY".to_owned()
            };
            (None, Some(problem))
        }
    };
    GroupDecision {
        primary,
        members: states,
        problem,
        unknown,
    }
}

fn member_states(members: &[MemberConfig], reports: &[Report], views: &[View]) -> Vec<MemberState> {
    members
        .iter()
        .map(|m| {
            let mut counts: Vec<((String, String), usize)> = Vec::new();
            let mut absent = 0;
            for v in views {
                match v.states.get(&m.name) {
                    Some(s) => match counts.iter_mut().find(|(x, _)| x == s) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((s.clone(), 1)),
                    },
                    None => absent += 1,
                }
            }
            let top = counts.iter().map(|(_, n)| *n).max().unwrap_or(0);
            let tops: Vec<&(String, String)> = counts.iter().filter(|(_, n)| *n == top).map(|(s, _)| s).collect();
            if top == 0 || absent > top {
                return not_serving(m, reports, "not in the group's majority view");
            }
            // A tie between states (or with absence) counts as not ONLINE.
            let chosen = if tops.len() == 1 && absent < top {
                tops[0].clone()
            } else {
                tops.iter()
                    .find(|(s, _)| s != "ONLINE")
                    .map(|s| (*s).clone())
                    .unwrap_or_else(|| ("UNREACHABLE".into(), String::new()))
            };
            let serves = chosen.0 == "ONLINE";
            MemberState {
                name: m.name.clone(),
                reason: (!serves).then(|| format!("{} in the group's majority view", chosen.0)),
                state: Some(chosen.0),
                role: Some(chosen.1).filter(|r| !r.is_empty()),
                serves,
            }
        })
        .collect()
}

fn not_serving(m: &MemberConfig, reports: &[Report], why: &str) -> MemberState {
    let own = reports.iter().find(|r| r.reporter == m.name);
    let reason = match own.map(|r| &r.rows) {
        Some(Err(e)) => format!("unreachable: {e}"),
        _ => why.to_owned(),
    };
    MemberState {
        name: m.name.clone(),
        state: None,
        role: None,
        serves: false,
        reason: Some(reason),
    }
}

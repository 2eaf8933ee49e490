//! The writer rules on hand-made probe results.

use super::decide::*;
use crate::cluster::view::{HealthState, MemberHealth};

fn synced(index: u32) -> Result<NodeStatus, String> {
    Ok(NodeStatus {
        cluster_status: "Primary".into(),
        local_state: SYNCED,
        local_state_comment: "Synced".into(),
        local_index: Some(index),
        cluster_size: 3,
        ready: true,
    })
}

fn cand(name: &str, priority: u32, order: usize, probe: Result<NodeStatus, String>, streak: u32) -> Candidate {
    let mut c = Candidate::new(name, priority, order, probe, None);
    c.eligible_streak = if c.eligible() { streak } else { 0 };
    c
}

#[test]
fn status_rows_are_parsed() {
    let rows: Vec<Vec<Option<String>>> = [
        ("wsrep_cluster_status", "Primary"),
        ("wsrep_local_state", "4"),
        ("wsrep_local_state_comment", "Synced"),
        ("wsrep_local_index", "2"),
        ("wsrep_cluster_size", "3"),
        ("wsrep_ready", "ON"),
    ]
    .iter()
    .map(|(k, v)| vec![Some(k.to_string()), Some(v.to_string())])
    .collect();
    let s = NodeStatus::from_rows(&rows);
    assert_eq!(s, synced(2).unwrap());
    assert_eq!(s.not_eligible_because(), None);
    // No wsrep variables at all: a plain server.
    let plain = NodeStatus::from_rows(&[]);
    assert!(plain.not_eligible_because().unwrap().contains("Galera is not running"));
}

#[test]
fn only_synced_primary_ready_nodes_are_eligible() {
    let mut s = synced(0).unwrap();
    s.cluster_status = "non-Primary".into();
    assert!(s.not_eligible_because().unwrap().contains("not in a Primary component"));
    let mut s = synced(0).unwrap();
    s.local_state = 2;
    s.local_state_comment = "Donor/Desynced".into();
    assert!(s.not_eligible_because().unwrap().contains("Donor/Desynced"));
    let mut s = synced(0).unwrap();
    s.ready = false;
    assert!(s.not_eligible_because().unwrap().contains("wsrep_ready"));
    let down = MemberHealth {
        state: HealthState::Down,
        ..Default::default()
    };
    let c = Candidate::new("a", 0, 0, synced(0), Some(&down));
    assert_eq!(c.reason().as_deref(), Some("health: down"));
    let c = Candidate::new("a", 0, 0, Err("connect refused".into()), None);
    assert!(c.reason().unwrap().starts_with("unreachable"));
}

#[test]
fn lowest_priority_then_lowest_index_then_config_order() {
    let cs = [
        cand("a", 1, 0, synced(0), 1),
        cand("b", 0, 1, synced(2), 1),
        cand("c", 0, 2, synced(1), 1),
    ];
    assert_eq!(choose(None, false, &cs, 3).as_deref(), Some("c"));
    let cs = [
        cand(
            "a",
            0,
            0,
            Ok(NodeStatus {
                local_index: None,
                ..synced(0).unwrap()
            }),
            1,
        ),
        cand(
            "b",
            0,
            1,
            Ok(NodeStatus {
                local_index: None,
                ..synced(0).unwrap()
            }),
            1,
        ),
    ];
    assert_eq!(choose(None, false, &cs, 3).as_deref(), Some("a"));
}

#[test]
fn the_writer_stays_while_eligible_even_when_indexes_change() {
    // b was chosen; a later view gives a the lower index: no move.
    let cs = [cand("a", 0, 0, synced(0), 5), cand("b", 0, 1, synced(1), 5)];
    assert_eq!(choose(Some("b"), false, &cs, 3).as_deref(), Some("b"));
}

#[test]
fn the_writer_moves_when_it_leaves() {
    let desynced = Ok(NodeStatus {
        local_state: 2,
        local_state_comment: "Donor/Desynced".into(),
        ..synced(0).unwrap()
    });
    let cs = [
        cand("a", 0, 0, desynced, 0),
        cand("b", 0, 1, synced(1), 4),
        cand("c", 0, 2, synced(2), 4),
    ];
    assert_eq!(choose(Some("a"), false, &cs, 3).as_deref(), Some("b"));
    let cs = [cand("a", 0, 0, Err("timeout".into()), 0), cand("b", 0, 1, synced(1), 4)];
    assert_eq!(
        choose(Some("a"), true, &cs, 3).as_deref(),
        Some("b"),
        "a pinned writer leaves too"
    );
    let cs = [
        cand("a", 0, 0, Err("timeout".into()), 0),
        cand("b", 0, 1, Err("refused".into()), 0),
    ];
    assert_eq!(choose(Some("a"), false, &cs, 3), None);
}

#[test]
fn a_lower_priority_node_takes_the_writes_back_only_after_a_streak() {
    let cs = [cand("a", 0, 0, synced(2), 1), cand("b", 5, 1, synced(0), 9)];
    assert_eq!(
        choose(Some("b"), false, &cs, 3).as_deref(),
        Some("b"),
        "one Synced round is not enough"
    );
    let cs = [cand("a", 0, 0, synced(2), 3), cand("b", 5, 1, synced(0), 9)];
    assert_eq!(choose(Some("b"), false, &cs, 3).as_deref(), Some("a"));
    assert_eq!(
        choose(Some("b"), true, &cs, 3).as_deref(),
        Some("b"),
        "a switchover's choice is pinned"
    );
    // Equal priority: never back.
    let cs = [cand("a", 0, 0, synced(0), 30), cand("b", 0, 1, synced(1), 30)];
    assert_eq!(choose(Some("b"), false, &cs, 3).as_deref(), Some("b"));
}

#[test]
fn best_skips_the_current_writer_for_a_switchover() {
    let cs = [
        cand("a", 0, 0, synced(0), 1),
        cand("b", 0, 1, synced(1), 1),
        cand("c", 0, 2, synced(2), 1),
    ];
    assert_eq!(best(&cs, Some("a")).map(|c| c.name.as_str()), Some("b"));
    assert_eq!(best(&cs[..1], Some("a")).map(|c| c.name.as_str()), None);
}

#[test]
fn a_timed_out_probe_keeps_the_last_status_until_the_limit() {
    let last = synced(1).unwrap();
    let timed_out = || Err("status query timed out after 160ms".to_owned());
    let (probe, late) = through_timeout(timed_out(), 1, 3, Some(&last));
    assert_eq!(probe, Ok(last.clone()));
    assert!(late.unwrap().contains("1 in a row; out at 3"));
    let (probe, late) = through_timeout(timed_out(), 2, 3, Some(&last));
    assert_eq!(probe, Ok(last.clone()));
    assert!(late.is_some());
    // The limit-th timeout in a row: out.
    let (probe, late) = through_timeout(timed_out(), 3, 3, Some(&last));
    assert!(probe.is_err());
    assert_eq!(late, None);
    // No answer since it last failed otherwise (or ever): nothing to keep.
    let (probe, _) = through_timeout(timed_out(), 1, 3, None);
    assert!(probe.is_err());
    // Not a timeout (a refused connection, an error): out at once.
    let (probe, late) = through_timeout(Err("connect failed: refused".into()), 0, 3, Some(&last));
    assert!(probe.is_err());
    assert_eq!(late, None);
    // A limit of 1: every timeout counts at once.
    assert!(through_timeout(timed_out(), 1, 1, Some(&last)).0.is_err());
    // An answer is the answer.
    let (probe, late) = through_timeout(synced(2), 0, 3, Some(&last));
    assert_eq!(probe, synced(2));
    assert_eq!(late, None);
}

#[test]
fn a_late_node_keeps_the_writes_but_is_not_given_them() {
    let late = |name: &str, priority: u32, order: usize, index: u32| {
        let mut c = cand(name, priority, order, synced(index), 0);
        c.late = Some("late".into());
        c
    };
    // The late writer keeps the writes, even with no other node to move them to.
    let cs = [late("a", 0, 0, 0), cand("b", 0, 1, synced(1), 4)];
    assert_eq!(choose(Some("a"), false, &cs, 3).as_deref(), Some("a"));
    let cs = [late("a", 0, 0, 0), cand("b", 0, 1, Err("refused".into()), 0)];
    assert_eq!(choose(Some("a"), false, &cs, 3).as_deref(), Some("a"));
    // No writer yet: a late node is not elected, however good its last status.
    let cs = [late("a", 0, 0, 0), cand("b", 5, 1, synced(1), 1)];
    assert_eq!(choose(None, false, &cs, 3).as_deref(), Some("b"));
    let cs = [late("a", 0, 0, 0)];
    assert_eq!(choose(None, false, &cs, 3), None);
    // A late node of lower priority takes no writes back, and no switchover picks it.
    let mut a = late("a", 0, 0, 0);
    a.eligible_streak = 9;
    let cs = [a, cand("b", 5, 1, synced(1), 9), cand("c", 5, 2, synced(2), 9)];
    assert_eq!(choose(Some("b"), false, &cs, 3).as_deref(), Some("b"));
    assert_eq!(best(&cs, Some("b")).map(|c| c.name.as_str()), Some("c"));
    assert!(cs[0].eligible() && !cs[0].electable());
}

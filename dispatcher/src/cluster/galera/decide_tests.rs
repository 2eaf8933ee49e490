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

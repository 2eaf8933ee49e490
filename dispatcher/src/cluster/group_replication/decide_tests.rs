//! The group's writer from hand-made `replication_group_members` rows.

use super::decide::*;
use crate::cluster::config::MemberConfig;

fn members() -> Vec<MemberConfig> {
    ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, n)| MemberConfig::new(*n, format!("db-{n}"), 3306 + i as u16))
        .collect()
}

fn row(m: &str, state: &str, role: &str) -> GroupRow {
    let i = (m.as_bytes()[0] - b'a') as u16;
    GroupRow::new(&format!("db-{m}"), 3306 + i, state, role)
}

fn report(reporter: &str, rows: Vec<GroupRow>) -> Report {
    Report {
        reporter: reporter.into(),
        rows: Ok(rows),
    }
}

fn down(reporter: &str) -> Report {
    Report {
        reporter: reporter.into(),
        rows: Err("connect failed: refused".into()),
    }
}

fn healthy(primary: &str) -> Vec<GroupRow> {
    ["a", "b", "c"]
        .iter()
        .map(|m| row(m, "ONLINE", if *m == primary { "PRIMARY" } else { "SECONDARY" }))
        .collect()
}

fn serves(d: &GroupDecision, name: &str) -> bool {
    d.members.iter().find(|m| m.name == name).unwrap().serves
}

#[test]
fn rows_are_parsed_from_text_columns() {
    let rows = vec![
        vec![
            Some("DB-A".into()),
            Some("3306".into()),
            Some("online".into()),
            Some("primary".into()),
        ],
        vec![None, Some("3307".into()), Some("ONLINE".into()), None],
        vec![Some("db-c".into()), None, Some("RECOVERING".into()), None],
    ];
    let parsed = parse_rows(&rows);
    assert_eq!(parsed.len(), 2, "a row without a host is skipped");
    assert_eq!(parsed[0], GroupRow::new("DB-A", 3306, "ONLINE", "PRIMARY"));
    assert_eq!(parsed[1].port, None);
    assert_eq!(parsed[1].role, "");
}

#[test]
fn single_primary_group() {
    let ms = members();
    let reports = vec![
        report("a", healthy("b")),
        report("b", healthy("b")),
        report("c", healthy("b")),
    ];
    let d = decide(&ms, &reports, None);
    assert_eq!(d.primary.as_deref(), Some("b"));
    assert_eq!(d.problem, None);
    assert!(["a", "b", "c"].iter().all(|m| serves(&d, m)));
    // Host names match case-insensitively.
    let mut rows = healthy("a");
    rows[0].host = "DB-A".into();
    let d = decide(&ms, &[report("a", rows)], None);
    assert_eq!(d.primary.as_deref(), Some("a"));
}

#[test]
fn one_answer_is_enough_when_it_sees_a_majority() {
    let ms = members();
    let d = decide(&ms, &[down("a"), report("b", healthy("c")), down("c")], None);
    assert_eq!(d.primary.as_deref(), Some("c"), "any reachable member tells");
}

#[test]
fn primary_change_is_followed() {
    let ms = members();
    let before = vec![
        report("a", healthy("a")),
        report("b", healthy("a")),
        report("c", healthy("a")),
    ];
    assert_eq!(decide(&ms, &before, None).primary.as_deref(), Some("a"));
    // a left the group; b was elected by the group.
    let after_rows = vec![row("b", "ONLINE", "PRIMARY"), row("c", "ONLINE", "SECONDARY")];
    let after = vec![down("a"), report("b", after_rows.clone()), report("c", after_rows)];
    let d = decide(&ms, &after, Some("a"));
    assert_eq!(d.primary.as_deref(), Some("b"));
    assert!(!serves(&d, "a"));
    let a = d.members.iter().find(|m| m.name == "a").unwrap();
    assert!(a.reason.as_deref().unwrap().starts_with("unreachable"), "{a:?}");
}

#[test]
fn members_not_online_take_no_requests() {
    let ms = members();
    for state in ["RECOVERING", "UNREACHABLE", "ERROR", "OFFLINE"] {
        let rows = vec![
            row("a", "ONLINE", "PRIMARY"),
            row("b", "ONLINE", "SECONDARY"),
            row("c", state, "SECONDARY"),
        ];
        let d = decide(&ms, &[report("a", rows.clone()), report("b", rows)], Some("a"));
        assert_eq!(d.primary.as_deref(), Some("a"), "{state}");
        assert!(!serves(&d, "c"), "{state}");
        let c = d.members.iter().find(|m| m.name == "c").unwrap();
        assert_eq!(c.state.as_deref(), Some(state));
        assert!(c.reason.as_deref().unwrap().contains(state), "{c:?}");
    }
}

#[test]
fn a_member_in_error_reports_only_itself_and_is_not_believed() {
    let ms = members();
    // In ERROR a member's table holds one row, itself; it must not make anybody primary.
    let d = decide(&ms, &[report("c", vec![row("c", "ERROR", "")])], None);
    assert_eq!(d.primary, None);
    assert!(d.problem.as_deref().unwrap().contains("majority"), "{d:?}");
    // Nor a member that left the group (OFFLINE).
    let d = decide(&ms, &[report("a", vec![row("a", "OFFLINE", "")])], None);
    assert_eq!(d.primary, None);
}

#[test]
fn no_online_primary_means_no_primary() {
    let ms = members();
    // The primary is RECOVERING (or the group is electing): writes wait.
    let rows = vec![
        row("a", "RECOVERING", "PRIMARY"),
        row("b", "ONLINE", "SECONDARY"),
        row("c", "ONLINE", "SECONDARY"),
    ];
    let d = decide(&ms, &[report("b", rows.clone()), report("c", rows)], Some("a"));
    assert_eq!(d.primary, None);
    assert!(d.problem.as_deref().unwrap().contains("no ONLINE PRIMARY"), "{d:?}");
    assert!(serves(&d, "b") && serves(&d, "c") && !serves(&d, "a"));
    // Nobody answers at all.
    let d = decide(&ms, &[down("a"), down("b"), down("c")], Some("a"));
    assert_eq!(d.primary, None);
    let problem = d.problem.unwrap();
    assert!(
        problem.starts_with("no member answered (a: connect failed"),
        "{problem}"
    );
}

#[test]
fn a_minority_partition_is_not_believed() {
    let ms = members();
    // a is cut off: it still shows itself ONLINE PRIMARY, the others UNREACHABLE.
    let minority = vec![
        row("a", "ONLINE", "PRIMARY"),
        row("b", "UNREACHABLE", "SECONDARY"),
        row("c", "UNREACHABLE", "SECONDARY"),
    ];
    // The majority expelled a and elected b.
    let majority = vec![row("b", "ONLINE", "PRIMARY"), row("c", "ONLINE", "SECONDARY")];
    let reports = vec![
        report("a", minority.clone()),
        report("b", majority.clone()),
        report("c", majority),
    ];
    let d = decide(&ms, &reports, Some("a"));
    assert_eq!(d.primary.as_deref(), Some("b"));
    assert!(!serves(&d, "a"), "{d:?}");
    // Only the minority answers: no primary rather than a writer that cannot commit.
    let d = decide(&ms, &[report("a", minority), down("b"), down("c")], Some("a"));
    assert_eq!(d.primary, None);
}

#[test]
fn a_member_seen_by_one_side_but_not_another_follows_the_majority() {
    let ms = members();
    // b and c both see a majority; c says a is UNREACHABLE, a and b say it is ONLINE.
    let ab = healthy("b");
    let c_view = vec![
        row("a", "UNREACHABLE", "SECONDARY"),
        row("b", "ONLINE", "PRIMARY"),
        row("c", "ONLINE", "SECONDARY"),
    ];
    let d = decide(
        &ms,
        &[
            report("a", ab.clone()),
            report("b", ab.clone()),
            report("c", c_view.clone()),
        ],
        None,
    );
    assert_eq!(d.primary.as_deref(), Some("b"));
    assert!(serves(&d, "a"), "two views of three say ONLINE: {d:?}");
    // Two say UNREACHABLE, one says ONLINE: it takes no requests.
    let d = decide(
        &ms,
        &[report("a", ab), report("b", c_view.clone()), report("c", c_view)],
        None,
    );
    assert!(!serves(&d, "a"), "{d:?}");
    assert_eq!(d.primary.as_deref(), Some("b"));
}

#[test]
fn views_that_disagree_on_the_primary() {
    let ms = members();
    // During an election two reports name different primaries: no winner, unless the
    // current writer is one of them.
    let d = decide(&ms, &[report("a", healthy("a")), report("b", healthy("b"))], None);
    assert_eq!(d.primary, None);
    assert!(d.problem.as_deref().unwrap().contains("disagree"), "{d:?}");
    let d = decide(&ms, &[report("a", healthy("a")), report("b", healthy("b"))], Some("b"));
    assert_eq!(d.primary.as_deref(), Some("b"));
    // Two against one: the majority wins.
    let d = decide(
        &ms,
        &[
            report("a", healthy("a")),
            report("b", healthy("b")),
            report("c", healthy("b")),
        ],
        Some("a"),
    );
    assert_eq!(d.primary.as_deref(), Some("b"));
}

#[test]
fn an_unknown_host_is_never_followed() {
    let ms = members();
    let rows = vec![
        GroupRow::new("db-x", 3306, "ONLINE", "PRIMARY"),
        row("a", "ONLINE", "SECONDARY"),
        row("b", "ONLINE", "SECONDARY"),
    ];
    let d = decide(&ms, &[report("a", rows.clone()), report("b", rows)], None);
    assert_eq!(d.primary, None);
    assert_eq!(d.unknown, vec!["db-x:3306".to_string()]);
    assert!(d.problem.as_deref().unwrap().contains("db-x:3306"), "{d:?}");
    // Same host, another port: unknown too.
    let rows = vec![
        GroupRow::new("db-a", 4000, "ONLINE", "PRIMARY"),
        row("b", "ONLINE", "SECONDARY"),
        row("c", "ONLINE", "SECONDARY"),
    ];
    let d = decide(&ms, &[report("b", rows)], None);
    assert_eq!(d.primary, None);
    assert_eq!(d.unknown, vec!["db-a:4000".to_string()]);
}

#[test]
fn multi_primary_keeps_the_current_writer_else_priority() {
    let mut ms = members();
    ms[2].priority = 0;
    ms[0].priority = 9;
    ms[1].priority = 9;
    let all_primary: Vec<GroupRow> = ["a", "b", "c"].iter().map(|m| row(m, "ONLINE", "PRIMARY")).collect();
    let reports = vec![report("a", all_primary.clone()), report("b", all_primary)];
    assert_eq!(decide(&ms, &reports, None).primary.as_deref(), Some("c"));
    assert_eq!(decide(&ms, &reports, Some("a")).primary.as_deref(), Some("a"));
}

//! Pure decisions on facts: who the servers say the primary is, what a crashed switch left
//! to repair, whether the replicas still hear from a primary we cannot reach, and whom to
//! promote. No I/O here, so every rule is tested on rows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::facts::MemberFacts;
use crate::cluster::{ClusterConfig, HealthState};

/// Facts of the members that answered this round, by name.
pub type Facts = BTreeMap<String, MemberFacts>;

/// The topology as the servers tell it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derived {
    /// The writable member the replicas follow, or (none writable) the member they follow.
    pub primary: Option<String>,
    /// Writable members besides the primary: two writers, fence them.
    pub extra_writers: Vec<String>,
    /// Replicas left pointing at a dead or replaced member while a primary exists: a switch
    /// that stopped half way. Re-point them at the primary.
    pub strays: Vec<String>,
    /// Nobody is writable but the replicas follow this reachable, read-only member that
    /// was not replaced: a switchover stopped after making it read-only. Make it writable.
    pub reopen: Option<String>,
    /// The writable primary still has replication configured: a failover stopped between
    /// `promote` and `detach`. Reset it.
    pub undetached: bool,
}

fn followers(facts: &Facts, of: &str) -> usize {
    facts
        .values()
        .filter(|f| f.replicates_from.as_deref() == Some(of))
        .count()
}

/// Derives the primary from the facts. `previous` (our last primary) breaks ties, so a
/// view does not flip between two equal candidates; `replaced` are members a switch
/// replaced (never primary again without a switch).
pub fn derive(facts: &Facts, previous: Option<&str>, replaced: &BTreeSet<String>) -> Derived {
    let writers: Vec<&String> = facts
        .iter()
        .filter(|(n, f)| !f.read_only && !replaced.contains(*n))
        .map(|(n, _)| n)
        .collect();
    // A replaced member that is writable again is always an extra writer.
    let mut extra: Vec<String> = facts
        .iter()
        .filter(|(n, f)| !f.read_only && replaced.contains(*n))
        .map(|(n, _)| n.clone())
        .collect();
    let mut out = Derived::default();
    if !writers.is_empty() {
        let best = writers
            .iter()
            .copied()
            .max_by(|a, b| {
                let (fa, fb) = (&facts[*a], &facts[*b]);
                followers(facts, a)
                    .cmp(&followers(facts, b))
                    .then_with(|| (previous == Some(a.as_str())).cmp(&(previous == Some(b.as_str()))))
                    // A member that is a replica itself ranks below one that is not.
                    .then_with(|| fb.is_replica().cmp(&fa.is_replica()))
                    .then_with(|| fa.binlog_pos().progress_cmp(&fb.binlog_pos()))
                    .then_with(|| b.cmp(a))
            })
            .cloned();
        extra.extend(
            writers
                .iter()
                .filter(|w| Some(**w) != best.as_ref())
                .map(|w| (*w).clone()),
        );
        out.primary = best;
    } else {
        // Nobody writable: the member most replicas follow (it may be down).
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for f in facts.values() {
            if let Some(m) = f.replicates_from.as_deref() {
                if !replaced.contains(m) {
                    *counts.entry(m).or_default() += 1;
                }
            }
        }
        let best = counts
            .iter()
            .max_by(|a, b| {
                a.1.cmp(b.1)
                    .then_with(|| (previous == Some(*a.0)).cmp(&(previous == Some(*b.0))))
                    .then_with(|| b.0.cmp(a.0))
            })
            .map(|(m, _)| (*m).to_owned());
        if let Some(p) = &best {
            if let Some(f) = facts.get(p) {
                if f.read_only && !f.is_replica() {
                    out.reopen = Some(p.clone());
                }
            }
        }
        out.primary = best;
    }
    if let Some(p) = &out.primary {
        out.undetached = facts.get(p).is_some_and(|f| !f.read_only && f.is_replica());
    }
    extra.sort();
    extra.dedup();
    out.extra_writers = extra;
    if let Some(p) = &out.primary {
        out.strays = facts
            .iter()
            .filter(|(n, f)| {
                *n != p
                    && f.slave.as_ref().is_some_and(|s| {
                        let master = f.replicates_from.as_deref();
                        master != Some(p.as_str())
                            && (master.is_some_and(|m| replaced.contains(m)) || (!s.io_running() && master.is_some()))
                    })
            })
            .map(|(n, _)| n.clone())
            .collect();
    }
    out
}

/// What our rounds saw of a replica's link to its primary: when its heartbeat count or
/// received position last changed, and when a heartbeat was last certainly missed.
#[derive(Debug, Clone)]
pub struct Progress {
    key: (u64, String),
    /// The observation that saw the last change.
    changed: Instant,
    /// The latest observation.
    seen: Instant,
    /// When a gap between two changes was certainly longer than 1.5 heartbeat periods.
    missed: Option<Instant>,
}

impl Progress {
    pub fn new(received_heartbeats: u64, received: &str, at: Instant) -> Progress {
        Progress {
            key: (received_heartbeats, received.to_owned()),
            changed: at,
            seen: at,
            missed: None,
        }
    }

    /// One more observation at `at`; `heartbeat` is the replica's heartbeat period.
    pub fn observe(&mut self, received_heartbeats: u64, received: &str, heartbeat: Duration, at: Instant) {
        if self.key.0 != received_heartbeats || self.key.1 != received {
            // The change happened after the previous observation (`seen`), so the gap
            // since the one before is at least `seen - changed`, whatever our own
            // rounds' lateness: a certain lower bound, not a sampling artefact.
            let certain_gap = self.seen.saturating_duration_since(self.changed);
            if !heartbeat.is_zero() && certain_gap > heartbeat.mul_f64(1.5) {
                self.missed = Some(at);
            }
            self.key = (received_heartbeats, received.to_owned());
            self.changed = at;
        }
        self.seen = at;
    }
}

/// A replica still hears from its primary: the IO thread is connected, it received an
/// event or a heartbeat within `window`, and it missed no heartbeat within `steady` —
/// a link that loses heartbeats (a flapping network around the primary) is no proof that
/// the primary is fine, only that it is sometimes reachable. `None` (no earlier round to
/// compare with) counts as hearing: the safe side.
pub fn is_receiving(f: &MemberFacts, progress: Option<&Progress>, window: Duration, now: Instant) -> bool {
    if !f.slave.as_ref().is_some_and(|s| s.io_running()) {
        return false;
    }
    let Some(p) = progress else {
        return true;
    };
    let steady = steady_window(f);
    now.saturating_duration_since(p.changed) <= window
        && p.missed.is_none_or(|m| now.saturating_duration_since(m) > steady)
}

/// How long without a heartbeat or an event means the primary is silent to a replica.
pub fn receive_window(f: &MemberFacts, interval: Duration) -> Duration {
    let hb = heartbeat(f);
    // Two heartbeats missed, and one of our rounds for the sampling.
    (hb * 2).max(interval * 2) + interval
}

/// How long a missed heartbeat keeps a replica's link suspect.
fn steady_window(f: &MemberFacts) -> Duration {
    (heartbeat(f) * 4).max(Duration::from_secs(2))
}

/// A replica's heartbeat period.
pub fn heartbeat(f: &MemberFacts) -> Duration {
    f.slave
        .as_ref()
        .map(|s| Duration::from_secs_f64(s.heartbeat_period_s.clamp(0.0, 3600.0)))
        .unwrap_or_default()
}

/// The replica to promote when `old` is gone: reachable and healthy, replicating from
/// `old` with its SQL thread running, not `no_promotion` (unless `allow_no_promotion`: a
/// switchover that names it); the most advanced by received position, then applied,
/// then the lowest priority, then the name. `Err` says why nobody qualifies.
pub fn elect(
    cluster: &ClusterConfig,
    facts: &Facts,
    health: &BTreeMap<String, HealthState>,
    old: Option<&str>,
    allow_no_promotion: bool,
) -> Result<String, String> {
    let mut why = Vec::new();
    let mut ok = Vec::new();
    for m in &cluster.members {
        if Some(m.name.as_str()) == old {
            continue;
        }
        let reason = match facts.get(&m.name) {
            None => Some("unreachable".to_owned()),
            Some(_) if m.no_promotion && !allow_no_promotion => Some("no_promotion".to_owned()),
            Some(_) if matches!(health.get(&m.name), Some(HealthState::Down)) => Some("down".to_owned()),
            Some(f) => match &f.slave {
                None => Some("not a replica".to_owned()),
                Some(_) if old.is_some() && f.replicates_from.as_deref() != old => Some(format!(
                    "replicates from {}",
                    f.replicates_from.as_deref().unwrap_or("an unknown server")
                )),
                // Stopped without an error (by hand, or by a dispatcher that died between
                // the two statements of `promote`): the catch-up starts it again. With an
                // error it would not apply what it received.
                Some(s) if !s.sql_running && !s.last_sql_error.is_empty() => {
                    Some(format!("SQL thread stopped: {}", s.last_sql_error))
                }
                Some(_) => None,
            },
        };
        match reason {
            Some(r) => why.push(format!("{}: {r}", m.name)),
            None => ok.push(m),
        }
    }
    ok.sort_by(|a, b| {
        let (fa, fb) = (&facts[&a.name], &facts[&b.name]);
        fb.received()
            .progress_cmp(&fa.received())
            .then_with(|| fb.applied().progress_cmp(&fa.applied()))
            .then_with(|| a.priority.cmp(&b.priority))
            .then_with(|| a.name.cmp(&b.name))
    });
    match ok.first() {
        Some(m) => Ok(m.name.clone()),
        None if why.is_empty() => Err("no other member".to_owned()),
        None => Err(format!("no electable replica ({})", why.join("; "))),
    }
}

/// The replicas of `old` that answered and received what `winner` did not: promoting
/// `winner` would throw that away, and with semi-sync it may be the only copy of an
/// acknowledged commit (the one replica that acked it may be `no_promotion`, down by its
/// monitor or have a broken SQL thread, so not electable). Each with its received position.
pub fn ahead_of(facts: &Facts, old: &str, winner: &str) -> Vec<(String, String)> {
    let Some(w) = facts.get(winner) else {
        return Vec::new();
    };
    let have = w.received();
    facts
        .iter()
        .filter(|(n, f)| {
            n.as_str() != winner && f.replicates_from.as_deref() == Some(old) && !have.covers(&f.received())
        })
        .map(|(n, f)| {
            let pos = f.slave.as_ref().map(|s| s.gtid_io_pos.clone()).unwrap_or_default();
            (n.clone(), pos)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::facts::SlaveFacts;
    use super::*;
    use crate::cluster::MemberConfig;

    fn member(name: &str, port: u16) -> MemberConfig {
        MemberConfig::new(name, "127.0.0.1", port)
    }

    fn cluster() -> ClusterConfig {
        let mut c: ClusterConfig =
            toml::from_str("name = \"c\"\nuser = \"u\"\n[[member]]\nname = \"a\"\nhost = \"127.0.0.1\"\nport = 1\n")
                .unwrap();
        c.members = vec![member("a", 1), member("b", 2), member("c", 3)];
        c
    }

    fn primary(pos: &str) -> MemberFacts {
        MemberFacts {
            read_only: false,
            server_id: 1,
            gtid_binlog_pos: pos.into(),
            gtid_binlog_state: pos.into(),
            gtid_slave_pos: String::new(),
            gtid_current_pos: pos.into(),
            semi_sync_master_enabled: true,
            semi_sync_master_on: true,
            semi_sync_master_clients: 2,
            slave: None,
            replicates_from: None,
            seen_at: Instant::now(),
        }
    }

    fn replica(of: &str, io: &str, received: &str, applied: &str) -> MemberFacts {
        MemberFacts {
            read_only: true,
            gtid_slave_pos: applied.into(),
            slave: Some(SlaveFacts {
                io_state: io.into(),
                sql_running: true,
                gtid_io_pos: received.into(),
                heartbeat_period_s: 0.5,
                ..Default::default()
            }),
            replicates_from: Some(of.into()),
            ..primary(applied)
        }
    }

    fn facts(rows: Vec<(&str, MemberFacts)>) -> Facts {
        rows.into_iter().map(|(n, f)| (n.to_owned(), f)).collect()
    }

    #[test]
    fn the_writable_member_the_replicas_follow_is_primary() {
        let f = facts(vec![
            ("a", primary("0-1-10")),
            ("b", replica("a", "Yes", "0-1-10", "0-1-10")),
            ("c", replica("a", "Yes", "0-1-9", "0-1-9")),
        ]);
        let d = derive(&f, None, &BTreeSet::new());
        assert_eq!(d.primary.as_deref(), Some("a"));
        assert!(d.extra_writers.is_empty() && d.strays.is_empty() && d.reopen.is_none());
    }

    #[test]
    fn two_writers_the_followed_one_wins_and_a_half_done_switch_is_repaired() {
        // b was promoted, c still points at the dead a, a came back writable.
        let f = facts(vec![
            ("a", primary("0-1-10")),
            ("b", primary("0-2-11")),
            ("c", replica("b", "Yes", "0-2-11", "0-2-11")),
        ]);
        let d = derive(&f, None, &BTreeSet::new());
        assert_eq!(d.primary.as_deref(), Some("b"));
        assert_eq!(d.extra_writers, vec!["a".to_owned()]);

        let f = facts(vec![
            ("b", primary("0-2-11")),
            ("c", replica("a", "Connecting", "0-1-10", "0-1-10")),
        ]);
        let d = derive(&f, None, &BTreeSet::new());
        assert_eq!(d.primary.as_deref(), Some("b"));
        assert_eq!(d.strays, vec!["c".to_owned()]);
    }

    #[test]
    fn a_replaced_member_never_wins_and_a_dead_primary_stays_primary() {
        let replaced: BTreeSet<String> = ["a".to_owned()].into();
        let f = facts(vec![
            ("a", primary("0-1-10")),
            ("b", replica("a", "Yes", "0-1-10", "0-1-10")),
        ]);
        let d = derive(&f, None, &replaced);
        assert_eq!(d.primary, None);
        assert_eq!(d.extra_writers, vec!["a".to_owned()]);

        let f = facts(vec![
            ("b", replica("a", "Connecting", "0-1-10", "0-1-10")),
            ("c", replica("a", "Connecting", "0-1-10", "0-1-10")),
        ]);
        let d = derive(&f, None, &BTreeSet::new());
        assert_eq!(d.primary.as_deref(), Some("a"));
        assert!(d.reopen.is_none());
        // A demoted (read-only) primary the replicas follow: a switchover stopped midway.
        let mut a = primary("0-1-10");
        a.read_only = true;
        let f = facts(vec![("a", a), ("b", replica("a", "Yes", "0-1-10", "0-1-10"))]);
        assert_eq!(derive(&f, None, &BTreeSet::new()).reopen.as_deref(), Some("a"));
    }

    #[test]
    fn elects_received_first_then_applied_then_priority_and_skips_no_promotion() {
        let mut c = cluster();
        let h = BTreeMap::new();
        let f = facts(vec![
            ("b", replica("a", "Connecting", "0-1-10", "0-1-8")),
            ("c", replica("a", "Connecting", "0-1-9", "0-1-9")),
        ]);
        assert_eq!(elect(&c, &f, &h, Some("a"), false).unwrap(), "b");
        let f = facts(vec![
            ("b", replica("a", "Connecting", "0-1-10", "0-1-8")),
            ("c", replica("a", "Connecting", "0-1-10", "0-1-9")),
        ]);
        assert_eq!(elect(&c, &f, &h, Some("a"), false).unwrap(), "c");
        let f = facts(vec![
            ("b", replica("a", "Connecting", "0-1-10", "0-1-10")),
            ("c", replica("a", "Connecting", "0-1-10", "0-1-10")),
        ]);
        c.members[1].priority = 5;
        assert_eq!(elect(&c, &f, &h, Some("a"), false).unwrap(), "c");
        c.members[2].no_promotion = true;
        assert_eq!(elect(&c, &f, &h, Some("a"), false).unwrap(), "b");
        assert_eq!(elect(&c, &f, &h, Some("a"), true).unwrap(), "c");
        let down: BTreeMap<String, HealthState> = [("b".to_owned(), HealthState::Down)].into();
        let err = elect(&c, &f, &down, Some("a"), false).unwrap_err();
        assert!(err.contains("b: down") && err.contains("c: no_promotion"), "{err}");
    }

    #[test]
    fn a_replica_that_alone_received_the_last_commits_blocks_a_lossy_election() {
        // c acked 0-1-11 (semi-sync waits for one replica) but may not be promoted.
        let mut c = cluster();
        c.members[2].no_promotion = true;
        let h = BTreeMap::new();
        let f = facts(vec![
            ("b", replica("a", "Connecting", "0-1-10", "0-1-10")),
            ("c", replica("a", "Connecting", "0-1-11", "0-1-11")),
        ]);
        let won = elect(&c, &f, &h, Some("a"), false).unwrap();
        assert_eq!(won, "b");
        assert_eq!(ahead_of(&f, "a", &won), vec![("c".to_owned(), "0-1-11".to_owned())]);
        // Once b has it too (or c is as far as b), nothing is lost.
        let f = facts(vec![
            ("b", replica("a", "Connecting", "0-1-11", "0-1-10")),
            ("c", replica("a", "Connecting", "0-1-11", "0-1-11")),
        ]);
        assert!(ahead_of(&f, "a", "b").is_empty());
    }

    #[test]
    fn a_replica_whose_sql_thread_was_stopped_without_error_stays_electable() {
        // A dispatcher died inside `promote`, after STOP SLAVE SQL_THREAD: b is the most
        // advanced and must still win, else its received commits are lost.
        let c = cluster();
        let h = BTreeMap::new();
        let mut b = replica("a", "Connecting", "0-1-11", "0-1-10");
        b.slave.as_mut().unwrap().sql_running = false;
        let f = facts(vec![
            ("b", b.clone()),
            ("c", replica("a", "Connecting", "0-1-10", "0-1-10")),
        ]);
        assert_eq!(elect(&c, &f, &h, Some("a"), false).unwrap(), "b");
        b.slave.as_mut().unwrap().last_sql_error = "Duplicate entry".into();
        let f = facts(vec![("b", b), ("c", replica("a", "Connecting", "0-1-10", "0-1-10"))]);
        assert_eq!(elect(&c, &f, &h, Some("a"), false).unwrap(), "c");
        assert_eq!(ahead_of(&f, "a", "c"), vec![("b".to_owned(), "0-1-11".to_owned())]);
    }

    #[test]
    fn receiving_needs_a_running_io_thread_and_recent_progress() {
        let r = replica("a", "Yes", "0-1-1", "0-1-1");
        let w = receive_window(&r, Duration::from_millis(100));
        assert_eq!(w, Duration::from_millis(1100));
        let t0 = Instant::now();
        let p = Progress::new(0, "0-1-1", t0);
        assert!(is_receiving(&r, None, w, t0));
        assert!(is_receiving(&r, Some(&p), w, t0 + Duration::from_millis(900)));
        assert!(!is_receiving(&r, Some(&p), w, t0 + Duration::from_millis(1500)));
        assert!(!is_receiving(&replica("a", "Connecting", "", ""), None, w, t0));
    }

    #[test]
    fn a_link_that_loses_heartbeats_is_not_receiving() {
        let ms = Duration::from_millis;
        let mut r = replica("a", "Yes", "0-1-1", "0-1-1");
        r.slave.as_mut().unwrap().heartbeat_period_s = 0.5;
        let w = receive_window(&r, ms(100));
        let t0 = Instant::now();
        // Every heartbeat, seen by rounds every 100 ms (some late ones): steady.
        let mut p = Progress::new(0, "0-1-1", t0);
        let mut hb = 0;
        for round in 1..=40u64 {
            let at = t0 + ms(round * 100 + if round % 7 == 0 { 50 } else { 0 });
            if round % 5 == 0 {
                hb += 1;
            }
            p.observe(hb, "0-1-1", ms(500), at);
            assert!(is_receiving(&r, Some(&p), w, at), "round {round}");
        }
        // One heartbeat lost (a gap of 1 s between two arrivals): suspect for the
        // steady window, although the link is "up" and heard from within `w`.
        let t1 = t0 + ms(4000);
        let mut lossy = Progress::new(0, "0-1-1", t1);
        for round in 1..=10u64 {
            lossy.observe(0, "0-1-1", ms(500), t1 + ms(round * 100));
        }
        lossy.observe(1, "0-1-1", ms(500), t1 + ms(1100));
        assert!(!is_receiving(&r, Some(&lossy), w, t1 + ms(1200)));
        // Steady again for longer than the steady window (2 s here): trusted again.
        let mut hb = 1;
        for k in 1..=6u64 {
            hb += 1;
            lossy.observe(hb, "0-1-1", ms(500), t1 + ms(1100 + k * 500));
        }
        assert!(is_receiving(&r, Some(&lossy), w, t1 + ms(4200)));
        // Without heartbeats configured there is nothing to miss.
        let mut quiet = Progress::new(0, "0-1-1", t1);
        quiet.observe(0, "0-1-2", Duration::ZERO, t1 + ms(3000));
        assert!(quiet.missed.is_none());
    }
}

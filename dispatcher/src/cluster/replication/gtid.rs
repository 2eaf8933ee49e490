//! MariaDB GTID positions (`domain-server-seq`, comma separated) and how they compare.
//!
//! A position names the last transaction per replication domain. With `gtid_strict_mode`
//! sequence numbers only grow within a domain, so "more advanced" is "a higher sequence in
//! every domain"; two positions where each is ahead in some domain are not comparable and are
//! ranked by their total.

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One GTID position or state, by domain (a state may hold several servers per domain).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gtid {
    /// domain -> server id -> sequence number.
    domains: BTreeMap<u32, BTreeMap<u32, u64>>,
}

impl Gtid {
    /// Parses `0-1-100,1-2-7`. Malformed entries are skipped: a position comes from the
    /// server and a garbled one must not stop the failover, only weigh less.
    pub fn parse(text: &str) -> Gtid {
        let mut g = Gtid::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.splitn(3, '-');
            let (Some(d), Some(s), Some(n)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let (Ok(d), Ok(s), Ok(n)) = (d.parse::<u32>(), s.parse::<u32>(), n.parse::<u64>()) else {
                continue;
            };
            let seq = g.domains.entry(d).or_default().entry(s).or_insert(0);
            *seq = (*seq).max(n);
        }
        g
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The highest sequence number per domain.
    fn seq(&self, domain: u32) -> Option<u64> {
        self.domains.get(&domain).and_then(|s| s.values().copied().max())
    }

    /// Per domain, the higher of the two (what a replica holds: received or applied).
    pub fn merge(&self, other: &Gtid) -> Gtid {
        let mut out = self.clone();
        for (d, servers) in &other.domains {
            for (s, n) in servers {
                let seq = out.domains.entry(*d).or_default().entry(*s).or_insert(0);
                *seq = (*seq).max(*n);
            }
        }
        out
    }

    /// Every domain of `other` is here with at least its sequence number.
    pub fn covers(&self, other: &Gtid) -> bool {
        other
            .domains
            .keys()
            .all(|d| self.seq(*d).unwrap_or(0) >= other.seq(*d).unwrap_or(0))
    }

    /// `self` (a server's `gtid_binlog_state`) holds the history that ends at `pos` (another
    /// server's `gtid_binlog_pos`): for each of its GTIDs `d-s-n`, the same domain and server
    /// with a sequence at least `n`. A member that committed transactions the new primary
    /// never got (same domain, its own server id, higher sequence) is not contained: it
    /// diverged and must not replicate from it.
    pub fn contains_history(&self, pos: &Gtid) -> bool {
        pos.domains.iter().all(|(d, servers)| {
            servers
                .iter()
                .all(|(s, n)| self.domains.get(d).and_then(|m| m.get(s)).is_some_and(|have| have >= n))
        })
    }

    /// Progress order for the election: dominance first, then the total.
    pub fn progress_cmp(&self, other: &Gtid) -> Ordering {
        match (self.covers(other), other.covers(self)) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => self.total().cmp(&other.total()),
        }
    }

    fn total(&self) -> u128 {
        self.domains.keys().map(|d| u128::from(self.seq(*d).unwrap_or(0))).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_domain_sequence() {
        let a = Gtid::parse("0-1-100");
        let b = Gtid::parse("0-1-99");
        assert_eq!(a.progress_cmp(&b), Ordering::Greater);
        assert_eq!(b.progress_cmp(&a), Ordering::Less);
        assert_eq!(a.progress_cmp(&Gtid::parse(" 0-1-100 ")), Ordering::Equal);
        assert_eq!(Gtid::parse("").progress_cmp(&a), Ordering::Less);
        // Incomparable: ranked by total.
        let c = Gtid::parse("0-1-10,1-2-50");
        let d = Gtid::parse("0-1-20,1-2-5");
        assert_eq!(c.progress_cmp(&d), Ordering::Greater);
        assert!(Gtid::parse("x,0-1,0-1-5").covers(&Gtid::parse("0-1-5")));
    }

    #[test]
    fn history_containment_sees_divergence() {
        let new_state = Gtid::parse("0-1-100,0-2-105");
        assert!(new_state.contains_history(&Gtid::parse("0-1-100")));
        assert!(new_state.contains_history(&Gtid::parse("0-1-90")));
        // The old primary committed 0-1-101 which the new one never received.
        assert!(!new_state.contains_history(&Gtid::parse("0-1-101")));
        assert!(!new_state.contains_history(&Gtid::parse("1-1-1")));
        assert!(new_state.contains_history(&Gtid::parse("")));
        assert!(Gtid::parse("0-1-5")
            .merge(&Gtid::parse("0-1-7,1-1-1"))
            .covers(&Gtid::parse("0-1-7,1-1-1")));
    }
}

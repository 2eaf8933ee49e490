//! The sliding-window accumulator: turns probe outcomes into a [`HealthState`].
//!
//! Failures are counted **within the window**, not in a row: a flapping path whose
//! failures never come `fail_threshold` in a row, but do come that often within
//! `window_ms`, must still mark the member down (the published design this comes from
//! failed exactly that scenario with "K in a row"). A member that is down comes back only
//! after `recover_successes` consecutive successful rounds.
//!
//! Pure code: the caller passes the time, so the tests drive it with made-up instants.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::cluster::config::HealthConfig;
use crate::cluster::view::HealthState;

/// Outcomes of the last `window_ms`, and the verdict drawn from them.
#[derive(Debug, Clone)]
pub struct Accumulator {
    interval: Duration,
    window: Duration,
    fail_threshold: u32,
    recover_successes: u32,
    /// (when, ok), oldest first.
    outcomes: VecDeque<(Instant, bool)>,
    state: HealthState,
    consecutive_successes: u32,
    last_passive: Option<Instant>,
    changed_at: Option<Instant>,
}

impl Accumulator {
    pub fn new(cfg: &HealthConfig) -> Accumulator {
        let mut acc = Accumulator {
            interval: Duration::ZERO,
            window: Duration::ZERO,
            fail_threshold: 1,
            recover_successes: 1,
            outcomes: VecDeque::new(),
            state: HealthState::Unknown,
            consecutive_successes: 0,
            last_passive: None,
            changed_at: None,
        };
        acc.set_config(cfg);
        acc
    }

    /// Applies new settings (SIGHUP) without forgetting the outcomes seen so far. The state
    /// is re-evaluated under the new settings at the next outcome, at most one interval away.
    pub fn set_config(&mut self, cfg: &HealthConfig) {
        // Validation rejects zeros; clamp anyway so that a bad value cannot make the
        // accumulator mark everything down or divide by zero.
        self.interval = Duration::from_millis(cfg.interval_ms.max(1));
        self.window = Duration::from_millis(cfg.window_ms.max(cfg.interval_ms).max(1));
        self.fail_threshold = cfg.fail_threshold.max(1);
        self.recover_successes = cfg.recover_successes.max(1);
        self.trim_to_capacity();
    }

    /// Records one probe round. Returns whether the state changed.
    pub fn record(&mut self, now: Instant, ok: bool) -> bool {
        if ok {
            self.consecutive_successes = self.consecutive_successes.saturating_add(1);
        } else {
            self.consecutive_successes = 0;
        }
        self.push(now, ok);
        self.evaluate(now)
    }

    /// Records a failure seen by a worker (failed connect, lost session). Counts at most once
    /// per interval, however many workers saw it: a pool of a hundred workers losing their
    /// sessions together is one piece of evidence, not a hundred. Returns whether the state
    /// changed; a failure ignored by the rate limit changes nothing.
    pub fn record_passive_failure(&mut self, now: Instant) -> bool {
        if !self.passive_due(now) {
            return false;
        }
        self.last_passive = Some(now);
        self.consecutive_successes = 0;
        self.push(now, false);
        self.evaluate(now)
    }

    /// Whether a passive failure at `now` would count (none counted within the interval).
    pub fn passive_due(&self, now: Instant) -> bool {
        self.last_passive
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval)
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    /// When the state last changed (`None`: still `Unknown`).
    pub fn changed_at(&self) -> Option<Instant> {
        self.changed_at
    }

    /// Failures (rounds and passive) younger than the window at `now`.
    pub fn failures_in_window(&self, now: Instant) -> u32 {
        self.outcomes
            .iter()
            .filter(|(t, ok)| !ok && self.in_window(*t, now))
            .count() as u32
    }

    /// Successful rounds since the last failure.
    pub fn consecutive_successes(&self) -> u32 {
        self.consecutive_successes
    }

    pub fn fail_threshold(&self) -> u32 {
        self.fail_threshold
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// Outcomes held now (for the bound's tests).
    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    /// At most one round and one passive failure per interval fit in the window, plus one
    /// of each at the edges; anything beyond that would be outcomes recorded faster than
    /// the schedule allows, and the oldest go first.
    fn capacity(&self) -> usize {
        let per_window = (self.window.as_millis() / self.interval.as_millis().max(1)) as usize;
        2 * (per_window + 2)
    }

    fn in_window(&self, t: Instant, now: Instant) -> bool {
        now.saturating_duration_since(t) < self.window
    }

    fn push(&mut self, now: Instant, ok: bool) {
        self.outcomes.push_back((now, ok));
        self.trim_to_capacity();
    }

    fn trim_to_capacity(&mut self) {
        let cap = self.capacity();
        while self.outcomes.len() > cap {
            self.outcomes.pop_front();
        }
    }

    fn evict(&mut self, now: Instant) {
        while let Some(&(t, _)) = self.outcomes.front() {
            if self.in_window(t, now) {
                break;
            }
            self.outcomes.pop_front();
        }
    }

    fn evaluate(&mut self, now: Instant) -> bool {
        self.evict(now);
        let failures = self.failures_in_window(now);
        let next = match self.state {
            HealthState::Down if self.consecutive_successes >= self.recover_successes => {
                // The failures that brought it down may still be inside the window; they
                // are history now, or the very next round would mark it down again.
                self.outcomes.retain(|&(_, ok)| ok);
                HealthState::Up
            }
            HealthState::Down => HealthState::Down,
            _ if failures >= self.fail_threshold => HealthState::Down,
            _ if failures > 0 => HealthState::Suspect,
            _ => HealthState::Up,
        };
        if next == self.state {
            return false;
        }
        self.state = next;
        self.changed_at = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(interval_ms: u64, window_ms: u64, fail_threshold: u32, recover_successes: u32) -> HealthConfig {
        HealthConfig {
            interval_ms,
            window_ms,
            fail_threshold,
            recover_successes,
            ..HealthConfig::default()
        }
    }

    /// Feeds one outcome per interval from `start`; returns the time of the last one and
    /// the states after each.
    fn feed(acc: &mut Accumulator, start: Instant, interval_ms: u64, pattern: &[bool]) -> (Instant, Vec<HealthState>) {
        let mut states = Vec::new();
        let mut t = start;
        for (i, &ok) in pattern.iter().enumerate() {
            t = start + Duration::from_millis(interval_ms * i as u64);
            acc.record(t, ok);
            states.push(acc.state());
        }
        (t, states)
    }

    #[test]
    fn starts_unknown_and_a_success_makes_it_up() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 3, 2));
        assert_eq!(acc.state(), HealthState::Unknown);
        assert_eq!(acc.changed_at(), None);
        let t = Instant::now();
        assert!(acc.record(t, true));
        assert_eq!(acc.state(), HealthState::Up);
        assert_eq!(acc.changed_at(), Some(t));
        assert!(!acc.record(t + Duration::from_millis(100), true));
        assert_eq!(acc.consecutive_successes(), 2);
    }

    #[test]
    fn k_failures_in_a_row_mark_it_down() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 3, 2));
        let (_, states) = feed(&mut acc, Instant::now(), 100, &[true, false, false, false]);
        use HealthState::*;
        assert_eq!(states, vec![Up, Suspect, Suspect, Down]);
    }

    #[test]
    fn flapping_never_k_in_a_row_but_k_in_the_window_marks_it_down() {
        // pass/fail alternating: never 2 failures in a row, 3 failures within 600 ms.
        let mut acc = Accumulator::new(&cfg(100, 1000, 3, 3));
        let t0 = Instant::now();
        let (t, states) = feed(&mut acc, t0, 100, &[true, false, true, false, true, false]);
        use HealthState::*;
        assert_eq!(states, vec![Up, Suspect, Suspect, Suspect, Suspect, Down]);
        assert_eq!(acc.failures_in_window(t), 3);
        // And it stays down while the flapping goes on: a success in between is not
        // `recover_successes` successes in a row.
        let (_, states) = feed(
            &mut acc,
            t + Duration::from_millis(100),
            100,
            &[true, false, true, true, false],
        );
        assert!(states.iter().all(|s| *s == Down), "{states:?}");
    }

    #[test]
    fn a_short_blip_below_the_threshold_does_not_mark_it_down() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 3, 3));
        let t0 = Instant::now();
        let mut pattern = vec![true; 5];
        pattern.extend([false, false]); // a 200 ms blip
        pattern.extend(vec![true; 20]);
        let (t, states) = feed(&mut acc, t0, 100, &pattern);
        assert!(!states.contains(&HealthState::Down), "{states:?}");
        assert!(states.contains(&HealthState::Suspect));
        // Once the blip has left the window, the member is plainly up again.
        assert_eq!(acc.state(), HealthState::Up);
        assert_eq!(acc.failures_in_window(t), 0);
    }

    #[test]
    fn failures_spread_wider_than_the_window_never_mark_it_down() {
        // One failure every 500 ms, window 1000 ms: at most 2 in the window, threshold 3.
        let mut acc = Accumulator::new(&cfg(100, 1000, 3, 3));
        let t0 = Instant::now();
        let pattern: Vec<bool> = (0..60).map(|i| i % 5 != 0).collect();
        let (_, states) = feed(&mut acc, t0, 100, &pattern);
        assert!(!states.contains(&HealthState::Down), "{states:?}");
    }

    #[test]
    fn window_eviction_counts_only_young_failures() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 5, 3));
        let t0 = Instant::now();
        acc.record(t0, false);
        acc.record(t0 + Duration::from_millis(100), false);
        assert_eq!(acc.failures_in_window(t0 + Duration::from_millis(999)), 2);
        assert_eq!(acc.failures_in_window(t0 + Duration::from_millis(1000)), 1);
        assert_eq!(acc.failures_in_window(t0 + Duration::from_millis(1100)), 0);
        // Recording evicts for real.
        acc.record(t0 + Duration::from_millis(1100), true);
        assert_eq!(acc.len(), 1);
        assert_eq!(acc.state(), HealthState::Up);
    }

    #[test]
    fn storage_stays_bounded() {
        let c = cfg(100, 1000, 3, 3);
        let mut acc = Accumulator::new(&c);
        let t0 = Instant::now();
        for i in 0..10_000u64 {
            acc.record(t0 + Duration::from_millis(100 * i), i % 2 == 0);
            acc.record_passive_failure(t0 + Duration::from_millis(100 * i + 50));
            assert!(acc.len() <= 2 * (10 + 2));
        }
        // Recorded far faster than the schedule (a bug elsewhere): still bounded.
        for i in 0..10_000u64 {
            acc.record(t0 + Duration::from_secs(2000) + Duration::from_micros(i), true);
        }
        assert!(acc.len() <= 2 * (10 + 2));
    }

    #[test]
    fn down_recovers_after_consecutive_successes_only() {
        let mut acc = Accumulator::new(&cfg(100, 3000, 3, 3));
        let t0 = Instant::now();
        let (t, _) = feed(&mut acc, t0, 100, &[false, false, false]);
        assert_eq!(acc.state(), HealthState::Down);
        let since = acc.changed_at();
        // Two successes, a failure, two successes: not 3 in a row.
        let (t, states) = feed(
            &mut acc,
            t + Duration::from_millis(100),
            100,
            &[true, true, false, true, true],
        );
        assert!(states.iter().all(|s| *s == HealthState::Down), "{states:?}");
        assert_eq!(acc.changed_at(), since);
        assert_eq!(acc.consecutive_successes(), 2);
        // The third success in a row brings it back, although the failures are still
        // inside the 3 s window.
        assert!(acc.record(t + Duration::from_millis(100), true));
        assert_eq!(acc.state(), HealthState::Up);
        assert_eq!(acc.failures_in_window(t + Duration::from_millis(100)), 0);
        // And the old failures do not bring it straight down again.
        let (_, states) = feed(&mut acc, t + Duration::from_millis(200), 100, &[false, true, true]);
        assert_eq!(
            states,
            vec![HealthState::Suspect, HealthState::Suspect, HealthState::Suspect]
        );
    }

    #[test]
    fn a_failure_right_after_recovery_starts_counting_afresh() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 2, 1));
        let t0 = Instant::now();
        feed(&mut acc, t0, 100, &[false, false]);
        assert_eq!(acc.state(), HealthState::Down);
        acc.record(t0 + Duration::from_millis(200), true);
        assert_eq!(acc.state(), HealthState::Up);
        acc.record(t0 + Duration::from_millis(300), false);
        assert_eq!(acc.state(), HealthState::Suspect);
        acc.record(t0 + Duration::from_millis(400), false);
        assert_eq!(acc.state(), HealthState::Down);
    }

    #[test]
    fn passive_failures_count_at_most_once_per_interval() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 3, 3));
        let t0 = Instant::now();
        acc.record(t0, true);
        // A hundred workers losing their sessions at once.
        for i in 0..100 {
            acc.record_passive_failure(t0 + Duration::from_micros(i));
        }
        assert_eq!(acc.failures_in_window(t0 + Duration::from_millis(1)), 1);
        assert_eq!(acc.state(), HealthState::Suspect);
        assert_eq!(acc.consecutive_successes(), 0);
        // 99 ms later: still the same interval.
        assert!(!acc.passive_due(t0 + Duration::from_millis(99)));
        assert!(!acc.record_passive_failure(t0 + Duration::from_millis(99)));
        assert_eq!(acc.failures_in_window(t0 + Duration::from_millis(99)), 1);
        // One interval later: counts again.
        assert!(acc.passive_due(t0 + Duration::from_millis(100)));
        acc.record_passive_failure(t0 + Duration::from_millis(100));
        assert_eq!(acc.failures_in_window(t0 + Duration::from_millis(100)), 2);
        // Passive and active failures add up within the window.
        assert!(acc.record(t0 + Duration::from_millis(150), false));
        assert_eq!(acc.state(), HealthState::Down);
    }

    #[test]
    fn passive_failure_breaks_a_recovery_streak() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 1, 3));
        let t0 = Instant::now();
        acc.record(t0, false);
        assert_eq!(acc.state(), HealthState::Down);
        acc.record(t0 + Duration::from_millis(100), true);
        acc.record(t0 + Duration::from_millis(200), true);
        acc.record_passive_failure(t0 + Duration::from_millis(250));
        acc.record(t0 + Duration::from_millis(300), true);
        assert_eq!(acc.state(), HealthState::Down);
        assert_eq!(acc.consecutive_successes(), 1);
    }

    #[test]
    fn config_change_applies_to_the_next_outcome() {
        let mut acc = Accumulator::new(&cfg(100, 1000, 5, 3));
        let t0 = Instant::now();
        let (t, _) = feed(&mut acc, t0, 100, &[false, false, false]);
        assert_eq!(acc.state(), HealthState::Suspect);
        // Lower threshold: the failures already seen count against it.
        acc.set_config(&cfg(100, 1000, 3, 3));
        assert_eq!(acc.fail_threshold(), 3);
        acc.record(t + Duration::from_millis(100), true);
        assert_eq!(acc.state(), HealthState::Down);
        // Fewer recovery rounds needed after a SIGHUP.
        acc.set_config(&cfg(100, 1000, 3, 1));
        acc.record(t + Duration::from_millis(200), true);
        assert_eq!(acc.state(), HealthState::Up);
    }

    #[test]
    fn shrinking_the_window_drops_old_failures() {
        let mut acc = Accumulator::new(&cfg(100, 5000, 4, 3));
        let t0 = Instant::now();
        let (t, _) = feed(&mut acc, t0, 100, &[false, true, true, true, true, true, false, false]);
        assert_eq!(acc.state(), HealthState::Suspect);
        assert_eq!(acc.failures_in_window(t), 3);
        acc.set_config(&cfg(100, 500, 4, 3));
        assert_eq!(acc.window(), Duration::from_millis(500));
        assert_eq!(acc.failures_in_window(t), 2);
        // The capacity shrank with the window.
        assert!(acc.len() <= 2 * (5 + 2));
        acc.record(t + Duration::from_millis(100), false);
        assert_eq!(acc.state(), HealthState::Suspect);
    }

    #[test]
    fn threshold_one_goes_down_on_the_first_failure() {
        let mut acc = Accumulator::new(&cfg(100, 100, 1, 1));
        let t0 = Instant::now();
        assert!(acc.record(t0, false));
        assert_eq!(acc.state(), HealthState::Down);
        assert!(acc.record(t0 + Duration::from_millis(100), true));
        assert_eq!(acc.state(), HealthState::Up);
    }
}

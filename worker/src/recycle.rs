//! Recycling policy: a worker retires after `max_requests` requests or `max_age`.

use std::time::Duration;

use tokio::time::Instant;

/// Counts requests and age; says when (and why) to ask for retirement, once.
#[derive(Debug)]
pub struct Recycler {
    max_requests: u64,
    max_age: Option<Duration>,
    started: Instant,
    served: u64,
    asked: bool,
}

impl Recycler {
    /// `max_requests` and `max_age_ms` of 0 mean "never".
    pub fn new(max_requests: u64, max_age_ms: u64, started: Instant) -> Recycler {
        let max_age = (max_age_ms > 0).then(|| Duration::from_millis(max_age_ms));
        Recycler {
            max_requests,
            max_age,
            started,
            served: 0,
            asked: false,
        }
    }

    /// One more request has ended.
    pub fn served_one(&mut self) {
        self.served += 1;
    }

    pub fn served(&self) -> u64 {
        self.served
    }

    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// Requests this worker may still serve before `max_requests` (`None`: no limit), at
    /// least 1: a pipeline goes no further, so that the worker asks to retire on time.
    pub fn remaining(&self) -> Option<u64> {
        (self.max_requests > 0).then(|| self.max_requests.saturating_sub(self.served).max(1))
    }

    /// The reason to retire now (`"max_requests"` or `"max_age"`), if one applies and
    /// `QUIT_REQUEST` was not sent yet.
    pub fn due(&self, now: Instant) -> Option<&'static str> {
        if self.asked {
            return None;
        }
        if self.max_requests > 0 && self.served >= self.max_requests {
            return Some("max_requests");
        }
        match self.max_age {
            Some(max) if self.age(now) >= max => Some("max_age"),
            _ => None,
        }
    }

    /// When an idle worker must look again (the age limit), unless already asked.
    pub fn deadline(&self) -> Option<Instant> {
        if self.asked {
            return None;
        }
        self.max_age.map(|a| self.started + a)
    }

    /// Whether `QUIT_REQUEST` was sent already.
    pub fn asked(&self) -> bool {
        self.asked
    }

    /// `QUIT_REQUEST` has been sent; never ask again.
    pub fn mark_asked(&mut self) {
        self.asked = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_when_zero() {
        let t0 = Instant::now();
        let mut r = Recycler::new(0, 0, t0);
        for _ in 0..1000 {
            r.served_one();
        }
        assert_eq!(r.due(t0 + Duration::from_secs(1_000_000)), None);
        assert_eq!(r.deadline(), None);
    }

    #[test]
    fn by_count_then_once() {
        let t0 = Instant::now();
        let mut r = Recycler::new(2, 0, t0);
        r.served_one();
        assert_eq!(r.due(t0), None);
        r.served_one();
        assert_eq!(r.due(t0), Some("max_requests"));
        r.mark_asked();
        r.served_one();
        assert_eq!(r.due(t0), None);
    }

    #[test]
    fn by_age() {
        let t0 = Instant::now();
        let r = Recycler::new(0, 500, t0);
        assert_eq!(r.due(t0 + Duration::from_millis(499)), None);
        assert_eq!(r.due(t0 + Duration::from_millis(500)), Some("max_age"));
        assert_eq!(r.deadline(), Some(t0 + Duration::from_millis(500)));
    }
}

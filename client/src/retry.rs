//! Retry policy: which failures the SDK retries on its own, and the back-off.

use std::time::Duration;

use osprey_protocol::ErrorCode;
use rand::Rng;

use crate::error::Error;

/// Whether a server `ERROR` is retried automatically: only when it provably did not
/// reach a database and the condition is one a new attempt can clear.
/// `QUEUE_FULL` and `QUEUE_TIMEOUT` are returned to the caller (load shedding).
pub fn is_auto_retryable(err: &Error) -> bool {
    !err.dispatched()
        && matches!(
            err.code(),
            ErrorCode::ShuttingDown | ErrorCode::WorkerLost | ErrorCode::BackendUnavailable
        )
}

/// Exponential back-off with jitter: attempt `n` (0-based) waits a random time in
/// `[d/2, d]` where `d = min(min * 2^n, max)`.
pub fn backoff(attempt: u32, min: Duration, max: Duration) -> Duration {
    let min = min.max(Duration::from_millis(1));
    let max = max.max(min);
    let d = min.saturating_mul(1u32 << attempt.min(20)).min(max);
    let half = d / 2;
    let jitter = rand::rng().random_range(0..=half.as_micros() as u64);
    half + Duration::from_micros(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let (min, max) = (Duration::from_millis(50), Duration::from_secs(5));
        for n in 0..30 {
            let d = backoff(n, min, max);
            let cap = min.saturating_mul(1 << n.min(20)).min(max);
            assert!(d >= cap / 2 && d <= cap, "attempt {n}: {d:?} vs cap {cap:?}");
        }
    }

    #[test]
    fn retry_only_undispatched_transient() {
        let mk = |code, dispatched| {
            let mut b = osprey_protocol::ErrorBody::undispatched(osprey_protocol::Origin::Dispatcher, code, "x");
            b.dispatched = dispatched;
            Error::from_body(b)
        };
        assert!(is_auto_retryable(&mk(ErrorCode::WorkerLost, false)));
        assert!(is_auto_retryable(&mk(ErrorCode::ShuttingDown, false)));
        assert!(is_auto_retryable(&mk(ErrorCode::BackendUnavailable, false)));
        assert!(!is_auto_retryable(&mk(ErrorCode::WorkerLost, true)));
        assert!(!is_auto_retryable(&mk(ErrorCode::QueueFull, false)));
        assert!(!is_auto_retryable(&mk(ErrorCode::QueueTimeout, false)));
    }
}

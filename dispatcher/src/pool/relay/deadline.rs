//! A cancelled statement that outlives `cancel_grace_ms`: its stream is answered and
//! the worker drains it, bounded.

use std::time::Duration;

use osprey_protocol::{ErrorBody, ErrorCode, Origin};
use tokio::time::Instant as TokioInstant;
use tracing::warn;

use super::*;

impl Relay {
    pub(super) fn grace(&self) -> Duration {
        self.env.bounds.cancel_grace
    }

    /// `cancel_grace_ms` passed since the CANCEL and the statement still runs: the client's
    /// stream ends now, the worker drains (see [`Draining`]), probed by a PING at once.
    pub(super) async fn overrun(&mut self, cur: Current) -> Result<Draining, LinkError> {
        let env = &self.env;
        let (conn, stream) = (cur.guard.shared().id, cur.guard.stream());
        env.metrics.cancel_overruns.inc();
        env.metrics.latency.observe(cur.received.elapsed().as_secs_f64());
        env.metrics
            .outcome(if cur.stalled { "slow_consumer" } else { "cancelled" });
        warn!(
            slot = self.slot,
            conn,
            stream,
            "statement still running cancel_grace_ms after CANCEL; stream answered, worker kept busy until it ends"
        );
        let body = ErrorBody {
            dispatched: true,
            ..ErrorBody::undispatched(
                Origin::Dispatcher,
                ErrorCode::Cancelled,
                "cancelled; the statement had not stopped within cancel_grace_ms",
            )
        };
        // Spawned, as on every path that answers without the worker: a client with a full
        // queue must not hold up the worker's link.
        tokio::spawn(cur.guard.fail(body));
        // The CANCEL went out one grace ago; the bound counts from it.
        let hard = cur.limit.min(later(
            TokioInstant::now(),
            self.grace().saturating_mul(CANCEL_HARD_GRACES - 1),
        ));
        self.ping().await?;
        // Nothing more may wait behind a statement that does not stop.
        self.reclaim_all().await?;
        Ok(Draining {
            wstream: cur.wstream,
            conn,
            stream,
            answered: TokioInstant::now(),
            hard,
            probed: TokioInstant::now(),
            fatal: cur.fatal,
        })
    }
}

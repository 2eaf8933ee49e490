//! Stage 5: the token bucket of the member the group targets now. A token at hand (or no
//! limit) costs nothing more; a request that must wait for one waits in its own task, so
//! that its connection's other streams keep being read.

use std::sync::Arc;

use osprey_protocol::ErrorCode;
use tracing::{debug, Instrument};

use crate::admit::{submit, Refusal};
use crate::ctx::Ctx;
use crate::pool::SlotGroup;
use crate::request::job::Job;

/// Submits `job` to `group` now, or once its member's throttle gives a token.
pub async fn then_submit(ctx: &Arc<Ctx>, group: &Arc<SlotGroup>, job: Job) {
    if ctx.policy.throttle.any_limit() {
        if let Some(member) = group.target_member() {
            let key = Ctx::throttle_key(group.cluster(), &member);
            if !ctx.policy.throttle.try_acquire(&key) {
                tokio::spawn(after_token(ctx.clone(), group.clone(), job, key).in_current_span());
                return;
            }
        }
    }
    submit::submit(ctx, group, job).await;
}

/// Waits for `key`'s throttle token, then submits. The stream's guard answers on every
/// path: CANCEL or the connection closing (its token is cancelled) while waiting, or
/// THROTTLED (queue full at once, or no token within `throttle.wait_ms`).
async fn after_token(ctx: Arc<Ctx>, group: Arc<SlotGroup>, job: Job, key: String) {
    let cancel = job.cancel.clone();
    let got = tokio::select! {
        r = ctx.policy.acquire(&key) => r,
        _ = cancel.cancelled() => {
            job.fail(&ctx.metrics, "cancelled", ErrorCode::Cancelled, "cancelled while waiting for a throttle token")
                .await;
            return;
        }
    };
    match got {
        Ok(()) => submit::submit(&ctx, &group, job).await,
        Err(throttled) => {
            debug!(member = %key, "throttled: {throttled}");
            let refusal = Refusal::from(throttled);
            ctx.metrics.outcome(refusal.outcome);
            job.guard.fail(refusal.body()).await;
        }
    }
}

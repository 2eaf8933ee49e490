//! Stage 6: the job goes to its slot group (an idle worker, or the group's wait queue).

use std::sync::Arc;

use osprey_protocol::ErrorCode;

use crate::admit::Refusal;
use crate::ctx::Ctx;
use crate::pool::{SlotGroup, SubmitError};
use crate::request::job::Job;

/// Hands the job to the group; a refusal answers the stream. A read group that stopped
/// serving between the routing and now passes the job to its fallback.
pub async fn submit(ctx: &Arc<Ctx>, group: &Arc<SlotGroup>, job: Job) {
    let mut result = group.submit(job);
    let mut group = group.clone();
    while let Err((job, SubmitError::Unavailable)) = result {
        let Some(fallback) = group.fallback() else {
            result = Err((job, SubmitError::Unavailable));
            break;
        };
        if let Some(reads) = ctx.cluster(Some(group.cluster())).and_then(|c| c.reads.as_ref()) {
            reads.fallen_back("replica_lost");
        }
        result = fallback.submit(job);
        group = fallback;
    }
    if let Err((job, e)) = result {
        let refusal = refusal(&group, e);
        ctx.metrics.outcome(refusal.outcome);
        job.guard.fail(refusal.body()).await;
    }
}

/// What the group's refusal tells the client.
fn refusal(group: &SlotGroup, e: SubmitError) -> Refusal {
    match e {
        SubmitError::QueueFull => Refusal::new(
            "queue_full",
            ErrorCode::QueueFull,
            "all workers busy and the wait queue is full",
        ),
        SubmitError::ConnectionQueueFull => Refusal::new(
            "queue_full",
            ErrorCode::QueueFull,
            "this connection's requests waiting for a worker fill pool.queue_bytes_per_connection",
        ),
        SubmitError::ShuttingDown => Refusal::new(
            "shutting_down",
            ErrorCode::ShuttingDown,
            "the dispatcher is shutting down",
        ),
        SubmitError::Cancelled => Refusal::new("cancelled", ErrorCode::Cancelled, "cancelled"),
        SubmitError::Unavailable => {
            let why = group.unavailable_reason().unwrap_or_default();
            Refusal::new(
                "unavailable",
                ErrorCode::BackendUnavailable,
                format!("cluster {}: no member can serve: {why}", group.cluster()),
            )
        }
    }
}

//! Stage 3: which slot group a REQUEST goes to: the cluster's write group, or (read/write
//! split) a replica's read group. The rules are in docs/ROUTING.md.

use std::sync::Arc;

use osprey_protocol::{ErrorCode, Request};
use osprey_sql::classify::{classify, Hint, Route};

use crate::admit::Refusal;
use crate::cluster::reads::{ReadChoice, Reads};
use crate::cluster::ClusterRuntime;
use crate::pool::SlotGroup;

/// The group for `request` on `cluster`, whose write group is `write`; refused: a read
/// with no replica to serve it under `read_fallback = "error"`.
pub fn route(
    write: &Arc<SlotGroup>,
    cluster: Option<&ClusterRuntime>,
    request: &Request,
) -> Result<Arc<SlotGroup>, Refusal> {
    let Some(reads) = cluster.and_then(|c| c.reads.as_ref()) else {
        return Ok(write.clone());
    };
    // A batch is a transaction: the primary, whatever its statements are.
    if request.force_primary || !request.batch.is_empty() {
        reads.decided(
            false,
            if request.force_primary {
                "force_primary"
            } else {
                "batch"
            },
        );
        return Ok(write.clone());
    }
    let decision = classify(&request.sql);
    let (read, why) = match decision.hint {
        // The comment hints stand in for the flags; asking for the primary always wins.
        Some(Hint::Primary) => (false, decision.why),
        Some(Hint::Replica) => (true, decision.why),
        None if request.read_only && decision.route == Route::Primary => (true, "read_only"),
        None => (decision.route == Route::Replica, decision.why),
    };
    reads.decided(read, why);
    if !read {
        return Ok(write.clone());
    }
    replica(write, reads, request)
}

/// The group whose worker a session opened by `request` pins: a read-only session
/// (`read_only`) a replica's read group when one is fresh enough (`causal_gtid`), like a
/// read; everything else the write group (a transaction that may write belongs on the
/// primary).
pub fn session(
    write: &Arc<SlotGroup>,
    cluster: Option<&ClusterRuntime>,
    request: &Request,
) -> Result<Arc<SlotGroup>, Refusal> {
    let Some(reads) = cluster.and_then(|c| c.reads.as_ref()) else {
        return Ok(write.clone());
    };
    if !request.read_only || request.force_primary {
        return Ok(write.clone());
    }
    reads.decided(true, "read_only_session");
    replica(write, reads, request)
}

/// A replica's read group for a read that may go to one (fresh enough for its
/// `causal_gtid`), else the write group; refused: none, under `read_fallback = "error"`.
fn replica(write: &Arc<SlotGroup>, reads: &Reads, request: &Request) -> Result<Arc<SlotGroup>, Refusal> {
    match reads.pick(request.causal_gtid.as_deref()) {
        ReadChoice::Replica(pool) => Ok(pool),
        ReadChoice::Primary(_) => Ok(write.clone()),
        ReadChoice::Refuse(why) => Err(Refusal::new("unavailable", ErrorCode::BackendUnavailable, why)),
    }
}

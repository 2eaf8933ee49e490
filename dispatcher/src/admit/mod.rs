//! Admission: the way of every statement from a front end to a slot group, as explicit
//! stages, each answering "next" or one [`Refusal`]:
//!
//! ```text
//! decode (decode.rs) -> intercept (intercept.rs) -> route (route.rs)
//!        -> reserve (reserve.rs) -> throttle (throttle.rs) -> submit (submit.rs)
//! ```
//!
//! A front end calls [`admit`] (or, with a request it built itself, [`admit_built`])
//! and nothing else. A refusal before the stream is open is
//! answered on its id (ERROR + END); from `reserve` on, the stream's guard answers it, so
//! the closed loop holds whatever stage says no. Interception runs before routing (a
//! blocked statement costs no routing decision and counts in no read-split figure).

pub mod decode;
pub mod intercept;
pub mod refusal;
pub mod reserve;
pub mod route;
pub mod session;
pub mod submit;
pub mod throttle;

use std::sync::Arc;
use std::time::Duration;

use osprey_protocol::{ErrorBody, Frame, Request};
use tracing::debug;

pub use refusal::Refusal;

use crate::ctx::Ctx;
use crate::request::job::Job;
use crate::request::streams::ClientShared;

/// Admits the REQUEST in `frame` from the client connection `shared`: every stage in
/// order, then the job is on its way to a worker (or refused, its stream answered). `Err`:
/// the peer is broken (an undecodable body, a duplicate stream id): the connection closes
/// with that error.
pub async fn admit(
    ctx: &Arc<Ctx>,
    shared: &Arc<ClientShared>,
    sessions: &session::Sessions,
    frame: Frame,
    draining: bool,
) -> Result<(), ErrorBody> {
    let stream = frame.stream;
    not_open(shared, stream)?;
    let request = match decode::decode(&frame, ctx.config.limits.max_payload)? {
        Ok(r) => r,
        Err(refusal) => return refuse(ctx, shared, stream, refusal).await,
    };
    admit_decoded(ctx, shared, sessions, frame, request, draining).await
}

/// [`admit`] for a request a front end built in process (the MySQL front end): the
/// REQUEST frame is encoded here from `request`, so the body the stages check and the
/// one a worker gets cannot differ, and it is not decoded back: the decode stage's size
/// and consistency checks run on the request as built.
pub async fn admit_built(
    ctx: &Arc<Ctx>,
    shared: &Arc<ClientShared>,
    sessions: &session::Sessions,
    stream: u32,
    request: Request,
    draining: bool,
) -> Result<(), ErrorBody> {
    not_open(shared, stream)?;
    let frame = request.to_frame(stream);
    if let Err(refusal) = decode::check_built(&frame, &request, ctx.config.limits.max_payload) {
        return refuse(ctx, shared, stream, refusal).await;
    }
    // What a decode would have given back (the encoders and decoders agree: their tests),
    // compared as encoded (a NaN parameter is not equal to itself).
    debug_assert_eq!(
        Request::from_frame(&frame).ok().map(|r| r.to_frame(stream).payload),
        Some(frame.payload.clone())
    );
    admit_decoded(ctx, shared, sessions, frame, request, draining).await
}

/// Checked before anything is answered on `stream`: an answer to a duplicate would land
/// on the stream that is still open, so a duplicate id closes the connection.
fn not_open(shared: &ClientShared, stream: u32) -> Result<(), ErrorBody> {
    if shared.is_open(stream) {
        return Err(reserve::duplicate(stream));
    }
    Ok(())
}

/// The stages after decoding.
async fn admit_decoded(
    ctx: &Arc<Ctx>,
    shared: &Arc<ClientShared>,
    sessions: &session::Sessions,
    frame: Frame,
    request: Request,
    draining: bool,
) -> Result<(), ErrorBody> {
    let stream = frame.stream;
    if let Some(id) = request.session {
        return session::statement(ctx, shared, sessions, frame, request, id).await;
    }
    if request.open_session {
        return session::open(ctx, shared, sessions, frame, request, draining).await;
    }
    let write = match decode::cluster_group(ctx, &request) {
        Ok(g) => g,
        Err(refusal) => return refuse(ctx, shared, stream, refusal).await,
    };
    let digest = match intercept::check(ctx, &request) {
        Ok(d) => d,
        Err(refusal) => {
            debug!(stream, "statement blocked: {}", refusal.message);
            return refuse(ctx, shared, stream, refusal).await;
        }
    };
    let cluster = ctx.cluster(request.cluster.as_deref());
    let group = match route::route(write, cluster.map(|c| &**c), &request) {
        Ok(g) => g,
        Err(refusal) => return refuse(ctx, shared, stream, refusal).await,
    };
    let Some((guard, cancel)) = reserve::stream(ctx, shared, stream, frame.payload.len(), draining).await? else {
        return Ok(());
    };
    let timeout = (request.timeout_ms > 0).then(|| Duration::from_millis(request.timeout_ms));
    let job = Job {
        multi_results: request.multi_results,
        raw_rows: request.raw_rows,
        ..Job::new(guard, cancel, frame, timeout, ctx.queue_timeout(), digest)
    };
    throttle::then_submit(ctx, &group, job).await;
    Ok(())
}

/// Answers a REQUEST refused before its stream opened (ERROR + END on its id).
pub(crate) async fn refuse(ctx: &Ctx, shared: &ClientShared, stream: u32, refusal: Refusal) -> Result<(), ErrorBody> {
    ctx.metrics.outcome(refusal.outcome);
    shared.reject(stream, refusal.body()).await;
    Ok(())
}

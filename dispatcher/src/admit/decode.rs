//! Stage 1: the REQUEST's body, decoded and checked, and the cluster it names.

use std::sync::Arc;

use osprey_protocol::{ErrorBody, ErrorCode, Frame, Origin, ProtocolError, Request};

use crate::admit::Refusal;
use crate::ctx::Ctx;
use crate::pool::SlotGroup;

/// The request in `frame`. `Ok(Err)`: it fails its stream alone (bad SQL text, a request
/// that contradicts itself); `Err`: an undecodable body, a broken peer (docs/PROTOCOL.md):
/// the connection closes with that error.
/// A REQUEST larger than `max_payload` (one a front end built in process; a client's
/// own frames cannot be) is refused here, before it could reach a worker link, whose
/// codec would refuse to write it.
pub fn decode(frame: &Frame, max_payload: usize) -> Result<Result<Request, Refusal>, ErrorBody> {
    if let Err(refusal) = within(frame, max_payload) {
        return Ok(Err(refusal));
    }
    let request = match Request::from_frame(frame) {
        Ok(r) => r,
        Err(e @ ProtocolError::BadUtf8) => return Ok(Err(Refusal::new("bad_request", e.code(), e.to_string()))),
        Err(e) => return Err(ErrorBody::undispatched(Origin::Dispatcher, e.code(), e.to_string())),
    };
    Ok(consistent(request))
}

/// What [`decode`] checks of a request built in process, `frame` its encoding: the same
/// refusals, without decoding the body back.
pub fn check_built(frame: &Frame, request: &Request, max_payload: usize) -> Result<(), Refusal> {
    within(frame, max_payload)?;
    valid(request)
}

fn within(frame: &Frame, max_payload: usize) -> Result<(), Refusal> {
    if frame.payload.len() > max_payload {
        let msg = format!(
            "the request is {} bytes, more than limits.max_payload ({max_payload})",
            frame.payload.len()
        );
        return Err(Refusal::new("bad_request", ErrorCode::FrameTooLarge, msg));
    }
    Ok(())
}

fn consistent(request: Request) -> Result<Request, Refusal> {
    valid(&request)?;
    Ok(request)
}

/// A request that contradicts itself fails its stream alone.
fn valid(request: &Request) -> Result<(), Refusal> {
    request
        .validate()
        .map_err(|msg| Refusal::new("bad_request", ErrorCode::InvalidRequest, msg))
}

/// The write group of the cluster the request names (the first by default).
pub fn cluster_group<'a>(ctx: &'a Ctx, request: &Request) -> Result<&'a Arc<SlotGroup>, Refusal> {
    ctx.group_for(request.cluster.as_deref()).ok_or_else(|| {
        let msg = format!(
            "unknown cluster {:?} (this dispatcher fronts {})",
            request.cluster.as_deref().unwrap_or_default(),
            ctx.clusters
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Refusal::new("bad_request", ErrorCode::UnknownCluster, msg)
    })
}

//! Stage 4: what the request holds while it waits: its stream (a count quota per
//! connection) and its REQUEST bytes (a byte quota per connection and for the whole
//! dispatcher). From here on the stream is open and its guard answers on every path.

use std::sync::Arc;

use osprey_protocol::{ErrorBody, ErrorCode, Origin};
use tokio_util::sync::CancellationToken;

use crate::admit::Refusal;
use crate::ctx::Ctx;
use crate::request::streams::{ClientShared, OpenError, StreamGuard};

/// Opens `stream`. `Ok(Err)`: refused before it was open (too many streams); `Err`: the
/// id is open already, a broken peer: the connection closes.
pub fn open(
    ctx: &Ctx,
    shared: &Arc<ClientShared>,
    stream: u32,
) -> Result<Result<(StreamGuard, CancellationToken), Refusal>, ErrorBody> {
    match shared.open(stream) {
        Ok(opened) => Ok(Ok(opened)),
        Err(OpenError::Duplicate) => Err(duplicate(stream)),
        Err(OpenError::TooMany) => Ok(Err(Refusal::new(
            "too_many_streams",
            ErrorCode::TooManyStreams,
            format!(
                "stream {stream} refused: {} streams already open on this connection",
                ctx.config.limits.max_streams_per_connection
            ),
        ))),
    }
}

/// The connection error for a REQUEST on a stream id that is open.
pub fn duplicate(stream: u32) -> ErrorBody {
    ErrorBody::undispatched(
        Origin::Dispatcher,
        ErrorCode::DuplicateStream,
        format!("stream {stream} is already open"),
    )
}

/// REQUEST payloads wait in memory until a worker takes them (up to max_payload each,
/// max_streams per connection): bounded in bytes per connection and in all. A draining
/// dispatcher takes no new request.
pub fn budget(
    ctx: &Ctx,
    shared: &ClientShared,
    guard: &mut StreamGuard,
    len: usize,
    draining: bool,
) -> Result<(), Refusal> {
    let limits = &ctx.config.limits;
    if !guard.take_request_bytes(&shared.request_bytes, limits.max_request_bytes_per_connection, len)
        || !guard.take_request_bytes(&ctx.request_bytes, limits.max_request_bytes, len)
    {
        return Err(Refusal::new(
            "queue_full",
            ErrorCode::QueueFull,
            "the requests waiting on this connection (or on the dispatcher) already hold their byte budget",
        ));
    }
    if draining {
        return Err(Refusal::new(
            "shutting_down",
            ErrorCode::ShuttingDown,
            "the dispatcher is draining (GOAWAY sent)",
        ));
    }
    Ok(())
}

/// [`open`] and [`budget`] together: the stream open and its bytes taken, or (`None`) the
/// REQUEST refused and answered. `Err`: a broken peer, as [`open`] says.
pub async fn stream(
    ctx: &Ctx,
    shared: &Arc<ClientShared>,
    stream: u32,
    len: usize,
    draining: bool,
) -> Result<Option<(StreamGuard, CancellationToken)>, ErrorBody> {
    let (mut guard, cancel) = match open(ctx, shared, stream)? {
        Ok(opened) => opened,
        Err(refusal) => {
            crate::admit::refuse(ctx, shared, stream, refusal).await?;
            return Ok(None);
        }
    };
    if let Err(refusal) = budget(ctx, shared, &mut guard, len, draining) {
        ctx.metrics.outcome(refusal.outcome);
        guard.fail(refusal.body()).await;
        return Ok(None);
    }
    Ok(Some((guard, cancel)))
}

//! The dispatcher's side of one worker connection (Unix socket): registration,
//! then a reader that routes response frames to the current request and a
//! writer that owns the socket's write half.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_protocol::{
    ErrorBody, ErrorCode, Frame, FrameCodec, Hello, HelloAck, Kind, Origin, Ping, Ready, Role, PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, info, warn, Instrument};

use crate::ctx::{constant_time_eq, Ctx};
use crate::pool::{Assignment, WorkerLink};

/// Why a link ended when the worker closed it (it is exiting by itself).
const WORKER_CLOSED: &str = "worker closed the connection";

/// Frames queued towards one worker.
const WORKER_QUEUE: usize = 64;

type Reader = FramedRead<OwnedReadHalf, FrameCodec>;
type Writer = FramedWrite<OwnedWriteHalf, FrameCodec>;

#[derive(Debug, thiserror::Error)]
enum RegisterError {
    #[error("no HELLO within the registration timeout")]
    Timeout,
    #[error("connection closed during registration")]
    Closed,
    #[error("{0}")]
    Protocol(#[from] osprey_protocol::ProtocolError),
    #[error("refused: {0}")]
    Refused(String),
    #[error("worker could not open its database session: {0}")]
    Backend(String),
}

/// Serves one accepted worker connection until it ends.
pub async fn serve(ctx: Arc<Ctx>, socket: UnixStream) {
    let peer_pid = socket.peer_cred().ok().and_then(|c| c.pid()).map(|p| p as u32);
    let (rd, wr) = socket.into_split();
    let codec = FrameCodec::new(ctx.config.limits.max_payload);
    let mut reader = FramedRead::new(rd, codec.clone());
    let mut writer = FramedWrite::new(wr, codec);
    let (slot, generation, ready) = match register(&ctx, &mut reader, &mut writer, peer_pid).await {
        Ok(r) => r,
        Err(e) => {
            warn!(peer_pid, "worker registration failed: {e}");
            if let RegisterError::Refused(msg) = &e {
                let body = ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::AuthFailed, msg.clone());
                let _ = writer.send(Frame::new(Kind::Error, 0, &body)).await;
            }
            return;
        }
    };
    let span = tracing::info_span!("worker", slot, pid = peer_pid);
    async move {
        info!(db_connection_id = ready.db_connection_id, "worker ready");
        let (to_worker, out_rx) = mpsc::channel(WORKER_QUEUE);
        let (assign, assign_rx) = mpsc::channel(1);
        let link = WorkerLink {
            to_worker: to_worker.clone(),
            assign,
        };
        let writer_task = tokio::spawn(write_loop(writer, out_rx));
        if ctx.pool.worker_ready(slot, generation, link, ready.db_connection_id) {
            let why = read_loop(&ctx, slot, generation, reader, to_worker, assign_rx).await;
            debug!("worker link ended: {why}");
            ctx.pool.link_lost(slot, generation, why, why == WORKER_CLOSED);
        }
        writer_task.abort();
    }
    .instrument(span)
    .await
}

async fn register(
    ctx: &Ctx,
    reader: &mut Reader,
    writer: &mut Writer,
    peer_pid: Option<u32>,
) -> Result<(u32, u64, Ready), RegisterError> {
    let deadline = Duration::from_millis(ctx.config.pool.register_timeout_ms);
    let first = timeout(deadline, reader.next())
        .await
        .map_err(|_| RegisterError::Timeout)?;
    let frame = first.ok_or(RegisterError::Closed)??;
    if frame.kind != Kind::Hello {
        return Err(RegisterError::Refused(format!(
            "expected HELLO, got {}",
            frame.kind.name()
        )));
    }
    let hello: Hello = frame.body()?;
    if hello.version_major != PROTOCOL_MAJOR {
        return Err(RegisterError::Refused(format!(
            "unsupported protocol version {}",
            hello.version_major
        )));
    }
    let secret_ok = hello
        .secret
        .as_deref()
        .is_some_and(|s| constant_time_eq(s.as_bytes(), ctx.secret.as_bytes()));
    if hello.role != Role::Worker || !secret_ok {
        return Err(RegisterError::Refused("wrong role or worker secret".into()));
    }
    let slot = hello
        .slot
        .ok_or_else(|| RegisterError::Refused("HELLO without slot".into()))?;
    // The kernel's word on who connected (SO_PEERCRED) must match the process we spawned.
    let (generation, pid) = ctx
        .pool
        .expected_registration(slot)
        .ok_or_else(|| RegisterError::Refused(format!("slot {slot} is not waiting for a worker")))?;
    if peer_pid != Some(pid) {
        return Err(RegisterError::Refused(format!(
            "slot {slot} expects pid {pid}, connection is from {peer_pid:?}"
        )));
    }
    let ack = HelloAck {
        version_major: PROTOCOL_MAJOR,
        version_minor: PROTOCOL_MINOR,
        server: format!("osprey-dispatcher {}", env!("CARGO_PKG_VERSION")),
        connection_id: ctx.next_conn_id(),
        max_payload: ctx.config.limits.max_payload as u32,
        max_streams: 1,
        keepalive_interval_ms: ctx.config.timeouts.keepalive_interval_ms,
        worker: Some(ctx.worker_settings.clone()),
    };
    writer.send(Frame::new(Kind::HelloAck, 0, &ack)).await?;
    let connect_budget = deadline + Duration::from_millis(ctx.worker_settings.connect_timeout_ms);
    loop {
        let frame = timeout(connect_budget, reader.next())
            .await
            .map_err(|_| RegisterError::Timeout)?;
        let frame = frame.ok_or(RegisterError::Closed)??;
        match frame.kind {
            Kind::Ready => return Ok((slot, generation, frame.body()?)),
            Kind::Error => {
                let body: ErrorBody = frame.body()?;
                return Err(RegisterError::Backend(body.message));
            }
            Kind::Ping => {
                let ping: Ping = frame.body()?;
                writer.send(Frame::new(Kind::Pong, 0, &ping)).await?;
            }
            Kind::Pong => {}
            other => {
                return Err(RegisterError::Refused(format!(
                    "unexpected {} before READY",
                    other.name()
                )))
            }
        }
    }
}

async fn write_loop(mut writer: Writer, mut rx: mpsc::Receiver<Frame>) {
    while let Some(frame) = rx.recv().await {
        if writer.feed(frame).await.is_err() {
            return;
        }
        while let Ok(frame) = rx.try_recv() {
            if writer.feed(frame).await.is_err() {
                return;
            }
        }
        if SinkExt::<Frame>::flush(&mut writer).await.is_err() {
            return;
        }
    }
}

async fn read_loop(
    ctx: &Ctx,
    slot: u32,
    generation: u64,
    mut reader: Reader,
    to_worker: mpsc::Sender<Frame>,
    mut assign_rx: mpsc::Receiver<Assignment>,
) -> &'static str {
    let mut current: Option<Assignment> = None;
    let mut last_rx = Instant::now();
    let mut tick = tokio::time::interval(ctx.keepalive_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut nonce = 0u64;
    loop {
        tokio::select! {
            biased;
            // An assignment is always sent before its REQUEST, so taking it first
            // guarantees it is in place when the response arrives.
            a = assign_rx.recv(), if current.is_none() => match a {
                Some(a) => current = Some(a),
                None => return "pool dropped the link",
            },
            frame = reader.next() => {
                let frame = match frame {
                    None => return WORKER_CLOSED,
                    Some(Err(e)) => {
                        warn!("bad frame from worker: {e}");
                        return "bad frame from worker";
                    }
                    Some(Ok(frame)) => frame,
                };
                last_rx = Instant::now();
                match frame.kind {
                    Kind::Ping => {
                        let Ok(ping) = frame.body::<Ping>() else { return "bad PING body" };
                        let _ = to_worker.try_send(Frame::new(Kind::Pong, 0, &ping));
                    }
                    Kind::Pong => {}
                    Kind::QuitRequest => {
                        debug!("worker asks to retire");
                        ctx.pool.quit_requested(slot, generation);
                    }
                    Kind::Columns | Kind::Rows | Kind::Error | Kind::End => {
                        let Some(a) = current.as_ref() else { return "response frame without a request" };
                        if frame.stream != a.stream {
                            return "response frame on the wrong stream";
                        }
                        let end = frame.kind == Kind::End;
                        // A closed receiver means the request task is gone; its lease kills us.
                        let _ = a.tx.send(frame).await;
                        if end {
                            current = None;
                        }
                    }
                    _ => return "unexpected frame kind from worker",
                }
            }
            _ = tick.tick() => {
                if last_rx.elapsed() > ctx.keepalive_timeout() {
                    warn!("worker silent past keepalive_timeout");
                    return "keepalive timeout";
                }
                nonce += 1;
                let _ = to_worker.try_send(Frame::new(Kind::Ping, 0, &Ping { nonce }));
            }
        }
    }
}

//! The dispatcher's side of one worker connection (Unix socket): registration,
//! then the relay (`relay/`) serves requests on it.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_protocol::{
    ErrorBody, ErrorCode, Frame, FrameCodec, Hello, HelloAck, Kind, Origin, Ping, Ready, Role, PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::pool::env::WorkerEnv;
use crate::pool::relay::{Reader, Relay, Writer};
use crate::pool::{SlotGroup, WorkerLink, LINK_JOBS};
use crate::secrets::constant_time_eq;

/// Largest frame read from a worker-socket connection before its `HELLO` has shown the
/// worker secret, as on the client port (docs/PROTOCOL.md, section 15): a worker's
/// `HELLO` is a few hundred bytes. Without it any local process could make the
/// dispatcher buffer a 16 MiB partial frame per connection (10 connections: 39 -> 151 MB).
const HANDSHAKE_MAX_PAYLOAD: usize = 4096;

#[derive(Debug, thiserror::Error)]
enum RegisterError {
    #[error("no HELLO within the registration timeout")]
    Timeout,
    #[error("connection closed during registration")]
    Closed,
    #[error("{0}")]
    Protocol(#[from] osprey_protocol::ProtocolError),
    /// A frame the registration's state does not allow (sections 3 and 14).
    #[error("protocol violation: {0}")]
    Violation(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("worker could not open its database session: {0}")]
    Backend(String),
}

impl RegisterError {
    /// The `ERROR` the peer gets before the close (section 14), if any.
    fn answer(&self) -> Option<ErrorBody> {
        let (code, message) = match self {
            RegisterError::Timeout | RegisterError::Closed | RegisterError::Backend(_) => return None,
            RegisterError::Protocol(osprey_protocol::ProtocolError::Io(_)) => return None,
            RegisterError::Protocol(e) => (e.code(), e.to_string()),
            RegisterError::Violation(m) => (ErrorCode::ProtocolViolation, m.clone()),
            RegisterError::Refused(m) => (ErrorCode::AuthFailed, m.clone()),
        };
        Some(ErrorBody::undispatched(Origin::Dispatcher, code, message))
    }
}

/// Serves one accepted worker connection until it ends.
pub async fn serve(env: Arc<WorkerEnv>, socket: UnixStream) {
    let peer_pid = socket.peer_cred().ok().and_then(|c| c.pid()).map(|p| p as u32);
    let (rd, wr) = match socket.into_std().and_then(osprey_protocol::link_socket::split) {
        Ok(halves) => halves,
        Err(e) => {
            warn!(peer_pid, "worker connection: {e}");
            return;
        }
    };
    // Until HELLO has shown the secret, one HELLO's worth at most (and the read buffer's
    // 8 KiB); `register` lifts the bound once it has.
    let mut reader = FramedRead::new(rd, FrameCodec::new(HANDSHAKE_MAX_PAYLOAD));
    let mut writer = FramedWrite::new(wr, FrameCodec::new(env.bounds.max_payload));
    let (pool, slot, generation, ready) = match register(&env, &mut reader, &mut writer, peer_pid).await {
        Ok(r) => r,
        Err(e) => {
            warn!(peer_pid, "worker registration failed: {e}");
            if let Some(body) = e.answer() {
                let _ = timeout(Duration::from_secs(1), writer.send(Frame::new(Kind::Error, 0, &body))).await;
            }
            return;
        }
    };
    let span = tracing::info_span!("worker", slot, pid = peer_pid);
    async move {
        info!(db_connection_id = ready.db_connection_id, "worker ready");
        *pool.server_version.lock().unwrap_or_else(|e| e.into_inner()) = Some(ready.server_version.clone());
        let (jobs_tx, jobs) = mpsc::channel(LINK_JOBS);
        let quit = CancellationToken::new();
        let link = WorkerLink {
            jobs: jobs_tx,
            quit: quit.clone(),
        };
        if pool.worker_ready(slot, generation, link, ready.db_connection_id) {
            Relay::new(
                env.clone(),
                pool.clone(),
                (slot, generation),
                reader,
                writer,
                jobs,
                quit,
            )
            .run()
            .await;
        }
    }
    .instrument(span)
    .await
}

async fn register(
    env: &WorkerEnv,
    reader: &mut Reader,
    writer: &mut Writer,
    peer_pid: Option<u32>,
) -> Result<(Arc<SlotGroup>, u32, u64, Ready), RegisterError> {
    let deadline = Duration::from_millis(env.pool.register_timeout_ms);
    let first = timeout(deadline, reader.next())
        .await
        .map_err(|_| RegisterError::Timeout)?;
    let frame = first.ok_or(RegisterError::Closed)??;
    if frame.kind != Kind::Hello {
        return Err(RegisterError::Violation(format!(
            "expected HELLO, got {}",
            frame.kind.name()
        )));
    }
    let hello: Hello = frame.body()?;
    hello.check_version()?;
    let secret_ok = hello
        .secret
        .as_deref()
        .is_some_and(|s| constant_time_eq(s.as_bytes(), env.secret.as_bytes()));
    if hello.role != Role::Worker || !secret_ok {
        return Err(RegisterError::Refused("wrong role or worker secret".into()));
    }
    let slot = hello
        .slot
        .ok_or_else(|| RegisterError::Refused("HELLO without slot".into()))?;
    // The kernel's word on who connected (SO_PEERCRED) must match the process we spawned.
    let not_waiting = || RegisterError::Refused(format!("slot {slot} is not waiting for a worker"));
    let pool = env.group_of_slot(slot).ok_or_else(not_waiting)?.clone();
    let (generation, pid) = pool.expected_registration(slot).ok_or_else(not_waiting)?;
    // The settings of the member the slot was spawned for (it may have been re-targeted
    // since: the pool then retires this worker as soon as it is ready).
    let settings = pool.settings_for(slot, generation).ok_or_else(not_waiting)?;
    if peer_pid != Some(pid) {
        return Err(RegisterError::Refused(format!(
            "slot {slot} expects pid {pid}, connection is from {peer_pid:?}"
        )));
    }
    // Authenticated (secret, slot, pid): the worker's frames may now be of any size.
    reader.decoder_mut().set_max_payload(env.bounds.max_payload);
    let ack = HelloAck {
        version_major: PROTOCOL_MAJOR,
        version_minor: PROTOCOL_MINOR,
        server: format!("osprey-dispatcher {}", env!("CARGO_PKG_VERSION")),
        connection_id: env.next_conn_id(),
        max_payload: env.bounds.max_payload as u32,
        max_streams: env.pool.pipeline_depth as u32,
        keepalive_interval_ms: env.bounds.keepalive_interval.as_millis() as u64,
        worker: Some(settings.clone()),
        stream_window: 0,
    };
    writer.send(Frame::new(Kind::HelloAck, 0, &ack)).await?;
    let connect_budget = deadline + Duration::from_millis(settings.connect_timeout_ms);
    loop {
        let frame = timeout(connect_budget, reader.next())
            .await
            .map_err(|_| RegisterError::Timeout)?;
        let frame = frame.ok_or(RegisterError::Closed)??;
        match frame.kind {
            Kind::Ready => return Ok((pool, slot, generation, frame.body()?)),
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
                return Err(RegisterError::Violation(format!(
                    "unexpected {} before READY",
                    other.name()
                )))
            }
        }
    }
}

//! The link to the dispatcher: registration, the reader task (pings, cancels, requests)
//! and the writer task (frames out, batched flushes, keepalive pings).

use std::path::Path;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_protocol::{
    ErrorBody, Frame, FrameCodec, Hello, HelloAck, Kind, Ping, ProtocolError, HEADER_LEN, PROTOCOL_MAJOR,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, warn};

use crate::cancel::{StopReason, Tracker};

/// How long the dispatcher has to answer `HELLO`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Frames queued between the executor/reader and the writer task (bounded: a
/// dispatcher that stops reading stalls the worker instead of growing its memory).
const OUTBOX_CAPACITY: usize = 32;

pub type LinkReader = FramedRead<OwnedReadHalf, FrameCodec>;
pub type LinkWriter = FramedWrite<OwnedWriteHalf, FrameCodec>;

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot connect to {path}: {source}")]
    Connect { path: String, source: std::io::Error },
    #[error("link error during registration: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("dispatcher closed the link during registration")]
    Closed,
    #[error("no HELLO_ACK within {0:?}")]
    Timeout(Duration),
    #[error("registration refused: {0}")]
    Refused(ErrorBody),
    #[error("unexpected {0} frame during registration")]
    Unexpected(&'static str),
    #[error("HELLO_ACK has protocol version {0}.x, this worker speaks {PROTOCOL_MAJOR}.x")]
    Version(u16),
    #[error("HELLO_ACK carries no worker settings")]
    NoSettings,
}

/// A registered link: both halves and the dispatcher's answer.
pub struct Registered {
    pub reader: LinkReader,
    pub writer: LinkWriter,
    pub ack: HelloAck,
}

/// Connects to the dispatcher's socket, sends `HELLO` and waits for `HELLO_ACK`.
pub async fn register(path: &Path, hello: &Hello) -> Result<Registered, RegisterError> {
    let sock = UnixStream::connect(path)
        .await
        .map_err(|source| RegisterError::Connect {
            path: path.display().to_string(),
            source,
        })?;
    let (r, w) = sock.into_split();
    let mut reader = FramedRead::new(r, FrameCodec::default());
    let mut writer = FramedWrite::new(w, FrameCodec::default());
    writer.send(Frame::new(Kind::Hello, 0, hello)).await?;
    let frame = match timeout(HELLO_TIMEOUT, reader.next()).await {
        Err(_) => return Err(RegisterError::Timeout(HELLO_TIMEOUT)),
        Ok(None) => return Err(RegisterError::Closed),
        Ok(Some(f)) => f?,
    };
    match frame.kind {
        Kind::HelloAck => {
            let ack: HelloAck = frame.body()?;
            if ack.version_major != PROTOCOL_MAJOR {
                return Err(RegisterError::Version(ack.version_major));
            }
            if ack.worker.is_none() {
                return Err(RegisterError::NoSettings);
            }
            // Frames we send must fit what the dispatcher accepts.
            let max = (ack.max_payload as usize).max(HEADER_LEN);
            *writer.encoder_mut() = FrameCodec::new(max);
            Ok(Registered { reader, writer, ack })
        }
        Kind::Error if frame.stream == 0 => Err(RegisterError::Refused(frame.body()?)),
        other => Err(RegisterError::Unexpected(other.name())),
    }
}

/// What the writer task is asked to do.
#[derive(Debug)]
pub enum Out {
    /// Queue a frame (no flush).
    Frame(Frame),
    /// Flush everything queued.
    Flush,
    /// Flush, then answer: everything sent before has left the process.
    Sync(oneshot::Sender<()>),
}

/// The link's writer task is gone (the dispatcher closed the link).
#[derive(Debug, thiserror::Error)]
#[error("link to the dispatcher is closed")]
pub struct LinkGone;

/// Handle to the writer task.
#[derive(Debug, Clone)]
pub struct Outbox(mpsc::Sender<Out>);

impl Outbox {
    pub fn new() -> (Outbox, mpsc::Receiver<Out>) {
        let (tx, rx) = mpsc::channel(OUTBOX_CAPACITY);
        (Outbox(tx), rx)
    }

    /// Queues a frame; it goes out at the next flush.
    pub async fn feed(&self, frame: Frame) -> Result<(), LinkGone> {
        self.0.send(Out::Frame(frame)).await.map_err(|_| LinkGone)
    }

    pub async fn flush(&self) -> Result<(), LinkGone> {
        self.0.send(Out::Flush).await.map_err(|_| LinkGone)
    }

    /// Queues a frame and flushes.
    pub async fn send(&self, frame: Frame) -> Result<(), LinkGone> {
        self.feed(frame).await?;
        self.flush().await
    }

    /// Waits until everything queued so far has been written to the socket.
    pub async fn sync(&self) -> Result<(), LinkGone> {
        let (tx, rx) = oneshot::channel();
        self.0.send(Out::Sync(tx)).await.map_err(|_| LinkGone)?;
        rx.await.map_err(|_| LinkGone)
    }
}

/// Writer task: feeds frames, flushes on request, and sends a `PING` whenever nothing
/// was written for `keepalive` (so the dispatcher sees traffic during long queries).
/// Returns when the socket fails or every [`Outbox`] is dropped.
pub async fn write_loop(
    mut writer: LinkWriter,
    mut rx: mpsc::Receiver<Out>,
    keepalive: Duration,
) -> Result<(), ProtocolError> {
    let mut last_write = Instant::now();
    let mut nonce = 0u64;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                None => {
                    flush(&mut writer).await?;
                    return Ok(());
                }
                Some(Out::Frame(f)) => {
                    if f.payload.len() > writer.encoder().max_payload() {
                        // Never reached in practice: the executor cuts batches below it.
                        warn!(kind = f.kind.name(), len = f.payload.len(), "dropping oversized frame");
                        continue;
                    }
                    writer.feed(f).await?;
                }
                Some(Out::Flush) => {
                    flush(&mut writer).await?;
                    last_write = Instant::now();
                }
                Some(Out::Sync(done)) => {
                    flush(&mut writer).await?;
                    last_write = Instant::now();
                    let _ = done.send(());
                }
            },
            _ = sleep_until(last_write + keepalive) => {
                nonce += 1;
                writer.send(Frame::new(Kind::Ping, 0, &Ping { nonce })).await?;
                last_write = Instant::now();
            }
        }
    }
}

async fn flush(writer: &mut LinkWriter) -> Result<(), ProtocolError> {
    SinkExt::<Frame>::flush(writer).await
}

/// Something the serving loop must act on, in arrival order.
#[derive(Debug)]
pub enum Event {
    Request(Frame),
    QuitNow,
    GoAway,
}

/// Why the reader stopped.
#[derive(Debug, thiserror::Error)]
pub enum LinkEnd {
    #[error("dispatcher closed the link")]
    Closed,
    #[error("nothing heard from the dispatcher for {0:?}")]
    Silent(Duration),
    #[error("bad input from the dispatcher: {0}")]
    Protocol(String),
}

/// Reader task: answers `PING` at once, hands `CANCEL` to the tracker (so it works while
/// a query runs), forwards requests and quit/goaway to the serving loop.
pub async fn read_loop(
    mut reader: LinkReader,
    events: mpsc::Sender<Event>,
    outbox: Outbox,
    tracker: Tracker,
    silence: Duration,
) -> LinkEnd {
    loop {
        let frame = match timeout(silence, reader.next()).await {
            Err(_) => return LinkEnd::Silent(silence),
            Ok(None) => return LinkEnd::Closed,
            Ok(Some(Err(ProtocolError::Io(e)))) => {
                debug!(error = %e, "link read error");
                return LinkEnd::Closed;
            }
            Ok(Some(Err(e))) => return LinkEnd::Protocol(e.to_string()),
            Ok(Some(Ok(f))) => f,
        };
        match frame.kind {
            Kind::Ping => {
                let ping: Ping = match frame.body() {
                    Ok(p) => p,
                    Err(e) => return LinkEnd::Protocol(e.to_string()),
                };
                if outbox.send(Frame::new(Kind::Pong, 0, &ping)).await.is_err() {
                    return LinkEnd::Closed;
                }
            }
            Kind::Pong => {}
            Kind::Cancel => {
                debug!(stream = frame.stream, "cancel");
                tracker.stop(frame.stream, StopReason::Cancelled);
            }
            Kind::Request => {
                tracker.opened(frame.stream);
                if events.send(Event::Request(frame)).await.is_err() {
                    return LinkEnd::Closed;
                }
            }
            Kind::QuitNow | Kind::GoAway => {
                let ev = if frame.kind == Kind::QuitNow {
                    Event::QuitNow
                } else {
                    Event::GoAway
                };
                if events.send(ev).await.is_err() {
                    return LinkEnd::Closed;
                }
            }
            Kind::Error if frame.stream == 0 => {
                let why = frame
                    .body::<ErrorBody>()
                    .map(|b| b.to_string())
                    .unwrap_or_else(|e| e.to_string());
                return LinkEnd::Protocol(format!("dispatcher sent ERROR on stream 0: {why}"));
            }
            other => return LinkEnd::Protocol(format!("unexpected {} frame on stream {}", other.name(), frame.stream)),
        }
    }
}

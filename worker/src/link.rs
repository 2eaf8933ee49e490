//! The link to the dispatcher: registration, then one [`Link`] that the serving loop
//! drives itself (no reader or writer task, no channels): frames out are encoded into one
//! buffer and written with one `write` per flush; frames in are read while a statement runs
//! too ([`Link::drive`]), so `PING` is answered and `CANCEL` acted on at once.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use futures::{FutureExt, SinkExt, StreamExt};
use osprey_protocol::link_socket::{self, LinkRead, LinkWrite};
use osprey_protocol::{
    Cancel, End, ErrorBody, ErrorCode, Frame, FrameCodec, Hello, HelloAck, Kind, Origin, Ping, ProtocolError,
    CANCEL_RECLAIM, HEADER_LEN, PROTOCOL_MAJOR,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::time::{sleep_until, timeout, Instant, Sleep};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, error, info, warn};

use crate::cancel::{StopReason, Tracker};
use crate::exit;

/// How long the dispatcher has to answer `HELLO`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The link to the dispatcher is closed (or a write to it failed).
#[derive(Debug, thiserror::Error)]
#[error("link to the dispatcher is closed")]
pub struct LinkGone;

/// Events read while a statement runs are queued up to this many; past it the link is
/// not read until the statement ends. The dispatcher writes at most
/// `MAX_PIPELINE_DEPTH` requests before the first has ended (prefetch), plus a
/// `QUIT_NOW` or `GOAWAY`: they all fit, so the link is always read (`PING`, `CANCEL`).
const MAX_QUEUED_EVENTS: usize = osprey_protocol::MAX_PIPELINE_DEPTH + 4;

/// Turns the registration-time halves into the serving-time [`Link`] parts.
pub fn split_registered(
    reader: LinkReader,
    writer: LinkWriter,
) -> io::Result<(FramedRead<LinkRead, FrameCodec>, LinkOut)> {
    let max_payload = writer.encoder().max_payload();
    let decoder = reader.decoder().clone();
    // Bytes the dispatcher sent right after HELLO_ACK, if any, must not be lost.
    let leftover = reader.read_buffer().clone();
    // Registration flushed every frame it wrote: nothing is buffered in `writer`.
    let stream = reader
        .into_inner()
        .reunite(writer.into_inner())
        .map_err(|e| io::Error::other(e.to_string()))?;
    // Registered for readability only (osprey_protocol::link_socket): the dispatcher's
    // reads of what we wrote must not wake an idle worker.
    let (read, write) = link_socket::split(stream.into_std()?)?;
    let mut framed = FramedRead::new(read, decoder);
    framed.read_buffer_mut().extend_from_slice(&leftover);
    Ok((framed, LinkOut::new(write, max_payload)))
}

/// The sending side: frames are encoded into one buffer; [`LinkOut::flush`] writes it.
///
/// Shared by reference between the executor and the link reader (both run in the one
/// serving future, so no lock); a `RefCell` borrow is never held across an `.await`.
/// Memory stays bounded: the executor flushes (and so waits for the dispatcher to read)
/// after every full `ROWS` batch, and holds at most the answers of one pipeline (≤ 16
/// statements' last batch and `END`) while their results are at hand; the reader adds
/// only small `PONG`s.
pub struct LinkOut {
    sock: LinkWrite,
    buf: RefCell<BytesMut>,
    max_payload: usize,
    last_write: Cell<Instant>,
}

impl LinkOut {
    fn new(sock: LinkWrite, max_payload: usize) -> LinkOut {
        LinkOut {
            sock,
            buf: RefCell::new(BytesMut::with_capacity(8 * 1024)),
            max_payload,
            last_write: Cell::new(Instant::now()),
        }
    }

    /// Queues a frame; it goes out at the next flush.
    pub fn push(&self, frame: &Frame) {
        if frame.payload.len() > self.max_payload {
            // Never reached in practice: the executor cuts batches below it.
            warn!(
                kind = frame.kind.name(),
                len = frame.payload.len(),
                "dropping oversized frame"
            );
            return;
        }
        frame.encode_to(&mut self.buf.borrow_mut());
    }

    /// Whether frames are waiting to be written.
    pub fn has_pending(&self) -> bool {
        !self.buf.borrow().is_empty()
    }

    /// Writes what the socket takes now without waiting. `Ok(true)` when all is written.
    pub fn try_flush(&self) -> Result<bool, LinkGone> {
        let mut buf = self.buf.borrow_mut();
        while !buf.is_empty() {
            match self.sock.try_write(&buf) {
                Ok(0) => return Err(LinkGone),
                Ok(n) => {
                    buf.advance(n);
                    self.last_write.set(Instant::now());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(error = %e, "link write error");
                    return Err(LinkGone);
                }
            }
        }
        buf.clear();
        Ok(true)
    }

    /// Writes everything queued, waiting while the dispatcher does not read.
    pub async fn flush(&self) -> Result<(), LinkGone> {
        while !self.try_flush()? {
            self.sock.writable().await.map_err(|e| {
                debug!(error = %e, "waiting for the link to take writes");
                LinkGone
            })?;
        }
        Ok(())
    }

    /// Queues a frame and flushes.
    pub async fn send(&self, frame: &Frame) -> Result<(), LinkGone> {
        self.push(frame);
        self.flush().await
    }

    fn last_write(&self) -> Instant {
        self.last_write.get()
    }
}

/// Something the serving loop must act on, in arrival order.
#[derive(Debug)]
pub enum Event {
    Request(Frame),
    /// End the session served (protocol 1.5), answered on this stream.
    Reset(u32),
    QuitNow,
    GoAway,
}

/// The events read and not yet taken, shared between the [`Link`] (which adds them, and
/// removes a request taken back) and the executor (which takes the requests queued
/// behind the one it serves, to pipeline them). One task: a borrow never crosses an
/// `.await`.
#[derive(Clone, Default)]
pub struct Queue(Rc<RefCell<VecDeque<Event>>>);

impl Queue {
    fn len(&self) -> usize {
        self.0.borrow().len()
    }

    fn push(&self, ev: Event) {
        self.0.borrow_mut().push_back(ev);
    }

    fn pop(&self) -> Option<Event> {
        self.0.borrow_mut().pop_front()
    }

    /// Removes the queued request of `stream`; whether there was one.
    fn remove_request(&self, stream: u32) -> bool {
        let mut q = self.0.borrow_mut();
        let at = q
            .iter()
            .position(|e| matches!(e, Event::Request(f) if f.stream == stream));
        at.and_then(|at| q.remove(at)).is_some()
    }

    /// Looks at the first event if it is a request.
    pub fn peek_request<T>(&self, f: impl FnOnce(&Frame) -> T) -> Option<T> {
        match self.0.borrow().front() {
            Some(Event::Request(frame)) => Some(f(frame)),
            _ => None,
        }
    }

    /// Takes the first event if it is a request.
    pub fn pop_request(&self) -> Option<Frame> {
        let mut q = self.0.borrow_mut();
        match q.front() {
            Some(Event::Request(_)) => match q.pop_front() {
                Some(Event::Request(frame)) => Some(frame),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Why the link stopped.
#[derive(Debug, thiserror::Error)]
pub enum LinkEnd {
    #[error("dispatcher closed the link")]
    Closed,
    #[error("nothing heard from the dispatcher for {0:?}")]
    Silent(Duration),
    #[error("bad input from the dispatcher: {0}")]
    Protocol(String),
}

impl LinkEnd {
    /// Logs why and gives the exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            LinkEnd::Closed | LinkEnd::Silent(_) => {
                info!("{self}; exiting");
                exit::OK
            }
            LinkEnd::Protocol(_) => {
                error!("{self}");
                exit::INTERNAL
            }
        }
    }
}

impl From<LinkGone> for LinkEnd {
    fn from(_: LinkGone) -> LinkEnd {
        LinkEnd::Closed
    }
}

/// The receiving side plus the link's timers: answers `PING` at once, hands `CANCEL` to
/// the tracker, queues requests and quit/goaway for the serving loop, sends a `PING` when
/// nothing was written for `keepalive`, and gives up after `silence` without a frame.
pub struct Link {
    reader: FramedRead<LinkRead, FrameCodec>,
    tracker: Tracker,
    events: Queue,
    keepalive: Duration,
    silence: Duration,
    last_read: Instant,
    nonce: u64,
    /// One timer for keepalive, silence and the caller's own deadline ([`Link::set_extra`]).
    /// It is re-armed only when it fires (the deadlines only move later), not per frame.
    timer: Pin<Box<Sleep>>,
    extra: Option<Instant>,
}

/// What woke [`Link::next`].
pub enum Wake {
    Event(Event),
    /// The timer fired (keepalive and silence are handled): check the caller's deadline.
    Timer,
}

impl Link {
    pub fn new(
        reader: FramedRead<LinkRead, FrameCodec>,
        tracker: Tracker,
        keepalive: Duration,
        silence: Duration,
    ) -> Link {
        let now = Instant::now();
        Link {
            reader,
            tracker,
            events: Queue::default(),
            keepalive,
            silence,
            last_read: now,
            nonce: 0,
            timer: Box::pin(sleep_until(now + keepalive.min(silence))),
            extra: None,
        }
    }

    /// The queue of events read and not yet taken.
    pub fn queue(&self) -> Queue {
        self.events.clone()
    }

    /// A deadline of the caller's (the timer fires at it, or earlier).
    pub fn set_extra(&mut self, at: Option<Instant>, out: &LinkOut) {
        self.extra = at;
        self.rearm(out);
    }

    fn rearm(&mut self, out: &LinkOut) {
        let mut at = (out.last_write() + self.keepalive).min(self.last_read + self.silence);
        // A caller's deadline that passed while it was busy (e.g. in a long statement) is
        // looked at when the caller next waits; re-arming to it would spin.
        if let Some(e) = self.extra.filter(|e| *e > Instant::now()) {
            at = at.min(e);
        }
        self.timer.as_mut().reset(at);
    }

    /// The timer fired: keepalive ping, silence check, re-arm.
    fn on_timer(&mut self, out: &LinkOut) -> Result<(), LinkEnd> {
        let now = Instant::now();
        if self.events.len() >= MAX_QUEUED_EVENTS {
            // Not reading on purpose (the queue is full): that is not the dispatcher's silence.
            self.last_read = now;
        } else if now >= self.last_read + self.silence {
            return Err(LinkEnd::Silent(self.silence));
        }
        if now >= out.last_write() + self.keepalive {
            self.nonce += 1;
            out.push(&Frame::new(Kind::Ping, 0, &Ping { nonce: self.nonce }));
            // Counts as a write even if the socket is full (the bytes go at the next flush).
            out.last_write.set(now);
            out.try_flush()?;
        }
        self.rearm(out);
        Ok(())
    }

    fn on_frame(&mut self, next: Option<Result<Frame, ProtocolError>>, out: &LinkOut) -> Result<(), LinkEnd> {
        let frame = match next {
            None => return Err(LinkEnd::Closed),
            Some(Err(ProtocolError::Io(e))) => {
                debug!(error = %e, "link read error");
                return Err(LinkEnd::Closed);
            }
            Some(Err(e)) => return Err(LinkEnd::Protocol(e.to_string())),
            Some(Ok(f)) => f,
        };
        self.last_read = Instant::now();
        match frame.kind {
            Kind::Ping => {
                let ping: Ping = frame.body().map_err(|e| LinkEnd::Protocol(e.to_string()))?;
                out.push(&Frame::new(Kind::Pong, 0, &ping));
                // Whatever the socket does not take now goes with the next flush.
                out.try_flush()?;
            }
            Kind::Pong => {}
            Kind::Cancel => {
                // A body that does not decode is still a cancel (the reason is for logs).
                let reason = frame.body::<Cancel>().map(|c| c.reason).unwrap_or_default();
                debug!(stream = frame.stream, %reason, "cancel");
                if reason == CANCEL_RECLAIM {
                    self.reclaim(frame.stream, out)?;
                } else {
                    self.tracker.stop(frame.stream, StopReason::Cancelled);
                }
            }
            Kind::Request => {
                self.tracker.opened(frame.stream);
                self.events.push(Event::Request(frame));
            }
            Kind::Reset => self.events.push(Event::Reset(frame.stream)),
            Kind::QuitNow => self.events.push(Event::QuitNow),
            Kind::GoAway => self.events.push(Event::GoAway),
            Kind::Error if frame.stream == 0 => {
                let why = frame
                    .body::<ErrorBody>()
                    .map(|b| b.to_string())
                    .unwrap_or_else(|e| e.to_string());
                return Err(LinkEnd::Protocol(format!("dispatcher sent ERROR on stream 0: {why}")));
            }
            other => {
                return Err(LinkEnd::Protocol(format!(
                    "unexpected {} frame on stream {}",
                    other.name(),
                    frame.stream
                )))
            }
        }
        Ok(())
    }

    /// The dispatcher takes back `stream`, which it wrote ahead of time. Still queued here:
    /// it leaves the queue and is answered at once, out of turn, as never run (`ERROR
    /// CANCELLED`, dispatched=false, then `END`), so that the dispatcher can give it to
    /// another worker now rather than after the statement running here. Taken from the
    /// queue but not started: it will be answered so when its turn comes. Started: it
    /// runs on, unharmed (the dispatcher relays its answer as usual).
    fn reclaim(&mut self, stream: u32, out: &LinkOut) -> Result<(), LinkEnd> {
        if !self.events.remove_request(stream) {
            self.tracker.reclaim(stream);
            return Ok(());
        }
        self.tracker.forget(stream);
        let body = ErrorBody::undispatched(Origin::Worker, ErrorCode::Cancelled, "taken back before it started");
        out.push(&Frame::new(Kind::Error, stream, &body));
        out.push(&Frame::new(Kind::End, stream, &End::default()));
        out.try_flush()?;
        Ok(())
    }

    /// Waits for the next event (or the timer), keeping the link alive meanwhile.
    pub async fn next(&mut self, out: &LinkOut) -> Result<Wake, LinkEnd> {
        loop {
            if let Some(ev) = self.events.pop() {
                if matches!(ev, Event::Request(_)) {
                    self.take_buffered(out)?;
                }
                return Ok(Wake::Event(ev));
            }
            tokio::select! {
                biased;
                next = self.reader.next(), if self.events.len() < MAX_QUEUED_EVENTS => self.on_frame(next, out)?,
                res = out.flush(), if out.has_pending() => res?,
                _ = &mut self.timer => {
                    self.on_timer(out)?;
                    return Ok(Wake::Timer);
                }
            }
        }
    }

    /// Queues the frames already read (or readable without waiting), so that the executor
    /// sees the requests that came with this one and can pipeline them.
    fn take_buffered(&mut self, out: &LinkOut) -> Result<(), LinkEnd> {
        while self.events.len() < MAX_QUEUED_EVENTS {
            match self.reader.next().now_or_never() {
                Some(next) => self.on_frame(next, out)?,
                None => break,
            }
        }
        Ok(())
    }

    /// Runs `work` (a statement, a connect) while answering pings, acting on cancels and
    /// queueing other events for [`Link::next`].
    ///
    /// The dispatcher's frames come first: work that streams a large result is ready
    /// again as soon as the dispatcher takes its bytes, and polled first it ran on for
    /// megabytes before a reclaim or a cancel was even read (the answer to a reclaim must
    /// follow the batch being written, within what the dispatcher reads to reach it; the
    /// emitter yields after each batch, so that this poll comes). The reader cannot starve
    /// the work: requests are bounded by the event queue, and the dispatcher's other
    /// frames by what it sends (PINGs on its timer, one CANCEL per request, one reclaim
    /// per request written ahead).
    pub async fn drive<F: Future>(&mut self, out: &LinkOut, work: F) -> Result<F::Output, LinkEnd> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                next = self.reader.next(), if self.events.len() < MAX_QUEUED_EVENTS => self.on_frame(next, out)?,
                done = &mut work => return Ok(done),
                res = out.flush(), if out.has_pending() => res?,
                _ = &mut self.timer => self.on_timer(out)?,
            }
        }
    }
}

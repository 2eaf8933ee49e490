//! Client-side stream bookkeeping and the closed-loop guard.
//!
//! Every accepted REQUEST is owned by a [`StreamGuard`]. The guard's owner sends
//! the terminal frames; if it is dropped before that happened (panic, early
//! return, task abort) its `Drop` sends a synthetic `ERROR` + `END`, removes the
//! stream from the connection's table and frees the quota. A stream therefore
//! cannot stay open by mistake.

// foldhash: looked up several times per request (SipHash was ~2 % of the dispatcher).
use foldhash::{HashMap, HashMapExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use osprey_protocol::{End, ErrorBody, ErrorCode, Frame, Kind, Origin, HEADER_LEN};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Most credit a stream can hold: a client granting more is capped here (a compliant one
/// never holds more than its window).
const MAX_CREDIT: usize = 1 << 24;

/// A frame in a client's write queue with its share of the queue's byte budget, held
/// until the writer has handed the frame's bytes to the socket (dropping it, even
/// unwritten, gives them back).
pub struct Queued {
    pub frame: Frame,
    pub bytes: OwnedSemaphorePermit,
}

/// The sending side of one client's write queue, bounded twice: in frames
/// (`limits.client_write_queue`) and in bytes (`limits.client_write_queue_bytes`). The
/// byte bound is what caps memory: a frame can be 16 MiB, so a queue of 256 frames
/// could otherwise hold 4 GiB for a client that does not read.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Queued>,
    bytes: Arc<Semaphore>,
    budget: usize,
}

/// The writer's side of the queue.
pub struct Inbox {
    rx: mpsc::Receiver<Queued>,
    bytes: Arc<Semaphore>,
}

/// Room for one frame in the queue: its bytes and its place, both taken.
pub struct Slot<'a> {
    place: mpsc::Permit<'a, Queued>,
    bytes: OwnedSemaphorePermit,
}

impl Slot<'_> {
    pub fn send(self, frame: Frame) {
        self.place.send(Queued {
            frame,
            bytes: self.bytes,
        });
    }
}

/// A queue for `frames` frames and `budget` bytes (header included).
pub fn outbox(frames: usize, budget: usize) -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel(frames.max(1));
    let budget = budget.clamp(1, u32::MAX as usize);
    let bytes = Arc::new(Semaphore::new(budget));
    (
        Outbox {
            tx,
            bytes: bytes.clone(),
            budget,
        },
        Inbox { rx, bytes },
    )
}

impl Outbox {
    /// A frame's charge against the budget. One larger than the whole budget is charged
    /// the whole budget: it goes alone, once the queue is empty.
    fn cost(&self, len: usize) -> u32 {
        (HEADER_LEN + len).min(self.budget) as u32
    }

    /// Waits for room for a payload of `len` bytes: its bytes first, then its place.
    /// None: the client is gone. Cancel-safe (nothing is taken until both are there).
    pub async fn reserve(&self, len: usize) -> Option<Slot<'_>> {
        let bytes = self.bytes.clone().acquire_many_owned(self.cost(len)).await.ok()?;
        let place = self.tx.reserve().await.ok()?;
        Some(Slot { place, bytes })
    }

    /// Queues `frame`, waiting for room. False: the client is gone.
    pub async fn send(&self, frame: Frame) -> bool {
        match self.reserve(frame.payload.len()).await {
            Some(slot) => {
                slot.send(frame);
                true
            }
            None => false,
        }
    }

    /// Queues `frame` if there is room now. False: full, or the client is gone.
    pub fn try_send(&self, frame: Frame) -> bool {
        let Ok(bytes) = self
            .bytes
            .clone()
            .try_acquire_many_owned(self.cost(frame.payload.len()))
        else {
            return false;
        };
        self.tx.try_send(Queued { frame, bytes }).is_ok()
    }
}

impl Inbox {
    pub async fn recv(&mut self) -> Option<Queued> {
        self.rx.recv().await
    }

    pub fn try_recv(&mut self) -> Option<Queued> {
        self.rx.try_recv().ok()
    }

    /// No more frames: senders waiting for room (bytes or place) fail at once.
    pub fn close(&mut self) {
        self.bytes.close();
        self.rx.close();
    }
}

/// One open stream in the connection's table.
struct Entry {
    cancel: CancellationToken,
    /// Data frames the client lets us send on it (flow control on), as permits.
    credit: Option<Arc<Semaphore>>,
}

/// State shared by a client connection's reader, writer and request tasks.
pub struct ClientShared {
    pub id: u64,
    /// Frames to the client, written by the connection's writer task (bounded in frames
    /// and bytes: backpressure).
    pub out: Outbox,
    streams: Mutex<HashMap<u32, Entry>>,
    max_streams: usize,
    /// Per-stream flow-control window agreed in the handshake, in data frames; 0 = off.
    window: u32,
    /// Bytes of REQUEST payload its open streams may hold (`limits.max_request_bytes_per_connection`).
    pub request_bytes: Arc<Semaphore>,
    /// Set when the connection is gone: request tasks stop relaying to it.
    pub closed: AtomicBool,
    metrics: Arc<Metrics>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum OpenError {
    Duplicate,
    TooMany,
}

impl ClientShared {
    pub fn new(
        id: u64,
        out: Outbox,
        max_streams: usize,
        window: u32,
        request_bytes: usize,
        metrics: Arc<Metrics>,
    ) -> Arc<ClientShared> {
        Arc::new(ClientShared {
            id,
            out,
            streams: Mutex::new(HashMap::new()),
            max_streams,
            window,
            request_bytes: Arc::new(Semaphore::new(request_bytes.clamp(1, u32::MAX as usize))),
            closed: AtomicBool::new(false),
            metrics,
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Entry>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens `stream`: the returned guard owns it, the token cancels it.
    pub fn open(self: &Arc<Self>, stream: u32) -> Result<(StreamGuard, CancellationToken), OpenError> {
        let mut table = self.table();
        if table.contains_key(&stream) {
            return Err(OpenError::Duplicate);
        }
        if table.len() >= self.max_streams {
            return Err(OpenError::TooMany);
        }
        let token = CancellationToken::new();
        let credit = (self.window > 0).then(|| Arc::new(Semaphore::new(self.window as usize)));
        table.insert(
            stream,
            Entry {
                cancel: token.clone(),
                credit: credit.clone(),
            },
        );
        self.metrics.streams_opened.inc();
        self.metrics.streams_open.inc();
        let guard = StreamGuard {
            shared: self.clone(),
            stream,
            terminal: Terminal::Open,
            dispatched: false,
            credit,
            request_bytes: Vec::new(),
        };
        Ok((guard, token))
    }

    /// Cancels one stream (client CANCEL). Unknown streams are ignored: the
    /// stream may have ended while the CANCEL was on its way.
    pub fn cancel(&self, stream: u32) -> bool {
        match self.table().get(&stream) {
            Some(e) => {
                e.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Whether this connection uses per-stream flow control.
    pub fn flow_control(&self) -> bool {
        self.window > 0
    }

    /// Client WINDOW: `increment` more data frames may go out on `stream`. Unknown
    /// streams are ignored: the WINDOW may have crossed the stream's END.
    pub fn grant(&self, stream: u32, increment: u32) {
        if let Some(credit) = self.table().get(&stream).and_then(|e| e.credit.as_ref()) {
            let room = MAX_CREDIT.saturating_sub(credit.available_permits());
            credit.add_permits((increment as usize).min(room));
        }
    }

    /// Cancels every open stream (connection lost or cut off).
    pub fn cancel_all(&self) {
        for e in self.table().values() {
            e.cancel.cancel();
        }
    }

    pub fn is_open(&self, stream: u32) -> bool {
        self.table().contains_key(&stream)
    }

    pub fn open_streams(&self) -> usize {
        self.table().len()
    }

    /// Answers a REQUEST that is refused before it opens a stream: ERROR + END.
    pub async fn reject(&self, stream: u32, body: ErrorBody) {
        let _ = self.out.send(Frame::new(Kind::Error, stream, &body)).await;
        let _ = self.out.send(Frame::new(Kind::End, stream, &End::default())).await;
    }

    fn close_stream(&self, stream: u32) {
        self.table().remove(&stream);
        self.metrics.streams_closed.inc();
        self.metrics.streams_open.dec();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Terminal {
    Open,
    /// An ERROR went out; only END is missing.
    ErrorSent,
    Closed,
}

/// Owner of one open client stream. See the module docs.
pub struct StreamGuard {
    shared: Arc<ClientShared>,
    stream: u32,
    terminal: Terminal,
    dispatched: bool,
    /// The stream's flow-control credit (None: flow control off).
    credit: Option<Arc<Semaphore>>,
    /// Its request's share of the request-byte budgets, until the stream ends.
    request_bytes: Vec<OwnedSemaphorePermit>,
}

impl StreamGuard {
    pub fn stream(&self) -> u32 {
        self.stream
    }

    pub fn shared(&self) -> &Arc<ClientShared> {
        &self.shared
    }

    /// The request has been handed to a worker: from now on it may have reached a database.
    pub fn set_dispatched(&mut self) {
        self.dispatched = true;
    }

    /// The worker it was handed to answered that it never ran it (it was taken back
    /// before it started): it has not reached a database after all.
    pub fn set_undispatched(&mut self) {
        self.dispatched = false;
    }

    pub fn dispatched(&self) -> bool {
        self.dispatched
    }

    /// Takes a share of `budget` (of `size` bytes in all) for a request of `len` bytes,
    /// held until the stream ends. One larger than the whole budget takes all of it: it
    /// goes alone. False: the budget is spent now.
    pub fn take_request_bytes(&mut self, budget: &Arc<Semaphore>, size: usize, len: usize) -> bool {
        let cost = len.min(size).min(u32::MAX as usize) as u32;
        match budget.clone().try_acquire_many_owned(cost) {
            Ok(permit) => {
                self.request_bytes.push(permit);
                true
            }
            Err(_) => false,
        }
    }

    /// The stream's flow-control credit (`None`: flow control off). A data frame goes
    /// out only with a permit of it; see [`StreamGuard::forward_spending`].
    pub fn credit(&self) -> Option<Arc<Semaphore>> {
        self.credit.clone()
    }

    /// Sends `ERROR` or `END` (which need no credit), or a data frame on a connection
    /// without flow control. Returns false when the client is gone.
    pub async fn forward(&mut self, frame: Frame) -> bool {
        self.forward_spending(frame, None).await
    }

    /// Sends a frame of this stream to the client, spending `credit` (the permit a data
    /// frame needs when flow control is on). Returns false when the client is gone.
    pub async fn forward_spending(&mut self, frame: Frame, credit: Option<OwnedSemaphorePermit>) -> bool {
        if self.terminal == Terminal::Closed {
            return false;
        }
        let frame = frame.with_stream(self.stream);
        // Cancel-safe: the guard's state changes only once the frame has its place
        // in the queue (after the last await). A caller that gives up mid-way
        // leaves the guard as it was, and its Drop still closes the loop.
        if self.shared.closed.load(Ordering::Relaxed) {
            if frame.kind == Kind::End {
                self.terminal = Terminal::Closed;
                self.shared.close_stream(self.stream);
            }
            return false;
        }
        debug_assert!(
            credit.is_some()
                || self.credit.is_none()
                || !matches!(frame.kind, Kind::Columns | Kind::Rows | Kind::RawRows | Kind::ResultEnd),
            "a data frame without credit"
        );
        let Some(slot) = self.shared.out.reserve(frame.payload.len()).await else {
            return false;
        };
        // Spent only now that the frame goes out (a give-up before returns it).
        if let Some(c) = credit {
            c.forget();
        }
        match frame.kind {
            // Free the id before END can reach the client (it may reuse the id the
            // moment it reads END), but only once END has its place in the queue: a
            // draining connection closes as soon as it has no open stream.
            Kind::End => {
                self.terminal = Terminal::Closed;
                self.shared.close_stream(self.stream);
            }
            Kind::Error => self.terminal = Terminal::ErrorSent,
            _ => {}
        }
        self.shared.metrics.bytes_to_clients.inc_by(frame.payload.len() as u64);
        slot.send(frame);
        true
    }

    /// Ends the stream with `ERROR` (unless the worker's own ERROR already went out) and `END`.
    pub async fn fail(mut self, mut body: ErrorBody) {
        body.dispatched |= self.dispatched;
        if self.terminal == Terminal::Open {
            self.forward(Frame::new(Kind::Error, 0, &body)).await;
        }
        self.forward(Frame::new(Kind::End, 0, &End::default())).await;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.terminal == Terminal::Closed {
            return; // `forward` of the END closed the stream.
        }
        if !self.shared.closed.load(Ordering::Relaxed) {
            let mut frames = Vec::with_capacity(2);
            if self.terminal == Terminal::Open {
                let body = ErrorBody {
                    origin: Origin::Dispatcher,
                    code: ErrorCode::Internal,
                    errno: None,
                    sqlstate: None,
                    message: "request ended without a response".into(),
                    dispatched: self.dispatched,
                    retryable: false,
                    transaction: None,
                };
                frames.push(Frame::new(Kind::Error, self.stream, &body));
            }
            frames.push(Frame::new(Kind::End, self.stream, &End::default()));
            let out = self.shared.out.clone();
            // Drop cannot wait for room in the bounded queue: hand the frames to a task.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    for f in frames {
                        if !out.send(f).await {
                            break;
                        }
                    }
                });
            }
        }
        self.shared.close_stream(self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize) -> Frame {
        Frame {
            kind: Kind::Rows,
            flags: 0,
            stream: 1,
            payload: bytes::Bytes::from(vec![0u8; len]),
        }
    }

    #[tokio::test]
    async fn the_queue_is_bounded_in_bytes_and_a_big_frame_goes_alone() {
        let (out, mut inbox) = outbox(256, 10_000);
        assert!(out.try_send(frame(4_000)));
        assert!(out.try_send(frame(4_000)));
        // 2 × 4012 queued: 4012 more do not fit, though 254 places are free.
        assert!(!out.try_send(frame(4_000)));
        let first = inbox.try_recv().unwrap();
        assert!(!out.try_send(frame(4_000)), "bytes are held until the writer lets go");
        drop(first);
        assert!(out.try_send(frame(4_000)));
        drop(inbox.try_recv());
        drop(inbox.try_recv());
        // Larger than the whole budget: it goes when the queue is empty, alone.
        assert!(out.try_send(frame(50_000)));
        assert!(!out.try_send(frame(1)));
        drop(inbox.try_recv());
        assert!(out.try_send(frame(1)));
    }

    #[tokio::test]
    async fn closing_the_queue_releases_waiting_senders() {
        let (out, mut inbox) = outbox(256, 10_000);
        assert!(out.try_send(frame(9_000)));
        let waiting = tokio::spawn({
            let out = out.clone();
            async move { out.send(frame(9_000)).await }
        });
        tokio::task::yield_now().await;
        inbox.close();
        assert!(
            !waiting.await.unwrap(),
            "a sender waiting for bytes on a closed queue fails"
        );
        assert!(!out.send(frame(1)).await);
    }
}

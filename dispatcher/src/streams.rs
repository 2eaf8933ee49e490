//! Client-side stream bookkeeping and the closed-loop guard.
//!
//! Every accepted REQUEST is owned by a [`StreamGuard`]. The guard's owner sends
//! the terminal frames; if it is dropped before that happened (panic, early
//! return, task abort) its `Drop` sends a synthetic `ERROR` + `END`, removes the
//! stream from the connection's table and frees the quota. A stream therefore
//! cannot stay open by mistake.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use osprey_protocol::{End, ErrorBody, ErrorCode, Frame, Kind, Origin};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Most credit a stream can hold: a client granting more is capped here (a compliant one
/// never holds more than its window).
const MAX_CREDIT: usize = 1 << 24;

/// One open stream in the connection's table.
struct Entry {
    cancel: CancellationToken,
    /// Data frames the client lets us send on it (flow control on), as permits.
    credit: Option<Arc<Semaphore>>,
}

/// State shared by a client connection's reader, writer and request tasks.
pub struct ClientShared {
    pub id: u64,
    /// Frames to the client, written by the connection's writer task (bounded: backpressure).
    pub out: mpsc::Sender<Frame>,
    streams: Mutex<HashMap<u32, Entry>>,
    max_streams: usize,
    /// Per-stream flow-control window agreed in the handshake, in data frames; 0 = off.
    window: u32,
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
        out: mpsc::Sender<Frame>,
        max_streams: usize,
        window: u32,
        metrics: Arc<Metrics>,
    ) -> Arc<ClientShared> {
        Arc::new(ClientShared {
            id,
            out,
            streams: Mutex::new(HashMap::new()),
            max_streams,
            window,
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

    pub fn dispatched(&self) -> bool {
        self.dispatched
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
            credit.is_some() || self.credit.is_none() || !matches!(frame.kind, Kind::Columns | Kind::Rows),
            "a data frame without credit"
        );
        let Ok(permit) = self.shared.out.reserve().await else {
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
        permit.send(frame);
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
                };
                frames.push(Frame::new(Kind::Error, self.stream, &body));
            }
            frames.push(Frame::new(Kind::End, self.stream, &End::default()));
            let out = self.shared.out.clone();
            // Drop cannot wait for room in the bounded queue: hand the frames to a task.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    for f in frames {
                        if out.send(f).await.is_err() {
                            break;
                        }
                    }
                });
            }
        }
        self.shared.close_stream(self.stream);
    }
}

//! One connection to the dispatcher: the handshake, and the two tasks that own
//! the socket halves.
//!
//! * The **writer task** owns the `FramedWrite`. Requests reach it over a bounded
//!   command channel; it `feed`s everything that is queued (up to a batch) and then
//!   `flush`es once. It also sends `PING` every keepalive interval.
//! * The **reader task** owns the `FramedRead`. It routes each stream frame to that
//!   stream's bounded channel, answers `PING` with `PONG`, handles `GOAWAY` and
//!   connection-level `ERROR`, and declares the connection dead when nothing has
//!   arrived for `keepalive_timeout`.
//!
//! The stream table (id → entry) is shared under a short-held mutex. An entry holds
//! the stream's semaphore permit (the `max_streams` cap), so a stream id and its
//! permit are released only when `END` arrives or the connection dies, never when
//! the caller merely stops listening.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_protocol::{
    Cancel, ErrorBody, ErrorCode, Frame, FrameCodec, Hello, HelloAck, Kind, Ping, Role, Window, PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, info, warn, Instrument};

use crate::config::ClientConfig;
use crate::error::Error;
use crate::stream_queue::{queue, QueueRx, QueueTx, TrySendError};
use crate::tls::{BoxRead, BoxWrite};

/// Frames fed to the socket before one flush.
const WRITE_BATCH: usize = 256;

/// While its reader takes frames, a stream gives credit back at least this often, not
/// only half a window at a time: a slow but steady reader must not look stalled to the
/// dispatcher, which ends a stream left without credit for its `client_write_timeout`.
const CREDIT_EVERY: Duration = Duration::from_secs(1);

/// Counters shared by all connections of one client.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub opened: AtomicU64,
    pub closed: AtomicU64,
    pub reconnects: AtomicU64,
    pub retries: AtomicU64,
}

/// Life of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Accepts new streams.
    Up,
    /// The dispatcher sent `GOAWAY`: open streams finish, no new ones.
    GoAway,
    /// Closed; every stream on it has been released.
    Dead,
}

pub(crate) enum Cmd {
    Open {
        id: u32,
        seq: u64,
        frame: Frame,
        /// A session's statement: written after `GOAWAY` too.
        in_session: bool,
    },
    Cancel {
        id: u32,
        seq: u64,
    },
    /// Flow-control credit for data frames the stream's reader has taken.
    Window {
        id: u32,
        seq: u64,
        increment: u32,
    },
    Pong {
        nonce: u64,
    },
}

struct Entry {
    seq: u64,
    /// `None` once the caller has gone away: later frames are discarded.
    tx: Option<QueueTx>,
    written: Arc<AtomicBool>,
    _permit: Option<OwnedSemaphorePermit>,
}

#[derive(Default)]
struct Table {
    map: foldhash::HashMap<u32, Entry>,
    next_id: u32,
    next_seq: u64,
}

pub(crate) struct ConnShared {
    pub addr: String,
    pub connection_id: u64,
    pub max_payload: usize,
    /// Per-stream flow-control window the dispatcher agreed to (data frames); 0 = off.
    window: u32,
    table: Mutex<Table>,
    status: watch::Sender<Status>,
    sem: Arc<Semaphore>,
    stats: Arc<Stats>,
}

/// A cheap handle on a live (or dead) connection.
#[derive(Clone)]
pub(crate) struct ConnHandle {
    pub shared: Arc<ConnShared>,
    cmd: mpsc::Sender<Cmd>,
}

/// A stream opened on a connection. Dropping it before `END` cancels the stream.
pub(crate) struct StreamGuard {
    conn: ConnHandle,
    pub id: u32,
    seq: u64,
    rx: QueueRx,
    written: Arc<AtomicBool>,
    /// Set once `END` (or `ERROR`) was received, or the connection died: no `CANCEL` on drop.
    pub finished: bool,
    /// Data frames taken from `rx` and not yet given back to the dispatcher as credit.
    consumed: u32,
    /// When credit was last given back (or the stream opened).
    credited_at: Instant,
}

impl StreamGuard {
    /// The stream's next frame; `None` when the connection died or refused the stream.
    /// With flow control on, the data frames taken are given back to the dispatcher as
    /// credit, half a window at a time, or after [`CREDIT_EVERY`]. Cancel-safe (it
    /// awaits only the channel).
    pub async fn recv(&mut self) -> Option<Frame> {
        let frame = self.rx.recv().await?;
        let window = self.conn.shared.window;
        if window > 0 && matches!(frame.kind, Kind::Columns | Kind::Rows | Kind::RawRows | Kind::ResultEnd) {
            self.consumed += 1;
            if self.consumed >= (window / 2).max(1) || self.credited_at.elapsed() >= CREDIT_EVERY {
                self.credited_at = Instant::now();
                let cmd = Cmd::Window {
                    id: self.id,
                    seq: self.seq,
                    increment: std::mem::take(&mut self.consumed),
                };
                self.conn.send_later(cmd);
            }
        }
        Some(frame)
    }

    /// Sends `CANCEL` for the stream and keeps reading it (a session's close: its `END`
    /// or `ERROR` still comes).
    pub fn cancel_and_keep(&self) {
        self.conn.send_later(Cmd::Cancel {
            id: self.id,
            seq: self.seq,
        });
    }

    /// Whether the `REQUEST` frame was handed to the socket.
    pub fn written(&self) -> bool {
        self.written.load(Ordering::SeqCst)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let shared = &self.conn.shared;
        let send_cancel = {
            let mut t = shared.table.lock().unwrap();
            match t.map.get_mut(&self.id) {
                Some(e) if e.seq == self.seq => {
                    if e.written.load(Ordering::SeqCst) {
                        e.tx = None;
                        true
                    } else {
                        // Never written: forget it; the writer skips its Open.
                        let e = t.map.remove(&self.id);
                        drop(t);
                        drop(e);
                        shared.close_if_drained();
                        false
                    }
                }
                _ => false,
            }
        };
        if send_cancel {
            debug!(stream = self.id, conn = shared.connection_id, "cancelling stream");
            self.conn.send_later(Cmd::Cancel {
                id: self.id,
                seq: self.seq,
            });
        }
    }
}

/// Why a stream could not be opened on this connection (the caller picks another).
#[derive(Debug)]
pub(crate) struct Unavailable;

impl ConnShared {
    pub fn status(&self) -> Status {
        *self.status.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    fn set_goaway(&self) {
        let went_away = self.status.send_if_modified(|s| {
            if *s == Status::Up {
                *s = Status::GoAway;
                true
            } else {
                false
            }
        });
        if went_away {
            // Requests waiting for a stream slot here must move to the new connection
            // now, not one by one as the old streams drain.
            self.sem.close();
        }
    }

    /// After `GOAWAY`, the connection closes once its last stream has ended.
    fn close_if_drained(&self) {
        if self.status() == Status::GoAway && self.table.lock().unwrap().map.is_empty() {
            self.kill("drained after GOAWAY");
        }
    }

    /// Marks the connection dead and releases every stream on it. Callers waiting on
    /// a stream see its channel close and decide (by `written`) what to do.
    pub fn kill(&self, reason: &str) {
        if self.status.send_replace(Status::Dead) == Status::Dead {
            return;
        }
        info!(conn = self.connection_id, addr = %self.addr, reason, "connection closed");
        self.sem.close();
        let entries = std::mem::take(&mut self.table.lock().unwrap().map);
        let lost = entries.values().filter(|e| e.written.load(Ordering::SeqCst)).count() as u64;
        self.stats.closed.fetch_add(lost, Ordering::SeqCst);
        drop(entries);
    }

    /// Turns a command into the frame to write, updating the table.
    fn prepare(&self, cmd: Cmd) -> Option<Frame> {
        match cmd {
            Cmd::Pong { nonce } => Some(Frame::new(Kind::Pong, 0, &Ping { nonce })),
            Cmd::Window { id, seq, increment } => {
                let t = self.table.lock().unwrap();
                match t.map.get(&id) {
                    Some(e) if e.seq == seq && e.tx.is_some() => {
                        Some(Frame::new(Kind::Window, id, &Window { increment }))
                    }
                    // Ended or cancelled meanwhile: no more data is wanted or coming.
                    _ => None,
                }
            }
            Cmd::Cancel { id, seq } => {
                let t = self.table.lock().unwrap();
                match t.map.get(&id) {
                    Some(e) if e.seq == seq && e.written.load(Ordering::SeqCst) => Some(Frame::new(
                        Kind::Cancel,
                        id,
                        &Cancel {
                            reason: "cancelled by the client".into(),
                        },
                    )),
                    _ => None,
                }
            }
            Cmd::Open {
                id,
                seq,
                frame,
                in_session,
            } => {
                let mut t = self.table.lock().unwrap();
                let usable = match self.status() {
                    Status::Up => true,
                    Status::GoAway => in_session,
                    Status::Dead => false,
                };
                match t.map.get(&id) {
                    Some(e) if e.seq == seq => {
                        if usable && e.tx.is_some() {
                            e.written.store(true, Ordering::SeqCst);
                            self.stats.opened.fetch_add(1, Ordering::SeqCst);
                            Some(frame)
                        } else {
                            // GOAWAY arrived first (or the caller left): not sent, the
                            // caller sees its channel close with `written == false`.
                            let e = t.map.remove(&id);
                            drop(t);
                            drop(e);
                            self.close_if_drained();
                            None
                        }
                    }
                    _ => None,
                }
            }
        }
    }
}

/// What the reader does after routing a frame.
enum Flow {
    Continue,
    /// The stream's channel is full: hold the frame and stop reading until it has room.
    Pause(QueueTx, Frame),
    Stop,
}

impl ConnHandle {
    /// Queues a command for the writer without waiting: at once when the channel has
    /// room (it is sized for every stream's commands), else from a task.
    fn send_later(&self, cmd: Cmd) {
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.cmd.try_send(cmd) {
            let tx = self.cmd.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = tx.send(cmd).await;
                });
            }
        }
    }

    /// Whether new streams may be opened here.
    pub fn usable(&self) -> bool {
        self.shared.status() == Status::Up
    }

    /// Opens a stream: waits for a permit under `max_streams`, picks a free id, and
    /// queues the `REQUEST` frame built by `build` for the writer.
    pub async fn open(&self, buffer: usize, build: impl FnOnce(u32) -> Frame) -> Result<StreamGuard, Unavailable> {
        self.open_if(buffer, build, false).await
    }

    /// [`ConnHandle::open`] for a session's statement: also after `GOAWAY` (a session
    /// open at a drain goes on until the dispatcher's `drain_timeout`).
    pub async fn open_in_session(
        &self,
        buffer: usize,
        build: impl FnOnce(u32) -> Frame,
    ) -> Result<StreamGuard, Unavailable> {
        self.open_if(buffer, build, true).await
    }

    async fn open_if(
        &self,
        buffer: usize,
        build: impl FnOnce(u32) -> Frame,
        in_session: bool,
    ) -> Result<StreamGuard, Unavailable> {
        // After GOAWAY the permits are closed (new requests move to the next connection);
        // a session's statement still goes here, unbounded by them: a session runs one at
        // a time.
        let permit = if in_session {
            // Never behind the opens that wait for these very sessions to end.
            self.shared.sem.clone().try_acquire_owned().ok()
        } else {
            Some(self.shared.sem.clone().acquire_owned().await.map_err(|_| Unavailable)?)
        };
        // With flow control the dispatcher sends at most `window` data frames ahead of
        // the reader, plus ERROR and END: the channel never fills, and the connection
        // never has to stop reading for one stream.
        let capacity = match self.shared.window {
            0 => buffer.max(1),
            w => w as usize + 2,
        };
        let (tx, rx) = queue(capacity);
        let written = Arc::new(AtomicBool::new(false));
        let (id, seq) = {
            let mut t = self.shared.table.lock().unwrap();
            let status = self.shared.status();
            if !(status == Status::Up || in_session && status == Status::GoAway) {
                return Err(Unavailable);
            }
            let id = loop {
                t.next_id = t.next_id.wrapping_add(1);
                if t.next_id != 0 && !t.map.contains_key(&t.next_id) {
                    break t.next_id;
                }
            };
            t.next_seq += 1;
            let seq = t.next_seq;
            t.map.insert(
                id,
                Entry {
                    seq,
                    tx: Some(tx),
                    written: written.clone(),
                    _permit: permit,
                },
            );
            (id, seq)
        };
        let guard = StreamGuard {
            conn: self.clone(),
            id,
            seq,
            rx,
            written,
            finished: false,
            consumed: 0,
            credited_at: Instant::now(),
        };
        let frame = build(id);
        self.cmd
            .send(Cmd::Open {
                id,
                seq,
                frame,
                in_session,
            })
            .await
            .map_err(|_| Unavailable)?;
        Ok(guard)
    }
}

/// Connects to `addr`, performs the handshake and starts the connection's tasks.
pub(crate) async fn connect(addr: &str, cfg: &ClientConfig, stats: Arc<Stats>) -> Result<ConnHandle, Error> {
    let handshake = async {
        let sock = TcpStream::connect(addr)
            .await
            .map_err(|e| Error::client(ErrorCode::ConnectFailed, false, format!("connect to {addr}: {e}")))?;
        let _ = sock.set_nodelay(true);
        let (r, w): (BoxRead, BoxWrite) = match &cfg.tls {
            None => {
                let (r, w) = sock.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(tls) => crate::tls::connect(addr, tls, sock).await?,
        };
        let mut reader = FramedRead::new(r, FrameCodec::default());
        let mut writer = FramedWrite::new(w, FrameCodec::default());
        let hello = Hello {
            version_major: PROTOCOL_MAJOR,
            version_minor: PROTOCOL_MINOR,
            role: Role::Client,
            token: Some(cfg.token.clone()),
            secret: None,
            slot: None,
            pid: Some(std::process::id()),
            name: Some(cfg.name.clone()),
            stream_window: Some(cfg.stream_buffer.clamp(1, u32::MAX as usize) as u32),
        };
        writer
            .send(Frame::new(Kind::Hello, 0, &hello))
            .await
            .map_err(|e| Error::client(ErrorCode::ConnectFailed, false, format!("send HELLO to {addr}: {e}")))?;
        let frame = match reader.next().await {
            Some(Ok(f)) => f,
            // Under TLS 1.3 a dispatcher that refuses our certificate says so only now.
            Some(Err(osprey_protocol::ProtocolError::Io(e))) if cfg.tls.is_some() => {
                return Err(Error::client(
                    ErrorCode::ConnectFailed,
                    false,
                    crate::tls::describe(addr, &e),
                ))
            }
            Some(Err(e)) => {
                let hint = if cfg.tls.is_none() && e.code() == ErrorCode::FrameTooLarge {
                    " (a TLS server? this port may require TLS)"
                } else {
                    ""
                };
                return Err(Error::client(
                    e.code(),
                    false,
                    format!("bad frame from {addr} during handshake: {e}{hint}"),
                ));
            }
            None => {
                return Err(Error::client(
                    ErrorCode::ConnectFailed,
                    false,
                    format!("{addr} closed the connection during the handshake"),
                ))
            }
        };
        let bad_body = |e: osprey_protocol::ProtocolError| Error::client(e.code(), false, format!("{addr}: {e}"));
        match frame.kind {
            Kind::HelloAck => {
                let ack: HelloAck = frame.body().map_err(bad_body)?;
                if ack.version_major != PROTOCOL_MAJOR {
                    return Err(Error::client(
                        ErrorCode::UnsupportedVersion,
                        false,
                        format!("{addr} speaks protocol {}.{}", ack.version_major, ack.version_minor),
                    ));
                }
                Ok((reader, writer, ack))
            }
            Kind::Error => Err(Error::from_body(frame.body::<ErrorBody>().map_err(bad_body)?)),
            other => Err(Error::client(
                ErrorCode::ProtocolViolation,
                false,
                format!("{addr} answered HELLO with {}", other.name()),
            )),
        }
    };
    let (reader, mut writer, ack) = tokio::time::timeout(cfg.connect_timeout, handshake)
        .await
        .map_err(|_| {
            Error::client(
                ErrorCode::ConnectFailed,
                false,
                format!("connecting to {addr} timed out after {:?}", cfg.connect_timeout),
            )
        })??;
    if cfg.read_your_writes && ack.version_minor < 3 {
        // It would ignore REQUEST.causal_gtid: reads may be served by a lagging replica.
        tracing::warn!(
            addr,
            version = %format!("{}.{}", ack.version_major, ack.version_minor),
            "read_your_writes is on, but this dispatcher predates protocol 1.3 and ignores it"
        );
    }
    let max_payload = (ack.max_payload as usize).clamp(1024, osprey_protocol::DEFAULT_MAX_PAYLOAD);
    *writer.encoder_mut() = FrameCodec::new(max_payload);
    let max_streams = ack
        .max_streams
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize) as u32);
    let mut ping_every = cfg.keepalive_interval;
    if ack.keepalive_interval_ms > 0 {
        ping_every = ping_every.min(Duration::from_millis(ack.keepalive_interval_ms));
    }
    let ping_every = ping_every.max(Duration::from_millis(10));
    let (status, _) = watch::channel(Status::Up);
    let shared = Arc::new(ConnShared {
        addr: addr.to_owned(),
        connection_id: ack.connection_id,
        max_payload,
        window: ack.stream_window,
        table: Mutex::new(Table::default()),
        status,
        sem: Arc::new(Semaphore::new(max_streams as usize)),
        stats,
    });
    info!(
        conn = ack.connection_id,
        addr,
        server = %ack.server,
        max_streams,
        max_payload,
        stream_window = ack.stream_window,
        "connected"
    );
    // Room for every stream's Open, WINDOW and Cancel plus control frames.
    let (cmd_tx, cmd_rx) = mpsc::channel(3 * (max_streams as usize).min(4096) + 64);
    let span = tracing::info_span!("osprey_conn", conn = ack.connection_id, addr);
    tokio::spawn(writer_task(shared.clone(), writer, cmd_rx, ping_every).instrument(span.clone()));
    tokio::spawn(reader_task(shared.clone(), reader, cmd_tx.downgrade(), cfg.keepalive_timeout).instrument(span));
    Ok(ConnHandle { shared, cmd: cmd_tx })
}

async fn writer_task(
    shared: Arc<ConnShared>,
    mut w: FramedWrite<BoxWrite, FrameCodec>,
    mut cmd_rx: mpsc::Receiver<Cmd>,
    ping_every: Duration,
) {
    let mut status = shared.subscribe();
    // One wait for the whole loop: a wait made anew in each round registers with the
    // status channel and leaves it again, for every request.
    let dead = status.wait_for(|s| *s == Status::Dead);
    tokio::pin!(dead);
    let mut tick = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut nonce = 0u64;
    let mut frames = Vec::with_capacity(WRITE_BATCH);
    loop {
        tokio::select! {
            biased;
            _ = &mut dead => break,
            cmd = cmd_rx.recv() => {
                let Some(cmd) = cmd else {
                    shared.kill("client dropped");
                    break;
                };
                frames.extend(shared.prepare(cmd));
                while frames.len() < WRITE_BATCH {
                    match cmd_rx.try_recv() {
                        Ok(cmd) => frames.extend(shared.prepare(cmd)),
                        Err(_) => break,
                    }
                }
            }
            _ = tick.tick() => {
                nonce += 1;
                frames.push(Frame::new(Kind::Ping, 0, &Ping { nonce }));
            }
        }
        if frames.is_empty() {
            continue;
        }
        let write = async {
            for f in frames.drain(..) {
                if f.kind == Kind::Request {
                    debug!(stream = f.stream, bytes = f.payload.len(), "REQUEST");
                }
                w.feed(f).await?;
            }
            SinkExt::<Frame>::flush(&mut w).await
        };
        let result = tokio::select! {
            r = write => r,
            _ = &mut dead => break,
        };
        if let Err(e) = result {
            shared.kill(&format!("write failed: {e}"));
            break;
        }
    }
    let _ = tokio::time::timeout(Duration::from_millis(100), SinkExt::<Frame>::close(&mut w)).await;
}

async fn reader_task(
    shared: Arc<ConnShared>,
    mut r: FramedRead<BoxRead, FrameCodec>,
    cmd: mpsc::WeakSender<Cmd>,
    keepalive_timeout: Duration,
) {
    let mut status = shared.subscribe();
    let dead = status.wait_for(|s| *s == Status::Dead);
    let mut last_rx = Instant::now();
    // Armed once and moved only when it fires: a frame just moves `last_rx`, where a
    // timer made anew for each frame would enter the timer wheel and leave it again.
    let idle = tokio::time::sleep_until(last_rx + keepalive_timeout);
    tokio::pin!(dead, idle);
    let mut paused: Option<(QueueTx, Frame)> = None;
    loop {
        let room = async {
            match &paused {
                Some((tx, _)) => tx.room().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = &mut dead => break,
            room = room => {
                let (tx, frame) = paused.take().expect("paused");
                if room {
                    // The reader is the stream's only sender: the room it saw is there.
                    let sent = tx.try_send(frame);
                    debug_assert!(!matches!(sent, Err(TrySendError::Full(_))), "room taken by another sender");
                }
                last_rx = Instant::now();
                shared.close_if_drained();
            }
            f = r.next(), if paused.is_none() => {
                last_rx = Instant::now();
                match f {
                    None => {
                        shared.kill("closed by the dispatcher");
                        break;
                    }
                    Some(Err(e)) => {
                        shared.kill(&format!("bad frame from the dispatcher: {e}"));
                        break;
                    }
                    Some(Ok(frame)) => match route(&shared, frame, &cmd) {
                        Flow::Continue => shared.close_if_drained(),
                        Flow::Pause(tx, frame) => paused = Some((tx, frame)),
                        Flow::Stop => break,
                    },
                }
            }
            _ = &mut idle, if paused.is_none() => {
                let due = last_rx + keepalive_timeout;
                if Instant::now() < due {
                    idle.as_mut().reset(due);
                    continue;
                }
                shared.kill(&format!("no frame from the dispatcher for {keepalive_timeout:?}"));
                break;
            }
        }
    }
    // A frame that had already arrived still reaches its stream (it may be its END).
    if let Some((tx, frame)) = paused {
        tokio::spawn(async move {
            if tx.room().await {
                let sent = tx.try_send(frame);
                debug_assert!(
                    !matches!(sent, Err(TrySendError::Full(_))),
                    "room taken by another sender"
                );
            }
        });
    }
}

fn route(shared: &ConnShared, frame: Frame, cmd: &mpsc::WeakSender<Cmd>) -> Flow {
    if frame.stream == 0 {
        match frame.kind {
            Kind::Ping => {
                if let (Ok(p), Some(tx)) = (frame.body::<Ping>(), cmd.upgrade()) {
                    let _ = tx.try_send(Cmd::Pong { nonce: p.nonce });
                }
            }
            Kind::Pong => {}
            Kind::GoAway => {
                let why = frame
                    .body::<osprey_protocol::GoAway>()
                    .map(|g| g.message)
                    .unwrap_or_default();
                info!(
                    conn = shared.connection_id,
                    why, "GOAWAY: no new streams on this connection"
                );
                shared.set_goaway();
            }
            Kind::Error => {
                let reason = match frame.body::<ErrorBody>() {
                    Ok(b) => format!("dispatcher error: {b}"),
                    Err(e) => format!("dispatcher error (unreadable: {e})"),
                };
                warn!(conn = shared.connection_id, "{reason}");
                shared.kill(&reason);
                return Flow::Stop;
            }
            other => {
                shared.kill(&format!("unexpected {} frame on stream 0", other.name()));
                return Flow::Stop;
            }
        }
        return Flow::Continue;
    }
    let mut t = shared.table.lock().unwrap();
    if !t.map.contains_key(&frame.stream) {
        debug!(
            stream = frame.stream,
            kind = frame.kind.name(),
            "frame for a stream that is not open; ignored"
        );
        return Flow::Continue;
    }
    // END takes the entry out, with its own handle, whose drop then tells the reader that
    // nothing follows; any other frame is sent under the table's lock (nothing takes the
    // table's lock while holding a queue's): no handle cloned for each frame.
    let ended = if frame.kind == Kind::End {
        shared.stats.closed.fetch_add(1, Ordering::SeqCst);
        t.map.remove(&frame.stream)
    } else {
        None
    };
    let tx = match &ended {
        Some(e) => e.tx.as_ref(),
        None => t.map.get(&frame.stream).and_then(|e| e.tx.as_ref()),
    };
    let Some(tx) = tx else {
        debug!(
            stream = frame.stream,
            kind = frame.kind.name(),
            "frame for a cancelled stream; discarded"
        );
        return Flow::Continue;
    };
    match tx.try_send(frame) {
        Ok(()) => Flow::Continue,
        Err(TrySendError::Full(frame)) => Flow::Pause(tx.clone(), frame),
        Err(TrySendError::Closed) => Flow::Continue,
    }
}

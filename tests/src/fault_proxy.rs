//! A fault-injecting loopback TCP proxy for the integration tests.
//!
//! [`FaultProxy::start`] listens on `127.0.0.1:0` and forwards every accepted connection to one
//! upstream address. The [`Mode`] can be switched at any time with [`FaultProxy::set_mode`]; the
//! mode lives in a `tokio::sync::watch` channel, so every connection task sees a change at once.
//!
//! # What a client sees, mode by mode
//!
//! * [`Mode::Pass`]: a plain TCP relay. Half-closes (FIN) are forwarded. When one side resets
//!   the connection, the proxy resets the other side too; other I/O errors close it (FIN).
//! * [`Mode::Latency`]: every chunk read from one side is written to the other side `d` later
//!   (per direction, so an echo round trip gets at least `2 * d` slower). Order is kept. Chunks
//!   still queued when the mode leaves `Latency` are delivered at once (or dropped if the new mode
//!   is a blackhole).
//! * [`Mode::Blackhole`]: both sockets stay open and the proxy keeps reading from both (so the
//!   peers' writes succeed), but every byte is dropped, including bytes already queued inside
//!   the proxy. A FIN or reset from either side is held back while the blackhole lasts (like a
//!   dead NAT entry, the other side learns nothing) and passed on once it ends. Bytes dropped
//!   during a blackhole are lost for good: switching back to `Pass` does not replay them.
//! * [`Mode::Reset`]: every open connection is reset on both sides (`SO_LINGER` 0, then close),
//!   so the peers' next read fails with `ECONNRESET` (or, rarely, sees EOF). New connections are
//!   accepted (the kernel completes the handshake) and reset at once without contacting the
//!   upstream: the client's first read fails with `ECONNRESET`, or, if the RST lands before a
//!   non-blocking connect is polled (usual with tokio on loopback), the connect itself fails
//!   with `ECONNRESET`.
//! * [`Mode::Refuse`]: the listening socket stops listening at once (`shutdown(SHUT_RD)` on the
//!   listener inside `set_mode`, then close), so a new `connect` fails fast with
//!   `ECONNREFUSED`; connections waiting in the accept backlog are reset. Open connections keep
//!   passing. Leaving `Refuse` re-binds the *same* port (with `SO_REUSEADDR`) inside `set_mode`,
//!   so [`FaultProxy::addr`] never changes. Should the re-bind fail (another socket took the
//!   port in between, very unlikely on loopback), the proxy logs a warning and retries every
//!   50 ms.
//! * [`Mode::Flap`]: alternates `Pass` for `pass`, then `Blackhole` for `blackhole`, starting
//!   with `Pass` at the moment of `set_mode`; the schedule is shared by all connections.
//!
//! If the upstream cannot be reached, the accepted client connection is reset (what the client
//! sees is as for a new connection in `Reset`).
//!
//! Buffers are bounded: each direction of each connection reads at most 16 KiB at a time and
//! holds at most 64 KiB (and 256 chunks) in flight between its reader and its writer.
//!
//! Dropping the [`FaultProxy`] stops listening at once and closes every connection (the tasks
//! are aborted; their sockets are closed within a runtime tick).

use std::future::Future;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

/// Largest single read, per direction.
const READ_CHUNK: usize = 16 * 1024;
/// Most bytes held between a direction's reader and writer.
const MAX_IN_FLIGHT_BYTES: usize = 64 * 1024;
/// Most chunks held between a direction's reader and writer.
const MAX_IN_FLIGHT_CHUNKS: usize = 256;
/// Delay between attempts to re-bind the listening port after leaving `Refuse` failed.
const REBIND_RETRY: Duration = Duration::from_millis(50);

/// What the proxy does to the traffic. See the module docs for what a client sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Copy both ways.
    Pass,
    /// Deliver every chunk this much later (both directions), order kept.
    Latency(Duration),
    /// Keep sockets open, silently drop all bytes both ways.
    Blackhole,
    /// Reset every open connection now and reset new ones on accept.
    Reset,
    /// Refuse new connections (`ECONNREFUSED`); open ones keep passing.
    Refuse,
    /// Alternate pass / blackhole on this schedule, starting with pass.
    Flap { pass: Duration, blackhole: Duration },
}

/// What a connection does with a chunk right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    Pass,
    Delay(Duration),
    Drop,
}

/// The value in the watch channel.
#[derive(Clone, Debug)]
struct State {
    mode: Mode,
    /// When `mode` was set (the origin of a `Flap` schedule).
    since: Instant,
    /// Bumped by `reset_all`.
    reset_gen: u64,
}

impl State {
    fn effect(&self, now: Instant) -> Effect {
        match self.mode {
            Mode::Pass | Mode::Reset | Mode::Refuse => Effect::Pass,
            Mode::Latency(d) => Effect::Delay(d),
            Mode::Blackhole => Effect::Drop,
            Mode::Flap { pass, blackhole } => {
                let period = (pass + blackhole).as_nanos();
                if period == 0 {
                    return Effect::Pass;
                }
                let pos = now.saturating_duration_since(self.since).as_nanos() % period;
                if pos < pass.as_nanos() {
                    Effect::Pass
                } else {
                    Effect::Drop
                }
            }
        }
    }

    /// The next instant after `now` at which `effect` changes without a new mode being set.
    fn next_boundary(&self, now: Instant) -> Option<Instant> {
        let Mode::Flap { pass, blackhole } = self.mode else {
            return None;
        };
        let period = (pass + blackhole).as_nanos();
        if period == 0 || pass.is_zero() || blackhole.is_zero() {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.since).as_nanos();
        let pos = elapsed % period;
        let to_next = if pos < pass.as_nanos() {
            pass.as_nanos() - pos
        } else {
            period - pos
        };
        let nanos = u64::try_from(to_next).unwrap_or(u64::MAX);
        Some(now + Duration::from_nanos(nanos))
    }

    fn wants_reset(&self, gen_at_accept: u64) -> bool {
        self.mode == Mode::Reset || self.reset_gen != gen_at_accept
    }
}

struct ListenerSlot {
    listener: Option<Arc<TcpListener>>,
    /// Set by `Drop`: never listen again.
    closed: bool,
}

struct Inner {
    upstream: SocketAddr,
    addr: SocketAddr,
    runtime: tokio::runtime::Handle,
    state: watch::Sender<State>,
    /// Also serialises mode changes with listener changes.
    listener: Mutex<ListenerSlot>,
    accepted: AtomicU64,
    open: AtomicUsize,
}

impl Inner {
    fn slot(&self) -> MutexGuard<'_, ListenerSlot> {
        self.listener.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the listening socket match the mode: stopped in `Refuse` (and after `Drop`),
    /// listening otherwise. Call with the slot locked.
    fn sync_listener(&self, slot: &mut ListenerSlot) {
        let refuse = slot.closed || self.state.borrow().mode == Mode::Refuse;
        if refuse {
            if let Some(listener) = slot.listener.take() {
                // Stops listening now even though the accept task may still hold a clone:
                // new SYNs get a RST, queued connections are reset, accept() fails (EINVAL).
                let _ = SockRef::from(&*listener).shutdown(Shutdown::Read);
            }
        } else if slot.listener.is_none() {
            let _enter = self.runtime.enter();
            match bind_listener(self.addr) {
                Ok(listener) => slot.listener = Some(Arc::new(listener)),
                Err(e) => tracing::warn!(addr = %self.addr, error = %e, "fault proxy: re-bind failed, will retry"),
            }
        }
    }
}

fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// A loopback TCP proxy whose [`Mode`] can be switched while connections are open.
pub struct FaultProxy {
    inner: Arc<Inner>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards every connection to `upstream`, in [`Mode::Pass`].
    /// Must be called within a Tokio runtime.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = bind_listener(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let (state, state_rx) = watch::channel(State {
            mode: Mode::Pass,
            since: Instant::now(),
            reset_gen: 0,
        });
        let inner = Arc::new(Inner {
            upstream,
            addr,
            runtime: tokio::runtime::Handle::current(),
            state,
            listener: Mutex::new(ListenerSlot {
                listener: Some(Arc::new(listener)),
                closed: false,
            }),
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
        });
        let cancel = CancellationToken::new();
        let task = tokio::spawn(accept_loop(inner.clone(), state_rx, cancel.clone()));
        tracing::debug!(%addr, %upstream, "fault proxy started");
        Ok(FaultProxy { inner, cancel, task })
    }

    /// The address clients connect to. Stays the same across `Refuse`.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Switches the mode for open connections at once and for new ones. When this returns, a
    /// switch to `Refuse` already refuses connects and a switch away from it already accepts.
    pub fn set_mode(&self, mode: Mode) {
        let mut slot = self.inner.slot();
        self.inner.state.send_modify(|s| {
            s.mode = mode;
            s.since = Instant::now();
        });
        self.inner.sync_listener(&mut slot);
        tracing::debug!(addr = %self.inner.addr, ?mode, "fault proxy mode set");
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.inner.state.borrow().mode
    }

    /// Connections accepted so far (including those reset on accept in `Reset` mode).
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently relayed (accepted and not yet closed by the proxy).
    pub fn open_connections(&self) -> usize {
        self.inner.open.load(Ordering::SeqCst)
    }

    /// Resets every open connection once (both sides), leaving the mode unchanged.
    pub fn reset_all(&self) {
        self.inner.state.send_modify(|s| s.reset_gen += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cancel.cancel();
        {
            let mut slot = self.inner.slot();
            slot.closed = true;
            self.inner.sync_listener(&mut slot);
        }
        // Dropping the accept task drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

/// Decrements the open-connection count when a connection task ends (or is aborted).
struct OpenGuard(Arc<Inner>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_opt(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

async fn accept_loop(inner: Arc<Inner>, mut state_rx: watch::Receiver<State>, cancel: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        // Mark the state seen before looking at the listener, so any later change wakes us.
        let refuse = state_rx.borrow_and_update().mode == Mode::Refuse;
        let listener = {
            let mut slot = inner.slot();
            if !cancel.is_cancelled() {
                inner.sync_listener(&mut slot);
            }
            slot.listener.clone()
        };
        let retry_bind = listener.is_none() && !refuse;
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            changed = state_rx.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = accept_opt(listener.as_deref()) => match accepted {
                Ok((client, peer)) => {
                    inner.accepted.fetch_add(1, Ordering::SeqCst);
                    let (state, gen) = {
                        let s = state_rx.borrow();
                        (s.mode, s.reset_gen)
                    };
                    if state == Mode::Reset {
                        tracing::debug!(%peer, "fault proxy: reset on accept");
                        rst(&client);
                        continue;
                    }
                    inner.open.fetch_add(1, Ordering::SeqCst);
                    let guard = OpenGuard(inner.clone());
                    conns.spawn(run_conn(guard, client, state_rx.clone(), gen, cancel.clone()));
                }
                Err(e) => {
                    let still_current = {
                        let slot = inner.slot();
                        match (&slot.listener, &listener) {
                            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                            _ => false,
                        }
                    };
                    if still_current {
                        // e.g. EMFILE: do not spin.
                        tracing::warn!(error = %e, "fault proxy: accept failed");
                        sleep(Duration::from_millis(10)).await;
                    }
                }
            },
            _ = sleep(REBIND_RETRY), if retry_bind => {}
        }
    }
}

/// Arranges for a RST when `stream` is closed (dropped).
fn rst(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Resolves once `Reset` is set or `reset_all` is called after the connection was accepted.
async fn reset_requested(mut rx: watch::Receiver<State>, gen_at_accept: u64) {
    loop {
        if rx.borrow_and_update().wants_reset(gen_at_accept) {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

enum End {
    Close,
    Reset,
}

async fn run_conn(
    guard: OpenGuard,
    client: TcpStream,
    rx: watch::Receiver<State>,
    gen_at_accept: u64,
    cancel: CancellationToken,
) {
    let upstream_addr = guard.0.upstream;
    let upstream = tokio::select! {
        r = TcpStream::connect(upstream_addr) => r,
        _ = reset_requested(rx.clone(), gen_at_accept) => {
            rst(&client);
            return;
        }
        _ = cancel.cancelled() => return,
    };
    let mut upstream = match upstream {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(upstream = %upstream_addr, error = %e, "fault proxy: upstream connect failed");
            rst(&client);
            return;
        }
    };
    let mut client = client;
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);

    let end = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        let relay = futures::future::try_join(direction(cr, uw, rx.clone()), direction(ur, cw, rx.clone()));
        tokio::select! {
            r = relay => match r {
                Ok(_) => End::Close,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => End::Reset,
                Err(e) => {
                    tracing::debug!(error = %e, "fault proxy: connection error");
                    End::Close
                }
            },
            _ = reset_requested(rx.clone(), gen_at_accept) => End::Reset,
            _ = cancel.cancelled() => End::Close,
        }
    };
    if let End::Reset = end {
        rst(&client);
        rst(&upstream);
    }
}

struct Chunk {
    deadline: Instant,
    data: Bytes,
    _budget: OwnedSemaphorePermit,
}

/// Relays one direction until EOF (then half-closes the writer) or an error.
async fn direction(r: ReadHalf<'_>, w: WriteHalf<'_>, rx: watch::Receiver<State>) -> io::Result<()> {
    let (tx, chunks) = mpsc::channel(MAX_IN_FLIGHT_CHUNKS);
    let budget = Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES));
    futures::future::try_join(read_side(r, tx, budget, rx.clone()), write_side(w, chunks, rx)).await?;
    Ok(())
}

/// The current effect; marks the state as seen so a later change wakes `shift`.
fn effect(rx: &mut watch::Receiver<State>) -> Effect {
    rx.borrow_and_update().effect(Instant::now())
}

/// Resolves when the effect may have changed: a new state, or the next `Flap` boundary.
async fn shift(rx: &mut watch::Receiver<State>) {
    let boundary = rx.borrow().next_boundary(Instant::now());
    let changed = async {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    match boundary {
        Some(at) => {
            tokio::select! {
                _ = changed => {}
                _ = sleep_until(at) => {}
            }
        }
        None => changed.await,
    }
}

/// Runs `fut` unless the effect turns to `Drop` first (then `None`).
async fn unless_dropping<F: Future>(fut: F, rx: &mut watch::Receiver<State>) -> Option<F::Output> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            out = &mut fut => return Some(out),
            _ = shift(rx) => {
                if effect(rx) == Effect::Drop {
                    return None;
                }
            }
        }
    }
}

/// Waits while the effect is `Drop` (a blackhole holds back FIN and errors too).
async fn while_dropping(rx: &mut watch::Receiver<State>) {
    while effect(rx) == Effect::Drop {
        shift(rx).await;
    }
}

async fn read_side(
    mut r: ReadHalf<'_>,
    tx: mpsc::Sender<Chunk>,
    budget: Arc<Semaphore>,
    mut rx: watch::Receiver<State>,
) -> io::Result<()> {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) => {
                while_dropping(&mut rx).await;
                return Ok(()); // dropping `tx` makes the writer half-close
            }
            Ok(n) => n,
            Err(e) => {
                while_dropping(&mut rx).await;
                return Err(e);
            }
        };
        let now = Instant::now();
        let deadline = match effect(&mut rx) {
            Effect::Drop => continue,
            Effect::Pass => now,
            // A delay too large for `Instant` means "never" in practice.
            Effect::Delay(d) => now.checked_add(d).unwrap_or(now + Duration::from_secs(1 << 32)),
        };
        let permits = u32::try_from(n).expect("read chunk fits u32");
        let Some(permit) = unless_dropping(budget.clone().acquire_many_owned(permits), &mut rx).await else {
            continue;
        };
        let permit = permit.expect("budget semaphore is never closed");
        let chunk = Chunk {
            deadline,
            data: Bytes::copy_from_slice(&buf[..n]),
            _budget: permit,
        };
        match unless_dropping(tx.reserve(), &mut rx).await {
            None => continue,
            Some(Ok(slot)) => slot.send(chunk),
            // The writer is gone: it failed, and its error ends the connection.
            Some(Err(_)) => return Ok(()),
        }
    }
}

async fn write_side(
    mut w: WriteHalf<'_>,
    mut chunks: mpsc::Receiver<Chunk>,
    mut rx: watch::Receiver<State>,
) -> io::Result<()> {
    while let Some(chunk) = chunks.recv().await {
        // Wait for the deadline while the mode is still `Latency`; otherwise deliver now.
        while chunk.deadline > Instant::now() && matches!(effect(&mut rx), Effect::Delay(_)) {
            tokio::select! {
                _ = sleep_until(chunk.deadline) => break,
                _ = shift(&mut rx) => {}
            }
        }
        let mut data = &chunk.data[..];
        while !data.is_empty() && effect(&mut rx) != Effect::Drop {
            tokio::select! {
                written = w.write(data) => {
                    let n = written?;
                    if n == 0 {
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                    data = &data[n..];
                }
                _ = shift(&mut rx) => {}
            }
        }
    }
    w.shutdown().await
}

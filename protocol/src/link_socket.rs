//! The worker link's Unix socket (either end), registered with the runtime for
//! *readability only*.
//!
//! tokio registers a `UnixStream` for reading and writing, edge-triggered. For a Unix
//! socket that means an `EPOLLOUT` edge every time the peer reads what was written (the
//! kernel's `unix_write_space` runs as the peer consumes each frame): a side asleep is
//! woken for nothing. The dispatcher saw 0.72 such wake-ups per request at one client in
//! flight (`perf record -e sched:sched_waking`, 30 % of all its wake-ups), each costing
//! this kind of guest a trip through the host; the worker ~15 % of requests
//! (docs/BENCHMARKS.md, "Issue 25, step 2: no wake-up for the worker's reads of the link").
//!
//! Writes are plain non-blocking writes. Only when the socket is full (the peer is not
//! reading) does a writer wait for writability, on a duplicate descriptor registered for
//! that alone and dropped as soon as a write goes through. Reads go straight into the
//! buffer's spare capacity, without zeroing it first.

use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

type Sock = Arc<AsyncFd<StdUnixStream>>;

/// Splits a connected, non-blocking socket into its two halves (see the module's doc).
/// Must run inside the runtime. The socket closes when both halves are dropped.
pub fn split(socket: StdUnixStream) -> io::Result<(LinkRead, LinkWrite)> {
    socket.set_nonblocking(true)?;
    let sock = Arc::new(watch(socket, Interest::READABLE)?);
    Ok((LinkRead(sock.clone()), LinkWrite { sock, full: None }))
}

fn watch(sock: StdUnixStream, interest: Interest) -> io::Result<AsyncFd<StdUnixStream>> {
    // SAFETY: the `AsyncFd` owns the `UnixStream`, which owns its descriptor: it stays open,
    // and `as_raw_fd` returns the same one, until the `AsyncFd` is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(sock, interest) }?)
}

/// The read half.
pub struct LinkRead(Sock);

impl AsyncRead for LinkRead {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            // SAFETY: `recv` only writes into the region (at most `len` bytes, never reads
            // it), and only the `n` bytes it reports written are marked initialised below.
            let unfilled = unsafe { buf.unfilled_mut() };
            let len = unfilled.len();
            let dst = unfilled.as_mut_ptr().cast::<libc::c_void>();
            let read = guard.try_io(|fd| {
                // SAFETY: `dst` points to `len` writable bytes (above); `fd` is open for
                // as long as the `AsyncFd` that the guard borrows.
                let n = unsafe { libc::recv(fd.as_raw_fd(), dst, len, 0) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            });
            match read {
                Ok(Ok(n)) => {
                    if n > 0 && n < len {
                        // A short read emptied the socket (tokio's own streams assume the
                        // same): wait for the next edge rather than pay a `recv` for EAGAIN.
                        guard.clear_ready();
                    }
                    // SAFETY: `recv` wrote these `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

/// The write half.
pub struct LinkWrite {
    sock: Sock,
    /// While the socket is full: a duplicate of it, registered for writability.
    full: Option<AsyncFd<StdUnixStream>>,
}

impl LinkWrite {
    /// Writes what the socket takes now; `WouldBlock` when it is full.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut sock: &StdUnixStream = self.sock.get_ref();
        sock.write(buf)
    }

    /// Waits until the socket takes writes again (rare: the peer is not reading).
    pub async fn writable(&self) -> io::Result<()> {
        let dup = StdUnixStream::from(self.sock.get_ref().as_fd().try_clone_to_owned()?);
        let fd = watch(dup, Interest::WRITABLE)?;
        let _ready = fd.writable().await?;
        Ok(())
    }

    fn poll_io(
        &mut self,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&StdUnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            let Some(full) = &self.full else {
                match op(self.sock.get_ref()) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // Registered after the EAGAIN: a socket drained in between is
                        // reported writable at once (epoll checks at registration).
                        let dup = StdUnixStream::from(self.sock.get_ref().as_fd().try_clone_to_owned()?);
                        self.full = Some(watch(dup, Interest::WRITABLE)?);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    done => return Poll::Ready(done),
                }
                continue;
            };
            let mut guard = ready!(full.poll_write_ready(cx))?;
            let done = match guard.try_io(|_| op(self.sock.get_ref())) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(done) => done,
                Err(_would_block) => continue,
            };
            self.full = None;
            return Poll::Ready(done);
        }
    }
}

impl AsyncWrite for LinkWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(cx, |s| (&*s).write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(cx, |s| (&*s).write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.sock.get_ref().shutdown(Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A write that fills the socket waits for the peer to read, then goes through; what
    /// was written arrives whole and in order; a shut-down write half is the peer's EOF,
    /// and the peer's is ours.
    #[tokio::test]
    async fn a_full_socket_waits_for_the_reader_and_loses_nothing() {
        let (a, b) = StdUnixStream::pair().unwrap();
        let (mut rd, mut wr) = split(a).unwrap();
        b.set_nonblocking(true).unwrap();
        let (mut peer_rd, mut peer_wr) = tokio::net::UnixStream::from_std(b).unwrap().into_split();
        let data: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let writer = tokio::spawn(async move {
            wr.write_all(&data).await.unwrap();
            wr.shutdown().await.unwrap();
            wr
        });
        // Far more than a Unix socket's buffer: the writer must have hit EAGAIN.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "4 MiB cannot fit in the socket unread");
        let mut got = Vec::new();
        peer_rd.read_to_end(&mut got).await.unwrap();
        let _wr = writer.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bytes changed on the way");

        peer_wr.write_all(b"hello").await.unwrap();
        drop(peer_wr);
        let mut back = Vec::new();
        rd.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"hello");
    }
}

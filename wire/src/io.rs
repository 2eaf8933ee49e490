//! Packets over the socket: the 4-byte header, sequence ids, 16 MiB chunking, and a write
//! buffer that drains while reading.
//!
//! Why not `PacketCodec`: it keeps one sequence id for both directions, but a pipelined
//! session writes command N+1 (sequence 0) while it still reads command N's response, so
//! the two directions are counted apart here. The chunk framing itself is mysql_common's
//! (`ChunkDecoder`, `packet_to_chunks`).

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use mysql_common::proto::codec::error::PacketCodecError;
use mysql_common::proto::codec::{packet_to_chunks, ChunkDecoder, ChunkInfo};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::error::{Error, Result};

/// The largest packet either side may send: the protocol's maximum.
pub(crate) const MAX_PACKET: usize = 1024 * 1024 * 1024;
/// Buffers that grew past this for one large packet are given back once empty.
const SHRINK_ABOVE: usize = 4 * 1024 * 1024;
/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 64 * 1024;
/// How much of the responses [`PacketIo::flush`] reads ahead while its writes wait.
const FLUSH_READ_CAP: usize = 64 * 1024 * 1024;

fn closed() -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    ))
}

pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// Between taking the TCP stream for the TLS handshake and getting the TLS stream back.
    Gone,
}

impl Stream {
    fn poll_read_into(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        match self {
            Stream::Plain(s) => tokio_util::io::poll_read_buf(Pin::new(s), cx, buf),
            Stream::Tls(s) => tokio_util::io::poll_read_buf(Pin::new(s.as_mut()), cx, buf),
            Stream::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

pub(crate) struct PacketIo {
    pub(crate) stream: Stream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Bytes handed to the stream since the last flush (TLS may hold them).
    unflushed: bool,
    decoder: ChunkDecoder,
    packet: BytesMut,
    /// The sequence id the next packet read must carry.
    read_seq: u8,
}

impl PacketIo {
    pub(crate) fn new(tcp: TcpStream) -> PacketIo {
        PacketIo {
            stream: Stream::Plain(tcp),
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::new(),
            unflushed: false,
            decoder: ChunkDecoder::default(),
            packet: BytesMut::new(),
            read_seq: 0,
        }
    }

    /// The sequence id the next packet read must carry.
    pub(crate) fn set_read_seq(&mut self, seq: u8) {
        self.read_seq = seq;
    }

    pub(crate) fn read_seq(&self) -> u8 {
        self.read_seq
    }

    /// Bytes read from the socket but not yet taken as packets (must be none when
    /// switching to TLS: the server speaks first after the switch).
    pub(crate) fn buffered_in(&self) -> usize {
        self.rbuf.len()
    }

    /// Whether the read buffer holds the next chunk whole (at a packet boundary: the
    /// next packet's first chunk): reading it needs no `recv`.
    pub(crate) fn chunk_buffered(&self) -> bool {
        self.rbuf.len() >= 4 && {
            let len = usize::from(self.rbuf[0]) | usize::from(self.rbuf[1]) << 8 | usize::from(self.rbuf[2]) << 16;
            self.rbuf.len() >= 4 + len
        }
    }

    /// Queues one packet starting with sequence id `seq`, split into chunks as needed;
    /// returns the sequence id after it (the one the reply starts with).
    pub(crate) fn queue_packet(&mut self, seq: u8, mut payload: &[u8]) -> Result<u8> {
        if payload.len() > MAX_PACKET {
            return Err(Error::Refused(format!(
                "a packet of {} bytes exceeds the protocol maximum of {MAX_PACKET}",
                payload.len()
            )));
        }
        Ok(packet_to_chunks(seq, &mut payload, &mut self.wbuf))
    }

    /// Hands queued bytes to the socket as far as it takes them without waiting; `Ready`
    /// once everything is written and flushed.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.wbuf.is_empty() {
            match self.stream.poll_write(cx, &self.wbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    let _ = self.wbuf.split_to(n);
                    self.unflushed = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        if self.wbuf.capacity() > SHRINK_ABOVE {
            self.wbuf = BytesMut::new();
        }
        if self.unflushed {
            match self.stream.poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                other => return other,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Writes and flushes everything queued. While the socket takes no more, responses
    /// already coming are read into the buffer (up to [`FLUSH_READ_CAP`]): a server that
    /// blocks on writing to us stops reading our commands.
    pub(crate) async fn flush(&mut self) -> Result<()> {
        poll_fn(|cx| loop {
            match self.poll_write_out(cx) {
                Poll::Ready(r) => return Poll::Ready(r.map_err(Error::Io)),
                Poll::Pending if self.rbuf.len() >= FLUSH_READ_CAP => return Poll::Pending,
                Poll::Pending => {}
            }
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            match self.stream.poll_read_into(cx, &mut self.rbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(closed())),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::Io(e))),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }

    /// Writes what the socket takes right now, without waiting: pipelined commands go out
    /// while the caller is still consuming buffered rows of an earlier one.
    pub(crate) fn write_now(&mut self) -> Result<()> {
        if self.wbuf.is_empty() && !self.unflushed {
            return Ok(());
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.poll_write_out(&mut cx) {
            Poll::Ready(Err(e)) => Err(Error::Io(e)),
            _ => Ok(()),
        }
    }

    /// Reads more bytes, writing queued ones meanwhile: the server may wait for us to read
    /// before it reads the commands we are still writing.
    async fn fill(&mut self) -> Result<()> {
        poll_fn(|cx| {
            if let Poll::Ready(Err(e)) = self.poll_write_out(cx) {
                return Poll::Ready(Err(Error::Io(e)));
            }
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            match self.stream.poll_read_into(cx, &mut self.rbuf) {
                Poll::Ready(Ok(0)) => Poll::Ready(Err(closed())),
                Poll::Ready(Ok(_)) => Poll::Ready(Ok(())),
                Poll::Ready(Err(e)) => Poll::Ready(Err(Error::Io(e))),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    /// The next whole packet (chunks joined), checked for its sequence id.
    pub(crate) async fn read_packet(&mut self) -> Result<Bytes> {
        loop {
            match self.decoder.decode(&mut self.rbuf, &mut self.packet, MAX_PACKET) {
                Ok(Some(info)) => {
                    let seq = match info {
                        ChunkInfo::Middle(s) | ChunkInfo::Last(s) => s,
                    };
                    if seq != self.read_seq {
                        return Err(Error::protocol(format!(
                            "packet sequence id {seq}, expected {}",
                            self.read_seq
                        )));
                    }
                    self.read_seq = self.read_seq.wrapping_add(1);
                    if let ChunkInfo::Last(_) = info {
                        let packet = if self.packet.capacity() > SHRINK_ABOVE {
                            std::mem::take(&mut self.packet).freeze()
                        } else {
                            self.packet.split().freeze()
                        };
                        if self.rbuf.is_empty() && self.rbuf.capacity() > SHRINK_ABOVE {
                            self.rbuf = BytesMut::with_capacity(READ_CHUNK);
                        }
                        return Ok(packet);
                    }
                }
                Ok(None) => self.fill().await?,
                Err(PacketCodecError::PacketTooLarge) => {
                    return Err(Error::protocol(format!("a packet over {MAX_PACKET} bytes")))
                }
                Err(e) => return Err(Error::protocol(e.to_string())),
            }
        }
    }
}

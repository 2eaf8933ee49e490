//! MySQL packets on a client connection: a 3-byte length and a sequence id, then the
//! payload. Reads are bounded (a packet larger than the limit is refused before its bytes
//! are buffered); writes go into one buffer that is flushed once per answer, with payloads
//! of 16 MiB or more split as the protocol says.

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest payload of one packet; a longer one continues in the next.
pub const MAX_PAYLOAD: usize = 0xFF_FFFF;

#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    #[error("connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a packet of {len} bytes (more than {max})")]
    TooLarge { len: usize, max: usize },
    #[error("packet sequence {got}, expected {want}")]
    Sequence { got: u8, want: u8 },
    #[error("the client took none of our bytes for {0:?}")]
    WriteTimeout(Duration),
    #[error("a packet begun was not finished within {0:?}")]
    ReadTimeout(Duration),
}

/// The reading half: whole packets, their sequence ids checked.
pub struct PacketReader<R> {
    io: R,
    buf: BytesMut,
    /// The largest payload accepted (a whole command, continuation packets joined).
    max: usize,
    /// Once a packet's header is in, the rest must come within this (MySQL's
    /// `net_read_timeout`): a client that claims a length and stops holds nothing long.
    body_timeout: Duration,
}

impl<R: AsyncRead + Unpin> PacketReader<R> {
    pub fn new(io: R, max: usize, body_timeout: Duration) -> Self {
        PacketReader {
            io,
            buf: BytesMut::new(),
            max,
            body_timeout,
        }
    }

    /// The reader's bytes so far and its stream (to upgrade the stream to TLS: nothing may
    /// be buffered then, which the caller checks).
    pub fn buffered_len(&self) -> usize {
        self.buf.len()
    }

    pub fn into_inner(self) -> R {
        self.io
    }

    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The next logical packet (continuations joined) and the sequence id of its first
    /// part. `want`: the sequence id it must carry (`None`: any, a new command).
    pub async fn read(&mut self, want: Option<u8>) -> Result<(u8, BytesMut), PacketError> {
        let mut payload = BytesMut::new();
        let mut first_seq = None;
        let mut next = want;
        // The first header may take as long as the caller lets it (idle between commands);
        // once it is in, the whole packet (continuations included) has one deadline.
        self.fill(4).await?;
        let deadline = tokio::time::Instant::now() + self.body_timeout;
        loop {
            let limit = self.body_timeout;
            tokio::time::timeout_at(deadline, self.fill(4))
                .await
                .map_err(|_| PacketError::ReadTimeout(limit))??;
            let len = usize::from(self.buf[0]) | usize::from(self.buf[1]) << 8 | usize::from(self.buf[2]) << 16;
            let seq = self.buf[3];
            if let Some(w) = next {
                if seq != w {
                    return Err(PacketError::Sequence { got: seq, want: w });
                }
            }
            if payload.len() + len > self.max {
                return Err(PacketError::TooLarge {
                    len: payload.len() + len,
                    max: self.max,
                });
            }
            tokio::time::timeout_at(deadline, self.fill(4 + len))
                .await
                .map_err(|_| PacketError::ReadTimeout(limit))??;
            self.buf.advance(4);
            payload.extend_from_slice(&self.buf.split_to(len));
            first_seq.get_or_insert(seq);
            next = Some(seq.wrapping_add(1));
            if len < MAX_PAYLOAD {
                // Give back a buffer that grew for a big packet.
                if self.buf.is_empty() && self.buf.capacity() > 64 * 1024 {
                    self.buf = BytesMut::new();
                }
                return Ok((first_seq.unwrap_or(0), payload));
            }
        }
    }

    async fn fill(&mut self, n: usize) -> Result<(), PacketError> {
        while self.buf.len() < n {
            // Grown as bytes come, not by what a header claims.
            self.buf.reserve((n - self.buf.len()).clamp(1, 64 * 1024));
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return Err(PacketError::Closed);
            }
        }
        Ok(())
    }

    /// Whether bytes of a next command are already buffered.
    pub fn buffered(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// The writing half: packets are queued with their sequence ids and go out on `flush`,
/// or when the buffer passes [`PacketWriter::HIGH_WATER`].
pub struct PacketWriter<W> {
    io: W,
    buf: BytesMut,
    /// The sequence id of the next packet.
    pub seq: u8,
    timeout: Duration,
}

impl<W: AsyncWrite + Unpin> PacketWriter<W> {
    /// Past this many buffered bytes a result's rows go out before more are encoded.
    pub const HIGH_WATER: usize = 64 * 1024;

    pub fn new(io: W, timeout: Duration) -> Self {
        PacketWriter {
            io,
            buf: BytesMut::new(),
            seq: 0,
            timeout,
        }
    }

    /// Queues one logical packet (split at [`MAX_PAYLOAD`]).
    pub fn packet(&mut self, payload: &[u8]) {
        let mut rest = payload;
        loop {
            let n = rest.len().min(MAX_PAYLOAD);
            self.buf.reserve(4 + n);
            self.buf.put_uint_le(n as u64, 3);
            self.buf.put_u8(self.seq);
            self.seq = self.seq.wrapping_add(1);
            self.buf.put_slice(&rest[..n]);
            rest = &rest[n..];
            if n < MAX_PAYLOAD {
                return;
            }
        }
    }

    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Writes out what is queued. A client that takes no byte for the write timeout is
    /// given up (the slow-consumer rule of the client port).
    pub async fn flush(&mut self) -> Result<(), PacketError> {
        while !self.buf.is_empty() {
            match tokio::time::timeout(self.timeout, self.io.write_buf(&mut self.buf)).await {
                Err(_) => return Err(PacketError::WriteTimeout(self.timeout)),
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(0)) => return Err(PacketError::Closed),
                Ok(Ok(_)) => {}
            }
        }
        if self.buf.capacity() > 256 * 1024 {
            self.buf = BytesMut::new();
        }
        Ok(())
    }

    pub async fn shutdown(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.io.shutdown()).await;
    }

    pub fn into_inner(self) -> W {
        self.io
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn packets_round_trip_and_split_at_16_mib() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = PacketWriter::new(a, Duration::from_secs(5));
        let big = vec![7u8; MAX_PAYLOAD + 10];
        w.packet(b"\x03SELECT 1");
        w.packet(&big);
        let writer = tokio::spawn(async move {
            w.flush().await.unwrap();
            w
        });
        let mut r = PacketReader::new(b, 32 << 20, Duration::from_secs(5));
        let (seq, p) = r.read(None).await.unwrap();
        assert_eq!((seq, &p[..]), (0, &b"\x03SELECT 1"[..]));
        let (seq, p) = r.read(Some(1)).await.unwrap();
        assert_eq!((seq, p.len()), (1, big.len()));
        assert_eq!(writer.await.unwrap().seq, 3);
    }

    #[tokio::test]
    async fn a_packet_over_the_limit_is_refused_before_it_is_read() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(&[0xff, 0xff, 0x0f, 0]).await.unwrap();
        let mut r = PacketReader::new(b, 1024, Duration::from_secs(5));
        assert!(matches!(r.read(None).await, Err(PacketError::TooLarge { .. })));
    }
}

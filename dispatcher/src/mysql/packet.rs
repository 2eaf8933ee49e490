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

/// Length-encoded integer.
pub fn put_lenenc_int(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=250 => out.push(v as u8),
        251..=0xFFFF => {
            out.push(0xFC);
            out.extend_from_slice(&(v as u16).to_le_bytes());
        }
        0x1_0000..=0xFF_FFFF => {
            out.push(0xFD);
            out.extend_from_slice(&(v as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xFE);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Length-encoded string.
pub fn put_lenenc_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_lenenc_int(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A cursor over a packet's payload; every read is checked (bad input is an error, never a
/// panic).
pub struct Cursor<'a>(pub &'a [u8]);

impl<'a> Cursor<'a> {
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    pub fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    /// A NUL-terminated string (the NUL consumed).
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let i = self.0.iter().position(|&b| b == 0)?;
        let s = &self.0[..i];
        self.0 = &self.0[i + 1..];
        Some(s)
    }

    pub fn lenenc_int(&mut self) -> Option<u64> {
        match self.u8()? {
            n @ 0..=0xFA => Some(u64::from(n)),
            0xFC => self.u16().map(u64::from),
            0xFD => {
                let b = self.take(3)?;
                Some(u64::from(b[0]) | u64::from(b[1]) << 8 | u64::from(b[2]) << 16)
            }
            0xFE => {
                let b = self.take(8)?;
                Some(u64::from_le_bytes(b.try_into().ok()?))
            }
            _ => None,
        }
    }

    pub fn lenenc_bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.lenenc_int()?).ok()?;
        self.take(n)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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
        let mut c = Cursor(&[0xFC, 1]);
        assert_eq!(c.lenenc_int(), None, "a truncated length is no panic");
    }
}

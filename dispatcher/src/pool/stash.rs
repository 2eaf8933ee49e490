//! The worker's frames a link read while a slow client held it (to reach the worker's
//! answers to reclaims, see `Relay::side_work`), kept to act on in the order they came.
//!
//! They are the worker's next frames: every read that acts on the worker's frames goes
//! through [`next_frame`], which gives them before anything from the socket (the serving
//! loop's inline reads of buffered frames stop while any are kept; `side_work` only adds
//! to the back). So they are acted on exactly where the socket's frames would be: after the
//! serving loop's timers (a deadline that passed meanwhile is a timeout, whatever `END` is
//! among them), and before anything read later.

use std::collections::VecDeque;

use futures::{Stream, StreamExt};
use osprey_protocol::{Frame, ProtocolError, HEADER_LEN};

/// While a slow client holds a worker link with requests written behind its current one,
/// the link reads on up to this many bytes of the worker's frames (kept for later, in
/// order) to reach the worker's answers to reclaims, which follow the row batch it was
/// writing (`pool.batch_bytes`, 256 KiB by default) and what the socket holds.
pub const STASH_BYTES: usize = 1024 * 1024;

#[derive(Debug, Default)]
pub struct Stash {
    frames: VecDeque<Frame>,
    /// Their bytes, headers included: at most about [`STASH_BYTES`] plus one frame.
    bytes: usize,
    /// The current request's `END` is among them: all that follows is kept in order too.
    ended: bool,
}

impl Stash {
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Room to read one more frame into it.
    pub fn has_room(&self) -> bool {
        self.bytes < STASH_BYTES
    }

    pub fn holds_the_end(&self) -> bool {
        self.ended
    }

    /// Keeps `frame`; `ends_current`: it is the current request's `END`.
    pub fn push(&mut self, frame: Frame, ends_current: bool) {
        self.ended |= ends_current;
        self.bytes += frame.payload.len() + HEADER_LEN;
        self.frames.push_back(frame);
    }

    fn pop(&mut self) -> Option<Frame> {
        let frame = self.frames.pop_front()?;
        self.bytes = self.bytes.saturating_sub(frame.payload.len() + HEADER_LEN);
        if self.frames.is_empty() {
            (self.bytes, self.ended) = (0, false);
        }
        Some(frame)
    }
}

/// The worker's next frame: a kept one first, else the next from its socket.
pub async fn next_frame<R>(stash: &mut Stash, reader: &mut R) -> Option<Result<Frame, ProtocolError>>
where
    R: Stream<Item = Result<Frame, ProtocolError>> + Unpin,
{
    match stash.pop() {
        Some(frame) => Some(Ok(frame)),
        None => reader.next().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use osprey_protocol::Kind;

    #[test]
    fn frames_come_back_in_order_and_the_bytes_are_counted_both_ways() {
        let mut s = Stash::default();
        let f = |stream: u32, n: usize| Frame::with_payload(Kind::Rows, stream, vec![0u8; n].into());
        s.push(f(1, 100), false);
        s.push(Frame::empty(Kind::End, 1), true);
        s.push(f(3, 50), false);
        assert!(s.holds_the_end() && s.has_room());
        assert_eq!(s.bytes, 100 + 50 + 3 * HEADER_LEN);
        assert_eq!(s.pop().map(|f| (f.kind, f.stream)), Some((Kind::Rows, 1)));
        assert_eq!(s.bytes, 50 + 2 * HEADER_LEN);
        assert_eq!(s.pop().map(|f| (f.kind, f.stream)), Some((Kind::End, 1)));
        assert_eq!(s.pop().map(|f| (f.kind, f.stream)), Some((Kind::Rows, 3)));
        assert!(s.is_empty() && !s.holds_the_end());
        assert_eq!(s.bytes, 0);
        assert!(s.pop().is_none());
        s.push(f(5, STASH_BYTES), false);
        assert!(!s.has_room());
    }
}

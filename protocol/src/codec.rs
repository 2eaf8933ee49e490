//! `tokio_util::codec` implementation of the frame layer.

use bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::ProtocolError;
use crate::frame::{peek_header, Frame, Kind, DEFAULT_MAX_PAYLOAD, HEADER_LEN};

/// Encodes and decodes [`Frame`]s. The length is checked against `max_payload`
/// before any memory is reserved, so a hostile length field costs nothing.
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max_payload: usize,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(DEFAULT_MAX_PAYLOAD)
    }
}

impl FrameCodec {
    pub fn new(max_payload: usize) -> FrameCodec {
        FrameCodec { max_payload }
    }

    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Changes the bound, e.g. to raise it once a peer has authenticated.
    pub fn set_max_payload(&mut self, max_payload: usize) {
        self.max_payload = max_payload;
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let h = peek_header(&src[..HEADER_LEN]);
        if h.len > self.max_payload {
            return Err(ProtocolError::FrameTooLarge {
                len: h.len,
                max: self.max_payload,
            });
        }
        let kind = Kind::from_u8(h.kind).ok_or(ProtocolError::UnknownKind(h.kind))?;
        if src[6] != 0 || src[7] != 0 {
            return Err(ProtocolError::ReservedNotZero);
        }
        if !kind.allowed_on(h.stream) {
            return Err(ProtocolError::WrongStream {
                kind: kind.name(),
                stream: h.stream,
            });
        }
        let total = HEADER_LEN + h.len;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let payload = src.split_to(h.len).freeze();
        Ok(Some(Frame {
            kind,
            flags: h.flags,
            stream: h.stream,
            payload,
        }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(ProtocolError::Truncated(src.len())),
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = ProtocolError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        self.encode(&frame, dst)
    }
}

impl Encoder<&Frame> for FrameCodec {
    type Error = ProtocolError;

    fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        if frame.payload.len() > self.max_payload {
            return Err(ProtocolError::FrameTooLarge {
                len: frame.payload.len(),
                max: self.max_payload,
            });
        }
        frame.encode_to(dst);
        Ok(())
    }
}

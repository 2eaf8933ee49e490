//! The frame: header layout and frame kinds.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};

use crate::error::ProtocolError;

/// Header size in bytes: `len:u32 | kind:u8 | flags:u8 | reserved:u16 | stream:u32`, big endian.
pub const HEADER_LEN: usize = 12;
/// Default upper bound on a payload (16 MiB). Larger frames are a protocol error.
pub const DEFAULT_MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// Deepest nesting of MessagePack containers a body may have, its own map being level 1
/// (`Request` → `batch` → `Statement` → `params` → tagged `Value` is 5). Deeper is `BAD_BODY`.
pub const MAX_BODY_DEPTH: usize = 32;

/// Flag bit on `ROWS`/`COLUMNS`: none defined in 1.0; receivers ignore unknown bits.
pub const FLAG_NONE: u8 = 0;

macro_rules! kinds {
    ($( $(#[$m:meta])* $name:ident = $code:expr, )*) => {
        /// Frame kind (header byte 4).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Kind { $( $(#[$m])* $name = $code, )* }

        impl Kind {
            /// Every kind, in code order.
            pub const ALL: &'static [Kind] = &[$(Kind::$name,)*];

            /// Parses a header byte; `None` for an unknown kind.
            pub fn from_u8(b: u8) -> Option<Kind> {
                match b { $( $code => Some(Kind::$name), )* _ => None }
            }

            /// Upper-case wire name, as used in the spec and logs.
            pub fn name(self) -> &'static str {
                match self { $( Kind::$name => stringify!($name), )* }
            }
        }
    };
}

kinds! {
    /// Opens a connection: version, role, credentials.
    Hello = 0x01,
    /// Accepts a `HELLO`.
    HelloAck = 0x02,
    /// Liveness probe; answered with `PONG` carrying the same nonce.
    Ping = 0x03,
    /// Answer to `PING`.
    Pong = 0x04,
    /// Sender accepts no new streams on this connection.
    GoAway = 0x05,
    /// A worker asks to retire.
    QuitRequest = 0x06,
    /// The dispatcher lets a worker retire.
    QuitNow = 0x07,
    /// Abort one stream (stream id in the header, stream-level frame).
    Cancel = 0x08,
    /// A worker has connected to its database and can take requests.
    Ready = 0x09,
    /// Per-stream flow control: the client grants more data frames on one stream.
    Window = 0x0A,
    /// A pipelining worker is about to send this request's statement to its database
    /// while it still answers an earlier one (1.4): from now on it may have run.
    Started = 0x0B,
    /// The dispatcher asks a worker to end the session it served (1.5): roll back, drop
    /// temporary tables, release locks and user variables; answered with `END`.
    Reset = 0x0C,
    /// Opens a stream with a SQL request.
    Request = 0x10,
    /// Result-set metadata.
    Columns = 0x11,
    /// A batch of rows.
    Rows = 0x12,
    /// Terminal frame of a stream: success summary, or the closing frame after `ERROR`.
    End = 0x13,
    /// An error; on a stream it is always followed by `END`.
    Error = 0x14,
    /// A session is open on this stream (1.5): a worker is pinned to it until the
    /// stream's terminal frame.
    Session = 0x15,
    /// One result of a request that asked for `multi_results` ended, and another follows
    /// (1.7): that result's own counters.
    ResultEnd = 0x16,
    /// A batch of rows as the database sent them (1.8, only on a stream whose `REQUEST`
    /// set `raw_rows`): see [`crate::raw_rows`].
    RawRows = 0x17,
}

impl Kind {
    /// Whether frames of this kind belong on stream 0.
    pub fn is_control(self) -> bool {
        matches!(
            self,
            Kind::Hello
                | Kind::HelloAck
                | Kind::Ping
                | Kind::Pong
                | Kind::GoAway
                | Kind::QuitRequest
                | Kind::QuitNow
                | Kind::Ready
        )
    }

    /// Whether a frame of this kind may travel on `stream`: control kinds only on
    /// stream 0, stream kinds only on a non-zero stream, and `ERROR` on either
    /// (on stream 0 it reports a connection-level problem before the connection closes).
    pub fn allowed_on(self, stream: u32) -> bool {
        self == Kind::Error || self.is_control() == (stream == 0)
    }
}

/// One frame. The payload stays undecoded bytes so that a relay can forward it
/// without parsing (only the header's stream id is rewritten).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub flags: u8,
    pub stream: u32,
    pub payload: Bytes,
}

impl Frame {
    /// A frame whose payload is the MessagePack (named-field map) encoding of `body`.
    pub fn new<T: Serialize>(kind: Kind, stream: u32, body: &T) -> Frame {
        let payload = rmp_serde::to_vec_named(body).expect("body types always serialise");
        Frame {
            kind,
            flags: FLAG_NONE,
            stream,
            payload: Bytes::from(payload),
        }
    }

    /// A frame with a payload encoded earlier (by [`Frame::new`]), sent again.
    pub fn with_payload(kind: Kind, stream: u32, payload: Bytes) -> Frame {
        Frame {
            kind,
            flags: FLAG_NONE,
            stream,
            payload,
        }
    }

    /// A frame with an empty payload.
    pub fn empty(kind: Kind, stream: u32) -> Frame {
        Frame::with_payload(kind, stream, Bytes::new())
    }

    /// Decodes the payload with `fast` (a hand-written decoder of the common form) when it
    /// takes it, else as [`Frame::body`] does: serde's result and error stand for the rest.
    pub fn body_fast<T: DeserializeOwned>(&self, fast: fn(&[u8]) -> Option<T>) -> Result<T, ProtocolError> {
        match fast(&self.payload) {
            Some(body) => Ok(body),
            None => self.body(),
        }
    }

    /// Decodes the payload as `T`.
    pub fn body<T: DeserializeOwned>(&self) -> Result<T, ProtocolError> {
        let mut de = rmp_serde::Deserializer::from_read_ref(&self.payload[..]);
        // rmp_serde's default (1024 levels) overflows a 2 MiB thread stack (tokio's
        // default) in a debug build when the nesting sits in an ignored field; real
        // bodies nest 5 levels.
        de.set_max_depth(MAX_BODY_DEPTH + 1);
        T::deserialize(&mut de).map_err(|e| {
            // Text sent as MessagePack str with invalid UTF-8 never reaches our visitor's
            // error: rmp_serde replaces it with its own `Utf8Error`. In a REQUEST every
            // text field is SQL (or SQL value text), so report it as BadUtf8 too.
            if self.kind == Kind::Request && matches!(e, rmp_serde::decode::Error::Utf8Error(_)) {
                return ProtocolError::BadUtf8;
            }
            // Only our own visitor's error is exactly the marker. A substring test would
            // also match serde's messages that quote the input ("invalid type: string
            // \"osprey:bad-utf8\" ..."), so a peer could turn any malformed body into
            // BAD_UTF8 (found by the `body_decoder` fuzz target).
            match e {
                rmp_serde::decode::Error::Syntax(msg) if msg == crate::body::BAD_UTF8_MARKER => ProtocolError::BadUtf8,
                e => ProtocolError::BadBody {
                    kind: self.kind.name(),
                    reason: e.to_string(),
                },
            }
        })
    }

    /// The same frame on another stream (used by the dispatcher's relay).
    pub fn with_stream(mut self, stream: u32) -> Frame {
        self.stream = stream;
        self
    }

    /// Writes header and payload to `dst`.
    pub fn encode_to(&self, dst: &mut BytesMut) {
        dst.reserve(HEADER_LEN + self.payload.len());
        put_header(dst, self.payload.len() as u32, self.kind, self.flags, self.stream);
        dst.extend_from_slice(&self.payload);
    }

    /// Header and payload as one buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        self.encode_to(&mut b);
        b.freeze()
    }
}

pub(crate) fn put_header(dst: &mut BytesMut, len: u32, kind: Kind, flags: u8, stream: u32) {
    dst.put_u32(len);
    dst.put_u8(kind as u8);
    dst.put_u8(flags);
    dst.put_u16(0);
    dst.put_u32(stream);
}

/// Parsed header fields, before the kind is validated.
pub(crate) struct RawHeader {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

/// Whether `buf` starts with a whole frame (header and payload): a reader holding it
/// gets its next frame without a read.
pub fn frame_buffered(buf: &[u8]) -> bool {
    buf.len() >= HEADER_LEN && buf.len() - HEADER_LEN >= peek_header(&buf[..HEADER_LEN]).len
}

pub(crate) fn peek_header(mut src: &[u8]) -> RawHeader {
    let len = src.get_u32() as usize;
    let kind = src.get_u8();
    let flags = src.get_u8();
    let _reserved = src.get_u16();
    let stream = src.get_u32();
    RawHeader {
        len,
        kind,
        flags,
        stream,
    }
}

//! The Osprey wire protocol.
//!
//! A connection carries [`Frame`]s: a fixed 12-byte header (payload length, kind,
//! flags, stream id) followed by a payload. Payloads are MessagePack documents
//! described by the types in [`body`]. `docs/PROTOCOL.md` is the normative spec;
//! this crate is its reference implementation.

pub mod body;
pub mod codec;
pub mod error;
pub mod frame;
pub mod gtid;
pub mod local;
pub mod value;

pub use body::*;
pub use codec::FrameCodec;
pub use error::{ErrorCode, Origin, ProtocolError};
pub use frame::{Frame, Kind, DEFAULT_MAX_PAYLOAD, HEADER_LEN, MAX_BODY_DEPTH};
pub use gtid::{Gtid, GtidError, GtidPos};
pub use value::Value;

/// Major protocol version. A peer announcing another major version is refused
/// with [`ErrorCode::UnsupportedVersion`].
pub const PROTOCOL_MAJOR: u16 = 1;
/// Minor protocol version: additions that older peers may ignore. 1.3 added
/// `END.gtid` and `REQUEST.causal_gtid` (read-your-writes).
pub const PROTOCOL_MINOR: u16 = 3;

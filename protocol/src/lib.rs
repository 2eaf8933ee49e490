//! The Osprey wire protocol.
//!
//! A connection carries [`Frame`]s: a fixed 12-byte header (payload length, kind,
//! flags, stream id) followed by a payload. Payloads are MessagePack documents
//! described by the types in [`body`]. `docs/PROTOCOL.md` is the normative spec;
//! this crate is its reference implementation.

pub mod body;
pub mod codec;
pub mod columns_decode;
pub mod end_decode;
pub mod end_encode;
pub mod error;
pub mod frame;
pub mod gtid;
pub mod link_socket;
pub mod local;
mod msgpack_read;
mod msgpack_write;
pub mod mysql_auth;
pub mod raw_rows;
pub mod request_decode;
pub mod request_encode;
pub mod rows_encode;
pub mod value;

pub use body::*;
pub use codec::FrameCodec;
pub use error::{ErrorCode, Origin, ProtocolError};
pub use frame::{frame_buffered, Frame, Kind, DEFAULT_MAX_PAYLOAD, HEADER_LEN, MAX_BODY_DEPTH};
pub use gtid::{Gtid, GtidError, GtidPos};
pub use value::Value;

/// Major protocol version. A peer announcing another major version is refused
/// with [`ErrorCode::UnsupportedVersion`].
pub const PROTOCOL_MAJOR: u16 = 1;
/// Minor protocol version: additions that older peers may ignore. 1.3 added
/// `END.gtid` and `REQUEST.causal_gtid` (read-your-writes); 1.4 the worker link's
/// pipelining (`STARTED`, `CANCEL` reason `reclaim`, several requests written at once);
/// 1.5 sessions (`REQUEST.open_session`/`session`, `SESSION`, `RESET`, `END.in_transaction`,
/// `ERROR.transaction`); 1.6 what a front end needs (`REQUEST.text_rows`, `prepared`,
/// `prepare_only`, `schema`, `vars`); 1.7 each result apart (`REQUEST.multi_results`,
/// `RESULT_END`); 1.8 rows handed on undecoded (`REQUEST.raw_rows`, `RAW_ROWS`) and the
/// server's autocommit status (`END.autocommit`, `RESULT_END.autocommit`).
pub const PROTOCOL_MINOR: u16 = 8;

/// The most requests a dispatcher writes to one worker before the first of them has
/// ended (`pool.pipeline_depth`): a worker reads that many ahead while it executes.
pub const MAX_PIPELINE_DEPTH: usize = 16;

/// `CANCEL.reason` with which the dispatcher takes back a request it wrote to a worker
/// ahead of time: the worker answers `ERROR CANCELLED` (dispatched=false) if it has not
/// started it, and ignores the `CANCEL` if it has (the statement runs on, unharmed).
pub const CANCEL_RECLAIM: &str = "reclaim";

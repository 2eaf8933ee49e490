//! `REQUEST` bodies: decoding, `Request::validate` against the spec's shape rules, and
//! the SQL scanner on every statement, as the dispatcher and the worker run them; the
//! hand-written decoder against serde's.
//! Input: a MessagePack `Request` payload (as on the wire).
#![no_main]

use bytes::Bytes;
use osprey_protocol::{Frame, Kind, Request};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let frame = Frame {
        kind: Kind::Request,
        flags: 0,
        stream: 1,
        payload: Bytes::copy_from_slice(data),
    };
    if let Some(request) = osprey_fuzz::decoded::<Request>(&frame) {
        osprey_fuzz::check_request(&request);
    }
    osprey_fuzz::request_by_hand(&frame);
});

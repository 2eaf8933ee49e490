//! What the fuzz targets share: the input layouts (also used by the seed generator,
//! `examples/make_seeds.rs`) and the checks each decoded value must pass.
//!
//! A check failing is a panic, which libFuzzer reports as a crash: the rule every
//! target enforces is "no input panics", and on top of it the invariants written here.

use bytes::{Bytes, BytesMut};
use osprey_protocol::*;
use serde::{de::DeserializeOwned, Serialize};
use tokio_util::codec::Decoder;

/// `frame_decoder` input: `[max, c0, c1, c2, c3, stream bytes…]`. `max` picks the
/// codec's payload limit (see [`frame_max_payload`]); `c0..c3` are the sizes of the
/// chunks the stream bytes arrive in, cycled (0 = 256).
pub const FRAME_PREFIX: usize = 5;

/// The payload limit a `frame_decoder` input asks for: high bit clear, the default
/// (16 MiB); set, a small limit (0 … 2032 bytes) so that the too-large path is reachable.
pub fn frame_max_payload(b: u8) -> usize {
    if b & 0x80 == 0 {
        DEFAULT_MAX_PAYLOAD
    } else {
        usize::from(b & 0x7f) * 16
    }
}

/// `body_decoder` input: `[selector, payload…]`. The selector (modulo [`BODY_TARGETS`])
/// picks which type the payload is decoded as: the body of each frame kind, in code
/// order, then the nested types on their own.
pub const BODY_TARGETS: usize = Kind::ALL.len() + 5;

/// Name of a selector's type, for the seed generator and crash reports.
pub fn body_target_name(selector: u8) -> &'static str {
    let i = usize::from(selector) % BODY_TARGETS;
    match Kind::ALL.get(i) {
        Some(k) => k.name(),
        None => ["Value", "Statement", "Column", "WorkerSettings", "Backend"][i - Kind::ALL.len()],
    }
}

/// Decodes `payload` as the body type `selector` picks and checks it.
pub fn check_body_selector(selector: u8, payload: &[u8]) {
    let i = usize::from(selector) % BODY_TARGETS;
    match Kind::ALL.get(i) {
        Some(&kind) => check_body_of_kind(kind, Bytes::copy_from_slice(payload)),
        None => {
            // Nested types: decoded straight from MessagePack, as rmp_serde does inside a body.
            match i - Kind::ALL.len() {
                0 => nested::<Value>(payload),
                1 => nested::<Statement>(payload),
                2 => nested::<Column>(payload),
                3 => nested::<WorkerSettings>(payload),
                _ => nested::<Backend>(payload),
            }
        }
    }
}

/// Decodes a frame's payload as the body its kind carries (what the dispatcher, the
/// worker and the SDK do with every frame they receive) and checks it.
pub fn check_body_of_kind(kind: Kind, payload: Bytes) {
    let stream = if kind.is_control() { 0 } else { 1 };
    let frame = Frame {
        kind,
        flags: 0,
        stream,
        payload,
    };
    match kind {
        Kind::Hello => {
            if let Some(h) = decoded::<Hello>(&frame) {
                let _ = h.check_version();
            }
        }
        Kind::HelloAck => {
            if let Some(h) = decoded::<HelloAck>(&frame) {
                let _ = h.check_version();
            }
        }
        Kind::Ping | Kind::Pong => drop(decoded::<Ping>(&frame)),
        Kind::GoAway => drop(decoded::<GoAway>(&frame)),
        Kind::QuitRequest => drop(decoded::<QuitRequest>(&frame)),
        Kind::QuitNow => drop(decoded::<QuitNow>(&frame)),
        Kind::Started => drop(decoded::<Started>(&frame)),
        Kind::Reset => drop(decoded::<Reset>(&frame)),
        Kind::Session => drop(decoded::<SessionOpened>(&frame)),
        Kind::Cancel => drop(decoded::<Cancel>(&frame)),
        Kind::Ready => drop(decoded::<Ready>(&frame)),
        Kind::Window => drop(decoded::<Window>(&frame)),
        Kind::Request => {
            if let Some(r) = decoded::<Request>(&frame) {
                check_request(&r);
            }
            request_by_hand(&frame);
        }
        Kind::Columns => {
            // The hand-written decoder (the SDK's and the MySQL front end's hot path) says
            // what serde says, or leaves it to serde.
            let serde = decoded::<Columns>(&frame);
            if let Some(fast) = Columns::decode_common(&frame.payload) {
                assert_eq!(
                    Some(&fast),
                    serde.as_ref(),
                    "COLUMNS decoded by hand differs from serde"
                );
            }
            assert_eq!(
                Columns::from_frame(&frame).map_err(|e| e.to_string()),
                frame.body::<Columns>().map_err(|e| e.to_string())
            );
        }
        Kind::Rows => {
            // The hand-written encoder (the worker's hot path) writes serde's bytes.
            if let Some(rows) = decoded::<Rows>(&frame) {
                let serde = rmp_serde::to_vec_named(&rows).expect("ROWS serialises");
                assert_eq!(
                    Rows::encode(&rows.rows),
                    serde,
                    "ROWS encoded by hand differs from serde"
                );
            }
        }
        Kind::End => {
            // The hand-written decoder (the dispatcher's hot path) says what serde says,
            // or leaves it to serde; the hand-written encoder writes serde's bytes.
            let serde = decoded::<End>(&frame);
            if let Some(fast) = End::decode_common(&frame.payload) {
                assert_eq!(Some(&fast), serde.as_ref(), "END decoded by hand differs from serde");
            }
            assert_eq!(
                End::from_frame(&frame).map_err(|e| e.to_string()),
                frame.body::<End>().map_err(|e| e.to_string())
            );
            if let Some(end) = serde {
                assert_eq!(end.encode(), rmp_serde::to_vec_named(&end).expect("END serialises"));
            }
        }
        Kind::ResultEnd => drop(decoded::<ResultEnd>(&frame)),
        Kind::RawRows => {
            if let Ok(rows) = osprey_protocol::raw_rows::decode(&frame.payload) {
                // Every row lies inside the payload, and encoding them again gives a
                // body that decodes to the same rows.
                let again = osprey_protocol::raw_rows::encode(&rows);
                assert_eq!(osprey_protocol::raw_rows::decode(&again).ok(), Some(rows));
            }
        }
        Kind::Error => {
            if let Some(e) = decoded::<ErrorBody>(&frame) {
                let _ = e.to_string();
                let _ = e.code.as_str();
            }
        }
    }
}

/// `frame.body::<T>()`, with the checks every body must pass:
/// - an error is `BAD_BODY`, or `BAD_UTF8` and then only for a `REQUEST` (the only
///   body with text whose bad UTF-8 fails one stream instead of the connection);
/// - a decoded body re-encodes (the reference encoder) to bytes that decode again, and
///   that second decoding encodes to the same bytes: what one peer reads, it can relay
///   and the next peer reads the same way.
pub fn decoded<T: Serialize + DeserializeOwned>(frame: &Frame) -> Option<T> {
    match frame.body::<T>() {
        Ok(body) => {
            let once = rmp_serde::to_vec_named(&body).expect("a decoded body serialises");
            let again: T = Frame {
                payload: Bytes::from(once.clone()),
                ..frame.clone()
            }
            .body()
            .unwrap_or_else(|e| panic!("{} body re-encoded by us does not decode: {e}", frame.kind.name()));
            let twice = rmp_serde::to_vec_named(&again).expect("a decoded body serialises");
            assert_eq!(
                once,
                twice,
                "{} body: encode(decode(x)) is not stable",
                frame.kind.name()
            );
            Some(body)
        }
        Err(ProtocolError::BadBody { .. }) => None,
        Err(ProtocolError::BadUtf8) => {
            assert_eq!(
                frame.kind,
                Kind::Request,
                "BAD_UTF8 reported for a {} body",
                frame.kind.name()
            );
            None
        }
        Err(other) => panic!("{} body: unexpected error kind {other:?}", frame.kind.name()),
    }
}

fn nested<T: Serialize + DeserializeOwned>(payload: &[u8]) {
    if let Ok(v) = rmp_serde::from_slice::<T>(payload) {
        let once = rmp_serde::to_vec_named(&v).expect("a decoded value serialises");
        let again: T = rmp_serde::from_slice(&once).expect("a value re-encoded by us decodes");
        let twice = rmp_serde::to_vec_named(&again).expect("a decoded value serialises");
        assert_eq!(once, twice, "encode(decode(x)) is not stable");
    }
}

/// The shape rules of `docs/PROTOCOL.md` section 5 (`Request`), written from the spec
/// rather than from `Request::validate`, so that the two check each other. (Whether a
/// parameter is a value some column can hold is section 6's `Value::check_param`, taken
/// as it is.)
pub fn spec_shape_ok(r: &Request) -> bool {
    let gtid_ok = r.causal_gtid.as_deref().is_none_or(spec_gtid_ok);
    // 1.5 (section 9a): a session is opened on its own stream, with nothing to run; a
    // statement in one names a non-zero stream id and is no batch.
    if r.open_session {
        return gtid_ok && r.sql.is_empty() && r.batch.is_empty() && r.params.is_empty() && r.session.is_none();
    }
    if r.session == Some(0) || (r.session.is_some() && !r.batch.is_empty()) {
        return false;
    }
    let has_sql = !r.sql.is_empty();
    let has_batch = !r.batch.is_empty();
    let blank = |s: &str| s.trim().is_empty();
    (has_sql != has_batch)
        && !(has_sql && blank(&r.sql))
        && r.batch.iter().all(|s| !blank(&s.sql))
        && (!has_batch || r.params.is_empty())
        && r.causal_gtid.as_deref().is_none_or(spec_gtid_ok)
        && std::iter::once(&r.params)
            .chain(r.batch.iter().map(|s| &s.params))
            .all(|ps| ps.len() <= 65_535 && ps.iter().all(|p| p.check_param().is_ok()))
}

/// `causal_gtid` as section 5 describes it: blank (no constraint), or at most 64
/// comma-separated `domain-server-seq` (decimal digits; 32-bit domain and server id,
/// 64-bit sequence), spaces around each, one per domain, at most 4096 bytes.
fn spec_gtid_ok(text: &str) -> bool {
    if text.len() > 4096 {
        return false;
    }
    if text.trim().is_empty() {
        return true;
    }
    let elements: Vec<&str> = text.split(',').map(str::trim).collect();
    let mut domains = std::collections::BTreeSet::new();
    elements.len() <= 64
        && elements.iter().all(|e| {
            let parts: Vec<&str> = e.split('-').collect();
            let decimal = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
            parts.len() == 3
                && parts.iter().all(decimal)
                && parts[1].parse::<u32>().is_ok()
                && parts[2].parse::<u64>().is_ok()
                && parts[0].parse::<u32>().is_ok_and(|d| domains.insert(d))
        })
}

/// What the dispatcher and the worker do with a decoded `REQUEST` before it runs:
/// `Request::validate` (which must agree with the spec's rules), then the SQL scanner
/// on every statement's text.
pub fn check_request(r: &Request) {
    let verdict = r.validate();
    assert_eq!(
        verdict.is_ok(),
        spec_shape_ok(r),
        "Request::validate disagrees with the spec's shape rules: {verdict:?} for {r:?}"
    );
    if let Err(why) = &verdict {
        assert!(!why.is_empty(), "a refusal must say why");
    }
    check_sql(&r.sql);
    for st in &r.batch {
        check_sql(&st.sql);
    }
}

/// Runs every scanner function on `sql` and checks the invariants they promise.
pub fn check_sql(sql: &str) {
    let d = osprey_sql::digest(sql);
    assert_eq!(
        d.hash,
        osprey_sql::digest_hash(d.text.as_bytes()),
        "digest hash of {sql:?}"
    );
    // Every token gains at most one space; a literal shrinks to `?`; a list to `(...)`.
    assert!(
        d.text.len() <= 2 * sql.len() + 8,
        "digest text of {sql:?} grew to {:?}",
        d.text
    );
    assert_eq!(osprey_sql::digest(sql), d, "digest of {sql:?} is not deterministic");

    let code = osprey_sql::code_text(sql);
    // Blanking keeps every byte's position: the result is the input with some bytes
    // turned into spaces, whole characters at a time (so it is still the same UTF-8
    // text, of the same length, and never gets a U+FFFD from a split character).
    assert_eq!(code.len(), sql.len(), "code_text changed the length of {sql:?}");
    for (i, (&c, &s)) in code.as_bytes().iter().zip(sql.as_bytes()).enumerate() {
        assert!(
            c == s || c == b' ',
            "code_text byte {i} is {c:#04x}, neither the input's {s:#04x} nor a space, for {sql:?}"
        );
    }
    for (i, ch) in code.char_indices() {
        if ch != ' ' {
            assert!(
                sql.is_char_boundary(i) && sql[i..].starts_with(ch),
                "code_text split a character at {i} of {sql:?}"
            );
        }
    }

    let marks = osprey_sql::placeholders(sql);
    assert_eq!(marks, code.bytes().filter(|&b| b == b'?').count());
    assert!(marks <= sql.bytes().filter(|&b| b == b'?').count());
    // A line comment appended on a new line is never code, whatever state the text
    // ends in (inside a quote or comment the new line changes nothing either).
    assert_eq!(
        osprey_sql::placeholders(&format!("{sql}\n-- ?")),
        marks,
        "a trailing comment changed the placeholder count of {sql:?}"
    );

    for part in osprey_sql::top_level_statements(&code) {
        assert!(part.len() <= code.len());
    }

    let controls = osprey_sql::controls_session(sql);
    let touches = osprey_sql::touches_session_state(sql);
    let plain = osprey_sql::is_plain_select(sql);
    if plain {
        assert!(
            sql.trim_start().as_bytes()[..6].eq_ignore_ascii_case(b"select"),
            "is_plain_select for {sql:?}"
        );
        assert!(!controls, "a plain SELECT cannot control the session: {sql:?}");
        // The worker wraps a plain SELECT in `SET STATEMENT … FOR`: still one statement.
        let wrapped = format!("SET STATEMENT max_statement_time=1.000 FOR {sql}");
        let body = wrapped.trim_end().trim_end_matches(';');
        assert!(!body.contains(';'), "a plain SELECT has a ';' inside: {sql:?}");
    }

    // Keywords, comment openers (`/*M!`) and quotes are matched without regard to
    // ASCII case, so no verdict may depend on it.
    let upper = sql.to_ascii_uppercase();
    let lower = sql.to_ascii_lowercase();
    for other in [&upper, &lower] {
        assert_eq!(
            osprey_sql::controls_session(other),
            controls,
            "controls_session: case of {sql:?}"
        );
        assert_eq!(
            osprey_sql::touches_session_state(other),
            touches,
            "touches_session_state: case of {sql:?}"
        );
        assert_eq!(osprey_sql::placeholders(other), marks, "placeholders: case of {sql:?}");
        assert_eq!(
            osprey_sql::is_plain_select(other),
            plain,
            "is_plain_select: case of {sql:?}"
        );
    }
}

/// The outcome of decoding a byte stream: the frames in order, and the error that
/// ended it (as its wire code), if any.
#[derive(Debug, PartialEq)]
pub struct Decoded {
    pub frames: Vec<Frame>,
    pub error: Option<ErrorCode>,
    /// Bytes the frames took, headers included.
    pub consumed: usize,
}

/// Feeds `input` to a fresh [`FrameCodec`] in chunks of the given sizes (cycled),
/// decoding after each chunk as `FramedRead` does, `decode_eof` at the end, until the
/// first error (where a connection closes). Checks every frame and the buffer's growth.
pub fn decode_chunked(input: &[u8], chunks: &[usize], max: usize) -> Decoded {
    let mut codec = FrameCodec::new(max);
    let mut buf = BytesMut::new();
    let mut out = Decoded {
        frames: Vec::new(),
        error: None,
        consumed: 0,
    };
    let mut rest = input;
    let mut sizes = chunks.iter().copied().cycle();
    // The decoder may ask for one whole frame; BytesMut may double what is asked.
    let bound = 2 * (HEADER_LEN + max);
    loop {
        let n = sizes
            .next()
            .unwrap_or(usize::MAX)
            .clamp(1, rest.len().max(1))
            .min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        let fed_cap = buf.capacity();
        loop {
            let result = if rest.is_empty() {
                codec.decode_eof(&mut buf)
            } else {
                codec.decode(&mut buf)
            };
            assert!(
                buf.capacity() <= fed_cap.max(bound),
                "buffer grew to {} (was {fed_cap}, bound {bound})",
                buf.capacity()
            );
            match result {
                Ok(Some(f)) => {
                    assert!(f.payload.len() <= max, "frame over the limit");
                    assert!(f.kind.allowed_on(f.stream), "{} on stream {}", f.kind.name(), f.stream);
                    out.consumed += HEADER_LEN + f.payload.len();
                    out.frames.push(f);
                }
                Ok(None) => break,
                Err(e) => {
                    if matches!(e, ProtocolError::Truncated(_)) {
                        assert!(rest.is_empty(), "truncated before the end of the input");
                    }
                    out.error = Some(e.code());
                    return out;
                }
            }
        }
        if rest.is_empty() {
            return out;
        }
    }
}

/// Decodes `input` through `tokio_util::codec::FramedRead` over a reader that returns
/// the given chunk sizes: the path the dispatcher, worker and SDK actually take.
pub fn decode_framed_read(input: &[u8], chunks: &[usize], max: usize) -> Decoded {
    use futures::StreamExt;
    let reader = ChunkedReader {
        data: input,
        chunks: chunks.to_vec(),
        next: 0,
    };
    let mut framed = tokio_util::codec::FramedRead::new(reader, FrameCodec::new(max));
    let mut out = Decoded {
        frames: Vec::new(),
        error: None,
        consumed: 0,
    };
    futures::executor::block_on(async {
        while let Some(item) = framed.next().await {
            match item {
                Ok(f) => {
                    out.consumed += HEADER_LEN + f.payload.len();
                    out.frames.push(f);
                }
                Err(e) => {
                    out.error = Some(e.code());
                    break;
                }
            }
        }
    });
    out
}

struct ChunkedReader<'a> {
    data: &'a [u8],
    chunks: Vec<usize>,
    next: usize,
}

impl tokio::io::AsyncRead for ChunkedReader<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let want = if self.chunks.is_empty() {
            usize::MAX
        } else {
            self.chunks[self.next % self.chunks.len()].max(1)
        };
        self.next += 1;
        let n = want.min(self.data.len()).min(buf.remaining());
        let (now, later) = self.data.split_at(n);
        buf.put_slice(now);
        self.data = later;
        std::task::Poll::Ready(Ok(()))
    }
}

/// The whole `frame_decoder` check on one input (layout: [`FRAME_PREFIX`]).
pub fn check_frame_input(data: &[u8]) {
    if data.len() < FRAME_PREFIX {
        return;
    }
    let max = frame_max_payload(data[0]);
    let chunks: Vec<usize> = data[1..FRAME_PREFIX]
        .iter()
        .map(|&c| if c == 0 { 256 } else { usize::from(c) })
        .collect();
    let stream = &data[FRAME_PREFIX..];

    let whole = decode_chunked(stream, &[usize::MAX], max);
    // Frames are re-encoded byte for byte: the header has no freedom left once it decodes
    // (reserved is zero, flags are kept), so what was consumed is what we would send.
    let mut again = BytesMut::new();
    for f in &whole.frames {
        f.encode_to(&mut again);
    }
    assert_eq!(
        &again[..],
        &stream[..whole.consumed],
        "re-encoded frames differ from the input"
    );
    // Where the bytes are cut cannot change what is decoded.
    let chunked = decode_chunked(stream, &chunks, max);
    assert_eq!(chunked, whole, "chunking changed the result ({chunks:?})");
    let framed = decode_framed_read(stream, &chunks, max);
    assert_eq!(
        framed, whole,
        "FramedRead disagrees with the codec driven by hand ({chunks:?})"
    );

    for f in &whole.frames {
        check_body_of_kind(f.kind, f.payload.clone());
    }
}

/// The hand-written `REQUEST` decoder (the dispatcher's and the worker's hot path) says
/// what serde says, or leaves it to serde (compared as their encodings: NaN included); the
/// hand-written encoder writes serde's bytes.
pub fn request_by_hand(frame: &Frame) {
    let named = |r: &Request| rmp_serde::to_vec_named(r).expect("a decoded body serialises");
    let serde = frame.body::<Request>();
    if let Ok(r) = &serde {
        // The hand-written encoder (the SDK's and the MySQL front end's) writes serde's bytes.
        assert_eq!(r.encode(), named(r), "REQUEST encoded by hand differs from serde");
    }
    if let Some(fast) = Request::decode_common(&frame.payload) {
        let serde = serde.as_ref().expect("REQUEST decoded by hand where serde refuses it");
        assert_eq!(named(&fast), named(serde), "REQUEST decoded by hand differs from serde");
    }
    assert_eq!(
        Request::from_frame(frame).map(|r| named(&r)).map_err(|e| e.to_string()),
        serde.map(|r| named(&r)).map_err(|e| e.to_string())
    );
}

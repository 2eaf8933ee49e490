//! The frame layer: hostile input, chunking, and every specific error.

mod common;

use bytes::{BufMut, BytesMut};
use common::*;
use futures::StreamExt;
use osprey_protocol::*;
use proptest::prelude::*;
use tokio_util::codec::{Decoder, Encoder, FramedRead};

const SMALL_MAX: usize = 64;

fn header(len: u32, kind: u8, flags: u8, reserved: u16, stream: u32) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u32(len);
    b.put_u8(kind);
    b.put_u8(flags);
    b.put_u16(reserved);
    b.put_u32(stream);
    b
}

/// Tries to decode the payload as every body type; none may panic.
fn decode_every_body(frame: &Frame) {
    let f = frame;
    let _ = f.body::<Hello>();
    let _ = f.body::<HelloAck>();
    let _ = f.body::<Ping>();
    let _ = f.body::<GoAway>();
    let _ = f.body::<QuitRequest>();
    let _ = f.body::<QuitNow>();
    let _ = f.body::<Ready>();
    let _ = f.body::<Cancel>();
    let _ = f.body::<Request>();
    let _ = f.body::<Columns>();
    let _ = f.body::<Rows>();
    let _ = f.body::<End>();
    let _ = f.body::<ErrorBody>();
    let _ = f.body::<Value>();
}

/// Feeds `input` in the given chunk sizes, decoding after each chunk, until the first
/// error (where a real connection would close). Checks the buffer's capacity after
/// every `decode`: the decoder may ask for at most one whole frame
/// (`HEADER_LEN + max_payload`); `BytesMut` may round a growth up to twice what is
/// asked, and never shrinks below what the fed chunks already needed.
fn feed(input: &[u8], chunks: &[usize], max: usize) -> (Vec<Frame>, Option<ProtocolError>) {
    let mut codec = FrameCodec::new(max);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut rest = input;
    let mut sizes = chunks.iter().copied().cycle();
    let bound = 2 * (HEADER_LEN + max);
    loop {
        let n = sizes
            .next()
            .unwrap_or(rest.len())
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
                "capacity {} after decode (was {fed_cap}, bound {bound})",
                buf.capacity()
            );
            match result {
                Ok(Some(f)) => {
                    assert!(f.payload.len() <= max);
                    assert!(f.kind.allowed_on(f.stream));
                    frames.push(f)
                }
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
        if rest.is_empty() {
            return (frames, None);
        }
    }
}

/// Random bytes, plus inputs that start as a stream of valid headers (so that the
/// decoder gets past the header checks) with a few bytes corrupted.
fn arb_input() -> impl Strategy<Value = Vec<u8>> {
    let raw = prop::collection::vec(any::<u8>(), 0..600);
    let framed = (
        prop::collection::vec(
            (
                prop::sample::select(Kind::ALL),
                0u32..4,
                prop::collection::vec(any::<u8>(), 0..80),
            ),
            0..8,
        ),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    )
        .prop_map(|(frames, flips)| {
            let mut out = Vec::new();
            for (kind, stream, payload) in frames {
                let stream = if kind.is_control() { 0 } else { stream.max(1) };
                out.extend_from_slice(&header(payload.len() as u32, kind as u8, 0, 0, stream));
                out.extend_from_slice(&payload);
            }
            for (i, b) in flips {
                if !out.is_empty() {
                    let i = i.index(out.len());
                    out[i] = b;
                }
            }
            out
        });
    prop_oneof![raw, framed]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic the decoder (nor the body decoders), and the buffer
    /// never grows past one maximal frame whatever the length field says.
    #[test]
    fn arbitrary_input_is_safe(input in arb_input(), chunks in prop::collection::vec(1usize..40, 1..6)) {
        let (frames, _err) = feed(&input, &chunks, SMALL_MAX);
        for f in &frames {
            decode_every_body(f);
        }
        // With the default maximum too (hostile lengths up to 4 GiB must not be reserved).
        let (frames, _err) = feed(&input, &chunks, DEFAULT_MAX_PAYLOAD);
        for f in &frames {
            decode_every_body(f);
        }
    }

    /// Arbitrary payload bytes decoded as any body type return an error or a value, never panic.
    #[test]
    fn arbitrary_bodies_are_safe(kind in prop::sample::select(Kind::ALL), payload in prop::collection::vec(any::<u8>(), 0..300)) {
        let frame = Frame { kind, flags: 0, stream: if kind.is_control() { 0 } else { 1 }, payload: payload.into() };
        decode_every_body(&frame);
    }

    /// A valid stream of frames decodes to the same frames however it is chunked.
    #[test]
    fn random_chunkings(frames in arb_frames(), chunks in prop::collection::vec(1usize..64, 1..10)) {
        let wire = encode_all(&frames);
        let (got, err) = feed(&wire, &chunks, DEFAULT_MAX_PAYLOAD);
        prop_assert!(err.is_none(), "{err:?}");
        prop_assert_eq!(got, frames);
    }
}

fn arb_frames() -> impl Strategy<Value = Vec<Frame>> {
    prop::collection::vec(
        (
            prop::sample::select(Kind::ALL),
            1u32..1000,
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..50),
        ),
        1..8,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(kind, stream, flags, payload)| Frame {
                kind,
                flags,
                stream: if kind.is_control() { 0 } else { stream },
                payload: payload.into(),
            })
            .collect()
    })
}

fn encode_all(frames: &[Frame]) -> Vec<u8> {
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    for f in frames {
        codec.encode(f, &mut buf).unwrap();
    }
    buf.to_vec()
}

fn sample_stream() -> Vec<Frame> {
    vec![
        Frame::new(
            Kind::Hello,
            0,
            &Hello {
                version_major: 1,
                version_minor: 0,
                role: Role::Client,
                token: Some("t".into()),
                secret: None,
                slot: None,
                pid: Some(42),
                name: None,
                stream_window: Some(16),
            },
        ),
        Frame::new(
            Kind::Request,
            1,
            &Request {
                params: vec![Value::Int(1), Value::Null],
                ..Request::sql("SELECT ?, ?")
            },
        ),
        Frame::new(Kind::Ping, 0, &Ping { nonce: 7 }),
        Frame::new(Kind::Request, 3, &Request::sql("SELECT 2")),
        Frame::new(Kind::Cancel, 3, &Cancel { reason: "user".into() }),
        Frame::new(
            Kind::Rows,
            1,
            &Rows {
                rows: vec![vec![Value::Text("x".repeat(30)), Value::Bytes(vec![0; 5])]],
            },
        ),
        Frame::empty(Kind::Rows, 2),
        Frame::new(Kind::End, 1, &End::default()),
        Frame::new(
            Kind::Error,
            0,
            &ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::ShuttingDown, "bye"),
        ),
    ]
}

#[test]
fn split_at_every_byte_boundary() {
    let frames = sample_stream();
    let wire = encode_all(&frames);
    for i in 0..=wire.len() {
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        buf.extend_from_slice(&wire[..i]);
        decode_all(&mut codec, &mut buf, &mut got);
        buf.extend_from_slice(&wire[i..]);
        decode_all(&mut codec, &mut buf, &mut got);
        assert!(buf.is_empty());
        assert_eq!(codec.decode_eof(&mut buf).unwrap(), None);
        assert_eq!(got, frames, "split at {i}");
    }
}

#[test]
fn one_byte_at_a_time() {
    let frames = sample_stream();
    let wire = encode_all(&frames);
    let (got, err) = feed(&wire, &[1], DEFAULT_MAX_PAYLOAD);
    assert!(err.is_none());
    assert_eq!(got, frames);
}

#[tokio::test]
async fn framed_read_over_a_reader() {
    let frames = sample_stream();
    let wire = encode_all(&frames);
    let got: Vec<Frame> = FramedRead::new(&wire[..], FrameCodec::default())
        .map(|r| r.unwrap())
        .collect()
        .await;
    assert_eq!(got, frames);
}

fn decode_one(bytes: &[u8], max: usize) -> Result<Option<Frame>, ProtocolError> {
    FrameCodec::new(max).decode(&mut BytesMut::from(bytes))
}

#[test]
fn oversized_length_fails_before_the_payload_arrives() {
    // Only the header is there; the error must come now, and nothing may be reserved.
    let mut buf = header(SMALL_MAX as u32 + 1, Kind::Rows as u8, 0, 0, 1);
    let cap = buf.capacity();
    let err = FrameCodec::new(SMALL_MAX).decode(&mut buf).unwrap_err();
    assert!(
        matches!(err, ProtocolError::FrameTooLarge { len: 65, max: 64 }),
        "{err:?}"
    );
    assert_eq!(err.code(), ErrorCode::FrameTooLarge);
    assert_eq!(buf.capacity(), cap);

    let mut buf = header(u32::MAX, Kind::Rows as u8, 0, 0, 1);
    let err = FrameCodec::default().decode(&mut buf).unwrap_err();
    assert!(
        matches!(err, ProtocolError::FrameTooLarge { len, max } if len == u32::MAX as usize && max == DEFAULT_MAX_PAYLOAD)
    );
    assert_eq!(buf.capacity(), cap);

    // Exactly the maximum is fine.
    let mut wire = header(SMALL_MAX as u32, Kind::Rows as u8, 0, 0, 1);
    wire.extend_from_slice(&[0x90; SMALL_MAX]);
    assert_eq!(decode_one(&wire, SMALL_MAX).unwrap().unwrap().payload.len(), SMALL_MAX);
}

#[test]
fn encoder_refuses_oversized_payloads() {
    let frame = Frame {
        kind: Kind::Rows,
        flags: 0,
        stream: 1,
        payload: vec![0u8; SMALL_MAX + 1].into(),
    };
    let mut buf = BytesMut::new();
    let err = FrameCodec::new(SMALL_MAX).encode(&frame, &mut buf).unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { len: 65, max: 64 }));
    assert!(buf.is_empty());
}

#[test]
fn unknown_kinds() {
    for b in 0..=255u8 {
        let known = Kind::from_u8(b);
        let stream = if known.is_some_and(|k| k.is_control()) { 0 } else { 1 };
        let r = decode_one(&header(0, b, 0, 0, stream), SMALL_MAX);
        match known {
            Some(k) => assert_eq!(r.unwrap().unwrap().kind, k),
            None => {
                let err = r.unwrap_err();
                assert!(matches!(err, ProtocolError::UnknownKind(x) if x == b));
                assert_eq!(err.code(), ErrorCode::UnknownKind);
            }
        }
    }
}

#[test]
fn kind_codes_are_the_documented_ones() {
    let table: &[(Kind, u8, bool)] = &[
        (Kind::Hello, 0x01, true),
        (Kind::HelloAck, 0x02, true),
        (Kind::Ping, 0x03, true),
        (Kind::Pong, 0x04, true),
        (Kind::GoAway, 0x05, true),
        (Kind::QuitRequest, 0x06, true),
        (Kind::QuitNow, 0x07, true),
        (Kind::Cancel, 0x08, false),
        (Kind::Ready, 0x09, true),
        (Kind::Window, 0x0a, false),
        (Kind::Started, 0x0b, false),
        (Kind::Reset, 0x0c, false),
        (Kind::Request, 0x10, false),
        (Kind::Columns, 0x11, false),
        (Kind::Rows, 0x12, false),
        (Kind::End, 0x13, false),
        (Kind::Error, 0x14, false),
        (Kind::Session, 0x15, false),
        (Kind::ResultEnd, 0x16, false),
        (Kind::RawRows, 0x17, false),
    ];
    assert_eq!(Kind::ALL.len(), table.len());
    for (i, &(kind, code, control)) in table.iter().enumerate() {
        assert_eq!(Kind::ALL[i], kind, "ALL is in code order");
        assert_eq!(kind as u8, code);
        assert_eq!(Kind::from_u8(code), Some(kind));
        assert_eq!(kind.is_control(), control);
    }
    assert!(Kind::Error.allowed_on(0) && Kind::Error.allowed_on(9));
}

#[test]
fn reserved_bytes_must_be_zero() {
    for reserved in [0x0001u16, 0x0100, 0xffff] {
        let err = decode_one(&header(0, Kind::Ping as u8, 0, reserved, 0), SMALL_MAX).unwrap_err();
        assert!(matches!(err, ProtocolError::ReservedNotZero), "{err:?}");
        assert_eq!(err.code(), ErrorCode::BadFrame);
    }
}

#[test]
fn flags_are_carried_and_ignored() {
    let f = decode_one(&header(0, Kind::Rows as u8, 0xa5, 0, 1), SMALL_MAX)
        .unwrap()
        .unwrap();
    assert_eq!(f.flags, 0xa5);
}

#[test]
fn wrong_stream() {
    for &kind in Kind::ALL {
        for stream in [0u32, 1, 0x8000_0000] {
            let r = decode_one(&header(0, kind as u8, 0, 0, stream), SMALL_MAX);
            let ok = kind == Kind::Error || kind.is_control() == (stream == 0);
            assert_eq!(kind.allowed_on(stream), ok);
            if ok {
                assert!(r.unwrap().is_some());
            } else {
                let err = r.unwrap_err();
                assert!(
                    matches!(&err, ProtocolError::WrongStream { kind: k, stream: s } if *k == kind.name() && *s == stream),
                    "{kind:?} on {stream}: {err:?}"
                );
                assert_eq!(err.code(), ErrorCode::BadFrame);
            }
        }
    }
    // The check happens on the header alone, before the payload arrives.
    let err = decode_one(&header(40, Kind::Ping as u8, 0, 0, 5), SMALL_MAX).unwrap_err();
    assert!(matches!(
        err,
        ProtocolError::WrongStream {
            kind: "Ping",
            stream: 5
        }
    ));
    let err = decode_one(&header(40, Kind::Request as u8, 0, 0, 0), SMALL_MAX).unwrap_err();
    assert!(matches!(
        err,
        ProtocolError::WrongStream {
            kind: "Request",
            stream: 0
        }
    ));
    let err = decode_one(&header(0, Kind::Cancel as u8, 0, 0, 0), SMALL_MAX).unwrap_err();
    assert!(matches!(
        err,
        ProtocolError::WrongStream {
            kind: "Cancel",
            stream: 0
        }
    ));
}

#[test]
fn header_checks_in_order() {
    // Length first, then kind, then reserved bytes, then the stream.
    let err = decode_one(&header(1000, 0xee, 0, 1, 0), SMALL_MAX).unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { .. }));
    let err = decode_one(&header(0, 0xee, 0, 1, 0), SMALL_MAX).unwrap_err();
    assert!(matches!(err, ProtocolError::UnknownKind(0xee)));
    let err = decode_one(&header(0, Kind::Request as u8, 0, 1, 0), SMALL_MAX).unwrap_err();
    assert!(matches!(err, ProtocolError::ReservedNotZero));
}

#[test]
fn truncated_at_eof() {
    let frame = Frame::new(Kind::Request, 1, &Request::sql("SELECT 1"));
    let wire = frame.to_bytes();
    let mut codec = FrameCodec::default();
    // Empty buffer at EOF: a clean close.
    assert_eq!(codec.decode_eof(&mut BytesMut::new()).unwrap(), None);
    for cut in 1..wire.len() {
        let mut buf = BytesMut::from(&wire[..cut]);
        let err = codec.decode_eof(&mut buf).unwrap_err();
        assert!(
            matches!(err, ProtocolError::Truncated(n) if n == cut),
            "cut {cut}: {err:?}"
        );
        assert_eq!(err.code(), ErrorCode::BadFrame);
    }
    let mut buf = BytesMut::from(&wire[..]);
    assert_eq!(codec.decode_eof(&mut buf).unwrap(), Some(frame));
}

#[tokio::test]
async fn truncated_through_framed_read() {
    let mut wire = encode_all(&sample_stream()[..2]);
    let whole = sample_stream()[..2].to_vec();
    wire.extend_from_slice(&header(10, Kind::Rows as u8, 0, 0, 1));
    wire.extend_from_slice(&[0x90; 3]);
    let mut r = FramedRead::new(&wire[..], FrameCodec::default());
    assert_eq!(r.next().await.unwrap().unwrap(), whole[0]);
    assert_eq!(r.next().await.unwrap().unwrap(), whole[1]);
    let err = r.next().await.unwrap().unwrap_err();
    assert!(matches!(err, ProtocolError::Truncated(15)), "{err:?}");
}

/// `{"sql": <bytes>}` as a MessagePack map, with the SQL as bin (`bin = true`) or str.
fn request_payload(sql: &[u8], bin: bool) -> Vec<u8> {
    let mut p = vec![0x81, 0xa3, b's', b'q', b'l'];
    p.push(if bin { 0xc4 } else { 0xd9 });
    p.push(sql.len() as u8);
    p.extend_from_slice(sql);
    p
}

fn request_frame(payload: Vec<u8>) -> Frame {
    Frame {
        kind: Kind::Request,
        flags: 0,
        stream: 1,
        payload: payload.into(),
    }
}

#[test]
fn sql_as_bin_is_accepted_when_utf8() {
    let r: Request = request_frame(request_payload(b"SELECT 1", true)).body().unwrap();
    assert_eq!(r.sql, "SELECT 1");
}

#[test]
fn sql_with_invalid_utf8_is_bad_utf8() {
    for bin in [true, false] {
        let err = request_frame(request_payload(b"SELECT '\xff\xfe'", bin))
            .body::<Request>()
            .unwrap_err();
        assert!(matches!(err, ProtocolError::BadUtf8), "bin={bin}: {err:?}");
        assert_eq!(err.code(), ErrorCode::BadUtf8);
    }
    // The same inside a batch statement: {"batch": [{"sql": bin}]}
    let mut p = vec![0x81, 0xa5, b'b', b'a', b't', b'c', b'h', 0x91];
    p.extend_from_slice(&request_payload(b"\xc3\x28", true));
    let err = request_frame(p).body::<Request>().unwrap_err();
    assert!(matches!(err, ProtocolError::BadUtf8), "{err:?}");
}

/// Found by the `body_decoder` fuzz target: serde's error messages quote the input
/// ("invalid type: string \"…\""), and the BAD_UTF8 check used to look for its marker
/// anywhere in the message, so a body holding that text where it does not belong was
/// reported BAD_UTF8 (stream-level) instead of BAD_BODY (connection-level).
#[test]
fn text_quoted_in_an_error_is_not_bad_utf8() {
    let marker = b"osprey:bad-utf8";
    let mut fixstr = vec![0xa0 | marker.len() as u8];
    fixstr.extend_from_slice(marker);
    // A PING body that is that string, and REQUEST bodies with it as a bool and as a Value tag's text.
    let ping = fixstr.clone();
    let mut read_only = vec![0x82, 0xa3, b's', b'q', b'l', 0xa1, b'x', 0xa9];
    read_only.extend_from_slice(b"read_only");
    read_only.extend_from_slice(&fixstr);
    let mut role = vec![0x83, 0xad];
    role.extend_from_slice(b"version_major");
    role.push(1);
    role.push(0xad);
    role.extend_from_slice(b"version_minor");
    role.push(1);
    role.extend_from_slice(&[0xa4, b'r', b'o', b'l', b'e']);
    role.extend_from_slice(&fixstr);
    // An unknown role string is not an error at all (it decodes as `Role::Unknown`, which
    // the dispatcher refuses with AUTH_FAILED), and certainly not BAD_UTF8.
    let hello = Frame {
        kind: Kind::Hello,
        flags: 0,
        stream: 0,
        payload: role.into(),
    };
    assert_eq!(hello.body::<Hello>().expect("HELLO decodes").role, Role::Unknown);
    for (kind, payload) in [(Kind::Ping, ping), (Kind::Request, read_only)] {
        let frame = Frame {
            kind,
            flags: 0,
            stream: if kind.is_control() { 0 } else { 1 },
            payload: payload.into(),
        };
        let err = match kind {
            Kind::Ping => frame.body::<Ping>().unwrap_err(),
            _ => frame.body::<Request>().unwrap_err(),
        };
        assert!(matches!(err, ProtocolError::BadBody { .. }), "{kind:?}: {err:?}");
        assert_eq!(err.code(), ErrorCode::BadBody);
    }
}

#[test]
fn garbage_bodies_are_bad_body() {
    let cases: &[(Kind, &[u8])] = &[
        (Kind::Request, &[]),                                                  // empty payload
        (Kind::Request, &[0xc1]),                                              // never-used marker
        (Kind::Request, &[0x81, 0xa3]),                                        // truncated map
        (Kind::Ping, &[0x81, 0xa5, b'n', b'o', b'n', b'c', b'e', 0xa1, b'x']), // nonce as str
        (Kind::Ping, &[0x80]),                                                 // missing required field
        (Kind::End, &[0x2a]),                                                  // an int, not a map
        (
            Kind::Rows,
            &[0x81, 0xa4, b'r', b'o', b'w', b's', 0x91, 0x91, 0x81, 0x01, 0x02],
        ), // a map as a Value
        (Kind::Hello, &[0x83, 0xad]),
    ];
    for &(kind, payload) in cases {
        let frame = Frame {
            kind,
            flags: 0,
            stream: if kind.is_control() { 0 } else { 1 },
            payload: payload.to_vec().into(),
        };
        let err = match kind {
            Kind::Request => frame.body::<Request>().unwrap_err(),
            Kind::Ping => frame.body::<Ping>().unwrap_err(),
            Kind::End => frame.body::<End>().unwrap_err(),
            Kind::Rows => frame.body::<Rows>().unwrap_err(),
            _ => frame.body::<Hello>().unwrap_err(),
        };
        assert!(
            matches!(&err, ProtocolError::BadBody { kind: k, .. } if *k == kind.name()),
            "{kind:?} {payload:x?}: {err:?}"
        );
        assert_eq!(err.code(), ErrorCode::BadBody);
    }
}

#[test]
fn deeply_nested_body_is_an_error_not_a_stack_overflow() {
    let mut p = vec![0x81, 0xa4, b'r', b'o', b'w', b's'];
    p.extend(std::iter::repeat_n(0x91u8, 100_000));
    let frame = Frame {
        kind: Kind::Rows,
        flags: 0,
        stream: 1,
        payload: p.into(),
    };
    assert!(matches!(frame.body::<Rows>(), Err(ProtocolError::BadBody { .. })));
}

/// `{rows: [], x: <levels - 1 nested arrays or maps around nil>}`: the nesting sits in an
/// unknown field, which the decoder skips by recursing through it.
fn nested_in_ignored_field(levels: usize, map: bool) -> Frame {
    let mut p = vec![0x82, 0xa4, b'r', b'o', b'w', b's', 0x90, 0xa1, b'x'];
    for _ in 1..levels {
        if map {
            p.extend_from_slice(&[0x81, 0x01]);
        } else {
            p.push(0x91);
        }
    }
    p.push(0xc0);
    Frame {
        kind: Kind::Rows,
        flags: 0,
        stream: 1,
        payload: p.into(),
    }
}

/// Nesting in an ignored field used to be followed 1023 levels deep, which overflows a
/// 2 MiB stack (a tokio worker thread's) in a debug build: a hostile body aborted the
/// dispatcher. Bodies deeper than MAX_BODY_DEPTH are now refused, and what is accepted
/// decodes on a small stack.
#[test]
fn nesting_in_ignored_fields_is_bounded() {
    let run = |levels: usize, map: bool| {
        let frame = nested_in_ignored_field(levels, map);
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || frame.body::<Rows>().map(|r| r.rows.len()))
            .unwrap()
            .join()
            .expect("decoding must not overflow a 256 KiB stack")
    };
    for map in [false, true] {
        assert_eq!(
            run(MAX_BODY_DEPTH, map).unwrap(),
            0,
            "{MAX_BODY_DEPTH} levels are allowed"
        );
        for levels in [MAX_BODY_DEPTH + 1, 200, 1000, 100_000] {
            let err = run(levels, map).unwrap_err();
            assert!(matches!(err, ProtocolError::BadBody { .. }), "{levels} levels: {err:?}");
        }
    }
}

#[test]
fn hello_with_another_major_version_decodes_and_is_refused_by_check_version() {
    let mut hello = Hello {
        version_major: 2,
        version_minor: 3,
        role: Role::Client,
        token: None,
        secret: None,
        slot: None,
        pid: None,
        name: Some("future".into()),
        stream_window: None,
    };
    let decoded: Hello = roundtrip(Kind::Hello, 0, &hello);
    assert_eq!(decoded, hello);
    let err = decoded.check_version().unwrap_err();
    assert!(
        matches!(err, ProtocolError::UnsupportedVersion { major: 2, minor: 3 }),
        "{err:?}"
    );
    assert_eq!(err.code(), ErrorCode::UnsupportedVersion);

    hello.version_major = PROTOCOL_MAJOR;
    hello.version_minor = 99; // newer minor: fine
    assert!(hello.check_version().is_ok());
    hello.version_major = 0;
    assert!(hello.check_version().is_err());

    let ack = HelloAck {
        version_major: 2,
        version_minor: 0,
        server: "osprey".into(),
        connection_id: 1,
        max_payload: DEFAULT_MAX_PAYLOAD as u32,
        max_streams: 1,
        keepalive_interval_ms: 1,
        worker: None,
        stream_window: 0,
    };
    assert!(matches!(
        ack.check_version(),
        Err(ProtocolError::UnsupportedVersion { major: 2, minor: 0 })
    ));
    assert!(HelloAck {
        version_major: PROTOCOL_MAJOR,
        ..ack
    }
    .check_version()
    .is_ok());
}

#[test]
fn protocol_error_codes() {
    let io = ProtocolError::Io(std::io::Error::other("x"));
    assert_eq!(io.code(), ErrorCode::BadFrame);
    assert_eq!(ProtocolError::Truncated(3).code(), ErrorCode::BadFrame);
}

/// Parameter text: a bare str that is not UTF-8 is read as Bytes (lenient); Decimal/Json
/// text that is not UTF-8 is BadUtf8, as the spec says.
#[test]
fn invalid_utf8_in_parameters() {
    // {"sql": "SELECT ?", "params": [<str ff fe>]}
    let mut p = vec![0x82, 0xa3, b's', b'q', b'l', 0xa8];
    p.extend_from_slice(b"SELECT ?");
    p.extend_from_slice(&[0xa6, b'p', b'a', b'r', b'a', b'm', b's', 0x91, 0xa2, 0xff, 0xfe]);
    let r: Request = request_frame(p.clone()).body().unwrap();
    assert_eq!(r.params, vec![Value::Bytes(vec![0xff, 0xfe])]);
    // The same bytes as Json text: [9, <str ff fe>].
    let n = p.len();
    p.truncate(n - 3);
    p.extend_from_slice(&[0x92, 0x09, 0xa2, 0xff, 0xfe]);
    let err = request_frame(p).body::<Request>().unwrap_err();
    assert!(matches!(err, ProtocolError::BadUtf8), "{err:?}");
}

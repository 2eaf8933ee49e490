//! Issue 9, item 6 and the spec gaps it lists: what the dispatcher does with frames and
//! handshakes that are well-formed but outside the rules of docs/PROTOCOL.md.

use std::time::{Duration, Instant};

use futures::future::join_all;
use osprey_client::ErrorCode;
use osprey_protocol::{ErrorBody, Frame, GoAway, Hello, HelloAck, Kind, Origin, Ping};
use osprey_tests::harness::rss_kib;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::raw::{header, hello, request, Got, Raw};
use crate::{assert_closed_loop, cluster, ms, serial};

/// A frame whose payload is `payload` as it is.
fn raw_frame(kind: Kind, stream: u32, payload: &[u8]) -> Frame {
    Frame {
        kind,
        flags: 0,
        stream,
        payload: payload.to_vec().into(),
    }
}

/// A dispatcher for one scenario of this file.
async fn one(handshake_ms: u64) -> osprey_tests::harness::Cluster {
    cluster(&format!(
        "[pool]\nsize = 1\n[timeouts]\nhandshake_timeout_ms = {handshake_ms}\n"
    ))
    .await
}

/// A HELLO as a MessagePack array (fields by position) is not a body: BAD_BODY. It was
/// accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_as_an_array_is_a_bad_body() {
    let _serial = serial().await;
    let c = one(5000).await;
    let d = &c.dispatcher;
    let mut raw = Raw::connect(d.client_addr).await;
    let positional = rmp_serde::to_vec(&hello(1, &d.client_token)).unwrap();
    raw.send(raw_frame(Kind::Hello, 0, &positional)).await;
    raw.expect_conn_error(ErrorCode::BadBody).await;
    assert_closed_loop(&c, &[], 1).await;
}

/// An unknown role is a wrong role: AUTH_FAILED, not BAD_BODY (section 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_role_is_refused_as_a_wrong_role() {
    let _serial = serial().await;
    let c = one(5000).await;
    let d = &c.dispatcher;
    #[derive(serde::Serialize)]
    struct HelloRole<'a> {
        version_major: u16,
        version_minor: u16,
        role: &'a str,
        token: &'a str,
    }
    let mut raw = Raw::connect(d.client_addr).await;
    let h = HelloRole {
        version_major: 1,
        version_minor: 1,
        role: "observer",
        token: &d.client_token,
    };
    raw.send(Frame::new(Kind::Hello, 0, &h)).await;
    raw.expect_conn_error(ErrorCode::AuthFailed).await;
    assert_closed_loop(&c, &[], 1).await;
}

/// A text as `str`, or as `bin` as a lenient encoder may write it.
enum Text<'a> {
    Str(&'a str),
    Bin(&'a [u8]),
}

impl serde::Serialize for Text<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Text::Str(t) => s.serialize_str(t),
            Text::Bin(b) => s.serialize_bytes(b),
        }
    }
}

/// Connects and sends a `HELLO` whose `role`, `token` and `name` are as given.
async fn hello_typed(addr: std::net::SocketAddr, role: Text<'_>, token: Text<'_>, name: Text<'_>) -> Raw {
    #[derive(serde::Serialize)]
    struct TypedHello<'a> {
        version_major: u16,
        version_minor: u16,
        role: Text<'a>,
        token: Text<'a>,
        name: Text<'a>,
    }
    let body = rmp_serde::to_vec_named(&TypedHello {
        version_major: 1,
        version_minor: 3,
        role,
        token,
        name,
    })
    .expect("encode");
    let mut raw = Raw::connect(addr).await;
    raw.send(raw_frame(Kind::Hello, 0, &body)).await;
    raw
}

/// Issue 20, item 5: a `HELLO` whose text fields are MessagePack `bin` instead of `str`
/// is a `BAD_BODY` (section 4: strings are `str`). The right token sent as `bin` was
/// accepted; so was a `bin` role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_text_sent_as_bytes_is_a_bad_body() {
    let _serial = serial().await;
    let c = one(5000).await;
    let d = &c.dispatcher;
    let token = d.client_token.as_str();
    let cases = [
        (
            "token",
            Text::Str("client"),
            Text::Bin(token.as_bytes()),
            Text::Str("t"),
        ),
        ("role", Text::Bin(b"client"), Text::Str(token), Text::Str("t")),
        ("name", Text::Str("client"), Text::Str(token), Text::Bin(b"t")),
    ];
    for (field, role, token, name) in cases {
        let mut raw = hello_typed(d.client_addr, role, token, name).await;
        let e = raw.expect_conn_error(ErrorCode::BadBody).await;
        println!("{field} as bin: {} {:?}", e.code, e.message);
        assert!(e.message.contains(field), "the message names the field: {e:?}");
    }
    // The same HELLO with every text a str is accepted: only the type was wrong.
    let mut raw = hello_typed(d.client_addr, Text::Str("client"), Text::Str(token), Text::Str("t")).await;
    match raw.next(Duration::from_secs(5)).await {
        Got::Frame(f) if f.kind == Kind::HelloAck => {}
        other => panic!("expected HELLO_ACK for a HELLO of str fields, got {other:?}"),
    }
    raw.expect_query_ok(1, "SELECT 1").await;
    drop(raw);
    assert_closed_loop(&c, &[], 1).await;
}

/// GOAWAY is the dispatcher's (section 3): from a client it is a PROTOCOL_VIOLATION. It
/// was ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_goaway_is_a_protocol_violation() {
    let _serial = serial().await;
    let c = one(5000).await;
    let d = &c.dispatcher;
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    let goaway = GoAway {
        code: ErrorCode::ShuttingDown,
        message: "bye".into(),
    };
    raw.send(Frame::new(Kind::GoAway, 0, &goaway)).await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;
    assert_closed_loop(&c, &[], 1).await;
}

/// PONG and CANCEL bodies are checked like any other: BAD_BODY. They were not decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pong_and_cancel_bodies_are_checked() {
    let _serial = serial().await;
    let c = one(5000).await;
    let d = &c.dispatcher;
    let (addr, token) = (d.client_addr, d.client_token.as_str());
    let (mut raw, _) = Raw::open(addr, token).await;
    raw.send(raw_frame(Kind::Pong, 0, &[0x80])).await; // {}: no nonce
    raw.expect_conn_error(ErrorCode::BadBody).await;
    let (mut raw, _) = Raw::open(addr, token).await;
    raw.send(Frame::new(Kind::Pong, 0, &Ping { nonce: 12345 })).await; // unknown nonce: ignored
    raw.send(raw_frame(Kind::Cancel, 9, &[0xa1, 0x78])).await; // "x": not a map
    raw.expect_conn_error(ErrorCode::BadBody).await;
    assert_closed_loop(&c, &[], 1).await;
}

/// A client's ERROR on stream 0 (section 10: it reports bad input, then closes): the
/// dispatcher answers nothing, closes, and cancels the client's open stream. It was
/// answered with PROTOCOL_VIOLATION.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_on_stream_0_closes_quietly() {
    let _serial = serial().await;
    let c = one(5000).await;
    let d = &c.dispatcher;
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.send(request(1, "SELECT SLEEP(30)")).await;
    crate::wait_busy(d, Duration::from_secs(5)).await;
    let body = ErrorBody::undispatched(Origin::Client, ErrorCode::BadFrame, "the client did not like a frame");
    raw.send(Frame::new(Kind::Error, 0, &body)).await;
    let t0 = Instant::now();
    raw.expect_closed(Duration::from_secs(5)).await;
    println!(
        "spec rules: a client's ERROR on stream 0 closed its connection in {} ms",
        ms(t0)
    );
    assert_closed_loop(&c, &[], 1).await;
}

/// Flow control is 1.1: a 1.0 HELLO that asks for a window gets none (section 13); 1.1
/// gets it. The 1.0 HELLO got one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_0_hello_gets_no_window() {
    let _serial = serial().await;
    let c = one(5000).await;
    let d = &c.dispatcher;
    for (minor, want) in [(0u16, 0u32), (1, 16)] {
        let ask = Hello {
            version_minor: minor,
            stream_window: Some(16),
            ..hello(1, &d.client_token)
        };
        let mut raw = Raw::connect(d.client_addr).await;
        raw.send(Frame::new(Kind::Hello, 0, &ask)).await;
        let Got::Frame(f) = raw.next(Duration::from_secs(5)).await else {
            panic!("no HELLO_ACK")
        };
        let ack: HelloAck = f.body().expect("HELLO_ACK");
        assert_eq!(ack.stream_window, want, "HELLO 1.{minor} asking for a window of 16");
        raw.expect_query_ok(1, "SELECT 1").await;
    }
    assert_closed_loop(&c, &[], 1).await;
}

/// No HELLO within the handshake timeout: KEEPALIVE_TIMEOUT (retryable), then the close
/// (section 10). It was an undocumented PROTOCOL_VIOLATION.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_handshake_deadline_is_a_keepalive_timeout() {
    let _serial = serial().await;
    let c = one(500).await;
    let d = &c.dispatcher;
    let mut raw = Raw::connect(d.client_addr).await;
    let e = raw.expect_conn_error(ErrorCode::KeepaliveTimeout).await;
    assert!(e.retryable, "{e:?}");
    assert_closed_loop(&c, &[], 1).await;
}

/// Before HELLO a connection may make the dispatcher buffer at most a small HELLO (4096
/// bytes of payload; a larger one is FRAME_TOO_LARGE at once), and only
/// `max_pending_handshakes` connections read their HELLO at once: the others wait, with
/// nothing buffered, and are served in turn. It was 64 KiB per connection, unbounded in
/// number: 1000 connections each sending most of a 60 KB "HELLO" grew the dispatcher by
/// about 60 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_before_hello_are_bounded() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\n[timeouts]\nhandshake_timeout_ms = 2000\n").await;
    let d = &c.dispatcher;
    let (addr, token) = (d.client_addr, d.client_token.clone());

    // A HELLO over 4096 bytes: FRAME_TOO_LARGE, on the header alone.
    let mut raw = Raw::connect(addr).await;
    raw.send_bytes(&header(5000, Kind::Hello as u8, 0)).await;
    raw.expect_conn_error(ErrorCode::FrameTooLarge).await;
    // A normal HELLO of nearly 4096 bytes is fine.
    let big = Hello {
        name: Some("n".repeat(3900)),
        ..hello(1, &token)
    };
    let mut raw = Raw::connect(addr).await;
    raw.send(Frame::new(Kind::Hello, 0, &big)).await;
    let Got::Frame(f) = raw.next(Duration::from_secs(5)).await else {
        panic!("no answer")
    };
    assert_eq!(f.kind, Kind::HelloAck, "{f:?}");

    // 1000 connections that each send most of a 60 KB HELLO and wait.
    const CONNS: usize = 1000;
    let rss0 = rss_kib(d.pid()).unwrap();
    let socks = join_all((0..CONNS).map(|_| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let mut bytes = header(60_000, Kind::Hello as u8, 0).to_vec();
        bytes.resize(12 + 59_000, 0x80);
        let _ = s.write_all(&bytes).await; // refused early: the write may fail
        s
    }))
    .await;
    let mut peak = rss0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss_kib(d.pid()).unwrap());
    }
    let grew_mib = peak.saturating_sub(rss0) as f64 / 1024.0;
    println!("before HELLO: {CONNS} connections sending 59 KB each: dispatcher RSS {rss0} KiB -> peak {peak} KiB (+{grew_mib:.1} MiB)");
    drop(socks);
    assert!(grew_mib < 16.0, "dispatcher RSS grew by {grew_mib:.1} MiB");
    Raw::open(addr, &token).await.0.expect_query_ok(1, "SELECT 1").await;
    assert_closed_loop(&c, &[], 1).await;
}

/// `limits.max_pending_handshakes`: with 4, four silent connections hold every handshake
/// slot; a fifth client's HELLO is read only when one frees (the silent ones are refused
/// at the handshake timeout), and then it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_wait_for_a_slot() {
    let _serial = serial().await;
    let c =
        cluster("[pool]\nsize = 1\n[limits]\nmax_pending_handshakes = 4\n[timeouts]\nhandshake_timeout_ms = 1500\n")
            .await;
    let d = &c.dispatcher;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(Raw::connect(d.client_addr).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    let mut raw = Raw::connect(d.client_addr).await;
    raw.send(Frame::new(Kind::Hello, 0, &hello(1, &d.client_token))).await;
    let Got::Frame(f) = raw.next(Duration::from_secs(5)).await else {
        panic!("closed")
    };
    let waited = ms(t0);
    assert_eq!(f.kind, Kind::HelloAck, "{f:?}");
    for mut s in silent {
        s.expect_conn_error(ErrorCode::KeepaliveTimeout).await;
    }
    println!("handshake slots: the fifth HELLO was answered after {waited} ms");
    // The silent ones held their slots for about handshake_timeout (minus our 200 ms).
    assert!(waited >= 1000, "answered after {waited} ms: the slots did not hold");
    raw.expect_query_ok(1, "SELECT 1").await;
    assert_closed_loop(&c, &[], 1).await;
}

/// REQUEST payloads wait in the dispatcher until a worker takes them: up to `max_payload`
/// each and `max_streams_per_connection` per connection (16 GiB by default). They are now
/// bounded in bytes (`limits.max_request_bytes_per_connection`, default 64 MiB, and
/// `max_request_bytes` in all): a REQUEST that does not fit fails alone with QUEUE_FULL.
/// 40 waiting 8 MiB requests on one connection grew the dispatcher by over 300 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_request_bytes_are_bounded() {
    let _serial = serial().await;
    const N: u32 = 40;
    let c = cluster("[pool]\nsize = 1\nqueue_timeout_ms = 60000\n").await;
    let d = &c.dispatcher;
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.expect_query_ok(1, "SELECT 1").await;
    let rss0 = rss_kib(d.pid()).unwrap();
    let pad = "x".repeat(8 * 1024 * 1024);
    for s in 0..N {
        raw.send(request(2 * s + 3, &format!("SELECT SLEEP(30) /* {pad} */")))
            .await;
    }
    // Every stream over the budget is answered at once: ERROR QUEUE_FULL + END.
    let (mut full, mut ends) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut peak = rss0;
    while Instant::now() < deadline {
        peak = peak.max(rss_kib(d.pid()).unwrap());
        match tokio::time::timeout(Duration::from_millis(200), raw.next_data(Duration::from_secs(60))).await {
            Err(_) => {}
            Ok(Got::Frame(f)) if f.kind == Kind::Error => {
                let e: ErrorBody = f.body().unwrap();
                assert_eq!(e.code, ErrorCode::QueueFull, "{e:?}");
                assert!(!e.dispatched && e.retryable, "{e:?}");
                full += 1;
            }
            Ok(Got::Frame(f)) if f.kind == Kind::End => ends += 1,
            Ok(other) => panic!("unexpected {other:?}"),
        }
    }
    let grew_mib = peak.saturating_sub(rss0) as f64 / 1024.0;
    println!(
        "waiting requests: {N} × 8 MiB on one connection: {full} refused with QUEUE_FULL; \
         dispatcher RSS {rss0} KiB -> peak {peak} KiB (+{grew_mib:.0} MiB)"
    );
    assert_eq!(full, ends, "each QUEUE_FULL is followed by END");
    assert!(full >= N - 8, "only {full} of {N} refused");
    // The 64 MiB budget, the worker link's copy of one request, buffers and slack.
    assert!(grew_mib < 128.0, "dispatcher RSS grew by {grew_mib:.0} MiB");
    drop(raw);
    assert_closed_loop(&c, &[], 1).await;
}

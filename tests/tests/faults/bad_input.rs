//! Risk: hostile or broken input on the client port. Bad input is answered, never crashed
//! on; memory and connections stay bounded; normal clients keep being served.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::{SinkExt, StreamExt};
use osprey_client::{Client, ErrorCode};
use osprey_protocol::{ErrorBody, Frame, Kind, Request, Rows};
use osprey_tests::harness::{rss_kib, wait_for, Dispatcher};
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::raw::{header, hello, read_to_close, request, Got, Raw};
use crate::{assert_closed_loop, cluster, describe, ms, serial};

const MAX_STREAMS: u32 = 64;
const PIPELINED: u32 = 100_000;
const FLOOD: usize = 2000;
const HANDSHAKE_MS: u128 = 500;

/// Codes a connection-level framing or handshake problem may be reported with.
const FRAMING: &[ErrorCode] = &[
    ErrorCode::FrameTooLarge,
    ErrorCode::UnknownKind,
    ErrorCode::BadFrame,
    ErrorCode::BadBody,
    ErrorCode::ProtocolViolation,
];

fn rss(d: &Dispatcher) -> u64 {
    rss_kib(d.pid()).expect("dispatcher RSS")
}

/// Samples the dispatcher's RSS until dropped; `peak()` is the largest value seen.
struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss_kib(pid).unwrap_or(0)));
        tokio::spawn({
            let (stop, peak) = (stop.clone(), peak.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(kib) = rss_kib(pid) {
                        peak.fetch_max(kib, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        });
        RssSampler { stop, peak }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Test 8. Everything a broken or hostile peer can send, one after the other on one
/// dispatcher; then it still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_on_the_wire() {
    let _serial = serial().await;
    let c = cluster(&format!(
        "[pool]\nsize = 2\n[limits]\nmax_streams_per_connection = {MAX_STREAMS}\n\
         [timeouts]\nhandshake_timeout_ms = {HANDSHAKE_MS}\n"
    ))
    .await;
    let d = &c.dispatcher;
    let addr = d.client_addr;
    let token = d.client_token.clone();
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let rss_start = rss(d);

    random_bytes(addr, &token).await;
    truncated_frames(addr, &token).await;
    huge_length(addr, &token).await;
    unknown_kind(addr, &token).await;
    handshake_refusals(addr, &token).await;
    unknown_streams(addr, &token).await;
    bad_utf8(addr, &token).await;
    duplicate_stream(d, &token).await;
    client.query("SELECT 1", &[]).await.unwrap();
    let s = d.status().await.unwrap();
    assert_eq!(
        s["clients"]["connections"], 1,
        "every bad connection was closed: {}",
        s["clients"]
    );

    pipelined_over_the_cap(d, &token).await;
    connection_flood(d, &client).await;

    // After all of this the dispatcher still serves, and the loop is closed.
    let r = client.query("SELECT 'after all that'", &[]).await.unwrap();
    assert_eq!(r.rows()[0].get::<String>(0).unwrap(), "after all that");
    let s = assert_closed_loop(&c, &[&client], 2).await;
    assert_eq!(s["clients"]["connections"], 1, "{}", s["clients"]);
    println!(
        "bad input: dispatcher RSS {rss_start} KiB at start, {} KiB at the end",
        rss(d)
    );
}

/// Random bytes, before and after HELLO: an ERROR on stream 0 naming a framing problem, then
/// the close.
async fn random_bytes(addr: SocketAddr, token: &str) {
    let mut codes: HashMap<ErrorCode, usize> = HashMap::new();
    for seed in 0..20u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut junk = vec![0u8; 4096];
        rng.fill(&mut junk[..]);
        let mut raw = if seed % 2 == 0 {
            Raw::connect(addr).await
        } else {
            Raw::open(addr, token).await.0
        };
        raw.send_bytes(&junk).await;
        let body = match raw.next_data(Duration::from_secs(5)).await {
            Got::Frame(f) if f.kind == Kind::Error && f.stream == 0 => f.body::<ErrorBody>().unwrap(),
            other => panic!("random bytes (seed {seed}): expected ERROR on stream 0, got {other:?}"),
        };
        assert!(FRAMING.contains(&body.code), "seed {seed}: {body:?}");
        raw.expect_closed(Duration::from_secs(5)).await;
        *codes.entry(body.code).or_default() += 1;
    }
    println!("bad input: 20 random-byte connections answered with {codes:?}, all closed");
}

/// A frame cut short, then the write side closed: BAD_FRAME (truncated), then the close.
async fn truncated_frames(addr: SocketAddr, token: &str) {
    let hello = Frame::new(Kind::Hello, 0, &hello(1, token)).to_bytes();
    // Inside the header, and inside the payload.
    for cut in [5, hello.len() - 3] {
        let mut raw = Raw::connect(addr).await;
        raw.send_bytes(&hello[..cut]).await;
        raw.wr.get_mut().shutdown().await.unwrap();
        raw.expect_conn_error(ErrorCode::BadFrame).await;
    }
    // After the handshake, a REQUEST cut short.
    let (mut raw, _) = Raw::open(addr, token).await;
    let req = request(1, "SELECT 1").to_bytes();
    raw.send_bytes(&req[..req.len() - 4]).await;
    raw.wr.get_mut().shutdown().await.unwrap();
    raw.expect_conn_error(ErrorCode::BadFrame).await;
    println!("bad input: truncated frames answered BAD_FRAME and closed");
}

/// A length field over the maximum: FRAME_TOO_LARGE on stream 0 at once (nothing buffered,
/// no payload needed), then the close.
async fn huge_length(addr: SocketAddr, token: &str) {
    let mut raw = Raw::connect(addr).await;
    raw.send_bytes(&header(u32::MAX, Kind::Hello as u8, 0)).await;
    raw.expect_conn_error(ErrorCode::FrameTooLarge).await;

    let (mut raw, ack) = Raw::open(addr, token).await;
    raw.send_bytes(&header(ack.max_payload + 1, Kind::Request as u8, 1))
        .await;
    let body = raw.expect_conn_error(ErrorCode::FrameTooLarge).await;
    println!("bad input: huge length field -> {} ({})", body.code, body.message);
}

async fn unknown_kind(addr: SocketAddr, token: &str) {
    let (mut raw, _) = Raw::open(addr, token).await;
    let mut frame = header(1, 0x0d, 1).to_vec();
    frame.push(0x80);
    raw.send_bytes(&frame).await;
    raw.expect_conn_error(ErrorCode::UnknownKind).await;
    // STARTED (1.4) is a worker's frame: from a client it is a protocol violation.
    let (mut raw, _) = Raw::open(addr, token).await;
    raw.send(Frame::new(Kind::Started, 1, &osprey_protocol::Started {}))
        .await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;
    // RESET (1.5) is the dispatcher's to a worker, SESSION its to a client.
    let (mut raw, _) = Raw::open(addr, token).await;
    raw.send(Frame::new(Kind::Reset, 1, &osprey_protocol::Reset {})).await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;
    let (mut raw, _) = Raw::open(addr, token).await;
    let opened = osprey_protocol::SessionOpened {
        member: "m".into(),
        slot: 0,
        read_only: false,
    };
    raw.send(Frame::new(Kind::Session, 1, &opened)).await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;
}

/// HELLO with another major version, a wrong token, a REQUEST before HELLO.
async fn handshake_refusals(addr: SocketAddr, token: &str) {
    let mut raw = Raw::connect(addr).await;
    raw.send(Frame::new(Kind::Hello, 0, &hello(2, token))).await;
    raw.expect_conn_error(ErrorCode::UnsupportedVersion).await;

    let mut raw = Raw::connect(addr).await;
    raw.send(Frame::new(Kind::Hello, 0, &hello(1, "not-the-token"))).await;
    raw.expect_conn_error(ErrorCode::AuthFailed).await;

    let mut raw = Raw::connect(addr).await;
    raw.send(request(1, "SELECT 1")).await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;
    println!(
        "bad input: HELLO v2 -> UNSUPPORTED_VERSION, wrong token -> AUTH_FAILED, REQUEST first -> PROTOCOL_VIOLATION"
    );
}

/// Frames on streams that do not exist: a CANCEL is ignored (the connection stays usable);
/// a ROWS frame from a client is a protocol violation.
async fn unknown_streams(addr: SocketAddr, token: &str) {
    let (mut raw, _) = Raw::open(addr, token).await;
    raw.send(Frame::new(
        Kind::Cancel,
        4242,
        &osprey_protocol::Cancel {
            reason: "no such stream".into(),
        },
    ))
    .await;
    raw.expect_query_ok(1, "SELECT 1").await;
    raw.send(Frame::new(Kind::Rows, 77, &Rows { rows: vec![] })).await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;
    println!("bad input: CANCEL on an unknown stream ignored; ROWS from a client -> PROTOCOL_VIOLATION");
}

/// SQL that is not UTF-8 fails its stream alone (BAD_UTF8 + END); the connection goes on.
async fn bad_utf8(addr: SocketAddr, token: &str) {
    let (mut raw, _) = Raw::open(addr, token).await;
    // {"sql": <str of 3 bytes that are not UTF-8>}
    let payload: &[u8] = &[0x81, 0xa3, b's', b'q', b'l', 0xa3, 0xff, 0xfe, 0x41];
    let mut frame = header(payload.len() as u32, Kind::Request as u8, 3).to_vec();
    frame.extend_from_slice(payload);
    raw.send_bytes(&frame).await;
    let body = match raw.next_data(Duration::from_secs(5)).await {
        Got::Frame(f) if f.kind == Kind::Error && f.stream == 3 => f.body::<ErrorBody>().unwrap(),
        other => panic!("expected ERROR on stream 3, got {other:?}"),
    };
    assert_eq!(body.code, ErrorCode::BadUtf8, "{body:?}");
    assert!(!body.dispatched);
    match raw.next_data(Duration::from_secs(5)).await {
        Got::Frame(f) if f.kind == Kind::End && f.stream == 3 => {}
        other => panic!("expected END on stream 3, got {other:?}"),
    }
    raw.expect_query_ok(5, "SELECT 1").await;
    // The same stream id is free again.
    raw.expect_query_ok(3, "SELECT 2").await;
    println!("bad input: invalid UTF-8 SQL -> BAD_UTF8 + END on its stream; connection still usable");
}

/// A REQUEST on a stream id that is still open: DUPLICATE_STREAM on stream 0 and the close;
/// the stream that was open is cancelled on the dispatcher side and its worker freed.
async fn duplicate_stream(d: &Dispatcher, token: &str) {
    let (mut raw, _) = Raw::open(d.client_addr, token).await;
    raw.send(request(1, "SELECT SLEEP(30)")).await;
    let busy = crate::wait_busy(d, Duration::from_secs(5)).await;
    raw.send(request(1, "SELECT 1")).await;
    let t = Instant::now();
    raw.expect_conn_error(ErrorCode::DuplicateStream).await;
    let freed = wait_for(
        Duration::from_secs(3),
        "the open stream's worker to be freed",
        || async {
            crate::slots(d)
                .await
                .into_iter()
                .find(|s| s.slot == busy.slot && s.state == "idle")
        },
    )
    .await
    .unwrap();
    assert_eq!(freed.pid, busy.pid, "cancelled, not killed");
    println!(
        "bad input: REQUEST on an open stream -> DUPLICATE_STREAM; its SLEEP(30) freed after {} ms",
        ms(t)
    );
}

/// 100k REQUESTs pipelined on one connection with max_streams 64: every stream gets exactly
/// one END; those over the cap get ERROR TOO_MANY_STREAMS first; RSS stays bounded.
async fn pipelined_over_the_cap(d: &Dispatcher, token: &str) {
    let (raw, ack) = Raw::open(d.client_addr, token).await;
    assert_eq!(ack.max_streams, MAX_STREAMS);
    let rss0 = rss(d);
    let sampler = RssSampler::start(d.pid());
    let Raw { mut rd, mut wr } = raw;
    let t0 = Instant::now();
    let writer = tokio::spawn(async move {
        let frame = Frame::new(Kind::Request, 0, &Request::sql("SELECT 1"));
        for id in 1..=PIPELINED {
            wr.feed(frame.clone().with_stream(id)).await.expect("feed REQUEST");
            if id % 1024 == 0 {
                SinkExt::<Frame>::flush(&mut wr).await.expect("flush");
            }
        }
        SinkExt::<Frame>::flush(&mut wr).await.expect("flush");
        wr
    });
    // Per stream: 0 = nothing yet, 1 = result frames, 2 = ERROR seen, 3 = ended.
    let mut state = vec![0u8; PIPELINED as usize + 1];
    let (mut ended, mut ok, mut rejected) = (0u32, 0u32, 0u32);
    let mut other_errors: HashMap<ErrorCode, u32> = HashMap::new();
    let read = async {
        while ended < PIPELINED {
            let f = match rd.next().await {
                Some(Ok(f)) => f,
                other => panic!("connection lost after {ended} ENDs: {other:?}"),
            };
            if f.stream == 0 {
                assert!(matches!(f.kind, Kind::Ping | Kind::Pong), "on stream 0: {f:?}");
                continue;
            }
            let st = &mut state[f.stream as usize];
            assert_ne!(*st, 3, "a frame after END on stream {}: {f:?}", f.stream);
            match f.kind {
                Kind::Columns | Kind::Rows => {
                    assert_eq!(*st & 2, 0, "result after ERROR");
                    *st = 1;
                }
                Kind::Error => {
                    let body: ErrorBody = f.body().unwrap();
                    *st = 2;
                    match body.code {
                        ErrorCode::TooManyStreams => rejected += 1,
                        code => *other_errors.entry(code).or_default() += 1,
                    }
                }
                Kind::End => {
                    if *st != 2 {
                        ok += 1;
                    }
                    *st = 3;
                    ended += 1;
                }
                other => panic!("unexpected {other:?} on stream {}", f.stream),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .unwrap_or_else(|_| panic!("not every pipelined stream ended within 120 s: {ended} of {PIPELINED}"));
    let wr = writer.await.unwrap();
    let took = t0.elapsed();
    let rss1 = rss(d);
    let peak = sampler.peak();
    drop(sampler);
    println!(
        "bad input: {PIPELINED} pipelined REQUESTs (max_streams {MAX_STREAMS}) in {took:?}: {ok} served, \
         {rejected} TOO_MANY_STREAMS, other errors {other_errors:?}; dispatcher RSS {rss0} KiB before, \
         peak {peak} KiB, {rss1} KiB after"
    );
    assert!(state[1..].iter().all(|&s| s == 3), "every stream ended exactly once");
    assert_eq!(ok + rejected + other_errors.values().sum::<u32>(), PIPELINED);
    assert!(
        other_errors.is_empty(),
        "only TOO_MANY_STREAMS is expected: {other_errors:?}"
    );
    assert!(ok >= MAX_STREAMS, "at least the first {MAX_STREAMS} were accepted");
    assert!(rejected > 0, "the cap was never hit");
    assert!(
        peak < rss0 + 64 * 1024,
        "dispatcher RSS grew from {rss0} KiB to a peak of {peak} KiB"
    );
    drop((rd, wr));
}

/// 2000 TCP connections that never send HELLO: each is closed after handshake_timeout, and a
/// normal client is served meanwhile.
async fn connection_flood(d: &Dispatcher, client: &Client) {
    let rss0 = rss(d);
    let sampler = RssSampler::start(d.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let normal = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            let (mut n, mut worst) = (0u32, Duration::ZERO);
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                if let Err(e) = client.query("SELECT 1", &[]).await {
                    panic!("the normal client failed during the flood: {}", describe(&e));
                }
                worst = worst.max(t.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (n, worst)
        }
    });
    let t0 = Instant::now();
    let addr = d.client_addr;
    // One task per connection, so that each one's timing is observed promptly. `since_start`
    // counts from before connect (a bound the dispatcher's handshake timer cannot beat),
    // `since_open` from when the connect was seen complete.
    let tasks: Vec<_> = (0..FLOOD)
        .map(|_| {
            tokio::spawn(async move {
                let start = Instant::now();
                let mut sock = TcpStream::connect(addr).await.expect("flood connect");
                let opened = Instant::now();
                let bytes = read_to_close(&mut sock, Duration::from_secs(15)).await;
                (start.elapsed(), opened.elapsed(), bytes)
            })
        })
        .collect();
    let conns: Vec<_> = join_all(tasks).await.into_iter().map(|r| r.unwrap()).collect();
    let all_closed_ms = ms(t0);
    let connections_peak = conns.len();
    let mut since_start: Vec<u128> = Vec::with_capacity(FLOOD);
    let mut lives: Vec<u128> = Vec::with_capacity(FLOOD);
    for (from_start, from_open, bytes) in &conns {
        let bytes = bytes.expect("a flood connection was not closed within 15 s");
        // The refusal (ERROR KEEPALIVE_TIMEOUT on stream 0) precedes the close.
        assert!(bytes > 0, "a flood connection was closed without an ERROR frame");
        since_start.push(from_start.as_millis());
        lives.push(from_open.as_millis());
    }
    since_start.sort_unstable();
    lives.sort_unstable();
    wait_for(Duration::from_secs(5), "the flood connections to be gone", || async {
        let s = d.status().await.ok()?;
        (s["clients"]["connections"].as_i64() == Some(1)).then_some(())
    })
    .await
    .unwrap();
    stop.store(true, Ordering::SeqCst);
    let (served, worst) = normal.await.unwrap();
    let peak = sampler.peak();
    drop(sampler);
    println!(
        "bad input: flood of {connections_peak} silent connections all closed after {all_closed_ms} ms; \
         lifetime from connect start min {} ms; from connect seen min {} ms, median {} ms, max {} ms; normal client served {served} queries meanwhile \
         (slowest {worst:?}); dispatcher RSS {rss0} KiB before, peak {peak} KiB",
        since_start[0],
        lives[0],
        lives[lives.len() / 2],
        lives[lives.len() - 1]
    );
    // Never before handshake_timeout (the dispatcher's timer starts after our connect began).
    assert!(
        since_start[0] >= HANDSHAKE_MS,
        "a connection was closed after {} ms",
        since_start[0]
    );
    assert!(
        lives[lives.len() - 1] < HANDSHAKE_MS + 5000,
        "a connection lived {} ms",
        lives[lives.len() - 1]
    );
    assert!(served > 0, "the normal client was not served during the flood");
}

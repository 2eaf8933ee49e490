//! Issue 20, item 4: what a peer of the worker socket can do before its `HELLO` has
//! shown the worker secret.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_client::ErrorCode;
use osprey_protocol::{ErrorBody, Frame, FrameCodec, Kind, Ping, Ready, DEFAULT_MAX_PAYLOAD};
use osprey_tests::harness::{rss_kib, Dispatcher};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

use crate::raw::header;
use crate::{assert_closed_loop, cluster, serial};

/// The connection-level ERROR a worker-socket peer gets for `frame` sent first, and
/// whether the dispatcher then closed the connection.
async fn first_frame_on_worker_socket(d: &Dispatcher, frame: Frame) -> (ErrorBody, bool) {
    let sock = UnixStream::connect(d.worker_socket()).await.expect("worker socket");
    let mut w = Framed::new(sock, FrameCodec::new(DEFAULT_MAX_PAYLOAD));
    w.send(frame).await.expect("send");
    let answer = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("an answer within 5 s")
        .expect("an ERROR frame, not a close")
        .expect("a well-formed frame");
    assert_eq!((answer.kind, answer.stream), (Kind::Error, 0), "{answer:?}");
    let body: ErrorBody = answer.body().expect("ERROR body");
    let closed = matches!(
        tokio::time::timeout(Duration::from_secs(5), w.next()).await,
        Ok(None) | Ok(Some(Err(_)))
    );
    (body, closed)
}

/// A `PING` or `READY` before `HELLO` on the worker socket is a `PROTOCOL_VIOLATION`
/// (sections 3 and 14), as on the client port; it was `AUTH_FAILED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_before_hello_on_the_worker_socket_is_a_protocol_violation() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\n").await;
    let d = &c.dispatcher;
    let before = d.worker_pids().await.expect("workers");
    for frame in [
        Frame::new(Kind::Ping, 0, &Ping { nonce: 1 }),
        Frame::new(
            Kind::Ready,
            0,
            &Ready {
                db_connection_id: 1,
                server_version: "11.0".into(),
            },
        ),
    ] {
        let kind = frame.kind;
        let (body, closed) = first_frame_on_worker_socket(d, frame).await;
        println!(
            "{kind:?} before HELLO on the worker socket: {} {:?}",
            body.code, body.message
        );
        assert_eq!(body.code, ErrorCode::ProtocolViolation, "{kind:?} first: {body:?}");
        assert!(!body.dispatched && !body.retryable);
        assert!(closed, "the connection is closed after the ERROR");
    }
    // The pool did not notice.
    d.wait_idle(1, Duration::from_secs(5)).await.expect("the slot idle");
    assert_eq!(d.worker_pids().await.expect("workers"), before);
    assert_closed_loop(&c, &[], 1).await;
}

/// Before `HELLO` a worker-socket peer may announce at most 4096 bytes of payload, as a
/// client may (section 15): a header announcing 16 MiB gets `FRAME_TOO_LARGE` and the
/// close at once, instead of the dispatcher reading and buffering the payload (10 such
/// connections took the dispatcher from 36 to 196 MB RSS here; 37 -> 37 MB with the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_socket_bounds_frames_before_hello() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\n").await;
    let d = &c.dispatcher;
    let rss_before = rss_kib(d.pid()).expect("rss");
    let chunk = vec![0u8; 1 << 20];
    let mut conns = Vec::new();
    let mut refused = 0;
    for _ in 0..10 {
        let mut s = UnixStream::connect(d.worker_socket()).await.expect("worker socket");
        // A HELLO of 16 MiB - 1 byte (within the general maximum), then 15 MiB of it.
        s.write_all(&header((16 << 20) - 1, Kind::Hello as u8, 0))
            .await
            .expect("header");
        let mut sent = 0;
        for _ in 0..15 {
            match tokio::time::timeout(Duration::from_secs(2), s.write_all(&chunk)).await {
                Ok(Ok(())) => sent += 1,
                // Closed by the dispatcher, or it stopped reading: it holds no more of it.
                _ => break,
            }
        }
        refused += usize::from(sent < 15);
        conns.push(s);
    }
    let rss_after = rss_kib(d.pid()).expect("rss");
    println!(
        "10 worker-socket connections each sending a 16 MiB HELLO: dispatcher RSS {} -> {} MB, {refused} cut short",
        rss_before / 1024,
        rss_after / 1024
    );
    // Each got FRAME_TOO_LARGE before the close.
    for mut s in conns {
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
        assert!(
            answer.len() > 12,
            "an ERROR frame before the close: {} bytes",
            answer.len()
        );
        let len = u32::from_be_bytes(answer[0..4].try_into().expect("4 bytes")) as usize;
        assert_eq!(answer[4], Kind::Error as u8, "an ERROR frame");
        let frame = Frame {
            kind: Kind::Error,
            flags: 0,
            stream: 0,
            payload: answer[12..12 + len].to_vec().into(),
        };
        let body: ErrorBody = frame.body().expect("ERROR body");
        assert_eq!(body.code, ErrorCode::FrameTooLarge, "{body:?}");
    }
    assert_eq!(refused, 10, "every oversized HELLO was cut short");
    assert!(
        rss_after < rss_before + 20 * 1024,
        "RSS grew from {rss_before} to {rss_after} KiB"
    );
    assert_closed_loop(&c, &[], 1).await;
}

/// A worker that sends `RESULT_END` on a stream whose REQUEST did not ask for it (test-only
/// `OSPREY_FAULT_UNASKED_RESULT_END`) is a broken worker: the request ends with
/// `WORKER_LOST`, the worker is replaced, and the client never sees a frame its protocol
/// version does not promise (it was relayed: the SDK failed the query with a protocol
/// violation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_end_nobody_asked_for_is_a_broken_worker() {
    a_worker_that_answers_select_1_so_is_replaced(("OSPREY_FAULT_UNASKED_RESULT_END", "1")).await;
}

/// A worker run with the test-only fault `env` breaks the protocol answering `SELECT 1`:
/// the request ends `WORKER_LOST`, and the worker is replaced.
async fn a_worker_that_answers_select_1_so_is_replaced(env: (&str, &str)) {
    let _serial = serial().await;
    let c = cluster("").await;
    let config = osprey_tests::harness::Dispatcher::config_for(c.sandbox.primary(), "[pool]\nsize = 1\n");
    let d = Dispatcher::spawn_with_env(config, &[env]).unwrap();
    d.wait_idle(1, Duration::from_secs(30)).await.unwrap();
    let client = d.client().await.unwrap();
    let e = client
        .query("SELECT 1", &[])
        .await
        .expect_err("the worker broke the protocol");
    assert_eq!(e.code(), ErrorCode::WorkerLost, "{}", crate::describe(&e));
    let m = d.metrics().await.unwrap();
    let kills: f64 = m
        .lines()
        .find(|l| l.starts_with("osprey_worker_kills_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    assert!(kills >= 1.0, "the worker was replaced: {m}");
}

/// Issue 23 item 9: a worker that sends `RAW_ROWS` on a stream whose request did not ask
/// for them (`raw_rows`) is a broken worker: replaced, the request answered `WORKER_LOST`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_rows_nobody_asked_for_are_a_broken_workers() {
    // The SDK asks for ROWS: the worker adds an empty RAW_ROWS.
    a_worker_that_answers_select_1_so_is_replaced(("OSPREY_FAULT_ROWS", "unasked")).await;
}

/// Issue 23 item 9: the MySQL front end hands the worker's row packets on, but not one a
/// client would read as something else (here an ERR packet a broken worker passes off as
/// a row): that connection ends with the statement unanswered, nothing forged reaches
/// the client, and the dispatcher goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_row_that_is_not_a_row_never_reaches_a_mysql_client() {
    use mysql_async::prelude::Queryable;
    let _serial = serial().await;
    let c = cluster("").await;
    // An ERR packet passed off as a row, then a 9-byte 0xFE packet (to a client with
    // DEPRECATE_EOF, as mysql_async, the result's OK terminator).
    for fault in ["not_a_row", "eof_row"] {
        let mysql = osprey_tests::harness::free_addr();
        let password = "rows-Secret-1";
        let overrides = format!(
            "[pool]\nsize = 1\n[mysql]\nlisten = \"{mysql}\"\n[[mysql.users]]\nname = \"app\"\nnative_hash = \"{}\"\n",
            osprey_protocol::mysql_auth::native_hash(password)
        );
        let config = osprey_tests::harness::Dispatcher::config_for(c.sandbox.primary(), &overrides);
        let d = Dispatcher::spawn_with_env(config, &[("OSPREY_FAULT_ROWS", fault)]).unwrap();
        d.wait_idle(1, Duration::from_secs(30)).await.unwrap();
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname(mysql.ip().to_string())
            .tcp_port(mysql.port())
            .user(Some("app"))
            .pass(Some(password))
            // Given, so that the driver asks the server nothing at login (each such query
            // would meet the broken worker).
            .max_allowed_packet(Some(16 << 20))
            .wait_timeout(Some(28_800))
            .prefer_socket(false);
        let mut conn = mysql_async::Conn::new(opts).await.expect("logs in");
        let r: Result<Vec<mysql_async::Row>, _> = conn.query("SELECT 1").await;
        match r {
            Err(mysql_async::Error::Server(e)) => panic!("{fault}: the forged ERR reached the client: {e}"),
            Err(_) => {}
            Ok(rows) => panic!("{fault}: a forged packet ended the result: {rows:?}"),
        }
        // The SDK's requests ask for ROWS, which this worker sends right.
        let client = d.client().await.unwrap();
        client.query("SELECT 41 + 1", &[]).await.expect("served");
    }
}

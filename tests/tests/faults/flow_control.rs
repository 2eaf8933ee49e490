//! Risk: one stream whose reader stops (a large result read slowly, or not at all) holds
//! up every other stream of the same SDK connection, and pins its worker.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mysql_async::prelude::Queryable;
use osprey_client::{ErrorCode, Origin, Request, StreamItem};
use osprey_protocol::{ErrorBody, Frame, Kind, Window};

use crate::raw::{request, Got, Raw};
use crate::{assert_closed_loop, cluster, describe, ms, serial};

const BIG: &str = "SELECT seq, REPEAT('x', 100) FROM seq_1_to_100000";

/// With per-stream flow control, a result the application has stopped reading (after its
/// first row) does not stop the connection: 200 more queries on the same `Client` (one
/// connection) each finish quickly meanwhile, and the big result then arrives complete and
/// in order. Without flow control the SDK's 16-frame buffer for that stream fills and the
/// connection stops reading the socket: the other queries stall behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stream_does_not_hold_up_the_others() {
    let _serial = serial().await;
    // One connection runs the unread stream and the others on the second worker: no
    // per-connection cap (it would keep the second worker for other connections).
    let c = cluster("[pool]\nsize = 2\nbatch_rows = 100\nmax_per_connection = 0\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();

    let mut big = client.stream(Request::sql(BIG));
    assert!(matches!(big.next().await, Some(Ok(StreamItem::ResultSet(_)))));
    let first = big.next_row().await.unwrap().unwrap();
    assert_eq!(first.get::<i64>(0).unwrap(), 1);

    // 1000 ROWS frames of 100 rows are waiting for a reader that does not come yet.
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    for i in 0..200i64 {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), client.query(format!("SELECT {i}"), &[]))
            .await
            .unwrap_or_else(|_| panic!("query {i} stalled behind the unread stream"))
            .unwrap_or_else(|e| panic!("query {i}: {}", describe(&e)));
        assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), i);
        worst = worst.max(t.elapsed());
    }
    println!(
        "flow control: 200 queries beside an unread stream in {} ms, slowest {worst:?}",
        ms(t0)
    );

    let mut expect = 2i64;
    while let Some(row) = big.next_row().await {
        let row = row.unwrap_or_else(|e| panic!("the big result: {}", describe(&e)));
        assert_eq!(row.get::<i64>(0).unwrap(), expect);
        expect += 1;
    }
    assert_eq!(expect, 100_001);
    assert_eq!(big.summary().unwrap().rows, 100_000);
    assert_closed_loop(&c, &[&client], 2).await;
}

/// A stream left unread for client_write_timeout ends with ERROR SLOW_CONSUMER (origin
/// dispatcher, dispatched) + END, its statement is killed and its worker freed: with a
/// pool of one, a second query on the same connection is served. The connection stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_stream_is_cancelled_and_frees_its_worker() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\nbatch_rows = 100\n[limits]\nclient_write_timeout_ms = 1500\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    let before = d.status().await.unwrap()["slots"][0]["pid"].as_u64();

    let mut big = client.stream(Request::sql(BIG));
    assert!(matches!(big.next().await, Some(Ok(StreamItem::ResultSet(_)))));
    let t0 = Instant::now();
    // The only worker is busy with the unread stream; this waits for it.
    let r = client
        .query("SELECT 'served'", &[])
        .await
        .unwrap_or_else(|e| panic!("the second query: {}", describe(&e)));
    let waited = t0.elapsed();
    assert_eq!(r.rows()[0].get::<String>(0).unwrap(), "served");
    println!("flow control: the worker was freed after {} ms", waited.as_millis());
    assert!(
        waited >= Duration::from_millis(1400),
        "served after {waited:?}: the stream was not stalled"
    );

    let mut rows = 0u64;
    let err = loop {
        match big.next_row().await {
            Some(Ok(_)) => rows += 1,
            Some(Err(e)) => break e,
            None => panic!("the abandoned stream ended without an error after {rows} rows"),
        }
    };
    println!("flow control: abandoned stream: {rows} rows, then {}", describe(&err));
    assert_eq!(err.code(), ErrorCode::SlowConsumer, "{}", describe(&err));
    assert_eq!(err.origin(), Origin::Dispatcher);
    assert!(err.dispatched());
    assert!(rows < 100_000);
    // KILL QUERY, not a killed worker.
    assert_eq!(d.status().await.unwrap()["slots"][0]["pid"].as_u64(), before);
    assert_eq!(
        crate::metric(d, "osprey_requests_total{outcome=\"slow_consumer\"}").await,
        1.0
    );
    assert_closed_loop(&c, &[&client], 1).await;
}

/// The dispatcher's side of the window, frame by frame (raw client, window 2): it sends
/// COLUMNS and one ROWS, then nothing until WINDOW +3 brings exactly three more ROWS;
/// after CANCEL no more data comes, only ERROR CANCELLED + END.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_sends_no_more_than_the_window() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\nbatch_rows = 100\n").await;
    let d = &c.dispatcher;
    let (mut raw, ack) = Raw::open_with_window(d.client_addr, &d.client_token, 2).await;
    assert_eq!(ack.stream_window, 2);
    raw.send(request(1, BIG)).await;

    // What arrives until `quiet` passes without a data frame (PINGs are answered).
    async fn data_until_quiet(raw: &mut Raw, quiet: Duration) -> Vec<Kind> {
        let mut kinds = Vec::new();
        loop {
            match tokio::time::timeout(quiet, raw.next_data(Duration::from_secs(30))).await {
                Err(_) => return kinds,
                Ok(Got::Frame(f)) => {
                    assert_eq!(f.stream, 1, "{f:?}");
                    kinds.push(f.kind);
                }
                Ok(Got::Closed) => panic!("closed after {kinds:?}"),
            }
        }
    }
    let quiet = Duration::from_millis(500);
    assert_eq!(data_until_quiet(&mut raw, quiet).await, vec![Kind::Columns, Kind::Rows]);
    raw.send(Frame::new(Kind::Window, 1, &Window { increment: 3 })).await;
    assert_eq!(data_until_quiet(&mut raw, quiet).await, vec![Kind::Rows; 3]);

    raw.send(Frame::new(
        Kind::Cancel,
        1,
        &osprey_protocol::Cancel { reason: "test".into() },
    ))
    .await;
    let mut tail = Vec::new();
    loop {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) => {
                tail.push(f.kind);
                if f.kind == Kind::Error {
                    let e: ErrorBody = f.body().unwrap();
                    assert_eq!(e.code, ErrorCode::Cancelled, "{e:?}");
                }
                if f.kind == Kind::End {
                    break;
                }
            }
            Got::Closed => panic!("closed after {tail:?}"),
        }
    }
    assert_eq!(tail, vec![Kind::Error, Kind::End]);
    raw.expect_query_ok(3, "SELECT 1").await;
    assert_closed_loop(&c, &[], 1).await;
}

/// Review finding (flow control). A CANCEL that reaches a stream whose worker had
/// already sent everything: the rows still waiting for credit are dropped, so the stream
/// must end with ERROR CANCELLED + END. It once ended with the worker's plain END, which
/// passes for a complete result to a client that reads to END (the SDK discards a
/// cancelled stream's frames, a client in another language may not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_the_worker_finished_is_not_a_success() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\nbatch_rows = 100\n").await;
    let d = &c.dispatcher;
    let session = crate::slots(d).await[0].db_connection_id.expect("db connection id");
    let (mut raw, _) = Raw::open_with_window(d.client_addr, &d.client_token, 2).await;
    raw.send(request(1, "SELECT seq FROM seq_1_to_1000")).await;
    for kind in [Kind::Columns, Kind::Rows] {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) => assert_eq!((f.kind, f.stream), (kind, 1)),
            Got::Closed => panic!("closed"),
        }
    }
    // The statement is over on the server (its session sleeps): the worker has the
    // whole result, and 1000 short rows fit in its socket to the dispatcher.
    let opts = c.sandbox.primary().opts();
    osprey_tests::harness::wait_for(Duration::from_secs(5), "the worker's statement to end", || {
        let opts = opts.clone();
        async move {
            let mut db = mysql_async::Conn::new(opts).await.ok()?;
            let sql = format!("SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = {session}");
            let cmd: Option<String> = db.query_first(sql).await.ok()?;
            let _ = db.disconnect().await;
            (cmd.as_deref() == Some("Sleep")).then_some(())
        }
    })
    .await
    .unwrap();
    raw.send(Frame::new(
        Kind::Cancel,
        1,
        &osprey_protocol::Cancel { reason: "test".into() },
    ))
    .await;
    let mut tail = Vec::new();
    let error = loop {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) if f.stream == 1 && f.kind == Kind::Error => break f.body::<ErrorBody>().unwrap(),
            Got::Frame(f) if f.stream == 1 && f.kind == Kind::End => panic!("END without ERROR after {tail:?}"),
            Got::Frame(f) => tail.push(f.kind),
            Got::Closed => panic!("closed after {tail:?}"),
        }
    };
    println!("cancel after the worker finished: {error:?}");
    assert_eq!(error.code, ErrorCode::Cancelled, "{error:?}");
    assert!(error.dispatched);
    match raw.next_data(Duration::from_secs(10)).await {
        Got::Frame(f) => assert_eq!((f.kind, f.stream), (Kind::End, 1)),
        Got::Closed => panic!("closed"),
    }
    raw.expect_query_ok(3, "SELECT 1").await;
    assert_closed_loop(&c, &[], 1).await;
}

/// WINDOW is checked: on a connection that did not ask for flow control, or with increment
/// 0, it is a PROTOCOL_VIOLATION (ERROR on stream 0, then close); on a stream that is not
/// open it is ignored (it may have crossed the END).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_frames_are_checked() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\n").await;
    let d = &c.dispatcher;

    // No stream_window in HELLO (the raw client's): WINDOW is not allowed.
    let (mut raw, ack) = Raw::open(d.client_addr, &d.client_token).await;
    assert_eq!(ack.stream_window, 0);
    raw.send(Frame::new(Kind::Window, 1, &Window { increment: 1 })).await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;

    // With flow control: a stream that is not open is ignored, increment 0 refused.
    let (mut raw, ack) = Raw::open_with_window(d.client_addr, &d.client_token, 8).await;
    assert_eq!(ack.stream_window, 8);
    raw.send(Frame::new(Kind::Window, 77, &Window { increment: 5 })).await;
    raw.expect_query_ok(1, "SELECT 1").await;
    raw.send(Frame::new(Kind::Window, 1, &Window { increment: 0 })).await;
    raw.expect_conn_error(ErrorCode::ProtocolViolation).await;
    assert_closed_loop(&c, &[], 1).await;
}

/// Review finding (step 4 of pipelining: the relay acts on the frames at hand without going
/// round its loop). A stream that reaches its deadline while its next data frame waits for
/// credit ends with `REQUEST_TIMEOUT`, as it did before, although its `END` was read with
/// that frame: the relay once ended it at that `END` instead, as a success whose rows were
/// dropped (`CANCELLED`, outcome "ok"), before its timer could act.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passed_waiting_for_credit_is_a_timeout_even_with_the_end_at_hand() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 1\n[limits]\nclient_write_timeout_ms = 20000\n").await;
    let d = &c.dispatcher;
    // A window of one frame: COLUMNS spends it, the ROWS behind it waits.
    let (mut raw, ack) = Raw::open_with_window(d.client_addr, &d.client_token, 1).await;
    assert_eq!(ack.stream_window, 1);
    // A result small enough that the worker writes COLUMNS, ROWS and END in one write.
    let mut req = Request::sql("SELECT seq FROM seq_1_to_3 WHERE (SELECT SLEEP(0.2)) = 0");
    req.timeout_ms = 1000;
    raw.send(Frame::new(Kind::Request, 1, &req)).await;
    let t0 = Instant::now();
    let mut kinds = Vec::new();
    let error = loop {
        match raw.next_data(Duration::from_secs(10)).await {
            Got::Frame(f) if f.kind == Kind::Error => break f.body::<ErrorBody>().expect("ERROR body"),
            Got::Frame(f) => {
                assert_eq!(f.stream, 1, "{f:?}");
                kinds.push(f.kind);
            }
            Got::Closed => panic!("closed after {kinds:?}"),
        }
    };
    assert_eq!(kinds, vec![Kind::Columns], "no credit was given for more");
    assert_eq!(error.code, ErrorCode::RequestTimeout, "{error:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "answered after {:?}",
        t0.elapsed()
    );
    match raw.next_data(Duration::from_secs(5)).await {
        Got::Frame(f) => assert_eq!((f.kind, f.stream), (Kind::End, 1)),
        Got::Closed => panic!("closed before END"),
    }
    assert_eq!(
        crate::metric(d, "osprey_requests_total{outcome=\"timeout\"}").await,
        1.0
    );
}

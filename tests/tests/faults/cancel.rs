//! Risk: a client gives up on a request. The statement must be stopped (KILL QUERY) and the
//! worker returned to the pool — not killed, not left running a 30 s query.

use std::time::{Duration, Instant};

use osprey_client::ErrorCode;
use osprey_protocol::{Cancel, ErrorBody, Frame, Kind};
use osprey_tests::harness::wait_for;

use crate::raw::{request, Got, Raw};
use crate::{assert_closed_loop, cluster, ms, serial, slots, wait_busy};

fn cancel(stream: u32) -> Frame {
    Frame::new(Kind::Cancel, stream, &Cancel { reason: "test".into() })
}

/// Test 6. SDK: a `SELECT SLEEP(30)` whose future is dropped frees its worker within 1 s,
/// through KILL QUERY (same pid), and that worker serves the next request. Raw frames:
/// REQUEST + CANCEL gives exactly one ERROR(CANCELLED) + END on that stream, and nothing after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancel() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\n").await;
    let d = &c.dispatcher;
    let client = d.client().await.unwrap();
    client.query("SELECT 1", &[]).await.unwrap();
    let before = slots(d).await;

    // SDK: drop the future after 300 ms.
    let dropped = tokio::time::timeout(Duration::from_millis(300), client.query("SELECT SLEEP(30)", &[])).await;
    assert!(dropped.is_err(), "SLEEP(30) cannot finish in 300 ms");
    let t_drop = Instant::now();
    let busy = wait_for(Duration::from_millis(200), "the cancelled request's slot", || async {
        slots(d).await.into_iter().find(|s| s.state == "busy")
    })
    .await
    .ok();
    wait_for(
        Duration::from_secs(1),
        "the worker to be idle within 1 s of the drop",
        || async { slots(d).await.iter().all(|s| s.state == "idle").then_some(()) },
    )
    .await
    .unwrap();
    println!(
        "client cancel (SDK): worker idle {} ms after the drop (busy slot seen: {busy:?})",
        ms(t_drop)
    );
    let after = slots(d).await;
    assert_eq!(
        before.iter().map(|s| s.pid).collect::<Vec<_>>(),
        after.iter().map(|s| s.pid).collect::<Vec<_>>(),
        "a cancelled worker must not be killed"
    );
    // LIFO: the freed worker is on top of the idle stack and serves the next request.
    let top = after.iter().max_by_key(|s| s.requests).unwrap().clone();
    let r = client.query("SELECT 5", &[]).await.unwrap();
    assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 5);
    let served: u64 = slots(d).await.iter().map(|s| s.requests).sum();
    assert_eq!(served, after.iter().map(|s| s.requests).sum::<u64>() + 1);
    println!("client cancel (SDK): next request served; slot of most requests {top:?}");
    assert!(crate::metric(d, "osprey_requests_total{outcome=\"cancelled\"}").await >= 1.0);
    assert_eq!(crate::metric(d, "osprey_worker_kills_total").await, 0.0);

    // Raw: REQUEST, wait until it runs on a worker, CANCEL.
    let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
    raw.send(request(7, "SELECT SLEEP(30)")).await;
    let busy = wait_busy(d, Duration::from_secs(2)).await;
    let t_cancel = Instant::now();
    raw.send(cancel(7)).await;
    // Result frames may precede it (MariaDB sends SLEEP's column metadata before the
    // statement ends); then exactly one ERROR, immediately followed by END.
    let mut kinds = Vec::new();
    let mut err: Option<ErrorBody> = None;
    loop {
        match raw.next_data(Duration::from_secs(3)).await {
            Got::Frame(f) if f.stream == 7 => {
                kinds.push(f.kind.name());
                match f.kind {
                    Kind::Columns | Kind::Rows => assert!(err.is_none(), "result after ERROR: {kinds:?}"),
                    Kind::Error => {
                        assert!(err.is_none(), "two ERRORs: {kinds:?}");
                        err = Some(f.body::<ErrorBody>().unwrap());
                    }
                    Kind::End => break,
                    _ => panic!("unexpected frame on stream 7: {f:?}"),
                }
            }
            other => panic!("expected frames of stream 7, got {other:?}"),
        }
    }
    let err = err.unwrap_or_else(|| panic!("the cancelled stream ended without ERROR: {kinds:?}"));
    assert_eq!(err.code, ErrorCode::Cancelled, "{err:?}");
    assert!(err.dispatched, "{err:?}");
    assert_eq!(
        kinds[kinds.len() - 2..],
        [Kind::Error.name(), Kind::End.name()],
        "{kinds:?}"
    );
    println!(
        "client cancel (raw): {kinds:?}: ERROR {} (origin {:?}, errno {:?}) + END {} ms after CANCEL",
        err.code,
        err.origin,
        err.errno,
        ms(t_cancel)
    );
    // A CANCEL for the ended stream is ignored; nothing more arrives on stream 7, and the
    // connection keeps working.
    raw.send(cancel(7)).await;
    raw.expect_query_ok(9, "SELECT 1").await;
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(500) {
        match tokio::time::timeout(Duration::from_millis(100), raw.next_data(Duration::from_secs(1))).await {
            Err(_) => {}
            Ok(got) => panic!("nothing may follow the END: {got:?}"),
        }
    }
    let freed = slots(d).await.into_iter().find(|s| s.slot == busy.slot).unwrap();
    assert_eq!(freed.state, "idle");
    assert_eq!(freed.pid, busy.pid, "the cancelled worker was killed");
    drop(raw);
    assert_closed_loop(&c, &[&client], 2).await;
}

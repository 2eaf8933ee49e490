//! Risk: a client reusing stream ids as the spec allows (right after END) must never
//! collide with the dispatcher's bookkeeping, and an answer to a REQUEST on an id that is
//! still open must never land on the open stream.

use std::time::Duration;

use futures::future::join_all;
use osprey_client::ErrorCode;
use osprey_protocol::Kind;

use crate::raw::{request, Got, Raw};
use crate::{cluster, serial};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_id_reused_right_after_end() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\n").await;
    let d = &c.dispatcher;
    // Eight connections, each reusing id 1 the moment its END arrives. Before the
    // guard freed the id ahead of END, most of them got DUPLICATE_STREAM within ~60 rounds.
    let loops = (0..8).map(|_| async {
        let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
        for _ in 0..300 {
            raw.expect_query_ok(1, "SELECT 1").await;
        }
    });
    join_all(loops).await;
    let s = d.status().await.expect("status");
    assert_eq!(s["streams"]["opened"], s["streams"]["closed"], "{s}");
    assert_eq!(s["streams"]["opened"], 8 * 300, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_request_on_an_open_stream_is_a_duplicate() {
    let _serial = serial().await;
    let c = cluster("[pool]\nsize = 2\n").await;
    let d = &c.dispatcher;
    for bad_sql in ["   ", ""] {
        let (mut raw, _) = Raw::open(d.client_addr, &d.client_token).await;
        raw.send(request(1, "SELECT SLEEP(1)")).await;
        raw.send(request(1, bad_sql)).await;
        // Whatever the open stream had produced may come first; then the connection-level
        // DUPLICATE_STREAM, and no terminal frame of stream 1 before it.
        loop {
            match raw.next_data(Duration::from_secs(5)).await {
                Got::Frame(f) if f.stream == 1 && matches!(f.kind, Kind::Columns | Kind::Rows) => {}
                Got::Frame(f) if f.stream == 0 && f.kind == Kind::Error => {
                    let body: osprey_protocol::ErrorBody = f.body().expect("ERROR body");
                    assert_eq!(body.code, ErrorCode::DuplicateStream, "{body:?}");
                    break;
                }
                other => panic!("{bad_sql:?}: unexpected {other:?}"),
            }
        }
        raw.expect_closed(Duration::from_secs(5)).await;
    }
    // The cancelled SLEEPs free their workers; every stream is closed once.
    let s = osprey_tests::harness::wait_for(Duration::from_secs(10), "streams to balance", || async {
        let s = d.status().await.ok()?;
        (s["streams"]["opened"] == s["streams"]["closed"] && s["pool"]["idle"] == 2).then_some(s)
    })
    .await
    .expect("closed loop");
    assert_eq!(s["clients"]["open_streams"], 0);
}

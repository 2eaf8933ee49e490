//! Test 2: big values and big results.

use std::time::Instant;

use futures::StreamExt;
use mysql_async::prelude::Queryable;
use osprey_client::{Request, StreamItem, Value};
use osprey_tests::harness::rss_kib;

use crate::{assert_closed_loop, client, cluster, describe};

/// A 10 MB LONGBLOB inserted as a parameter through Osprey comes back byte for byte
/// (through Osprey and straight from MariaDB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabyte_blob_round_trips() {
    let c = cluster("[pool]\nsize = 1\n").await;
    let mut db = c.sandbox.primary().conn().await.unwrap();
    db.query_drop("CREATE TABLE big (id INT PRIMARY KEY, b LONGBLOB)")
        .await
        .unwrap();
    // Every byte value, zeros included, in a pattern that is not periodic in 256.
    let mut x: u32 = 0x1234_5678;
    let blob: Vec<u8> = (0..10_000_000)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if i % 7 == 0 {
                0
            } else {
                x as u8
            }
        })
        .collect();
    let client = client(&c).await;
    let r = client
        .execute(
            "INSERT INTO big VALUES (?, ?)",
            &[Value::Int(1), Value::Bytes(blob.clone())],
        )
        .await
        .unwrap_or_else(|e| panic!("insert: {}", describe(&e)));
    assert_eq!(r.affected_rows, 1);

    for (what, params) in [("text", vec![]), ("binary", vec![Value::Int(1)])] {
        let sql = if params.is_empty() {
            "SELECT b FROM big WHERE id = 1"
        } else {
            "SELECT b FROM big WHERE id = ?"
        };
        let back = client
            .query(sql, &params)
            .await
            .unwrap_or_else(|e| panic!("{what} read: {}", describe(&e)));
        assert_eq!(back.rows().len(), 1);
        match back.rows()[0].value(0) {
            Some(Value::Bytes(b)) => {
                assert_eq!(b.len(), blob.len(), "{what}: length");
                assert!(b == &blob, "{what}: bytes differ");
            }
            other => panic!("{what}: expected Bytes, got {:?}", other.map(std::mem::discriminant)),
        }
    }
    let direct: Option<Vec<u8>> = db.query_first("SELECT b FROM big WHERE id = 1").await.unwrap();
    assert!(
        direct.as_deref() == Some(&blob[..]),
        "stored bytes differ from the sent ones"
    );
    assert_closed_loop(&c, &[&client]).await;
}

/// 100 000 rows (about 41 MB of values) streamed through the SDK arrive complete and in
/// order, and the dispatcher does not hold the result: its RSS grows by much less than
/// the result's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_rows_stream_in_order_with_bounded_dispatcher_memory() {
    // Small frames and a short write queue: the dispatcher's own buffers for this client
    // are then at most 16 frames x 64 KiB = 1 MiB (plus the worker link's channel), so any
    // growth near the size of the result would mean the result is being held somewhere.
    let c =
        cluster("[pool]\nsize = 1\nbatch_bytes = 65536\nbatch_rows = 512\n[limits]\nclient_write_queue = 16\n").await;
    const N: i64 = 100_000;
    const PAD: usize = 400;
    let client = client(&c).await;
    // Warm up (first request allocations), then take the baseline.
    client.query("SELECT 1", &[]).await.unwrap();
    let pid = c.dispatcher.pid();
    let before = rss_kib(pid).unwrap();
    let mut peak = before;

    let sql = format!("SELECT seq AS n, CONCAT(seq, ':', REPEAT('x', {PAD})) AS pad FROM seq_1_to_{N} ORDER BY seq");
    let started = Instant::now();
    let mut s = client.stream(Request::sql(sql));
    let mut next = 1i64;
    let mut sets = 0;
    let mut bytes = 0usize;
    while let Some(item) = s.next().await {
        match item.unwrap_or_else(|e| panic!("after {} rows: {}", next - 1, describe(&e))) {
            StreamItem::ResultSet(meta) => {
                sets += 1;
                assert_eq!(meta.columns.len(), 2);
            }
            StreamItem::Row(row) => {
                let n: i64 = row.get(0).unwrap();
                assert_eq!(n, next, "rows out of order");
                let pad: String = row.get(1).unwrap();
                assert_eq!(pad.len(), format!("{n}:").len() + PAD, "row {n} payload");
                assert!(pad.starts_with(&format!("{n}:")), "row {n} payload");
                bytes += pad.len() + 8;
                next += 1;
                if n % 5000 == 0 {
                    peak = peak.max(rss_kib(pid).unwrap());
                }
            }
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(sets, 1, "one result set");
    assert_eq!(next - 1, N, "every row arrived");
    assert_eq!(s.summary().expect("END").rows, N as u64, "END.rows");
    let after = rss_kib(pid).unwrap();
    peak = peak.max(after);
    let growth_kib = peak.saturating_sub(before);
    println!(
        "streamed {N} rows ({:.1} MB of values) in {elapsed:.2?}; dispatcher VmRSS before {before} KiB, \
         peak {peak} KiB, after {after} KiB, growth {growth_kib} KiB",
        bytes as f64 / 1e6
    );
    // 32 MiB: a fraction of the ~41 MB result (so the dispatcher cannot have held it), and
    // far above the ~1 MiB its bounded queues may hold plus allocator slack.
    assert!(bytes > 40_000_000, "the result is big enough to matter ({bytes} bytes)");
    assert!(
        growth_kib < 32 * 1024,
        "dispatcher RSS grew by {growth_kib} KiB while streaming"
    );
    assert_closed_loop(&c, &[&client]).await;
}

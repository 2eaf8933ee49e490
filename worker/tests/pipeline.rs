//! Pipelining in the real `osprey-worker` against a real MariaDB, this test playing the
//! dispatcher: several REQUESTs written at once are written to the database session
//! before their results are read (`STARTED` tells), each answered on its own stream, in
//! order. The rules are in `worker/src/execute/pipeline.rs`.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use futures::SinkExt;
use mysql_async::prelude::Queryable;
use osprey_protocol::{Cancel, Columns, ErrorCode, Frame, Kind, Origin, Request, Rows, Value};
use osprey_sandbox::Sandbox;
use tokio::time::Instant;

use support::*;

/// Every frame of the streams asked for, until each has its `END`: the responses by
/// stream, the order the `END`s came in, and the streams that got `STARTED` (with how
/// many `END`s had come before it).
struct Pipelined {
    responses: HashMap<u32, Response>,
    end_order: Vec<u32>,
    started: HashMap<u32, usize>,
}

impl Worker {
    /// Writes every request in one go (so that the worker finds them queued together).
    async fn send_all(&mut self, reqs: &[(u32, Request)]) {
        for (stream, req) in reqs {
            self.tx.feed(Frame::new(Kind::Request, *stream, req)).await.unwrap();
        }
        SinkExt::<Frame>::flush(&mut self.tx).await.unwrap();
    }

    async fn collect(&mut self, streams: &[u32]) -> Pipelined {
        let mut p = Pipelined {
            responses: HashMap::new(),
            end_order: Vec::new(),
            started: HashMap::new(),
        };
        self.collect_until(&mut p, streams, streams).await;
        p
    }

    /// Reads frames of `streams` into `p` until every one of `until` has ended.
    async fn collect_until(&mut self, p: &mut Pipelined, streams: &[u32], until: &[u32]) {
        while !until.iter().all(|s| p.end_order.contains(s)) {
            let f = self.next().await;
            assert!(streams.contains(&f.stream), "{f:?}");
            assert!(!p.end_order.contains(&f.stream), "a frame after END: {f:?}");
            let resp = p.responses.entry(f.stream).or_default();
            match f.kind {
                Kind::Started => {
                    assert!(
                        resp.columns.is_empty() && resp.error.is_none(),
                        "STARTED after the response began"
                    );
                    p.started.insert(f.stream, p.end_order.len());
                }
                Kind::Columns => {
                    let c: Columns = f.body().unwrap();
                    assert_eq!(c.result_set as usize, resp.columns.len());
                    resp.columns.push(c);
                    resp.rows.push(Vec::new());
                }
                Kind::Rows => {
                    let r: Rows = f.body().unwrap();
                    resp.rows.last_mut().expect("ROWS after COLUMNS").extend(r.rows);
                }
                Kind::Error => {
                    assert!(resp.error.is_none(), "one ERROR per stream");
                    resp.error = Some(f.body().unwrap());
                }
                Kind::End => {
                    resp.end = f.body().unwrap();
                    p.end_order.push(f.stream);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

fn params(sql: &str, params: Vec<Value>) -> Request {
    Request {
        sql: sql.into(),
        params,
        ..Default::default()
    }
}

async fn direct(sandbox: &Sandbox) -> mysql_async::Conn {
    sandbox.primary().conn().await.unwrap()
}

/// A pipeline of fast statements, one of which fails: each is answered on its own stream,
/// in order, the failure alone; every one after the first was written behind it.
#[tokio::test]
async fn mixed_pipeline_with_one_failure() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let mut db = direct(&sandbox).await;
    db.query_drop("CREATE TABLE t_pipe (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(20))")
        .await
        .unwrap();
    let (mut w, _ready) = start_worker(settings(&sandbox)).await;
    // A slow first statement, so that the others are queued behind it in the worker;
    // they then go as one pipeline.
    let reqs = vec![
        (10, Request::sql("SELECT SLEEP(0.3)")),
        (11, Request::sql("SELECT 11")),
        (12, Request::sql("INSERT INTO t_pipe (v) VALUES ('one')")),
        (13, Request::sql("SELEC 13")),
        (14, params("SELECT ? + 1", vec![Value::Int(13)])),
        (15, Request::sql("INSERT INTO t_pipe (v) VALUES ('two')")),
        (16, Request::sql("SELECT id, v FROM t_pipe ORDER BY id")),
    ];
    // Each text once alone: then it is known to be fast (and the prepared one cached),
    // which it must be to have statements pipelined behind it.
    for (i, (_, req)) in reqs.iter().enumerate().skip(1) {
        w.request(1 + i as u32, req).await;
    }
    db.query_drop("TRUNCATE t_pipe").await.unwrap();
    w.send_all(&reqs).await;
    let streams: Vec<u32> = reqs.iter().map(|(s, _)| *s).collect();
    let p = w.collect(&streams).await;
    assert_eq!(p.end_order, streams, "answered in order");
    assert!(
        !p.started.is_empty(),
        "at least some statements were pipelined: {:?}",
        p.started
    );
    for s in [12, 13, 14, 15, 16] {
        let before = p.started.get(&s).copied();
        assert!(
            before.is_some_and(|ends| ends < streams.iter().position(|x| *x == s).unwrap()),
            "stream {s}: STARTED while an earlier one was unanswered ({before:?})"
        );
    }
    let r = &p.responses;
    assert!(r[&10].error.is_none(), "{:?}", r[&10].error);
    assert_eq!(r[&11].rows[0], vec![vec![Value::Int(11)]]);
    assert_eq!(r[&12].end.affected_rows, 1);
    assert!(r[&12].error.is_none());
    assert!(r[&11].error.is_none(), "{:?}", r[&11].error);
    let e = r[&13].error.as_ref().expect("the syntax error");
    assert_eq!(
        (e.origin, e.code, e.errno, e.dispatched),
        (Origin::Database, ErrorCode::Database, Some(1064), true)
    );
    assert_eq!(r[&14].rows[0], vec![vec![Value::Int(14)]]);
    assert_eq!(r[&15].end.affected_rows, 1);
    assert_eq!(
        r[&16].rows[0],
        vec![
            vec![Value::Int(1), Value::Text("one".into())],
            vec![Value::Int(2), Value::Text("two".into())]
        ]
    );
    // GTIDs of each insert's own commit.
    let g12 = r[&12].end.gtid.clone().expect("a GTID for the first insert");
    let g15 = r[&15].end.gtid.clone().expect("a GTID for the second insert");
    assert_ne!(g12, g15);
    assert!(r[&16].end.gtid.is_none(), "a read commits nothing");
    // The session is fine: nothing left open.
    let r = w.ok(20, &Request::sql("SELECT @@in_transaction, @@autocommit")).await;
    assert_eq!(r.rows[0], vec![vec![Value::UInt(0), Value::Int(1)]]);
}

/// Values through a pipeline are byte for byte the values of the same statements alone.
#[tokio::test]
async fn values_are_the_same_pipelined() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let (mut w, _ready) = start_worker(settings(&sandbox)).await;
    let texts = [
        "SELECT CAST(-42 AS SIGNED), CAST(18446744073709551615 AS UNSIGNED), 1.5e0, CAST(1.25 AS FLOAT)",
        "SELECT CAST('12.340' AS DECIMAL(10,3)), DATE '2024-02-29', TIMESTAMP '2024-02-29 23:59:58.123456'",
        "SELECT TIME '-838:59:59', X'00FF', b'101', 'héllo', NULL, JSON_OBJECT('a', 1)",
        "SELECT YEAR(DATE '2024-01-01'), CAST('x' AS BINARY), CONVERT('ü' USING latin1)",
    ];
    let prepared = [
        (
            "SELECT ?, ?, ?",
            vec![Value::Int(-1), Value::UInt(u64::MAX), Value::Text("t".into())],
        ),
        (
            "SELECT CAST(? AS DATETIME(6)), CAST(? AS TIME(6)), CAST(? AS DECIMAL(30,10))",
            vec![
                Value::date(2024, 2, 29, 1, 2, 3, 4),
                Value::time(true, 1, 2, 3, 4, 5),
                Value::Decimal("-123.456".into()),
            ],
        ),
    ];
    let mut reqs: Vec<(u32, Request)> = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        reqs.push((100 + i as u32, Request::sql(*t)));
    }
    for (i, (t, p)) in prepared.iter().enumerate() {
        reqs.push((200 + i as u32, params(t, p.clone())));
    }
    let mut alone = HashMap::new();
    for (stream, req) in &reqs {
        let mut r = w.ok(*stream, req).await;
        r.end.server_time_us = 0;
        alone.insert(*stream, r);
    }
    let mut all = vec![(1000, Request::sql("SELECT SLEEP(0.2)"))];
    all.extend(reqs.iter().map(|(s, r)| (s + 1000, r.clone())));
    w.send_all(&all).await;
    let streams: Vec<u32> = all.iter().map(|(s, _)| *s).collect();
    let p = w.collect(&streams).await;
    assert_eq!(p.end_order, streams);
    assert_eq!(
        p.started.len(),
        reqs.len() - 1,
        "all pipelined (the SLEEP is not known fast: the first after it runs with the rest behind it): {:?}",
        p.started
    );
    for (stream, _) in &reqs {
        let mut r = p.responses[&(stream + 1000)].clone_response();
        r.end.server_time_us = 0;
        let a = &alone[stream];
        assert_eq!(format!("{:?}", r.columns), format!("{:?}", a.columns), "{stream}");
        assert_eq!(r.rows, a.rows, "{stream}");
        assert_eq!(format!("{:?}", r.end), format!("{:?}", a.end), "{stream}");
        assert!(r.error.is_none());
    }
}

impl Response {
    fn clone_response(&self) -> Response {
        Response {
            columns: self.columns.clone(),
            rows: self.rows.clone(),
            error: self.error.clone(),
            end: self.end.clone(),
        }
    }
}

async fn processlist_has(sandbox: &Sandbox, id: u32, text: &str) -> bool {
    let mut c = direct(sandbox).await;
    let n: Option<u64> = c
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO = ?",
            (id, text),
        )
        .await
        .unwrap();
    c.disconnect().await.unwrap();
    n == Some(1)
}

/// A CANCEL of the running statement with others written behind it stops it (KILL QUERY
/// ID), and only it: the ones behind complete. A CANCEL of one written but not running
/// gets CANCELLED with dispatched=true, and its result is not given.
#[tokio::test]
async fn cancel_in_a_pipeline_hits_only_its_statement() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let (mut w, ready) = start_worker(settings(&sandbox)).await;
    let id = ready.db_connection_id;
    // Known to be fast (they ran fast before), so that statements go behind them.
    w.ok(90, &params("SELECT SLEEP(?)", vec![Value::Int(0)])).await;
    w.ok(91, &params("SELECT SLEEP(?), 4", vec![Value::Int(0)])).await;
    w.ok(92, &Request::sql("SELECT 3")).await;
    w.ok(93, &Request::sql("SELECT 5")).await;
    let reqs = vec![
        (1, Request::sql("SELECT SLEEP(0.3)")),
        (2, params("SELECT SLEEP(?)", vec![Value::Int(30)])),
        (3, Request::sql("SELECT 3")),
        (4, params("SELECT SLEEP(?), 4", vec![Value::Int(30)])),
        (5, Request::sql("SELECT 5")),
    ];
    w.send_all(&reqs).await;
    // Stream 1 answers first; 2 runs then, with 3..5 written behind it.
    let streams = [1, 2, 3, 4, 5];
    let mut p = Pipelined {
        responses: HashMap::new(),
        end_order: Vec::new(),
        started: HashMap::new(),
    };
    w.collect_until(&mut p, &streams, &[1]).await;
    assert!(p.responses[&1].error.is_none());
    until("SLEEP(?) to run", || async {
        processlist_has(&sandbox, id, "SELECT SLEEP(?)").await
    })
    .await;
    // Cancel the written-but-waiting 4 first, then the running 2.
    w.send(Frame::new(Kind::Cancel, 4, &Cancel { reason: "test".into() }))
        .await;
    let sent = Instant::now();
    w.send(Frame::new(Kind::Cancel, 2, &Cancel { reason: "test".into() }))
        .await;
    w.collect_until(&mut p, &streams, &streams).await;
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "cancels took {:?}",
        sent.elapsed()
    );
    assert_eq!(p.end_order, streams);
    for s in [3, 4, 5] {
        assert!(p.started.contains_key(&s), "stream {s} was pipelined: {:?}", p.started);
    }
    let e = p.responses[&2].error.as_ref().expect("2 cancelled");
    assert_eq!(
        (e.code, e.errno, e.dispatched),
        (ErrorCode::Cancelled, Some(1317), true),
        "{e:?}"
    );
    assert_eq!(p.responses[&3].rows[0], vec![vec![Value::Int(3)]], "3 unharmed");
    let e = p.responses[&4].error.as_ref().expect("4 cancelled");
    assert_eq!((e.code, e.dispatched), (ErrorCode::Cancelled, true), "{e:?}");
    assert!(p.responses[&4].columns.is_empty(), "no result given for 4");
    assert_eq!(p.responses[&5].rows[0], vec![vec![Value::Int(5)]], "5 unharmed");
    // The session serves on.
    let r = w.ok(6, &Request::sql("SELECT 6")).await;
    assert_eq!(r.rows[0], vec![vec![Value::Int(6)]]);
}

/// The same for a prepared statement running with statements behind it: the processlist
/// shows its text, and it alone is stopped.
#[tokio::test]
async fn cancel_of_a_running_prepared_statement_in_a_pipeline() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let (mut w, ready) = start_worker(settings(&sandbox)).await;
    let id = ready.db_connection_id;
    // Cached and known to be fast, so that it may be pipelined, with others behind it.
    w.ok(1, &params("SELECT SLEEP(?)", vec![Value::Int(0)])).await;
    w.ok(9, &Request::sql("SELECT 4")).await;
    let reqs = vec![
        (2, Request::sql("SELECT SLEEP(0.3)")),
        (3, params("SELECT SLEEP(?)", vec![Value::Int(30)])),
        (4, Request::sql("SELECT 4")),
    ];
    let streams = [2, 3, 4];
    w.send_all(&reqs).await;
    let mut p = Pipelined {
        responses: HashMap::new(),
        end_order: Vec::new(),
        started: HashMap::new(),
    };
    w.collect_until(&mut p, &streams, &[2]).await;
    until("SLEEP(?) to run", || async {
        let mut c = direct(&sandbox).await;
        let info: Option<Option<String>> = c
            .exec_first("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = ?", (id,))
            .await
            .unwrap();
        c.disconnect().await.unwrap();
        info.flatten()
            .is_some_and(|i| i.contains("SLEEP(") && !i.contains("0.3"))
    })
    .await;
    let sent = Instant::now();
    w.send(Frame::new(Kind::Cancel, 3, &Cancel { reason: "test".into() }))
        .await;
    w.collect_until(&mut p, &streams, &streams).await;
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        sent.elapsed()
    );
    assert_eq!(p.end_order, streams);
    assert!(p.started.contains_key(&4), "{:?}", p.started);
    let e = p.responses[&3].error.as_ref().expect("3 cancelled");
    assert_eq!(
        (e.code, e.errno, e.dispatched),
        (ErrorCode::Cancelled, Some(1317), true),
        "{e:?}"
    );
    assert_eq!(p.responses[&4].rows[0], vec![vec![Value::Int(4)]], "4 unharmed");
}

/// The same prepared text with other parameters (the point select) shares a pipeline:
/// repeated texts go as tagged variants, prepared once when the session is idle.
#[tokio::test]
async fn repeated_texts_share_a_pipeline() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let (mut w, ready) = start_worker(settings(&sandbox)).await;
    w.ok(1, &params("SELECT ? + 0", vec![Value::Int(0)])).await;
    w.ok(2, &Request::sql("SELECT 7")).await;
    let mut next = 100;
    let mut all_started = false;
    // The variants get prepared over the first rounds; then everything is pipelined.
    for _round in 0..6 {
        let mut reqs = vec![(next, Request::sql("SELECT SLEEP(0.1)"))];
        for i in 1..=4 {
            reqs.push((next + i, params("SELECT ? + 0", vec![Value::Int(i64::from(next + i))])));
            reqs.push((next + 10 + i, Request::sql("SELECT 7")));
        }
        let streams: Vec<u32> = reqs.iter().map(|(s, _)| *s).collect();
        w.send_all(&reqs).await;
        let p = w.collect(&streams).await;
        assert_eq!(p.end_order, streams);
        for i in 1..=4 {
            assert_eq!(
                p.responses[&(next + i)].rows[0],
                vec![vec![Value::Int(i64::from(next + i))]]
            );
            assert_eq!(p.responses[&(next + 10 + i)].rows[0], vec![vec![Value::Int(7)]]);
        }
        // All but the SLEEP (not known fast) and the first after it.
        if p.started.len() == streams.len() - 2 {
            all_started = true;
            break;
        }
        next += 100;
    }
    assert!(all_started, "repeated texts never all pipelined");
    let _ = ready;
}

/// The session dies under a pipeline: every written statement is answered DATABASE_FATAL
/// with dispatched=true, and the worker exits 2; a request not yet written stays
/// unanswered (the dispatcher re-queues it).
#[tokio::test]
async fn a_lost_session_fails_every_written_statement() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let (mut w, ready) = start_worker(settings(&sandbox)).await;
    let id = ready.db_connection_id;
    w.ok(90, &params("SELECT SLEEP(?)", vec![Value::Int(0)])).await;
    w.ok(91, &Request::sql("SELECT 3")).await;
    w.ok(92, &Request::sql("SELECT 4")).await;
    let reqs = vec![
        (1, Request::sql("SELECT SLEEP(0.3)")),
        (2, params("SELECT SLEEP(?)", vec![Value::Int(30)])),
        (3, Request::sql("SELECT 3")),
        (4, Request::sql("SELECT 4")),
        // A barrier: not written behind the others.
        (5, Request::sql("SET @x = 1")),
    ];
    let streams = [1, 2, 3, 4, 5];
    w.send_all(&reqs).await;
    let mut p = Pipelined {
        responses: HashMap::new(),
        end_order: Vec::new(),
        started: HashMap::new(),
    };
    w.collect_until(&mut p, &streams, &[1]).await;
    until("SLEEP(?) to run", || async {
        processlist_has(&sandbox, id, "SELECT SLEEP(?)").await
    })
    .await;
    let mut admin = direct(&sandbox).await;
    admin.query_drop(format!("KILL {id}")).await.unwrap();
    w.collect_until(&mut p, &streams, &[2, 3, 4]).await;
    assert_eq!(p.end_order, vec![1, 2, 3, 4]);
    for s in [2, 3, 4] {
        let e = p.responses[&s].error.as_ref().expect("failed");
        assert_eq!(
            (e.code, e.dispatched),
            (ErrorCode::DatabaseFatal, true),
            "stream {s}: {e:?}"
        );
    }
    assert!(!p.started.contains_key(&5));
    assert_eq!(w.exit_status().await.code(), Some(2));
}

/// Nothing is written behind a statement not known to be fast (never run here, or slow
/// last time): a slow one cannot hold fast ones, which the dispatcher may still take back.
#[tokio::test]
async fn nothing_waits_behind_a_statement_not_known_fast() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let (mut w, _ready) = start_worker(settings(&sandbox)).await;
    w.ok(1, &Request::sql("SELECT 3")).await;
    w.ok(2, &Request::sql("SELECT SLEEP(0.05)")).await;
    let reqs = vec![
        (10, Request::sql("SELECT SLEEP(0.2)")),
        (11, Request::sql("SELECT SLEEP(0.05)")),
        (12, Request::sql("SELECT 3")),
        (13, Request::sql("SELECT 3 + 0")),
    ];
    w.send_all(&reqs).await;
    let streams: Vec<u32> = reqs.iter().map(|(s, _)| *s).collect();
    let p = w.collect(&streams).await;
    assert_eq!(p.end_order, streams);
    // Not behind the slow 11; the new 13 may go last, behind the known-fast 12.
    assert_eq!(
        p.started.keys().copied().collect::<Vec<_>>(),
        vec![13],
        "{:?}",
        p.started
    );
}

/// A dispatcher older than protocol 1.4 knows no `STARTED`: its worker runs the same
/// queued requests one after the other, sending none.
#[tokio::test]
async fn no_pipelining_for_a_dispatcher_before_1_4() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let mut old = ack(settings(&sandbox));
    old.version_minor = 3;
    let (mut w, _ready) = start_worker_with(old).await;
    let reqs = vec![
        (10, Request::sql("SELECT 10")),
        (11, Request::sql("SELECT 11")),
        (12, Request::sql("SELECT 12")),
    ];
    // Known fast, as in the pipelined tests.
    for (i, (_, req)) in reqs.iter().enumerate() {
        w.request(1 + i as u32, req).await;
    }
    w.send_all(&reqs).await;
    let streams: Vec<u32> = reqs.iter().map(|(s, _)| *s).collect();
    let p = w.collect(&streams).await;
    assert_eq!(p.end_order, streams, "answered in order");
    assert!(p.started.is_empty(), "STARTED to a 1.3 dispatcher: {:?}", p.started);
    for (s, _) in &reqs {
        assert_eq!(p.responses[s].rows[0], vec![vec![Value::Int(*s as i64)]]);
    }
}

/// A reclaim of a request queued behind one that streams a large result, to a dispatcher
/// that takes every byte at once: the worker answers it within about a batch of rows (the
/// dispatcher reads at most 1 MiB to reach that answer). Its serving loop once polled the
/// statement first, which was ready again at every batch the dispatcher took: it ran on
/// for megabytes before it read the reclaim.
#[tokio::test]
async fn a_reclaim_is_answered_while_a_large_result_streams() {
    let sandbox = Sandbox::start(0).await.unwrap();
    let (mut w, _ready) = start_worker(settings(&sandbox)).await;
    let reqs = vec![
        (1, Request::sql("SELECT REPEAT('x', 2000) FROM seq_1_to_100000")),
        (3, Request::sql("SELECT 3")),
    ];
    w.send_all(&reqs).await;
    let mut rows_after = None;
    let answer = loop {
        let f = w.next().await;
        match (f.stream, f.kind) {
            (1, Kind::Rows) if rows_after.is_none() => {
                let reclaim = Cancel {
                    reason: osprey_protocol::CANCEL_RECLAIM.into(),
                };
                w.send(Frame::new(Kind::Cancel, 3, &reclaim)).await;
                rows_after = Some(0usize);
            }
            (1, Kind::Rows) => *rows_after.as_mut().unwrap() += f.payload.len(),
            (1, Kind::Columns) => {}
            (3, Kind::Error) => break f.body::<osprey_protocol::ErrorBody>().unwrap(),
            _ => panic!("unexpected {f:?} before the reclaim's answer"),
        }
    };
    assert!(!answer.dispatched, "{answer:?}");
    let bytes = rows_after.unwrap();
    println!("{bytes} bytes of rows came between the reclaim and its answer");
    assert!(bytes < 1024 * 1024, "{bytes} bytes of rows before the reclaim's answer");
}

//! Risk (issue 9, item 1): a request that decodes but that the database driver refuses
//! itself (it then closes its connection), or that the server answers by closing the
//! session, made a worker exit; repeated, the slots went into crash-loop back-off. Every
//! such request must be answered `INVALID_REQUEST` and no worker may exit or reconnect.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use osprey_client::ErrorCode;
use osprey_protocol::{ErrorBody, Frame, Kind, Request, Rows, Statement, Value};
use osprey_sandbox::Sandbox;
use osprey_tests::harness::Dispatcher;

use crate::raw::{Got, Raw};
use crate::{metric, serial, SETTLE};

/// The server's `max_allowed_packet` in this test (MariaDB's default is 16 MiB, as large as
/// a frame; a smaller one makes the packet-size path reachable).
const MAX_PACKET: usize = 1024 * 1024;
const CONNECTIONS: usize = 8;
const PER_CONNECTION: usize = 300;

/// What a request of the storm must get.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// `INVALID_REQUEST` with this `dispatched`.
    Refused(bool),
    /// One row holding this integer.
    Row(i64),
}

fn single(sql: impl Into<String>, params: Vec<Value>) -> Request {
    Request {
        sql: sql.into(),
        params,
        ..Default::default()
    }
}

fn batch(statements: Vec<(&str, Vec<Value>)>) -> Request {
    Request {
        batch: statements
            .into_iter()
            .map(|(sql, params)| Statement {
                sql: sql.into(),
                params,
            })
            .collect(),
        ..Default::default()
    }
}

/// The `n`-th request of the storm: every kind of malformed request in turn, with a good
/// one between any two of them. The large ones (a MiB each) come once per hundred.
fn storm_request(n: usize) -> (&'static str, Request, Expect) {
    let i = |v: i64| Value::Int(v);
    if n.is_multiple_of(2) {
        return (
            "good",
            single("SELECT ? + 1", vec![i(n as i64)]),
            Expect::Row(n as i64 + 1),
        );
    }
    let refused = Expect::Refused(false);
    if n % 100 == 1 {
        return match (n / 100) % 3 {
            0 => (
                "SQL over max_allowed_packet",
                single(format!("SELECT '{}'", "x".repeat(MAX_PACKET)), vec![]),
                refused,
            ),
            1 => (
                "params over max_allowed_packet",
                single("SELECT LENGTH(?)", vec![Value::Bytes(vec![1; MAX_PACKET])]),
                refused,
            ),
            _ => (
                "over 65 535 params",
                single("SELECT ?", vec![Value::Null; 65_536]),
                refused,
            ),
        };
    }
    match (n / 2) % 18 {
        0 => ("too many params", single("SELECT ?", vec![i(1), i(2)]), refused),
        1 => ("too few params", single("SELECT ?, ?", vec![i(1)]), refused),
        2 => ("a marker without params", single("SELECT ?", vec![]), refused),
        3 => (
            "a marker in a multi-statement",
            single("SELECT 1; SELECT ?", vec![]),
            refused,
        ),
        4 => ("named parameter", single("SELECT :a", vec![i(1)]), refused),
        5 => ("named and positional", single("SELECT :a, ?", vec![i(1)]), refused),
        6 => (
            "LOCAL INFILE",
            single("LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE t_storm", vec![]),
            refused,
        ),
        7 => (
            "a marker the server skips",
            single("SELECT /*M!999999 ?, */ ?", vec![i(1), i(2)]),
            refused,
        ),
        8 => (
            "batch: too many params",
            batch(vec![
                ("INSERT INTO t_storm VALUES (?)", vec![i(1)]),
                ("SELECT ?", vec![i(1), i(2)]),
            ]),
            refused,
        ),
        9 => (
            "batch: a marker without params",
            batch(vec![("INSERT INTO t_storm VALUES (1)", vec![]), ("SELECT ?", vec![])]),
            refused,
        ),
        10 => (
            "batch: a marker the server skips",
            batch(vec![
                ("INSERT INTO t_storm VALUES (?)", vec![i(1)]),
                ("SELECT /*M!999999 ?, */ ?", vec![i(1), i(2)]),
            ]),
            Expect::Refused(true),
        ),
        11 => (
            "Date with month 13",
            single("SELECT ?", vec![Value::date(2024, 13, 1, 0, 0, 0, 0)]),
            refused,
        ),
        12 => (
            "Date with day 32",
            single("SELECT ?", vec![Value::date(2024, 1, 32, 0, 0, 0, 0)]),
            refused,
        ),
        13 => (
            "Time out of range",
            single("SELECT ?", vec![Value::time(true, 35, 0, 0, 0, 0)]),
            refused,
        ),
        14 => (
            "Decimal abc",
            single("SELECT ? + 0", vec![Value::Decimal("abc".into())]),
            refused,
        ),
        15 => (
            "Bit of 72 bits",
            single("SELECT ?", vec![Value::Bit(vec![1; 9])]),
            refused,
        ),
        16 => (
            "KILL of its own session",
            single("KILL CONNECTION_ID()", vec![]),
            refused,
        ),
        _ => (
            "65 535 params for one marker",
            single("SELECT ?", vec![Value::Null; 65_535]),
            refused,
        ),
    }
}

/// Sends `count` storm requests one after the other on one connection; checks each answer.
/// Returns how many were sent.
async fn storm(addr: SocketAddr, token: String, first: usize, count: usize) -> usize {
    let (mut raw, _) = Raw::open(addr, &token).await;
    for n in first..first + count {
        let (what, req, expect) = storm_request(n);
        let stream = (n % 1000 + 1) as u32;
        raw.send(Frame::new(Kind::Request, stream, &req)).await;
        let mut rows: Vec<Vec<Value>> = Vec::new();
        let mut error: Option<ErrorBody> = None;
        loop {
            match raw.next_data(Duration::from_secs(20)).await {
                Got::Frame(f) if f.stream == stream => match f.kind {
                    Kind::Columns => {}
                    Kind::Rows => rows.extend(f.body::<Rows>().expect("ROWS body").rows),
                    Kind::Error => {
                        assert!(error.is_none(), "request {n} ({what}): two ERRORs");
                        error = Some(f.body().expect("ERROR body"));
                    }
                    Kind::End => break,
                    other => panic!("request {n} ({what}): unexpected {other:?}"),
                },
                other => panic!("request {n} ({what}): expected its frames, got {other:?}"),
            }
        }
        match expect {
            Expect::Row(v) => {
                assert!(error.is_none(), "request {n} ({what}) failed: {error:?}");
                assert_eq!(rows, vec![vec![Value::Int(v)]], "request {n} ({what})");
            }
            Expect::Refused(dispatched) => {
                let e = error.unwrap_or_else(|| panic!("request {n} ({what}) succeeded"));
                assert_eq!(
                    (e.code, e.dispatched),
                    (ErrorCode::InvalidRequest, dispatched),
                    "request {n} ({what}): {e:?}"
                );
            }
        }
    }
    count
}

/// Test: thousands of malformed-but-decodable requests of every kind the driver or the
/// server would have ended the session on, mixed with good ones, through the real
/// dispatcher: every one gets its terminal frame and the right answer, and no worker
/// exits, is killed or is respawned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_storm_kills_no_worker() {
    let _serial = serial().await;
    let sandbox = Sandbox::builder()
        .server_arg(format!("--max-allowed-packet={MAX_PACKET}"))
        .start()
        .await
        .expect("sandbox");
    let d = Dispatcher::start(sandbox.primary(), "[pool]\nsize = 4\n")
        .await
        .expect("dispatcher");
    let client = d.client().await.unwrap();
    client
        .query("CREATE TABLE t_storm (id INT) ENGINE=InnoDB", &[])
        .await
        .unwrap();
    let pids_before = d.worker_pids().await.unwrap();
    let respawns = metric(&d, "osprey_worker_respawns_total").await;
    let kills = metric(&d, "osprey_worker_kills_total").await;
    let fatal = metric(&d, "osprey_worker_fatal_exits_total").await;

    let t0 = Instant::now();
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            tokio::spawn(storm(
                d.client_addr,
                d.client_token.clone(),
                c * PER_CONNECTION,
                PER_CONNECTION,
            ))
        })
        .collect();
    let mut sent = 0;
    for t in tasks {
        sent += t.await.expect("storm task");
    }
    let took = t0.elapsed();

    let pids_after = d.worker_pids().await.unwrap();
    let respawned = metric(&d, "osprey_worker_respawns_total").await - respawns;
    let killed = metric(&d, "osprey_worker_kills_total").await - kills;
    let exited = metric(&d, "osprey_worker_fatal_exits_total").await - fatal;
    println!(
        "malformed storm: {sent} requests ({} malformed) in {took:?}; worker exits {exited}, kills {killed}, \
         respawns {respawned}; pids before {pids_before:?} after {pids_after:?}",
        sent / 2
    );
    assert_eq!(pids_after, pids_before, "a worker was replaced");
    assert_eq!((exited, killed, respawned), (0.0, 0.0, 0.0));
    let r = client.query("SELECT COUNT(*) FROM t_storm", &[]).await.unwrap();
    assert_eq!(r.rows()[0].get::<i64>(0).unwrap(), 0, "a refused batch left rows");
    assert_closed_loop_of(&d, &client).await;
}

async fn assert_closed_loop_of(d: &Dispatcher, client: &osprey_client::Client) {
    d.wait_closed_loop(&[client], SETTLE).await.expect("closed loop");
    d.wait_idle(4, SETTLE).await.expect("every slot idle again");
}

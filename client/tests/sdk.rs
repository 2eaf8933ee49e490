//! SDK logic against a scripted fake dispatcher: multiplexing, stream cap, cancel,
//! timeouts, keepalive, reconnect, GOAWAY, resend and retry rules.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use osprey_client::{params, Client, ErrorCode, Origin, Request, RequestExt, StreamItem};
use osprey_protocol::{Cancel, End, Frame, Kind, Ping, Role, Value, Window, PROTOCOL_MAJOR};
use support::*;

fn assert_balanced(client: &Client) {
    let s = client.stats();
    assert_eq!(s.streams_opened, s.streams_closed, "{s:?}");
    assert_eq!(s.in_flight, 0, "{s:?}");
}

#[tokio::test]
async fn query_execute_and_conversions() {
    let mut server = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    let hello = conn.hello.clone().unwrap();
    assert_eq!((hello.role, hello.version_major), (Role::Client, PROTOCOL_MAJOR));
    assert_eq!(hello.pid, Some(std::process::id()));

    let c = client.clone();
    let q = tokio::spawn(async move {
        c.query_as::<(i64, Option<String>)>("SELECT id, name FROM t WHERE id > ?", &params![0])
            .await
    });
    let (s, req) = conn.request().await;
    assert_eq!(req.sql, "SELECT id, name FROM t WHERE id > ?");
    assert_eq!(req.params, vec![Value::Int(0)]);
    assert!(!req.idempotent && !req.read_only);
    conn.columns(s, &["id", "name"]).await;
    conn.rows(s, vec![vec![Value::Int(1), Value::Text("a".into())]]).await;
    conn.rows(s, vec![vec![Value::Bytes(b"2".to_vec()), Value::Null]]).await;
    conn.end(
        s,
        End {
            rows: 2,
            ..Default::default()
        },
    )
    .await;
    let rows = within("query", q).await.unwrap().unwrap();
    assert_eq!(rows, vec![(1, Some("a".to_string())), (2, None)]);

    let c = client.clone();
    let q = tokio::spawn(async move { c.query_json("SELECT name", &[]).await });
    let (s, _) = conn.request().await;
    conn.answer(s, "name", vec![vec![Value::Text("x".into())]]).await;
    let json = within("query_json", q).await.unwrap().unwrap();
    assert_eq!(
        serde_json::Value::Object(json[0].clone()),
        serde_json::json!({"name": "x"})
    );

    let c = client.clone();
    let q = tokio::spawn(async move { c.execute("UPDATE t SET a = 1", &[]).await });
    let (s, _) = conn.request().await;
    conn.end(
        s,
        End {
            affected_rows: 3,
            last_insert_id: Some(9),
            warnings: 1,
            ..Default::default()
        },
    )
    .await;
    let r = within("execute", q).await.unwrap().unwrap();
    assert_eq!((r.affected_rows, r.last_insert_id, r.warnings), (3, Some(9), 1));

    let c = client.clone();
    let q = tokio::spawn(async move {
        c.batch(vec![
            osprey_client::statement("INSERT INTO t VALUES (?)", params![1]),
            osprey_client::statement("SELECT 1", vec![]),
        ])
        .await
    });
    let (s, req) = conn.request().await;
    assert_eq!(req.batch.len(), 2);
    assert!(req.sql.is_empty());
    conn.answer(s, "1", vec![vec![Value::Int(1)]]).await;
    let r = within("batch", q).await.unwrap().unwrap();
    assert_eq!(r.sets.len(), 1);

    // A database error keeps errno and SQLSTATE.
    let c = client.clone();
    let q = tokio::spawn(async move { c.query("SELEC 1", &[]).await });
    let (s, _) = conn.request().await;
    let mut body = err(ErrorCode::Database, true);
    body.origin = Origin::Database;
    body.errno = Some(1064);
    body.sqlstate = Some("42000".into());
    conn.error(s, body).await;
    let e = within("error", q).await.unwrap().unwrap_err();
    assert_eq!(
        (e.code(), e.origin(), e.errno(), e.sqlstate()),
        (ErrorCode::Database, Origin::Database, Some(1064), Some("42000"))
    );
    assert!(e.dispatched());

    // An invalid request never leaves the client.
    let e = client.query("   ", &[]).await.unwrap_err();
    assert_eq!(
        (e.code(), e.origin(), e.dispatched()),
        (ErrorCode::InvalidRequest, Origin::Client, false)
    );

    eventually("balanced streams", || client.stats().in_flight == 0).await;
    assert_balanced(&client);
    assert_eq!(client.stats().streams_opened, 5);
}

#[tokio::test]
async fn auth_failure_is_reported() {
    let server = FakeServer::start(Settings::default()).await;
    let mut cfg = config(&[&server.addr]);
    cfg.token = "wrong".into();
    let e = Client::connect(cfg).await.unwrap_err();
    assert_eq!(
        (e.code(), e.origin(), e.dispatched()),
        (ErrorCode::AuthFailed, Origin::Dispatcher, false)
    );

    let e = Client::connect(config(&["127.0.0.1:1"])).await.unwrap_err();
    assert_eq!((e.code(), e.origin()), (ErrorCode::ConnectFailed, Origin::Client));
}

#[tokio::test]
async fn concurrent_requests_are_multiplexed() {
    let mut server = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    let tasks: Vec<_> = (0..20i64)
        .map(|n| {
            let c = client.clone();
            tokio::spawn(async move { c.query_as::<(i64,)>("SELECT ?", &params![n]).await })
        })
        .collect();
    // All twenty are open at once on one connection.
    let mut reqs = Vec::new();
    for _ in 0..20 {
        reqs.push(conn.request().await);
    }
    let ids: HashSet<u32> = reqs.iter().map(|(s, _)| *s).collect();
    assert_eq!(ids.len(), 20, "stream ids are unique");
    assert!(!ids.contains(&0));
    // Answer in reverse order, each with its own parameter.
    for (s, req) in reqs.into_iter().rev() {
        conn.answer(s, "n", vec![req.params.clone()]).await;
    }
    for (n, t) in tasks.into_iter().enumerate() {
        assert_eq!(within("answer", t).await.unwrap().unwrap(), vec![(n as i64,)]);
    }
    eventually("balanced", || client.stats().in_flight == 0).await;
    assert_balanced(&client);
}

#[tokio::test]
async fn stream_cap_from_hello_ack_is_respected() {
    let mut server = FakeServer::start(Settings {
        max_streams: 2,
        ..Default::default()
    })
    .await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    let tasks: Vec<_> = (0..5i64)
        .map(|n| {
            let c = client.clone();
            tokio::spawn(async move { c.query_as::<(i64,)>("SELECT ?", &params![n]).await })
        })
        .collect();
    let mut open = vec![conn.request().await, conn.request().await];
    let mut answered = 0;
    while answered < 5 {
        // With two streams open, nothing more arrives.
        assert!(
            conn.try_recv_for(Duration::from_millis(100)).await.is_none(),
            "third stream opened over the cap"
        );
        let (s, req) = open.remove(0);
        conn.answer(s, "n", vec![req.params]).await;
        answered += 1;
        if answered <= 3 {
            open.push(conn.request().await);
        }
    }
    for t in tasks {
        within("answer", t).await.unwrap().unwrap();
    }
    eventually("balanced", || client.stats().in_flight == 0).await;
    assert_balanced(&client);
}

#[tokio::test]
async fn dropping_a_request_sends_cancel_and_frees_the_stream_on_end() {
    let mut server = FakeServer::start(Settings {
        max_streams: 1,
        ..Default::default()
    })
    .await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;

    let c = client.clone();
    let t = tokio::spawn(async move { c.query("SELECT SLEEP(10)", &[]).await });
    let (s, _) = conn.request().await;
    t.abort();
    let f = conn.recv().await.unwrap();
    assert_eq!((f.kind, f.stream), (Kind::Cancel, s));
    let _: Cancel = f.body().unwrap();

    // Until END arrives the stream (the only one allowed) stays taken.
    let c = client.clone();
    let next = tokio::spawn(async move { c.query_as::<(i64,)>("SELECT 1", &[]).await });
    assert!(conn.try_recv_for(Duration::from_millis(100)).await.is_none());
    assert_eq!(client.stats().in_flight, 1);
    conn.error(s, err(ErrorCode::Cancelled, true)).await; // swallowed
    let (s2, _) = conn.request().await;
    conn.answer(s2, "1", vec![vec![Value::Int(1)]]).await;
    assert_eq!(within("next", next).await.unwrap().unwrap(), vec![(1,)]);

    // The same for a RowStream dropped after its first row.
    let mut rows = client.stream(Request::sql("SELECT n FROM big"));
    let reader = async {
        let first = rows.next_row().await.unwrap().unwrap();
        assert_eq!(first.get::<i64>(0).unwrap(), 1);
        drop(rows);
    };
    let server_side = async {
        let (s3, _) = conn.request().await;
        conn.columns(s3, &["n"]).await;
        conn.rows(s3, vec![vec![Value::Int(1)], vec![Value::Int(2)]]).await;
        s3
    };
    let ((), s3) = tokio::join!(reader, server_side);
    let f = conn.recv().await.unwrap();
    assert_eq!((f.kind, f.stream), (Kind::Cancel, s3));
    conn.error(s3, err(ErrorCode::Cancelled, true)).await;
    eventually("balanced", || client.stats().in_flight == 0).await;
    assert_balanced(&client);
}

#[tokio::test]
async fn local_request_timeout_fails_and_cancels() {
    let mut server = FakeServer::start(Settings::default()).await;
    let mut cfg = config(&[&server.addr]);
    cfg.request_timeout = Some(Duration::from_millis(300));
    let client = Client::connect(cfg).await.unwrap();
    let mut conn = server.accept().await;
    let c = client.clone();
    let t = tokio::spawn(async move { c.query("SELECT SLEEP(10)", &[]).await });
    let (s, req) = conn.request().await;
    assert!(
        req.timeout_ms > 0 && req.timeout_ms <= 300,
        "timeout_ms = {}",
        req.timeout_ms
    );
    let e = within("timeout", t).await.unwrap().unwrap_err();
    assert_eq!(
        (e.code(), e.origin(), e.dispatched()),
        (ErrorCode::RequestTimeout, Origin::Client, true)
    );
    let f = conn.recv().await.unwrap();
    assert_eq!((f.kind, f.stream), (Kind::Cancel, s));
    conn.error(s, err(ErrorCode::Cancelled, true)).await;
    eventually("balanced", || client.stats().in_flight == 0).await;
}

#[tokio::test]
async fn keepalive_pings_and_pongs() {
    let mut server = FakeServer::start(Settings {
        keepalive_interval_ms: 50,
        ..Default::default()
    })
    .await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    // The client pings at the dispatcher's (shorter) interval.
    let f = conn.recv_raw().await.unwrap();
    assert_eq!(f.kind, Kind::Ping);
    // The client answers our ping with the same nonce.
    conn.send(Frame::new(Kind::Ping, 0, &Ping { nonce: 77 })).await;
    loop {
        let f = conn.recv_raw().await.unwrap();
        if f.kind == Kind::Pong {
            assert_eq!(f.body::<Ping>().unwrap().nonce, 77);
            break;
        }
        assert_eq!(f.kind, Kind::Ping);
    }
    drop(client);
}

#[tokio::test]
async fn silent_dispatcher_is_declared_dead_and_replaced() {
    let mut server = FakeServer::start(Settings {
        answer_pings: false,
        ..Default::default()
    })
    .await;
    let mut cfg = config(&[&server.addr]);
    cfg.keepalive_interval = Duration::from_millis(50);
    cfg.keepalive_timeout = Duration::from_millis(300);
    let client = Client::connect(cfg).await.unwrap();
    let mut conn = server.accept().await;
    let c = client.clone();
    let t = tokio::spawn(async move { c.execute("UPDATE t SET a = a + 1", &[]).await });
    let _ = conn.request().await; // never answered, pings ignored
    let e = within("keepalive timeout", t).await.unwrap().unwrap_err();
    assert_eq!(
        (e.code(), e.origin(), e.dispatched()),
        (ErrorCode::OutcomeUnknown, Origin::Client, true)
    );
    let mut conn2 = server.accept().await;
    conn2.settings.answer_pings = true;
    eventually("reconnect counted", || client.stats().reconnects == 1).await;
    let c = client.clone();
    let t = tokio::spawn(async move { c.query_as::<(i64,)>("SELECT 1", &[]).await });
    let (s, _) = conn2.request().await;
    conn2.answer(s, "1", vec![vec![Value::Int(1)]]).await;
    within("query", t).await.unwrap().unwrap();
    assert_balanced(&client);
    drop(conn);
}

#[tokio::test]
async fn lost_connection_fails_non_idempotent_and_reconnects_to_second_address() {
    let mut a = FakeServer::start(Settings::default()).await;
    let mut b = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&a.addr, &b.addr])).await.unwrap();
    {
        let mut conn_a = a.accept().await;
        let c = client.clone();
        let t = tokio::spawn(async move { c.execute("INSERT INTO t VALUES (1)", &[]).await });
        let _ = conn_a.request().await;
        a.stop();
        drop(conn_a);
        let e = within("outcome", t).await.unwrap().unwrap_err();
        assert_eq!(
            (e.code(), e.origin(), e.dispatched()),
            (ErrorCode::OutcomeUnknown, Origin::Client, true)
        );
    };
    let mut conn_b = b.accept().await;
    let c = client.clone();
    let t = tokio::spawn(async move { c.query_as::<(i64,)>("SELECT 2", &[]).await });
    let (s, _) = conn_b.request().await;
    conn_b.answer(s, "2", vec![vec![Value::Int(2)]]).await;
    assert_eq!(within("query on b", t).await.unwrap().unwrap(), vec![(2,)]);
    let st = client.stats();
    assert_eq!((st.reconnects, st.retries), (1, 0));
    assert_balanced(&client);
}

#[tokio::test]
async fn idempotent_request_is_resent_after_connection_loss() {
    let mut a = FakeServer::start(Settings::default()).await;
    let mut b = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&a.addr, &b.addr])).await.unwrap();
    let mut conn_a = a.accept().await;
    let c = client.clone();
    let t = tokio::spawn(async move {
        c.send(
            Request::sql("SELECT v FROM kv WHERE k = ?")
                .with_params(params!["x"])
                .with_idempotent(true),
        )
        .await
    });
    let (_, first) = conn_a.request().await;
    conn_a.columns(1, &["v"]).await; // partial answer, then the connection dies
    drop(conn_a);
    a.stop();
    let mut conn_b = b.accept().await;
    let (s, again) = conn_b.request().await;
    assert_eq!(again.sql, first.sql);
    assert_eq!(again.params, first.params);
    conn_b.answer(s, "v", vec![vec![Value::Text("y".into())]]).await;
    let r = within("resent", t).await.unwrap().unwrap();
    assert_eq!(r.sets.len(), 1, "the partial first answer was discarded");
    assert_eq!(r.rows()[0].get::<String>(0).unwrap(), "y");
    assert_eq!(client.stats().retries, 1);
    assert_balanced(&client);
}

#[tokio::test]
async fn unwritten_request_moves_to_the_new_connection() {
    let mut server = FakeServer::start(Settings {
        max_streams: 1,
        ..Default::default()
    })
    .await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    let c = client.clone();
    let first = tokio::spawn(async move { c.execute("UPDATE a SET x = 1", &[]).await });
    let _ = conn.request().await;
    let c = client.clone();
    let second = tokio::spawn(async move { c.execute("UPDATE b SET x = 1", &[]).await });
    // The second waits locally for the only stream.
    assert!(conn.try_recv_for(Duration::from_millis(100)).await.is_none());
    drop(conn);
    let e = within("first", first).await.unwrap().unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutcomeUnknown);
    let mut conn2 = server.accept().await;
    let (s, req) = conn2.request().await;
    assert_eq!(req.sql, "UPDATE b SET x = 1");
    conn2
        .end(
            s,
            End {
                affected_rows: 1,
                ..Default::default()
            },
        )
        .await;
    assert_eq!(within("second", second).await.unwrap().unwrap().affected_rows, 1);
    assert_eq!(client.stats().retries, 0, "never sent before: not a retry");
    assert_balanced(&client);
}

#[tokio::test]
async fn goaway_moves_new_requests_and_drains_the_old_connection() {
    let mut server = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut old = server.accept().await;
    let c = client.clone();
    let inflight = tokio::spawn(async move { c.query_as::<(i64,)>("SELECT 1", &[]).await });
    let (s_old, _) = old.request().await;
    old.goaway().await;

    let mut new = server.accept().await;
    let c = client.clone();
    let fresh = tokio::spawn(async move { c.query_as::<(i64,)>("SELECT 2", &[]).await });
    let (s_new, _) = new.request().await;
    new.answer(s_new, "2", vec![vec![Value::Int(2)]]).await;
    assert_eq!(within("fresh", fresh).await.unwrap().unwrap(), vec![(2,)]);

    // The in-flight stream finishes on the old connection, which the client then closes.
    old.answer(s_old, "1", vec![vec![Value::Int(1)]]).await;
    assert_eq!(within("inflight", inflight).await.unwrap().unwrap(), vec![(1,)]);
    assert!(old.recv().await.is_none(), "old connection closed by the client");
    assert_eq!(client.stats().reconnects, 1);
    assert_balanced(&client);
}

#[tokio::test]
async fn undispatched_errors_are_retried_and_load_shedding_is_not() {
    let mut server = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;

    let c = client.clone();
    let t = tokio::spawn(async move { c.execute("INSERT INTO t VALUES (1)", &[]).await });
    let (s, _) = conn.request().await;
    conn.error(s, err(ErrorCode::WorkerLost, false)).await;
    let (s, _) = conn.request().await;
    conn.error(s, err(ErrorCode::BackendUnavailable, false)).await;
    let (s, _) = conn.request().await;
    conn.end(
        s,
        End {
            affected_rows: 1,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(within("retried", t).await.unwrap().unwrap().affected_rows, 1);
    assert_eq!(client.stats().retries, 2);

    for (code, dispatched) in [
        (ErrorCode::QueueFull, false),
        (ErrorCode::QueueTimeout, false),
        (ErrorCode::WorkerLost, true),
    ] {
        let c = client.clone();
        let t = tokio::spawn(async move { c.execute("INSERT INTO t VALUES (2)", &[]).await });
        let (s, _) = conn.request().await;
        conn.error(s, err(code, dispatched)).await;
        let e = within("error", t).await.unwrap().unwrap_err();
        assert_eq!(
            (e.code(), e.origin(), e.dispatched()),
            (code, Origin::Dispatcher, dispatched)
        );
    }
    assert_eq!(client.stats().retries, 2);

    // Retries stop at max_retries (3): the fourth error is returned.
    let c = client.clone();
    let t = tokio::spawn(async move { c.execute("INSERT INTO t VALUES (3)", &[]).await });
    for _ in 0..4 {
        let (s, _) = conn.request().await;
        conn.error(s, err(ErrorCode::ShuttingDown, false)).await;
    }
    let e = within("exhausted", t).await.unwrap().unwrap_err();
    assert_eq!(e.code(), ErrorCode::ShuttingDown);
    assert_eq!(client.stats().retries, 5);
    eventually("balanced", || client.stats().in_flight == 0).await;
    assert_balanced(&client);
}

#[tokio::test]
async fn row_stream_is_pulled_incrementally_with_a_small_buffer() {
    let mut server = FakeServer::start(Settings::default()).await;
    let mut cfg = config(&[&server.addr]);
    cfg.stream_buffer = 1;
    cfg.keepalive_timeout = Duration::from_millis(500);
    cfg.keepalive_interval = Duration::from_millis(100);
    let client = Client::connect(cfg).await.unwrap();
    let mut conn = server.accept().await;
    let mut rows = client.stream(Request::sql("SELECT n FROM big"));

    let server_side = async {
        let (s, _) = conn.request().await;
        conn.columns(s, &["n"]).await;
        conn.rows(s, vec![vec![Value::Int(0)]]).await;
        s
    };
    let reader = async {
        match rows.next().await.unwrap().unwrap() {
            StreamItem::ResultSet(meta) => assert_eq!(meta.columns[0].name, "n"),
            other => panic!("expected a result set, got {other:?}"),
        }
        // The first row arrives before the rest of the result exists.
        rows.next_row().await.unwrap().unwrap().get::<i64>(0).unwrap()
    };
    let (s, first) = tokio::join!(server_side, reader);
    assert_eq!(first, 0);

    // 200 more frames while the reader is slower than the keepalive timeout: the
    // connection pauses instead of buffering, and is not declared dead.
    let server_side = async {
        for n in 1..=200 {
            conn.rows(s, vec![vec![Value::Int(n)]]).await;
        }
        conn.end(
            s,
            End {
                rows: 201,
                ..Default::default()
            },
        )
        .await;
    };
    let reader = async {
        tokio::time::sleep(Duration::from_millis(700)).await; // a deliberately slow consumer
        let mut expect = 1;
        while let Some(r) = rows.next_row().await {
            assert_eq!(r.unwrap().get::<i64>(0).unwrap(), expect);
            expect += 1;
        }
        expect
    };
    let ((), n) = within("stream", async { tokio::join!(server_side, reader) }).await;
    assert_eq!(n, 201);
    assert_eq!(rows.summary().unwrap().rows, 201);
    assert_eq!(client.stats().reconnects, 0);
    assert_balanced(&client);
}

#[tokio::test]
async fn an_error_whose_end_was_lost_is_still_the_outcome() {
    let mut server = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    let c = client.clone();
    let t = tokio::spawn(async move { c.execute("INSERT INTO t VALUES (1)", &[]).await });
    let (s, _) = conn.request().await;
    // SHUTTING_DOWN (never reached a database), then the connection dies before END.
    conn.send(Frame::new(Kind::Error, s, &err(ErrorCode::ShuttingDown, false)))
        .await;
    drop(conn);
    // So the request is provably unrun and is sent again, not reported as OUTCOME_UNKNOWN.
    let mut conn = server.accept().await;
    let (s, _) = conn.request().await;
    conn.end(
        s,
        End {
            affected_rows: 1,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(within("resent", t).await.unwrap().unwrap().affected_rows, 1);
    assert_balanced(&client);
}

#[tokio::test]
async fn an_idempotent_resend_never_claims_the_request_did_not_run() {
    let mut server = FakeServer::start(Settings::default()).await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    let c = client.clone();
    let t = tokio::spawn(async move { c.send(Request::sql("UPDATE t SET n = n").with_idempotent(true)).await });
    let _ = conn.request().await;
    drop(conn); // written, then lost: it may have run
    let mut conn = server.accept().await;
    let (s, _) = conn.request().await;
    conn.error(s, err(ErrorCode::QueueTimeout, false)).await;
    let e = within("error", t).await.unwrap().unwrap_err();
    assert_eq!(e.code(), ErrorCode::QueueTimeout);
    assert!(e.dispatched(), "the first attempt may have run: {e:?}");
}

#[tokio::test]
async fn goaway_releases_requests_waiting_for_a_stream_slot() {
    let mut server = FakeServer::start(Settings {
        max_streams: 1,
        ..Settings::default()
    })
    .await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut old = server.accept().await;
    let c = client.clone();
    let first = tokio::spawn(async move { c.query_as::<(i64,)>("SELECT 1", &[]).await });
    let (s_old, _) = old.request().await;
    // The only slot is taken: the second request waits for it ...
    let c = client.clone();
    let second = tokio::spawn(async move { c.query_as::<(i64,)>("SELECT 2", &[]).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    old.goaway().await;
    // ... and moves to the new connection at once, while the old stream is still open.
    let mut new = server.accept().await;
    let (s_new, _) = new.request().await;
    new.answer(s_new, "2", vec![vec![Value::Int(2)]]).await;
    assert_eq!(within("second", second).await.unwrap().unwrap(), vec![(2,)]);
    old.answer(s_old, "1", vec![vec![Value::Int(1)]]).await;
    assert_eq!(within("first", first).await.unwrap().unwrap(), vec![(1,)]);
    assert_balanced(&client);
}

/// Flow control on (the dispatcher agreed to a window of 4): the SDK asks for its
/// `stream_buffer` as the window in HELLO, and gives credit back with WINDOW as its reader
/// takes data frames, half a window at a time — not before they are read.
#[tokio::test]
async fn flow_control_credit_follows_the_reader() {
    let mut server = FakeServer::start(Settings {
        stream_window: 4,
        ..Settings::default()
    })
    .await;
    let mut cfg = config(&[&server.addr]);
    cfg.stream_buffer = 8;
    let client = Client::connect(cfg).await.unwrap();
    let mut conn = server.accept().await;
    assert_eq!(conn.hello.as_ref().unwrap().stream_window, Some(8));
    let mut rows = client.stream(Request::sql("SELECT n FROM big"));
    let first = async { rows.next().await };
    let server_side = async {
        let (s, _) = conn.request().await;
        // The whole window: COLUMNS + 3 ROWS.
        conn.columns(s, &["n"]).await;
        for n in 0..3 {
            conn.rows(s, vec![vec![Value::Int(n)]]).await;
        }
        s
    };
    let (item, s) = tokio::join!(first, server_side);
    assert!(matches!(item, Some(Ok(StreamItem::ResultSet(_)))));
    // One data frame read: no credit yet (half a window is 2).
    assert!(conn.try_recv_for(Duration::from_millis(200)).await.is_none());
    // The second frame read (row 0) completes half a window: WINDOW +2.
    assert_eq!(rows.next_row().await.unwrap().unwrap().get::<i64>(0).unwrap(), 0);
    let f = conn.recv().await.expect("WINDOW");
    assert_eq!((f.kind, f.stream), (Kind::Window, s));
    assert_eq!(f.body::<Window>().unwrap().increment, 2);
    for n in 1..3 {
        assert_eq!(rows.next_row().await.unwrap().unwrap().get::<i64>(0).unwrap(), n);
    }
    let f = conn.recv().await.expect("WINDOW");
    assert_eq!(f.body::<Window>().unwrap().increment, 2);
    conn.end(
        s,
        End {
            rows: 3,
            ..Default::default()
        },
    )
    .await;
    assert!(rows.next_row().await.is_none());
    assert_balanced(&client);
}

/// A slow but steady reader gives credit back at least every second, not only half a
/// window at a time, so the dispatcher never takes it for a stalled one.
#[tokio::test]
async fn a_slow_reader_gives_credit_back_within_a_second() {
    let mut server = FakeServer::start(Settings {
        stream_window: 8,
        ..Settings::default()
    })
    .await;
    let client = Client::connect(config(&[&server.addr])).await.unwrap();
    let mut conn = server.accept().await;
    let mut rows = client.stream(Request::sql("SELECT n FROM big"));
    let first = async { rows.next().await };
    let server_side = async {
        let (s, _) = conn.request().await;
        conn.columns(s, &["n"]).await;
        conn.rows(s, vec![vec![Value::Int(0)]]).await;
        s
    };
    let (item, s) = tokio::join!(first, server_side);
    assert!(matches!(item, Some(Ok(StreamItem::ResultSet(_)))));
    // One of a half window of 4 taken: nothing yet.
    assert!(conn.try_recv_for(Duration::from_millis(200)).await.is_none());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The next frame taken, over a second after the stream opened: its credit goes back.
    assert_eq!(rows.next_row().await.unwrap().unwrap().get::<i64>(0).unwrap(), 0);
    let f = conn.recv().await.expect("WINDOW");
    assert_eq!((f.kind, f.stream), (Kind::Window, s));
    assert_eq!(f.body::<Window>().unwrap().increment, 2);
    conn.end(s, End::default()).await;
    assert!(rows.next_row().await.is_none());
    assert_balanced(&client);
}

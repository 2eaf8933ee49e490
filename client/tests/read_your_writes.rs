//! Read-your-writes in the SDK against a scripted fake dispatcher: the position kept
//! per cluster from `END.gtid`, and what each REQUEST carries as `causal_gtid`.

mod support;

use osprey_client::{Client, ErrorCode, GtidPos, Request, RequestExt};
use osprey_protocol::End;
use support::*;

fn end(gtid: Option<&str>) -> End {
    End {
        affected_rows: 1,
        gtid: gtid.map(str::to_owned),
        ..Default::default()
    }
}

fn pos(s: &str) -> GtidPos {
    GtidPos::parse(s).unwrap()
}

/// Sends `req`, answers it with `end` and returns the REQUEST the dispatcher saw.
async fn round(client: &Client, conn: &mut FakeConn, req: Request, end: End) -> Request {
    let c = client.clone();
    let call = tokio::spawn(async move { c.send(req).await });
    let (s, seen) = conn.request().await;
    conn.end(s, end).await;
    within("the request", call).await.unwrap().unwrap();
    seen
}

#[tokio::test]
async fn position_grows_per_cluster_and_is_sent_when_on() {
    let mut server = FakeServer::start(Settings::default()).await;
    let mut cfg = config(&[&server.addr]);
    cfg.read_your_writes = true;
    let client = Client::connect(cfg).await.unwrap();
    let mut conn = server.accept().await;
    assert_eq!(client.last_gtid(None), None);

    // Nothing seen yet: nothing to send.
    let seen = round(&client, &mut conn, Request::sql("INSERT 1"), end(Some("0-1-5"))).await;
    assert_eq!(seen.causal_gtid, None);
    assert_eq!(client.last_gtid(None), Some(pos("0-1-5")));
    let r = client.clone();
    let c = tokio::spawn(async move { r.execute("INSERT 2", &[]).await });
    let (s, seen) = conn.request().await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("0-1-5"));
    conn.end(s, end(Some("0-1-7"))).await;
    let summary = within("execute", c).await.unwrap().unwrap();
    assert_eq!(summary.gtid.as_deref(), Some("0-1-7"));

    // Monotonic: an older GTID (a lagging answer, another domain) never moves it back.
    let seen = round(&client, &mut conn, Request::sql("SELECT 1"), end(Some("0-1-6"))).await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("0-1-7"));
    assert_eq!(client.last_gtid(None), Some(pos("0-1-7")));
    round(&client, &mut conn, Request::sql("INSERT 3"), end(Some("1-2-3"))).await;
    assert_eq!(client.last_gtid(None), Some(pos("0-1-7,1-2-3")));
    // A read's END (no gtid) changes nothing.
    let seen = round(&client, &mut conn, Request::sql("SELECT 2"), end(None)).await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("0-1-7,1-2-3"));
    assert_eq!(client.last_gtid(None), Some(pos("0-1-7,1-2-3")));

    // Another cluster has a position of its own, starting empty.
    let seen = round(
        &client,
        &mut conn,
        Request::sql("INSERT 4").with_cluster("b"),
        end(Some("0-9-100")),
    )
    .await;
    assert_eq!(seen.cluster.as_deref(), Some("b"));
    assert_eq!(seen.causal_gtid, None, "the default cluster's position is not b's");
    assert_eq!(client.last_gtid(Some("b")), Some(pos("0-9-100")));
    assert_eq!(client.last_gtid(None), Some(pos("0-1-7,1-2-3")));
    let seen = round(
        &client,
        &mut conn,
        Request::sql("SELECT 3").with_cluster("b"),
        end(None),
    )
    .await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("0-9-100"));
    let seen = round(&client, &mut conn, Request::sql("SELECT 4"), end(None)).await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("0-1-7,1-2-3"));

    // Per request off: nothing sent, yet the position still follows the END.
    let seen = round(
        &client,
        &mut conn,
        Request::sql("INSERT 5").with_read_your_writes(false),
        end(Some("0-1-8")),
    )
    .await;
    assert_eq!(seen.causal_gtid, None);
    assert_eq!(client.last_gtid(None), Some(pos("0-1-8,1-2-3")));

    // A position given by the caller is merged with the client's.
    let seen = round(
        &client,
        &mut conn,
        Request::sql("SELECT 5").with_causal_gtid(&pos("0-1-2,2-1-40")),
        end(None),
    )
    .await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("0-1-8,1-2-3,2-1-40"));
    // ... and sent as given when read-your-writes is off for the request.
    let seen = round(
        &client,
        &mut conn,
        Request::sql("SELECT 6")
            .with_causal_gtid(&pos("2-1-40"))
            .with_read_your_writes(false),
        end(None),
    )
    .await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("2-1-40"));

    // Clones share the position.
    let clone = client.clone();
    assert_eq!(clone.last_gtid(None), client.last_gtid(None));
}

#[tokio::test]
async fn off_by_default_and_on_per_request() {
    let mut server = FakeServer::start(Settings::default()).await;
    let mut cfg = config(&[&server.addr]);
    cfg.cluster = Some("main".into());
    let client = Client::connect(cfg).await.unwrap();
    assert!(!client.config().read_your_writes);
    let mut conn = server.accept().await;

    let seen = round(&client, &mut conn, Request::sql("INSERT 1"), end(Some("0-1-5"))).await;
    assert_eq!(seen.cluster.as_deref(), Some("main"));
    assert_eq!(seen.causal_gtid, None);
    // `None` means the client's default cluster, here "main".
    assert_eq!(client.last_gtid(None), Some(pos("0-1-5")));
    assert_eq!(client.last_gtid(Some("main")), Some(pos("0-1-5")));
    let seen = round(&client, &mut conn, Request::sql("SELECT 1"), end(None)).await;
    assert_eq!(seen.causal_gtid, None, "off unless asked for");
    let seen = round(
        &client,
        &mut conn,
        Request::sql("SELECT 2").with_read_your_writes(true),
        end(None),
    )
    .await;
    assert_eq!(seen.causal_gtid.as_deref(), Some("0-1-5"));
}

#[tokio::test]
async fn bad_positions_are_refused_or_ignored() {
    let mut server = FakeServer::start(Settings::default()).await;
    let mut cfg = config(&[&server.addr]);
    cfg.read_your_writes = true;
    let client = Client::connect(cfg).await.unwrap();
    let mut conn = server.accept().await;

    // A caller's causal_gtid that is no position fails before anything is sent.
    let req = Request {
        causal_gtid: Some("not-a-gtid".into()),
        ..Request::sql("SELECT 1")
    };
    let e = client.send(req).await.unwrap_err();
    assert_eq!((e.code(), e.dispatched()), (ErrorCode::InvalidRequest, false), "{e}");

    // An END with a GTID that is not one: the request succeeds, the position is untouched.
    round(&client, &mut conn, Request::sql("INSERT 1"), end(Some("0-1-5"))).await;
    let c = client.clone();
    let call = tokio::spawn(async move { c.execute("INSERT 2", &[]).await });
    let (s, _) = conn.request().await;
    conn.end(s, end(Some("garbage"))).await;
    let r = within("execute", call).await.unwrap().unwrap();
    assert_eq!(r.gtid.as_deref(), Some("garbage"));
    assert_eq!(client.last_gtid(None), Some(pos("0-1-5")));
}

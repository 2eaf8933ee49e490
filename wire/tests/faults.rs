//! The server dies under the session: a typed fatal error, no hang, no panic.

mod common;

use std::time::{Duration, Instant};

use common::{opts, query, scalar};
use osprey_sandbox::Sandbox;
use osprey_wire::{Error, Event, Session};

/// Reads events until an error, within `limit`.
async fn until_error(s: &mut Session, limit: Duration) -> Error {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.next_event()).await {
            Err(_) => panic!("no error within {limit:?}: the session hangs"),
            Ok(Err(e)) => return e,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn server_killed_while_rows_stream() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut s = Session::connect(&opts(p)).await?;
    s.send_query("SELECT seq, REPEAT('k', 200) FROM seq_1_to_100000000")?;
    s.send_query("SELECT 'never'")?;
    // Some rows are in: the server is mid-result.
    let mut rows = 0;
    while rows < 10 {
        if let Event::Row(_) = s.next_event().await? {
            rows += 1;
        }
    }
    p.kill();
    let e = until_error(&mut s, Duration::from_secs(10)).await;
    assert!(e.is_fatal(), "{e:?}");
    assert!(matches!(e, Error::Io(_)), "{e:?}");
    assert!(s.is_broken());
    assert!(matches!(s.next_event().await, Err(Error::Broken)));
    assert!(matches!(s.send_query("SELECT 1"), Err(Error::Broken)));
    assert!(matches!(s.ping().await, Err(Error::Broken)));
    Ok(())
}

#[tokio::test]
async fn server_killed_while_a_statement_runs() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut s = Session::connect(&opts(p)).await?;
    let id = s.connection_id();
    s.send_query("SELECT SLEEP(30)")?;
    s.send_query("SELECT 2")?;
    s.flush().await?;
    let mut side = Session::connect(&opts(p)).await?;
    let running =
        format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id} AND INFO LIKE 'SELECT SLEEP%'");
    let deadline = Instant::now() + Duration::from_secs(5);
    while scalar(&mut side, &running).await != "1" {
        assert!(Instant::now() < deadline, "the sleep never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reader = tokio::spawn(async move {
        let e = until_error(&mut s, Duration::from_secs(10)).await;
        (e, s)
    });
    p.kill();
    let (e, s) = reader.await?;
    assert!(matches!(e, Error::Io(_)), "{e:?}");
    assert!(s.is_broken());
    Ok(())
}

#[tokio::test]
async fn server_closing_the_session_is_fatal() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut s = Session::connect(&opts(p)).await?;
    let mut side = Session::connect(&opts(p)).await?;
    s.send_query("SELECT SLEEP(30)")?;
    s.flush().await?;
    query(&mut side, &format!("KILL CONNECTION {}", s.connection_id())).await;
    // MariaDB may send an ERR (1927) before closing, or just close: fatal either way
    // once the socket is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), s.next_event()).await {
            Err(_) => panic!("hangs"),
            Ok(Err(e)) if e.is_fatal() => break e,
            Ok(Err(Error::Server(e))) => {
                assert!(matches!(e.code, 1927 | 1317 | 1053), "{e}");
                // The response ended; the next read finds the socket closed.
                s.send_query("SELECT 1")?;
            }
            Ok(other) => panic!("unexpected {other:?}"),
        }
    };
    assert!(matches!(e, Error::Io(_)), "{e:?}");
    Ok(())
}

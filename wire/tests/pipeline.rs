//! Pipelining and the session's commands against a real MariaDB.

mod common;

use std::time::{Duration, Instant};

use common::{admin_opts, opts, query, read_response, scalar};
use osprey_sandbox::Sandbox;
use osprey_wire::mysql_common::constants::SessionStateType;
use osprey_wire::mysql_common::packets::session_state_change::SessionStateChange;
use osprey_wire::{Error, Event, Session, StatusFlags, Value};

enum Kind {
    Select(i64),
    Insert(i64),
    SyntaxError,
    Execute(i64),
    Multi(i64),
}

#[tokio::test]
async fn fifty_mixed_statements_in_one_go() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    for deprecate_eof in [true, false] {
        let mut o = opts(p);
        o.deprecate_eof = deprecate_eof;
        let mut s = Session::connect(&o).await?;
        let table = if deprecate_eof { "pt" } else { "pt_eof" };
        query(
            &mut s,
            &format!("CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))"),
        )
        .await;
        let stmt = s.prepare("SELECT CAST(? AS SIGNED), 'prepared'").await?;

        let mut kinds = Vec::new();
        for i in 0..50i64 {
            let kind = match i {
                17 => Kind::SyntaxError,
                33 => Kind::Execute(i),
                41 => Kind::Multi(i),
                i if i % 5 == 0 => Kind::Insert(i),
                i => Kind::Select(i),
            };
            match &kind {
                Kind::Select(i) => s.send_query(&format!("SELECT {i}, 'sel{i}'"))?,
                Kind::Insert(i) => s.send_query(&format!("INSERT INTO {table} VALUES ({i}, 'v{i}')"))?,
                Kind::SyntaxError => s.send_query("SELEC 17")?,
                Kind::Execute(i) => s.send_execute(&stmt, &[Value::Int(*i)])?,
                Kind::Multi(i) => s.send_query(&format!("SELECT {i}; SELECT {i}00"))?,
            }
            kinds.push(kind);
        }
        assert_eq!(s.pending(), 50, "all written before any response is read");
        s.flush().await?;
        for (n, kind) in kinds.iter().enumerate() {
            let r = read_response(&mut s).await?;
            match kind {
                Kind::Select(i) => {
                    assert!(r.error.is_none(), "#{n}: {r:?}");
                    assert_eq!(r.results.len(), 1);
                    assert_eq!(
                        r.results[0].rows,
                        vec![vec![
                            Value::Bytes(i.to_string().into()),
                            Value::Bytes(format!("sel{i}").into())
                        ]],
                        "#{n}"
                    );
                }
                Kind::Insert(_) => {
                    assert!(r.error.is_none(), "#{n}: {r:?}");
                    assert_eq!(r.results.len(), 1);
                    assert!(r.results[0].columns.is_none());
                    assert_eq!(r.ok().affected_rows(), 1, "#{n}");
                }
                Kind::SyntaxError => {
                    let e = r.error.expect("a syntax error");
                    assert_eq!((e.code, e.state.as_str()), (1064, "42000"), "#{n}");
                    assert!(r.results.is_empty());
                    assert!(s.last_ok().is_none(), "an error clears last_ok");
                }
                Kind::Execute(i) => {
                    assert!(r.error.is_none(), "#{n}: {r:?}");
                    assert_eq!(
                        r.results[0].rows,
                        vec![vec![Value::Int(*i), Value::Bytes(b"prepared".to_vec())]],
                        "#{n}"
                    );
                }
                Kind::Multi(i) => {
                    assert!(r.error.is_none(), "#{n}: {r:?}");
                    assert_eq!(r.texts(), vec![i.to_string(), format!("{i}00")], "#{n}");
                    assert_eq!(r.results.len(), 2);
                }
            }
        }
        assert_eq!(s.pending(), 0);
        let inserts = kinds.iter().filter(|k| matches!(k, Kind::Insert(_))).count();
        assert_eq!(
            scalar(&mut s, &format!("SELECT COUNT(*) FROM {table}")).await,
            inserts.to_string()
        );
        assert_eq!(scalar(&mut s, "SELECT 'fine'").await, "fine");
        s.ping().await?;
    }
    Ok(())
}

#[tokio::test]
async fn round_trips_wait_for_pending_responses() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    s.send_query("SELECT 1")?;
    for r in [
        s.ping().await.map(|_| ()),
        s.prepare("SELECT ?").await.map(|_| ()),
        s.reset_connection().await,
    ] {
        match r {
            Err(e @ Error::Refused(_)) => assert!(!e.is_fatal()),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // A wrong parameter count is refused before anything is sent.
    let stmt = {
        read_response(&mut s).await?;
        s.prepare("SELECT ?").await?
    };
    assert!(matches!(s.send_execute(&stmt, &[]), Err(Error::Refused(_))));
    assert_eq!(s.pending(), 0);
    assert!(matches!(s.next_event().await, Err(Error::Refused(_))));
    assert_eq!(scalar(&mut s, "SELECT 2").await, "2");
    Ok(())
}

#[tokio::test]
async fn multi_results_call_and_multi_statements() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    // mysql_async sets CLIENT_MULTI_STATEMENTS; so does this session.
    assert!(s
        .capabilities()
        .contains(osprey_wire::mysql_common::constants::CapabilityFlags::CLIENT_MULTI_STATEMENTS));
    query(
        &mut s,
        "CREATE PROCEDURE two_sets(n INT) BEGIN SELECT n AS a; SELECT n + 1 AS b, 'x' AS c; END",
    )
    .await;
    let r = query(&mut s, "CALL two_sets(7)").await;
    assert!(r.error.is_none(), "{r:?}");
    // Two result sets and the CALL's own OK.
    assert_eq!(r.results.len(), 3);
    assert_eq!(r.results[0].rows, vec![vec![Value::Bytes(b"7".to_vec())]]);
    assert_eq!(
        r.results[1].rows,
        vec![vec![Value::Bytes(b"8".to_vec()), Value::Bytes(b"x".to_vec())]]
    );
    assert!(r.results[2].columns.is_none());
    // The same through the binary protocol (PS_MULTI_RESULTS), pipelined twice.
    let stmt = s.prepare("CALL two_sets(?)").await?;
    s.send_execute(&stmt, &[Value::Int(1)])?;
    s.send_execute(&stmt, &[Value::Int(2)])?;
    for n in [1i64, 2] {
        let r = read_response(&mut s).await?;
        assert_eq!(r.results.len(), 3, "{r:?}");
        assert_eq!(r.results[0].rows, vec![vec![Value::Int(n)]]);
        assert_eq!(
            r.results[1].rows,
            vec![vec![Value::Int(n + 1), Value::Bytes(b"x".to_vec())]]
        );
    }
    // Multi-statements: an error stops the rest of that command only.
    s.send_query("SELECT 1; SELEC 2; SELECT 3")?;
    s.send_query("SELECT 4; SELECT 5")?;
    let r = read_response(&mut s).await?;
    assert_eq!(r.texts(), vec!["1"]);
    assert_eq!(r.error.map(|e| e.code), Some(1064));
    assert_eq!(read_response(&mut s).await?.texts(), vec!["4", "5"]);
    // Statements without rows in between.
    let r = query(&mut s, "SET @a = 1; SELECT @a; DO 1").await;
    assert_eq!(r.results.len(), 3);
    assert_eq!(r.texts(), vec!["1"]);
    Ok(())
}

#[tokio::test]
async fn kill_query_ends_the_running_statement_and_the_ones_behind_it_complete() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut s = Session::connect(&opts(p)).await?;
    query(&mut s, "CREATE TABLE k (id INT PRIMARY KEY)").await;
    let id = s.connection_id();
    let started = Instant::now();
    s.send_query("SELECT SLEEP(5)")?;
    s.send_query("SELECT 'one'")?;
    s.send_query("INSERT INTO k VALUES (1)")?;
    s.send_query("SELECT 'three'")?;
    s.flush().await?;

    let mut side = Session::connect(&opts(p)).await?;
    let running =
        format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id} AND INFO LIKE 'SELECT SLEEP%'");
    let deadline = Instant::now() + Duration::from_secs(5);
    while scalar(&mut side, &running).await != "1" {
        assert!(Instant::now() < deadline, "the sleep never showed in the processlist");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = query(&mut side, &format!("KILL QUERY {id}")).await;
    assert!(r.error.is_none(), "{r:?}");

    let r = read_response(&mut s).await?;
    let e = r.error.expect("the sleep is interrupted");
    assert_eq!((e.code, e.state.as_str()), (1317, "70100"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_eq!(read_response(&mut s).await?.texts(), vec!["one"]);
    assert_eq!(read_response(&mut s).await?.ok().affected_rows(), 1);
    assert_eq!(read_response(&mut s).await?.texts(), vec!["three"]);
    assert_eq!(scalar(&mut s, "SELECT COUNT(*) FROM k").await, "1");
    Ok(())
}

#[tokio::test]
async fn values_over_16_mib_both_ways() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut admin = Session::connect(&admin_opts(p)).await?;
    query(&mut admin, "SET GLOBAL max_allowed_packet = 256 * 1024 * 1024").await;
    // The global value applies to sessions opened after it.
    let mut s = Session::connect(&opts(p)).await?;
    assert_eq!(
        scalar(&mut s, "SELECT @@max_allowed_packet").await,
        (256 * 1024 * 1024).to_string()
    );
    query(&mut s, "CREATE TABLE big (id INT PRIMARY KEY, b LONGBLOB)").await;

    const N: usize = 20 * 1024 * 1024 + 7;
    let data: Vec<u8> = (0..N).map(|i| (i * 7 % 251) as u8).collect();
    // Out: a prepared parameter (sent as long data) and a text literal, each > 16 MiB.
    let insert = s.prepare("INSERT INTO big VALUES (?, ?)").await?;
    s.send_execute(&insert, &[Value::Int(1), Value::Bytes(data.clone())])?;
    let hex: String = data.iter().map(|b| format!("{b:02X}")).collect();
    s.send_query(&format!("INSERT INTO big VALUES (2, x'{hex}')"))?;
    // Pipelined behind them: something small.
    s.send_query("SELECT 'after'")?;
    assert_eq!(read_response(&mut s).await?.ok().affected_rows(), 1);
    assert_eq!(read_response(&mut s).await?.ok().affected_rows(), 1);
    assert_eq!(read_response(&mut s).await?.texts(), vec!["after"]);

    // Back: text and binary rows over 16 MiB (several chunks per packet).
    let r = query(&mut s, "SELECT b, LENGTH(b) FROM big ORDER BY id").await;
    assert_eq!(r.results[0].rows.len(), 2);
    for row in &r.results[0].rows {
        assert_eq!(row[0], Value::Bytes(data.clone()));
        assert_eq!(row[1], Value::Bytes(N.to_string().into_bytes()));
    }
    let select = s.prepare("SELECT b FROM big WHERE id = ?").await?;
    s.send_execute(&select, &[Value::Int(2)])?;
    s.send_query("SELECT 'tail'")?;
    let r = read_response(&mut s).await?;
    assert_eq!(r.results[0].rows, vec![vec![Value::Bytes(data.clone())]]);
    assert_eq!(read_response(&mut s).await?.texts(), vec!["tail"]);
    // Exactly 16 MiB - 1 and 16 MiB payloads (the chunk boundary, an empty last chunk).
    for len in [16 * 1024 * 1024 - 1 - 5, 16 * 1024 * 1024 - 5, 16 * 1024 * 1024 - 4] {
        let r = query(&mut s, &format!("SELECT REPEAT('z', {len})")).await;
        assert_eq!(r.results[0].rows, vec![vec![Value::Bytes(vec![b'z'; len])]], "{len}");
    }
    Ok(())
}

#[tokio::test]
async fn local_infile_is_answered_with_an_empty_file() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut admin = Session::connect(&admin_opts(p)).await?;
    query(&mut admin, "SET GLOBAL local_infile = 1").await;
    let mut s = Session::connect(&opts(p)).await?;
    query(&mut s, "CREATE TABLE li (a INT)").await;
    let r = query(&mut s, "LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE li").await;
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(r.ok().affected_rows(), 0);
    assert_eq!(scalar(&mut s, "SELECT COUNT(*) FROM li").await, "0");
    // Pipelined behind another command, the request cannot be answered: the server would
    // read the next command as the file. The session says so and is broken.
    s.send_query("LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE li")?;
    s.send_query("SELECT 1")?;
    match read_response(&mut s).await {
        Err(e @ Error::Protocol(_)) => assert!(e.is_fatal()),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert!(matches!(s.send_query("SELECT 1"), Err(Error::Broken)));
    Ok(())
}

fn last_gtid(ok: &osprey_wire::OkPacket<'_>) -> Option<String> {
    if !ok.status_flags().contains(StatusFlags::SERVER_SESSION_STATE_CHANGED) {
        return None;
    }
    for change in ok.session_state_info().ok()? {
        if change.data_type() != SessionStateType::SESSION_TRACK_SYSTEM_VARIABLES {
            continue;
        }
        if let Ok(SessionStateChange::SystemVariables(vars)) = change.decode() {
            if let Some(v) = vars.iter().find(|v| v.name_bytes() == b"last_gtid") {
                return Some(String::from_utf8_lossy(v.value_bytes()).into_owned());
            }
        }
    }
    None
}

#[tokio::test]
async fn ok_packets_carry_last_gtid() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    query(&mut s, "CREATE TABLE g (id INT PRIMARY KEY)").await;
    query(&mut s, "SET SESSION session_track_system_variables = 'last_gtid'").await;
    let r = query(&mut s, "INSERT INTO g VALUES (1)").await;
    let gtid = last_gtid(r.ok()).expect("the INSERT's OK carries last_gtid");
    assert_eq!(scalar(&mut s, "SELECT @@last_gtid").await, gtid);
    assert_eq!(
        last_gtid(s.last_ok().expect("ok")),
        None,
        "the SELECT's end carries nothing"
    );
    // Pipelined writes, text and binary: each OK carries its own GTID.
    let stmt = s.prepare("INSERT INTO g VALUES (?)").await?;
    s.send_query("INSERT INTO g VALUES (2)")?;
    s.send_execute(&stmt, &[Value::Int(3)])?;
    s.send_query("SELECT @@last_gtid")?;
    let a = last_gtid(read_response(&mut s).await?.ok()).expect("gtid 2");
    let b = last_gtid(read_response(&mut s).await?.ok()).expect("gtid 3");
    assert_ne!(a, b);
    assert_ne!(a, gtid);
    assert_eq!(read_response(&mut s).await?.texts(), vec![b]);
    // Inside a transaction: nothing until the COMMIT.
    query(&mut s, "START TRANSACTION").await;
    assert!(s.status_flags().contains(StatusFlags::SERVER_STATUS_IN_TRANS));
    let r = query(&mut s, "INSERT INTO g VALUES (4)").await;
    assert_eq!(last_gtid(r.ok()), None);
    let r = query(&mut s, "COMMIT").await;
    assert!(last_gtid(r.ok()).is_some());
    assert!(!s.status_flags().contains(StatusFlags::SERVER_STATUS_IN_TRANS));
    Ok(())
}

#[tokio::test]
async fn reset_connection_and_change_user() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut s = Session::connect(&opts(p)).await?;
    let id = s.connection_id();
    query(
        &mut s,
        "SET @x = 1; CREATE TEMPORARY TABLE tmp (a INT); SET autocommit = 0",
    )
    .await;
    assert!(!s.status_flags().contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT));
    let stmt = s.prepare("SELECT ? + 1").await?;
    assert_eq!(s.cached_statements(), 1);
    s.reset_connection().await?;
    assert_eq!(s.cached_statements(), 0);
    assert!(s.status_flags().contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT));
    assert_eq!(scalar(&mut s, "SELECT @x").await, "NULL");
    assert_eq!(scalar(&mut s, "SELECT @@autocommit").await, "1");
    assert!(query(&mut s, "SELECT * FROM tmp").await.error.is_some());
    // The old statement is gone on the server: a server error, and the session goes on.
    s.send_execute(&stmt, &[Value::Int(1)])?;
    let r = read_response(&mut s).await?;
    assert_eq!(r.error.map(|e| e.code), Some(1243));
    let stmt = s.prepare("SELECT ? + 1").await?;
    s.send_execute(&stmt, &[Value::Int(1)])?;
    assert_eq!(read_response(&mut s).await?.results[0].rows, vec![vec![Value::Int(2)]]);

    query(&mut s, "CREATE DATABASE other; USE other; SET @y = 2").await;
    assert_eq!(scalar(&mut s, "SELECT DATABASE()").await, "other");
    s.change_user().await?;
    assert_eq!(s.connection_id(), id);
    assert_eq!(scalar(&mut s, "SELECT DATABASE()").await, p.database());
    assert_eq!(scalar(&mut s, "SELECT @y").await, "NULL");
    assert_eq!(scalar(&mut s, "SELECT CONNECTION_ID()").await, id.to_string());
    assert_eq!(s.cached_statements(), 0);
    assert_eq!(
        scalar(&mut s, "SELECT @@collation_connection").await,
        "utf8mb4_general_ci"
    );
    // Twice (the nonce of the last exchange is used).
    s.change_user().await?;
    s.ping().await?;
    Ok(())
}

#[tokio::test]
async fn statement_cache_evicts_and_closes() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    let first = s.prepare("SELECT 0 + ?").await?;
    for i in 1..=osprey_wire::STMT_CACHE_SIZE {
        s.prepare(&format!("SELECT {i} + ?")).await?;
    }
    assert_eq!(s.cached_statements(), osprey_wire::STMT_CACHE_SIZE);
    // The first one was evicted and closed on the server.
    s.send_execute(&first, &[Value::Int(1)])?;
    assert_eq!(read_response(&mut s).await?.error.map(|e| e.code), Some(1243));
    let open = scalar(
        &mut s,
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'PREPARED_STMT_COUNT'",
    )
    .await;
    assert_eq!(open, osprey_wire::STMT_CACHE_SIZE.to_string());
    // A hit costs no round trip and works with responses pending.
    s.send_query("SELECT 1")?;
    let again = s.prepare("SELECT 5 + ?").await?;
    s.send_execute(&again, &[Value::Int(1)])?;
    read_response(&mut s).await?;
    assert_eq!(read_response(&mut s).await?.results[0].rows, vec![vec![Value::Int(6)]]);
    Ok(())
}

#[tokio::test]
async fn rows_stream_one_at_a_time() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    // Far more than any buffer: counted as they come, never collected.
    s.send_query("SELECT seq, REPEAT('r', 100) FROM seq_1_to_300000")?;
    s.send_query("SELECT 'next'")?;
    let mut rows = 0u64;
    loop {
        match s.next_event().await? {
            Event::Columns(c) => assert_eq!(c.len(), 2),
            Event::Row(r) => {
                rows += 1;
                assert_eq!(r.as_ref(0), Some(&Value::Bytes(rows.to_string().into_bytes())));
            }
            Event::RawRow(_) => panic!("a raw row nobody asked for"),
            Event::End { more_results, .. } => {
                assert!(!more_results);
                break;
            }
        }
    }
    assert_eq!(rows, 300_000);
    assert_eq!(read_response(&mut s).await?.texts(), vec!["next"]);
    Ok(())
}

#[tokio::test]
async fn cached_metadata_is_used_and_renewed() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut other = Session::connect(&opts(p)).await?;
    query(&mut other, "CREATE TABLE mc (id INT PRIMARY KEY, v INT)").await;
    query(&mut other, "INSERT INTO mc VALUES (1, 10), (2, 20)").await;
    for (cache, deprecate_eof) in [(true, true), (true, false), (false, true)] {
        let mut o = opts(p);
        o.cache_metadata = cache;
        o.deprecate_eof = deprecate_eof;
        let mut s = Session::connect(&o).await?;
        assert_eq!(s.caches_metadata(), cache, "MariaDB 10.6+ offers it");
        let stmt = s.prepare("SELECT * FROM mc WHERE id >= ? ORDER BY id").await?;
        let run = |s: &mut Session| {
            s.send_execute(&stmt, &[Value::Int(1)]).expect("send");
        };
        run(&mut s);
        run(&mut s);
        let first = read_response(&mut s).await?;
        let second = read_response(&mut s).await?;
        assert_eq!(first, second);
        assert_eq!(first.results[0].rows[1][..2], [Value::Int(2), Value::Int(20)]);
        // The prepare sent the definitions: neither execute needs them.
        assert_eq!(s.metadata_skips(), 2 * u64::from(cache));

        let wide = format!(
            "ALTER TABLE mc ADD COLUMN w{} VARCHAR(5) DEFAULT 'w'",
            u8::from(cache) * 2 + u8::from(deprecate_eof)
        );
        query(&mut other, &wide).await;
        run(&mut s);
        run(&mut s);
        let changed = read_response(&mut s).await?;
        let again = read_response(&mut s).await?;
        // (The first one's end says SERVER_STATUS_METADATA_CHANGED.)
        assert_eq!(again.results[0].columns, changed.results[0].columns);
        assert_eq!(again.results[0].rows, changed.results[0].rows);
        let cols = changed.results[0].columns.clone().expect("columns");
        assert_eq!(cols.len(), stmt.columns().len());
        assert!(cols.len() >= 3, "the new column is there: {}", cols.len());
        assert_eq!(changed.results[0].rows[0][2], Value::Bytes(b"w".to_vec()));
        // Changed definitions come with the first execute after the change, then not again.
        assert_eq!(s.metadata_skips(), 3 * u64::from(cache));
        // Text results never skip.
        assert_eq!(
            query(&mut s, "SELECT * FROM mc").await.results[0]
                .columns
                .as_ref()
                .map(|c| c.len()),
            Some(cols.len())
        );
    }
    Ok(())
}

/// Commands and responses both larger than the socket buffers: the session must write the
/// rest of the pipeline while it reads the first responses, or neither side moves.
#[tokio::test]
async fn big_commands_and_big_responses_do_not_deadlock() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    let literal = "y".repeat(1024 * 1024);
    const N: usize = 20;
    for flush_first in [false, true] {
        for i in 0..N {
            s.send_query(&format!("SELECT {i}, '{literal}', REPEAT('z', 1024 * 1024)"))?;
        }
        let all = async {
            if flush_first {
                // flush() alone must get through too (it reads ahead while writes wait).
                s.flush().await?;
            }
            for i in 0..N {
                let r = read_response(&mut s).await?;
                let row = &r.results[0].rows[0];
                assert_eq!(row[0], Value::Bytes(i.to_string().into_bytes()));
                assert_eq!(row[1], Value::Bytes(literal.clone().into_bytes()));
                assert_eq!(row[2], Value::Bytes(vec![b'z'; 1024 * 1024]));
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .map_err(|_| anyhow::anyhow!("the pipeline is stuck (flush first: {flush_first})"))??;
    }
    assert_eq!(scalar(&mut s, "SELECT 'ok'").await, "ok");
    Ok(())
}

/// An ERR packet after some rows of a result set ends that response only.
#[tokio::test]
async fn error_in_the_middle_of_rows() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    let failing = "SELECT IF(seq < 4, seq, (SELECT 1 UNION SELECT 2)) FROM seq_1_to_10";
    let stmt = s.prepare(failing).await?;
    s.send_query(failing)?;
    s.send_query("SELECT 'behind text'")?;
    s.send_execute(&stmt, &[])?;
    s.send_query("SELECT 'behind binary'")?;
    for (protocol, behind) in [("text", "behind text"), ("binary", "behind binary")] {
        let mut rows = 0;
        let e = loop {
            match s.next_event().await {
                Ok(Event::Row(_) | Event::RawRow(_)) => rows += 1,
                Ok(Event::Columns(_)) => {}
                Ok(end @ Event::End { .. }) => panic!("{protocol}: no error but {end:?}"),
                Err(Error::Server(e)) => break e,
                Err(e) => panic!("{protocol}: {e}"),
            }
        };
        assert_eq!(e.code, 1242, "{protocol}: {e}");
        // The rows before the failing one came first: the ERR arrived in the rows phase.
        assert_eq!(rows, 3, "{protocol}");
        assert_eq!(read_response(&mut s).await?.texts(), vec![behind]);
    }
    // A statement that cannot be prepared is a server error too.
    match s.prepare("SELEC ?").await {
        Err(Error::Server(e)) => assert_eq!(e.code, 1064),
        other => panic!("expected a syntax error, got {other:?}"),
    }
    assert_eq!(scalar(&mut s, "SELECT 'still fine'").await, "still fine");
    Ok(())
}

/// `raw_rows`: the packets of a command's rows as the server sent them, in text and
/// binary protocol, pipelined between commands whose rows are parsed; each parses to
/// what the same statement's parsed rows hold.
#[tokio::test]
async fn raw_rows_are_the_row_packets_unparsed() -> anyhow::Result<()> {
    use osprey_wire::mysql_common::io::ParseBuf;
    use osprey_wire::mysql_common::proto::{Binary, Text};
    use osprey_wire::mysql_common::row::{Row, RowDeserializer};
    use osprey_wire::mysql_common::value::ServerSide;

    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    let sql = "SELECT seq, IF(seq % 3 = 0, NULL, REPEAT('x', seq)), seq / 7, TIMESTAMP'2020-01-01 00:00:00.123456' - INTERVAL seq DAY \
               FROM seq_1_to_300";
    let stmt = s.prepare(sql).await?;
    // parsed, raw, parsed, raw: text then binary.
    s.send_query(sql)?;
    s.send_query(sql)?;
    s.raw_rows();
    s.send_execute(&stmt, &[])?;
    s.send_execute(&stmt, &[])?;
    s.raw_rows();
    s.send_query("SELECT 'after'")?;
    for binary in [false, true] {
        let parsed = read_response(&mut s).await?;
        let want = &parsed.results[0].rows;
        let mut columns = None;
        let mut raw = Vec::new();
        loop {
            match s.next_event().await? {
                Event::Columns(c) => columns = Some(c),
                Event::RawRow(packet) => raw.push(packet),
                Event::Row(_) => panic!("a parsed row where raw ones were asked for"),
                Event::End { more_results, .. } => {
                    assert!(!more_results);
                    break;
                }
            }
        }
        let columns = columns.expect("a result set");
        assert_eq!(raw.len(), 300);
        let got: Vec<Vec<Value>> = raw
            .iter()
            .map(|p| {
                let mut buf = ParseBuf(p);
                let row: Row = if binary {
                    buf.parse::<RowDeserializer<ServerSide, Binary>>(columns.clone())
                        .unwrap()
                        .into()
                } else {
                    buf.parse::<RowDeserializer<ServerSide, Text>>(columns.clone())
                        .unwrap()
                        .into()
                };
                assert!(buf.is_empty());
                row.unwrap()
            })
            .collect();
        assert_eq!(&got, want, "binary={binary}");
    }
    assert_eq!(read_response(&mut s).await?.texts(), vec!["after"]);
    Ok(())
}

//! Faults and hostile clients on the MySQL port: a worker killed inside a transaction,
//! bytes that are not MySQL, a handshake that never ends. Each answered clearly, nothing
//! else disturbed.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{run, text, Rig};

/// Kill -9 of the worker pinned to a transaction: the next statement gets ERR 1927 with
/// SQLSTATE 08S01 and the connection closes (a driver's pool discards it); the
/// transaction's write is not there; other clients go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_inside_a_transaction_closes_the_connection_with_08s01() {
    let rig = Rig::start("").await;
    let mut setup = rig.conn().await;
    setup.query_drop("DROP TABLE IF EXISTS killed").await.unwrap();
    setup
        .query_drop("CREATE TABLE killed (id INT PRIMARY KEY) ENGINE=InnoDB")
        .await
        .unwrap();
    let mut a = rig.conn().await;
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO killed VALUES (1)").await.unwrap();
    let d = &rig.cluster.dispatcher;
    let sessions = d.admin_get("/sessions").await.unwrap();
    let slot = sessions[0]["slot"].as_u64().expect("a pinned slot");
    let pid = d
        .worker_pids()
        .await
        .unwrap()
        .into_iter()
        .find(|(s, _)| *s == slot)
        .and_then(|(_, p)| p)
        .expect("the pinned worker's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let e = a.query_drop("INSERT INTO killed VALUES (2)").await.unwrap_err();
    match &e {
        mysql_async::Error::Server(s) => {
            assert_eq!((s.code, s.state.as_str()), (1927, "08S01"), "{s:?}");
            assert!(s.message.contains("rolled back"), "{s:?}");
        }
        other => panic!("expected ERR 1927/08S01, got {other:?}"),
    }
    assert!(
        a.query_drop("SELECT 1").await.is_err(),
        "the connection is closed after 08S01"
    );
    let n: Option<i64> = setup.query_first("SELECT COUNT(*) FROM killed").await.unwrap();
    assert_eq!(n, Some(0), "the transaction's write was rolled back");
    // The slot was refilled and others are served.
    let mut c = rig.conn().await;
    let one: Option<i64> = c.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
}

/// Reads the server's greeting; returns its scramble.
async fn greeting(s: &mut TcpStream) -> Vec<u8> {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.unwrap();
    let len = usize::from(head[0]) | usize::from(head[1]) << 8 | usize::from(head[2]) << 16;
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).await.unwrap();
    assert_eq!(p[0], 10, "protocol 10");
    let v_end = p.iter().position(|&b| b == 0).unwrap();
    let rest = &p[v_end + 1..];
    let mut nonce = rest[4..12].to_vec();
    nonce.extend_from_slice(&rest[31..43]);
    nonce
}

async fn read_packet(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut head))
        .await
        .ok()?
        .ok()?;
    let len = usize::from(head[0]) | usize::from(head[1]) << 8 | usize::from(head[2]) << 16;
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).await.ok()?;
    Some(p)
}

fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    v.push(seq);
    v.extend_from_slice(payload);
    v
}

/// A logged-in raw connection (mysql_native_password computed here).
async fn logged_in(rig: &Rig) -> TcpStream {
    use sha1::{Digest, Sha1};
    let mut s = TcpStream::connect(rig.mysql).await.unwrap();
    let nonce = greeting(&mut s).await;
    let once = Sha1::digest(crate::PASSWORD.as_bytes());
    let twice = Sha1::digest(once);
    let mask = Sha1::new().chain_update(&nonce).chain_update(twice).finalize();
    let answer: Vec<u8> = once.iter().zip(mask.iter()).map(|(a, m)| a ^ m).collect();
    let caps: u32 = 0x200 | 0x8000 | 0x80000; // PROTOCOL_41, SECURE_CONNECTION, PLUGIN_AUTH
    let mut p = caps.to_le_bytes().to_vec();
    p.extend_from_slice(&(1u32 << 24).to_le_bytes());
    p.push(45);
    p.extend_from_slice(&[0; 23]);
    p.extend_from_slice(crate::USER.as_bytes());
    p.push(0);
    p.push(20);
    p.extend_from_slice(&answer);
    p.extend_from_slice(b"mysql_native_password\0");
    s.write_all(&packet(1, &p)).await.unwrap();
    let ok = read_packet(&mut s).await.expect("login answered");
    assert_eq!(ok[0], 0, "OK after login: {ok:?}");
    s
}

fn err_code(p: &[u8]) -> u16 {
    assert_eq!(p[0], 0xFF, "an ERR packet: {p:?}");
    u16::from_le_bytes([p[1], p[2]])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_disturbs_nothing() {
    let rig = Rig::start_with(
        "read_timeout_ms = 1000",
        "[timeouts]\nhandshake_timeout_ms = 1000\n[limits]\nmax_payload = 1048576\n",
    )
    .await;
    // A handshake response that is too short: "Bad handshake".
    let mut s = TcpStream::connect(rig.mysql).await.unwrap();
    greeting(&mut s).await;
    s.write_all(&packet(1, &[0x00, 0x02])).await.unwrap();
    let p = read_packet(&mut s).await.expect("an answer");
    assert_eq!(err_code(&p), 1043);
    // A handshake that never comes: closed after handshake_timeout_ms.
    let mut s = TcpStream::connect(rig.mysql).await.unwrap();
    greeting(&mut s).await;
    let t0 = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed in time");
    assert_eq!(n.unwrap_or(0), 0, "closed without an answer");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // Bytes that are not UTF-8: inside a string literal they reach the server as the same
    // bytes (a hex literal); outside one, a clear error and the connection stays.
    let mut s = logged_in(&rig).await;
    s.write_all(&packet(0, b"\x03SELECT HEX(_binary'\xff\\0\xfe')"))
        .await
        .unwrap();
    let mut rows = Vec::new();
    while let Some(p) = read_packet(&mut s).await {
        let end = p[0] == 0xFE && p.len() < 9;
        rows.push(p);
        if end && rows.len() > 3 {
            break;
        }
    }
    assert!(rows.iter().any(|p| p.ends_with(b"FF00FE")), "{rows:?}");
    s.write_all(&packet(0, b"\x03SELECT \xff")).await.unwrap();
    assert_eq!(err_code(&read_packet(&mut s).await.unwrap()), 1366);
    s.write_all(&packet(0, &[0x0E])).await.unwrap();
    assert_eq!(read_packet(&mut s).await.unwrap()[0], 0, "still served");
    // A packet that claims 1000 bytes and sends 5: closed after mysql.read_timeout_ms.
    let mut s = logged_in(&rig).await;
    s.write_all(&[0xE8, 0x03, 0, 0, 0x03, b'S', b'E', b'L', b'E'])
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    assert!(read_packet(&mut s).await.is_none(), "closed, not waited on forever");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The status flags: IN_TRANS from BEGIN until COMMIT (drivers read them).
    let mut s = logged_in(&rig).await;
    let status = |p: &[u8]| -> u16 {
        assert_eq!(p[0], 0, "OK: {p:?}");
        u16::from_le_bytes([p[3], p[4]])
    };
    s.write_all(&packet(0, b"\x03BEGIN")).await.unwrap();
    assert_eq!(
        status(&read_packet(&mut s).await.unwrap()) & 1,
        1,
        "IN_TRANS after BEGIN"
    );
    s.write_all(&packet(0, b"\x03COMMIT")).await.unwrap();
    assert_eq!(
        status(&read_packet(&mut s).await.unwrap()) & 3,
        2,
        "AUTOCOMMIT, not IN_TRANS"
    );
    // A command packet that claims more than the payload limit: refused before it is
    // read (1153).
    let mut s = logged_in(&rig).await;
    let mut lying = vec![0xFF, 0xFF, 0xFF, 0];
    lying.extend_from_slice(b"\x03SELECT 1");
    s.write_all(&lying).await.unwrap();
    let p = read_packet(&mut s).await.expect("an answer");
    assert_eq!(err_code(&p), 1153);
    assert!(read_packet(&mut s).await.is_none(), "closed after 1153");
    // An unknown command: ERR 1047, the connection stays.
    let mut s = logged_in(&rig).await;
    s.write_all(&packet(0, &[0x7F, 1, 2, 3])).await.unwrap();
    assert_eq!(err_code(&read_packet(&mut s).await.unwrap()), 1047);
    s.write_all(&packet(0, &[0x0E])).await.unwrap(); // COM_PING
    assert_eq!(read_packet(&mut s).await.unwrap()[0], 0, "still served");
    // An empty command packet, then a truncated one: answered, not crashed on.
    s.write_all(&packet(0, &[])).await.unwrap();
    assert_eq!(err_code(&read_packet(&mut s).await.unwrap()), 1047);
    s.write_all(&[0x10, 0, 0, 0, 0x03, b'S']).await.unwrap();
    drop(s);
    // Prepared statements: PREPARE_OK with the dispatcher's id and the server's counts;
    // an EXECUTE of an id never given, or cut short, is an error, not a crash.
    let mut s = logged_in(&rig).await;
    s.write_all(&packet(0, b"\x16SELECT ?")).await.unwrap();
    let ok = read_packet(&mut s).await.unwrap();
    assert_eq!(
        (ok[0], u16::from_le_bytes([ok[7], ok[8]])),
        (0, 1),
        "PREPARE_OK, 1 parameter: {ok:?}"
    );
    let id = u32::from_le_bytes([ok[1], ok[2], ok[3], ok[4]]);
    // One parameter and one column definition, each list ended by an EOF (no DEPRECATE_EOF).
    for _ in 0..2 {
        assert_ne!(read_packet(&mut s).await.unwrap()[0], 0xFE, "a definition");
        assert_eq!(read_packet(&mut s).await.unwrap()[0], 0xFE, "its EOF");
    }
    let mut unknown = vec![0x17];
    unknown.extend_from_slice(&(id + 100).to_le_bytes());
    unknown.extend_from_slice(&[0, 1, 0, 0, 0]);
    s.write_all(&packet(0, &unknown)).await.unwrap();
    assert_eq!(err_code(&read_packet(&mut s).await.unwrap()), 1243);
    let mut short = vec![0x17];
    short.extend_from_slice(&id.to_le_bytes());
    short.extend_from_slice(&[0, 1, 0, 0, 0, 0, 1, 0x08]);
    s.write_all(&packet(0, &short)).await.unwrap();
    assert_eq!(err_code(&read_packet(&mut s).await.unwrap()), 1210);
    // Through all of it, the dispatcher serves the mariadb client as before.
    let mut args = rig.osprey_args();
    args.extend(["-N".into(), "-e".into(), "SELECT 6 * 7".into()]);
    let out = run("mariadb", args, None).await;
    assert_eq!(text(&out.stdout).trim(), "42", "{}", text(&out.stderr));
}

/// SIGTERM: a MySQL client inside a transaction finishes it during the drain; one
/// between statements is let go at once, even one pinned by untracked state (a user
/// variable) when no transaction is open; the dispatcher exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_an_open_mysql_transaction_commit() {
    let mut rig = Rig::start("[timeouts]\ndrain_timeout_ms = 5000\n").await;
    let mut setup = rig.conn().await;
    setup.query_drop("DROP TABLE IF EXISTS drained").await.unwrap();
    setup
        .query_drop("CREATE TABLE drained (id INT PRIMARY KEY) ENGINE=InnoDB")
        .await
        .unwrap();
    let mut pinned = rig.conn().await;
    pinned.query_drop("SET @x = 1").await.unwrap();
    let mut a = rig.conn().await;
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO drained VALUES (1)").await.unwrap();
    rig.cluster.dispatcher.signal(nix::sys::signal::Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Pinned but outside a transaction: nothing to finish, so it does not hold the drain.
    assert!(
        pinned.query_drop("SELECT @x").await.is_err(),
        "a pinned connection without a transaction was let go at once"
    );
    a.query_drop("INSERT INTO drained VALUES (2)").await.unwrap();
    a.query_drop("COMMIT").await.unwrap();
    // Between statements now: the connection is let go, and the dispatcher exits.
    let code = rig.cluster.dispatcher.wait_exit(Duration::from_secs(10)).await.unwrap();
    assert_eq!(code, Some(0));
    let mut direct = rig.direct().await;
    let n: Option<i64> = direct.query_first("SELECT COUNT(*) FROM drained").await.unwrap();
    assert_eq!(n, Some(2), "the transaction open at SIGTERM committed");
    assert!(
        setup.query_drop("SELECT 1").await.is_err(),
        "idle connections were closed"
    );
}

/// A statement whose REQUEST outgrows `limits.max_payload` (here a non-UTF-8 literal,
/// which the front end passes on as hex, twice its size) is refused at admission with
/// ERROR 1153; the connection and every worker go on. (Before, the worker link's codec
/// refused to write it, which looked like a dead link: three workers were replaced for
/// one statement, and a request prefetched with it could have been lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_too_large_for_a_worker_is_refused_and_kills_nothing() {
    let rig = Rig::start("[limits]\nmax_payload = 1048576\n").await;
    let counter = |m: &str, name: &str| -> u64 {
        m.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    let before = rig.cluster.dispatcher.metrics().await.unwrap();
    let mut s = logged_in(&rig).await;
    let mut sql = b"\x03SELECT LENGTH(_binary'".to_vec();
    sql.extend(std::iter::repeat_n(0xFFu8, 600_000));
    sql.extend_from_slice(b"')");
    s.write_all(&packet(0, &sql)).await.unwrap();
    let answer = read_packet(&mut s).await.expect("answered");
    assert_eq!(err_code(&answer), 1153, "{}", String::from_utf8_lossy(&answer));
    // The same connection goes on.
    s.write_all(&packet(0, b"\x03SELECT 1")).await.unwrap();
    let columns = read_packet(&mut s).await.expect("a result");
    assert_eq!(columns, vec![1], "one column");
    let after = rig.cluster.dispatcher.metrics().await.unwrap();
    for name in ["osprey_worker_kills", "osprey_worker_respawns"] {
        assert_eq!(
            counter(&before, name),
            counter(&after, name),
            "{name}: no worker replaced"
        );
    }
}

/// COM_CHANGE_USER whose auth switch the client never answers: bounded by the handshake
/// timeout, as a login is (the command loop's idle timeout does not run meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_user_left_unanswered_is_bounded() {
    let rig = Rig::start("[timeouts]\nhandshake_timeout_ms = 1000\n").await;
    let mut s = logged_in(&rig).await;
    // caching_sha2_password with an empty answer (as libmariadb starts): the front end
    // switches the client to its plugin and waits for the answer.
    let mut body = vec![0x11];
    body.extend_from_slice(crate::USER.as_bytes());
    body.extend_from_slice(&[0, 0, 0]); // NUL, auth length 0, no database
    body.extend_from_slice(&45u16.to_le_bytes());
    body.extend_from_slice(b"caching_sha2_password\0");
    s.write_all(&packet(0, &body)).await.unwrap();
    let switch = read_packet(&mut s).await.expect("an auth switch request");
    assert_eq!(switch[0], 0xFE, "auth switch: {switch:?}");
    // Say nothing: the connection is closed after the handshake timeout.
    let t = std::time::Instant::now();
    let mut byte = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "closed: {r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "within the handshake timeout: {:?}",
        t.elapsed()
    );
}

/// Silent connections flooding the MySQL port from one address hold at most half the
/// port's logins in progress, and past that their address's share (an eighth of
/// `limits.max_pending_handshakes`), and none of the SDK port's: a MySQL client from
/// another address and an SDK client log in at once meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_flood_from_one_address_locks_no_one_else_out() {
    let rig = Rig::start("[limits]\nmax_pending_handshakes = 64\n[timeouts]\nhandshake_timeout_ms = 4000\n").await;
    // 200 connections from 127.0.0.2 that never answer the greeting.
    let mut flood = Vec::new();
    for _ in 0..200 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        flood.push(socket.connect(rig.mysql).await.unwrap());
    }
    // Alone, an address may use half the port's logins in progress (32 of 64), beyond its
    // share of an eighth (8) while the pool is not contended: the first 20 are greeted.
    for s in flood.iter_mut().take(20) {
        let greeting = read_packet(s).await.expect("a greeting");
        assert_eq!(greeting[0], 10, "protocol 10, not an ERR: {greeting:?}");
    }
    let t = std::time::Instant::now();
    let mut c = rig.conn().await;
    c.query_drop("SELECT 1").await.unwrap();
    let sdk = rig.cluster.dispatcher.client().await.unwrap();
    sdk.query("SELECT 1", &[]).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "logged in while the flood held its logins: {:?}",
        t.elapsed()
    );
    // Past its share the flood's own connections were turned away at once, with 1040.
    let mut refused = 0;
    for s in flood.iter_mut().skip(100) {
        if let Some(p) = read_packet(s).await {
            if p.first() == Some(&0xFF) && err_code(&p) == 1040 {
                refused += 1;
            }
        }
    }
    assert!(
        refused >= 90,
        "the flood's connections past its share got 1040: {refused} of 100"
    );
}

/// One tenant (a MySQL user) cannot keep every session place of a group while another
/// waits for one: alone it may use them all, but once another user waits, a place that
/// frees goes to that user (the first user's share is the cap less one place per other
/// tenant holding or waiting, `sessions.max_per_tenant` derived), even though the first
/// user's own open was waiting before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_take_every_session_place() {
    let other = format!(
        "[sessions]\nopen_timeout_ms = 3000\n[[mysql.users]]\nname = \"other\"\nnative_hash = \"{}\"\n",
        osprey_protocol::mysql_auth::native_hash("other-pw")
    );
    let rig = Rig::start(&other).await;
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname(rig.mysql.ip().to_string())
        .tcp_port(rig.mysql.port())
        .user(Some("other"))
        .pass(Some("other-pw"))
        .db_name(Some(rig.primary().database()))
        .prefer_socket(false);
    let mut b = mysql_async::Conn::new(opts).await.unwrap();
    b.query_drop("CREATE TABLE IF NOT EXISTS tenant_t (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
        .await
        .unwrap();
    // The pool has 4 slots: sessions may pin 2. The app's user, alone, pins both (a user
    // variable each).
    let mut a1 = rig.conn().await;
    a1.query_drop("SET @x = 1").await.unwrap();
    let mut a2 = rig.conn().await;
    a2.query_drop("SET @y = 2").await.unwrap();
    // Its third pin waits; then the other user's transaction waits too.
    let mut a3 = rig.conn().await;
    let third = tokio::spawn(async move { a3.query_drop("SET @z = 3").await.map(|_| a3) });
    // (Only to put the two waits in this order: the third's first.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waited = std::time::Instant::now();
    let txn = tokio::spawn(async move {
        b.query_drop("BEGIN").await?;
        b.query_drop("INSERT INTO tenant_t (v) VALUES (1)").await?;
        b.query_drop("COMMIT").await?;
        Ok::<_, mysql_async::Error>(waited.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A place frees: it is the other user's, not the app's third.
    a1.reset().await.unwrap();
    let took = txn.await.unwrap().expect("the other user's transaction gets the place");
    assert!(took < Duration::from_millis(2500), "it got the freed place: {took:?}");
    // The app's third gets a place once the transaction gave it back.
    third
        .await
        .unwrap()
        .expect("the app's third pin, after the transaction");
    let (y,): (i64,) = a2.query_first("SELECT @y").await.unwrap().unwrap();
    assert_eq!(y, 2, "the app's pinned connection goes on");
}

/// Long data waiting for its EXECUTE counts against the port's statement budget for all
/// connections (`mysql.max_statement_bytes`), not only its connection's: past it, the
/// EXECUTE gets ERROR 1153 and the dispatcher holds no more; requests are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_data_counts_against_the_ports_statement_budget() {
    let rig = Rig::start_with("max_statement_bytes = 4194304", "").await;
    async fn prepared(rig: &Rig) -> (TcpStream, [u8; 4]) {
        let mut s = logged_in(rig).await;
        s.write_all(&packet(0, b"\x16SELECT LENGTH(?)")).await.unwrap();
        let ok = read_packet(&mut s).await.expect("PREPARE_OK");
        assert_eq!(ok[0], 0, "{ok:?}");
        // A parameter and its EOF, a column and its EOF.
        for _ in 0..4 {
            read_packet(&mut s).await.expect("a definition");
        }
        (s, ok[1..5].try_into().unwrap())
    }
    let (mut a, id_a) = prepared(&rig).await;
    let (mut b, id_b) = prepared(&rig).await;
    let long = |id: [u8; 4]| {
        let mut p = vec![0x18];
        p.extend_from_slice(&id);
        p.extend_from_slice(&[0, 0]);
        p.extend(std::iter::repeat_n(b'x', 3 << 20));
        packet(0, &p)
    };
    let execute = |id: [u8; 4]| {
        let mut p = vec![0x17];
        p.extend_from_slice(&id);
        p.extend_from_slice(&[0, 1, 0, 0, 0, 0, 1, 0xFC, 0]);
        packet(0, &p)
    };
    // Each connection's long data, then a COM_PING whose OK says the dispatcher has
    // taken the long data in (a connection's commands are served in order).
    for (s, id) in [(&mut a, id_a), (&mut b, id_b)] {
        s.write_all(&long(id)).await.unwrap();
        s.write_all(&packet(0, b"\x0e")).await.unwrap();
        assert_eq!(read_packet(s).await.expect("OK")[0], 0);
    }
    // Both taken in before either runs: 6 MiB asked for, the budget is 4.
    a.write_all(&execute(id_a)).await.unwrap();
    let first = read_packet(&mut a).await.expect("a result");
    assert_eq!(first, vec![1], "the first fits: one column");
    b.write_all(&execute(id_b)).await.unwrap();
    let refused = read_packet(&mut b).await.expect("an answer");
    assert_eq!(err_code(&refused), 1153, "{}", String::from_utf8_lossy(&refused));
}

/// 10 000 idle MySQL connections, logged in: each costs the dispatcher bounded memory;
/// one over `mysql.max_connections` gets ERROR 1040 at once; meanwhile an SDK client, a
/// new MySQL login and the admin port are served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_cost_bounded_memory_and_disturb_nothing() {
    const N: usize = 10_000;
    // The test holds N sockets, the dispatcher N more: each process needs its own room.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write a struct we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur = lim.rlim_max;
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert!(
        lim.rlim_cur >= (N + 2_000) as u64,
        "RLIMIT_NOFILE {} is below what {N} connections need",
        lim.rlim_cur
    );
    let rig = Rig::start_with(&format!("max_connections = {N}"), "").await;
    let d = &rig.cluster.dispatcher;
    let before = osprey_tests::harness::rss_kib(d.pid()).unwrap();
    let started = std::time::Instant::now();
    let mut open = Vec::with_capacity(N);
    let mut batch = tokio::task::JoinSet::new();
    let rig_ref = std::sync::Arc::new(rig);
    while open.len() < N {
        // At most 64 logins in progress (an address's share of the port's is 128).
        while batch.len() < 64 && open.len() + batch.len() < N {
            let r = rig_ref.clone();
            batch.spawn(async move { logged_in(&r).await });
        }
        open.push(batch.join_next().await.unwrap().unwrap());
    }
    let login_time = started.elapsed();
    let rig = &*rig_ref;
    let d = &rig.cluster.dispatcher;
    // One more: the cap says so at once.
    let mut over = TcpStream::connect(rig.mysql).await.unwrap();
    let refused = read_packet(&mut over).await.expect("an answer");
    assert_eq!(err_code(&refused), 1040, "{}", String::from_utf8_lossy(&refused));
    // Everyone else is served at once.
    let t = std::time::Instant::now();
    let sdk = d.client().await.unwrap();
    sdk.query("SELECT 1", &[]).await.unwrap();
    let status = d.status().await.unwrap();
    assert_eq!(status["clients"]["mysql_connections"], N, "{}", status["clients"]);
    assert!(t.elapsed() < Duration::from_secs(2), "served in {:?}", t.elapsed());
    // An idle one still answers.
    open[0].write_all(&packet(0, b"\x0e")).await.unwrap(); // COM_PING
    assert_eq!(read_packet(&mut open[0]).await.expect("OK")[0], 0);
    let after = osprey_tests::harness::rss_kib(d.pid()).unwrap();
    let per_conn = (after.saturating_sub(before) * 1024) / N as u64;
    println!(
        "{N} idle MySQL connections: logged in in {login_time:?}; dispatcher RSS {before} KiB -> {after} KiB, \
         {per_conn} bytes per connection"
    );
    // Measured: ~11 KB (a socket's buffers, the connection's state and task).
    assert!(per_conn < 32 * 1024, "{per_conn} bytes per idle connection");
    drop(open);
    // They all leave.
    osprey_tests::harness::wait_for(Duration::from_secs(20), "the connections to close", || async {
        let s = d.status().await.ok()?;
        (s["clients"]["mysql_connections"] == 0).then_some(())
    })
    .await
    .unwrap();
}

/// A MySQL client that asks for a large result and stops reading: the dispatcher holds a
/// bounded part of it (the client's write queue), cuts the client off after
/// `limits.client_write_timeout_ms` and frees the worker, which goes on serving; other
/// clients are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_large_result_is_cut_off_and_frees_its_worker() {
    let rig = Rig::start("[limits]\nclient_write_timeout_ms = 1500\n").await;
    let d = &rig.cluster.dispatcher;
    let before = osprey_tests::harness::rss_kib(d.pid()).unwrap();
    let mut s = logged_in(&rig).await;
    // ~200 MB of rows, never read.
    s.write_all(&packet(0, b"\x03SELECT REPEAT('x', 2000) AS pad FROM seq_1_to_100000"))
        .await
        .unwrap();
    // Meanwhile, others are served.
    let mut other = rig.conn().await;
    for _ in 0..5 {
        let (one,): (i64,) = other.query_first("SELECT 1").await.unwrap().unwrap();
        assert_eq!(one, 1);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = osprey_tests::harness::rss_kib(d.pid()).unwrap();
    // Cut off: the socket is closed by the dispatcher within the timeout (and a margin).
    let t = std::time::Instant::now();
    osprey_tests::harness::wait_for(Duration::from_secs(10), "the stalled client cut off", || async {
        let st = d.status().await.ok()?;
        (st["clients"]["mysql_connections"] == 1).then_some(())
    })
    .await
    .unwrap();
    println!(
        "stalled after {:?}; dispatcher RSS {before} KiB, {during} KiB while it held the result",
        t.elapsed()
    );
    assert!(during < before + 64 * 1024, "bounded: {before} -> {during} KiB");
    // Every worker serves again: four statements at once all run.
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(rig.conn().await);
    }
    let runs = conns
        .iter_mut()
        .map(|c| c.query_first::<(i64,), _>("SELECT SLEEP(0.2) + 1"));
    let t = std::time::Instant::now();
    for r in futures::future::join_all(runs).await {
        assert_eq!(r.unwrap(), Some((1,)));
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

//! Writes the committed seed corpus, `fuzz/seeds/<target>/`: one valid input of each
//! shape per target (every frame kind and body type, every `Value` variant, requests of
//! every form, the SQL of the scanner's tests), plus a few near misses.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example make_seeds` (normal build, no
//! sanitizer). Re-run it when a body type changes; the files are named after what they hold.

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use osprey_fuzz::{body_target_name, BODY_TARGETS};
use osprey_protocol::*;

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let frames = sample_frames();

    // body_decoder: [selector, payload]
    let dir = fresh(&root, "body_decoder")?;
    for (name, f) in &frames {
        let selector = Kind::ALL.iter().position(|k| *k == f.kind).unwrap() as u8;
        write(&dir, name, &[&[selector], &f.payload[..]].concat())?;
    }
    let nested = Kind::ALL.len() as u8;
    for (i, v) in sample_values().iter().enumerate() {
        write(&dir, &format!("value-{i:02}"), &[&[nested][..], &enc(v)].concat())?;
    }
    let statement = Statement {
        sql: "UPDATE t SET a = ? WHERE id = ?".into(),
        params: vec![Value::Int(1), Value::Text("x".into())],
    };
    write(&dir, "statement", &[&[nested + 1][..], &enc(&statement)].concat())?;
    write(&dir, "column", &[&[nested + 2][..], &enc(&sample_column())].concat())?;
    write(
        &dir,
        "worker-settings",
        &[&[nested + 3][..], &enc(&worker_settings())].concat(),
    )?;
    write(
        &dir,
        "backend",
        &[&[nested + 4][..], &enc(&worker_settings().backend)].concat(),
    )?;
    assert_eq!(body_target_name(nested + 4), "Backend");
    assert_eq!(usize::from(nested + 5), BODY_TARGETS);

    // frame_decoder: [max, 4 chunk sizes, frames…]
    let dir = fresh(&root, "frame_decoder")?;
    let mut all = BytesMut::new();
    for (name, f) in &frames {
        write(
            &dir,
            &format!("one-{name}"),
            &[&[0, 0, 0, 0, 0][..], &f.to_bytes()].concat(),
        )?;
        f.encode_to(&mut all);
    }
    write(&dir, "all-whole", &[&[0, 0, 0, 0, 0][..], &all].concat())?;
    write(&dir, "all-bytewise", &[&[0, 1, 1, 1, 1][..], &all].concat())?;
    write(&dir, "all-odd-chunks", &[&[0, 3, 12, 7, 200][..], &all].concat())?;
    // A limit of 64 bytes: the HELLO_ACK (146) is too large.
    write(&dir, "too-large", &[&[0x84, 5, 5, 5, 5][..], &all].concat())?;
    write(
        &dir,
        "truncated",
        &[&[0, 2, 0, 0, 0][..], &all[..all.len() - 3]].concat(),
    )?;
    let mut bad_reserved = frames[0].1.to_bytes().to_vec();
    bad_reserved[7] = 1;
    write(
        &dir,
        "reserved-not-zero",
        &[&[0, 0, 0, 0, 0][..], &bad_reserved].concat(),
    )?;
    let mut wrong_stream = frames[0].1.to_bytes().to_vec();
    wrong_stream[11] = 1;
    write(&dir, "wrong-stream", &[&[0, 0, 0, 0, 0][..], &wrong_stream].concat())?;

    // request: Request payloads
    let dir = fresh(&root, "request")?;
    for (name, r) in sample_requests() {
        write(&dir, name, &enc(&r))?;
    }
    // The spec's minimal REQUEST body, and `sql` as bin holding UTF-8 / not UTF-8.
    write(
        &dir,
        "minimal-from-spec",
        &hex("82 a3 73 71 6c ac 53 45 4c 45 43 54 20 3f 20 2b 20 31 a6 70 61 72 61 6d 73 91 29"),
    )?;
    write(&dir, "sql-as-bin", &hex("81 a3 73 71 6c c4 08 53 45 4c 45 43 54 20 31"))?;
    write(&dir, "sql-bad-utf8", &hex("81 a3 73 71 6c a8 53 45 4c 45 43 54 20 ff"))?;

    // sql_scanner: SQL text
    let dir = fresh(&root, "sql_scanner")?;
    for (i, sql) in SQL.iter().enumerate() {
        write(&dir, &format!("sql-{i:03}"), sql.as_bytes())?;
    }
    Ok(())
}

/// The target's seed directory. Files already there stay: the `regression-*` inputs of
/// crashes (docs/FUZZING.md) are not made here.
fn fresh(root: &Path, target: &str) -> std::io::Result<PathBuf> {
    let dir = root.join(target);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn write(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    std::fs::write(dir.join(name), data)
}

fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(v).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    s.split(' ').map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
}

fn worker_settings() -> WorkerSettings {
    WorkerSettings {
        backend: Backend {
            name: "primary".into(),
            host: "127.0.0.1".into(),
            port: 3306,
            user: "app".into(),
            password: "pw".into(),
            database: Some("app".into()),
        },
        max_requests: 10_000,
        max_age_ms: 3_600_000,
        batch_rows: 256,
        batch_bytes: 65_536,
        connect_timeout_ms: 2_000,
        backend_tls: Some(BackendTls {
            mode: SslMode::VerifyIdentity,
            ca_file: Some("/etc/osprey/ca.pem".into()),
            server_name: None,
        }),
        session_reset: SessionReset::Always,
    }
}

fn sample_column() -> Column {
    Column {
        name: "? + 1".into(),
        table: String::new(),
        column_type: 8,
        flags: 128 | 32768,
        charset: 63,
        length: 21,
        decimals: 0,
    }
}

fn sample_values() -> Vec<Value> {
    vec![
        Value::Null,
        Value::Int(42),
        Value::Int(-1),
        Value::Int(i64::MIN),
        Value::UInt(u64::MAX),
        Value::Float(1.5),
        Value::Double(f64::NAN),
        Value::Decimal("-12.340".into()),
        Value::Bytes(vec![0, 1, 0xff]),
        Value::Text("héllo".into()),
        Value::date(2024, 2, 29, 13, 5, 9, 0),
        Value::time(true, 34, 22, 59, 59, 0),
        Value::Bit(vec![0x80]),
        Value::Json("{\"a\":[1,2]}".into()),
    ]
}

fn sample_requests() -> Vec<(&'static str, Request)> {
    let batch = vec![
        Statement {
            sql: "INSERT INTO t VALUES (?)".into(),
            params: vec![Value::Int(1)],
        },
        Statement {
            sql: "UPDATE t SET a = a + 1".into(),
            params: vec![],
        },
    ];
    vec![
        (
            "single-with-params",
            Request {
                params: vec![Value::Int(41), Value::Text("x".into()), Value::Null],
                timeout_ms: 500,
                ..Request::sql("SELECT ? + 1, ?, ?")
            },
        ),
        ("multi-statement", Request::sql("SELECT 1; SELECT 2; SET @a = 1")),
        (
            "batch",
            Request {
                batch: batch.clone(),
                idempotent: true,
                ..Default::default()
            },
        ),
        (
            "both",
            Request {
                batch: batch.clone(),
                ..Request::sql("SELECT 1")
            },
        ),
        ("neither", Request::default()),
        ("blank", Request::sql(" \t\n")),
        (
            "batch-with-top-params",
            Request {
                batch,
                params: vec![Value::Int(1)],
                ..Default::default()
            },
        ),
        (
            "batch-blank-statement",
            Request {
                batch: vec![Statement {
                    sql: "  ".into(),
                    params: vec![],
                }],
                ..Default::default()
            },
        ),
        ("control", Request::sql("/*!40000 LOCK TABLES t WRITE */")),
        (
            "open-session",
            Request {
                open_session: true,
                read_only: true,
                timeout_ms: 2000,
                ..Default::default()
            },
        ),
        (
            "in-session",
            Request {
                session: Some(3),
                ..Request::sql("BEGIN")
            },
        ),
        (
            "open-session-with-sql",
            Request {
                open_session: true,
                ..Request::sql("SELECT 1")
            },
        ),
        (
            "read-only-select",
            Request {
                read_only: true,
                force_primary: true,
                ..Request::sql("SELECT * FROM t WHERE a = '?' -- ?")
            },
        ),
    ]
}

fn sample_frames() -> Vec<(String, Frame)> {
    let mut v = vec![
        (
            "hello",
            Frame::new(
                Kind::Hello,
                0,
                &Hello {
                    version_major: 1,
                    version_minor: 1,
                    role: Role::Client,
                    token: Some("s3cret".into()),
                    secret: None,
                    slot: None,
                    pid: Some(4242),
                    name: Some("app".into()),
                    stream_window: Some(16),
                },
            ),
        ),
        (
            "hello-ack-worker",
            Frame::new(
                Kind::HelloAck,
                0,
                &HelloAck {
                    version_major: 1,
                    version_minor: 1,
                    server: "osprey 0.1.0".into(),
                    connection_id: 7,
                    max_payload: DEFAULT_MAX_PAYLOAD as u32,
                    max_streams: 1,
                    keepalive_interval_ms: 10_000,
                    worker: Some(worker_settings()),
                    stream_window: 0,
                },
            ),
        ),
        ("ping", Frame::new(Kind::Ping, 0, &Ping { nonce: 1 })),
        ("pong", Frame::new(Kind::Pong, 0, &Ping { nonce: u64::MAX })),
        (
            "goaway",
            Frame::new(
                Kind::GoAway,
                0,
                &GoAway {
                    code: ErrorCode::ShuttingDown,
                    message: "draining".into(),
                },
            ),
        ),
        (
            "quit-request",
            Frame::new(
                Kind::QuitRequest,
                0,
                &QuitRequest {
                    reason: "max_requests".into(),
                    requests_served: 10_000,
                    age_ms: 12_345,
                },
            ),
        ),
        ("quit-now", Frame::new(Kind::QuitNow, 0, &QuitNow {})),
        ("cancel", Frame::new(Kind::Cancel, 3, &Cancel { reason: "user".into() })),
        (
            "ready",
            Frame::new(
                Kind::Ready,
                0,
                &Ready {
                    db_connection_id: 99,
                    server_version: "10.11.19-MariaDB".into(),
                },
            ),
        ),
        ("window", Frame::new(Kind::Window, 1, &Window { increment: 8 })),
        ("reset", Frame::new(Kind::Reset, 1, &Reset {})),
        (
            "session",
            Frame::new(
                Kind::Session,
                3,
                &SessionOpened {
                    member: "primary".into(),
                    slot: 2,
                    read_only: false,
                },
            ),
        ),
        (
            "columns",
            Frame::new(
                Kind::Columns,
                1,
                &Columns {
                    result_set: 0,
                    columns: vec![sample_column()],
                },
            ),
        ),
        (
            "rows",
            Frame::new(
                Kind::Rows,
                1,
                &Rows {
                    rows: vec![sample_values(), vec![Value::Int(42)]],
                },
            ),
        ),
        (
            "raw-rows",
            Frame::with_payload(
                Kind::RawRows,
                1,
                osprey_protocol::raw_rows::encode(&[&[0x02, b'4', b'2', 0xFB][..], &[0x00, 0x04, 0x2A][..]]).into(),
            ),
        ),
        (
            "end",
            Frame::new(
                Kind::End,
                1,
                &End {
                    affected_rows: 3,
                    last_insert_id: Some(17),
                    warnings: 1,
                    rows: 2,
                    server_time_us: 180,
                    queue_time_us: 25,
                    gtid: None,
                    in_transaction: true,
                    info: Some("Rows matched: 3  Changed: 3  Warnings: 1".into()),
                    autocommit: Some(false),
                },
            ),
        ),
        (
            "error-stream",
            Frame::new(
                Kind::Error,
                1,
                &ErrorBody {
                    origin: Origin::Database,
                    code: ErrorCode::Database,
                    errno: Some(1064),
                    sqlstate: Some("42000".into()),
                    message: "You have an error in your SQL syntax".into(),
                    dispatched: true,
                    retryable: false,
                    transaction: Some(TransactionOutcome::RolledBack),
                },
            ),
        ),
        (
            "error-conn",
            Frame::new(
                Kind::Error,
                0,
                &ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::BadFrame, "reserved bytes"),
            ),
        ),
    ]
    .into_iter()
    .map(|(n, f)| (n.to_string(), f))
    .collect::<Vec<_>>();
    for (name, r) in sample_requests() {
        v.push((format!("request-{name}"), Frame::new(Kind::Request, 5, &r)));
    }
    v
}

/// The statements of `sql/src/lib.rs`'s tests, and a few more shapes.
const SQL: &[&str] = &[
    "BEGIN",
    "begin;",
    "START TRANSACTION READ ONLY",
    "LOCK TABLES t WRITE",
    "unlock tables",
    "set autocommit=0",
    "SET @@session.autocommit=0",
    "SET LOCAL autocommit = 0",
    "set @@local.AUTOCOMMIT=0",
    "XA START 'x'",
    "COMMIT",
    "rollback",
    "SELECT 1; SET autocommit=0",
    "SELECT 1; LOCK TABLES t WRITE",
    "/*!40000 LOCK TABLES t WRITE */",
    "/* why */ LOCK TABLES t WRITE",
    "/*!40000 SET autocommit=0 */",
    "SELECT 1",
    "set @a = 1",
    "INSERT INTO begin_t VALUES (1)",
    "startx transaction",
    "ROLLBACK TO SAVEPOINT a",
    "ROLLBACK WORK TO SAVEPOINT a",
    "SELECT 'x'",
    "BEGIN NOT ATOMIC SELECT 1; END",
    "INSERT INTO notes VALUES ('fixed; commit later')",
    "INSERT INTO notes VALUES (\"a; begin the test\")",
    "SELECT 1 -- a; commit b",
    "SELECT 1 /* ; rollback */",
    "CREATE PROCEDURE p() BEGIN START TRANSACTION; UPDATE t SET a = 1; COMMIT; END",
    "SELECT * FROM commit_log WHERE lock_id = 1",
    "SET @x = 1",
    "set names utf8mb4",
    "SET SESSION sql_mode = ''",
    "set time_zone = '+05:00'",
    "SELECT @x := 5",
    "SELECT 1 INTO @v",
    "USE mysql",
    "CREATE TEMPORARY TABLE t (a INT)",
    "create or replace temporary table t (a INT)",
    "DROP TEMPORARY TABLE t",
    "SELECT GET_LOCK('l', 0)",
    "PREPARE s FROM 'SELECT 1'",
    "EXECUTE s",
    "CALL p()",
    "  /* hint */ SET @a = 2",
    "SET STATEMENT max_statement_time=1 FOR SELECT 1",
    "HANDLER t OPEN",
    "/*!40101 SET time_zone='+05:00' */",
    "/*!40014 SET FOREIGN_KEY_CHECKS=0 */;",
    "/*M!100100 SET sql_mode = '' */",
    "IF 1 THEN SET time_zone='+05:00'; END IF",
    "FLUSH TABLES WITH READ LOCK",
    "BACKUP STAGE START",
    "SELECT 2--1;SET time_zone='+05:00'",
    "SELECT 'a@b.example'",
    "SELECT `odd@name` FROM t",
    "SELECT @@version, @@session.time_zone",
    "SELECT 1 # USE mysql",
    "SELECT 1 /*/ ; SET @x = 1 */",
    "SELECT 'it''s; set @x = 1'",
    "SELECT 'a\\'; set @x = 1'",
    "UPDATE t SET a = 1 WHERE id = ?",
    "SELECT ?, ? FROM t WHERE a = ?",
    "SELECT '?', \"?\", `?` -- ?\n /* ? */ # ?",
    "SELECT /*! ? */ 1",
    "  select\n* from t;",
    "séléct 'ü' -- ü\n, `ö`",
    "SELECT 'unterminated",
    "SELECT /* unterminated",
    "SELECT '\\",
];

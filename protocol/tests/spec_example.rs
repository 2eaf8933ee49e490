//! The worked example in docs/PROTOCOL.md: the hex there must be exactly what this
//! crate produces. If a body type changes, run
//! `cargo test -p osprey-protocol --test spec_example -- --nocapture`
//! and paste the printed blocks into the doc.

use osprey_protocol::*;

/// The example exchange: a client's HELLO/HELLO_ACK, then `SELECT ? + 1` with 41 on stream 1.
fn example() -> Vec<(&'static str, Frame)> {
    vec![
        (
            "HELLO",
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
                    pid: None,
                    name: None,
                    stream_window: Some(16),
                },
            ),
        ),
        (
            "HELLO_ACK",
            Frame::new(
                Kind::HelloAck,
                0,
                &HelloAck {
                    version_major: 1,
                    version_minor: 1,
                    server: "osprey 0.1.0".into(),
                    connection_id: 7,
                    max_payload: DEFAULT_MAX_PAYLOAD as u32,
                    max_streams: 256,
                    keepalive_interval_ms: 10_000,
                    worker: None,
                    stream_window: 16,
                },
            ),
        ),
        (
            "REQUEST",
            Frame::new(
                Kind::Request,
                1,
                &Request {
                    params: vec![Value::Int(41)],
                    ..Request::sql("SELECT ? + 1")
                },
            ),
        ),
        (
            "COLUMNS",
            Frame::new(
                Kind::Columns,
                1,
                &Columns {
                    result_set: 0,
                    // Copied from what MariaDB 10.11.19 sent for this prepared statement with
                    // Int(41) (a live run through the worker): LONGLONG, BINARY, binary charset,
                    // length 22. Other servers and versions may describe it differently.
                    columns: vec![Column {
                        name: "? + 1".into(),
                        table: String::new(),
                        column_type: 8,
                        flags: 128,
                        charset: 63,
                        length: 22,
                        decimals: 0,
                    }],
                },
            ),
        ),
        (
            "ROWS",
            Frame::new(
                Kind::Rows,
                1,
                &Rows {
                    rows: vec![vec![Value::Int(42)]],
                },
            ),
        ),
        ("WINDOW", Frame::new(Kind::Window, 1, &Window { increment: 8 })),
        (
            "END",
            Frame::new(
                Kind::End,
                1,
                &End {
                    affected_rows: 0,
                    last_insert_id: None,
                    warnings: 0,
                    rows: 1,
                    server_time_us: 180,
                    queue_time_us: 25,
                    gtid: None,
                    in_transaction: false,
                    info: None,
                    autocommit: None,
                },
            ),
        ),
    ]
}

/// The block as it appears in the doc: header on one line, payload 16 bytes a line.
fn block(frame: &Frame) -> String {
    let wire = frame.to_bytes();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ");
    let mut s = format!("header  {}\n", hex(&wire[..HEADER_LEN]));
    for (i, chunk) in wire[HEADER_LEN..].chunks(16).enumerate() {
        s.push_str(if i == 0 { "payload " } else { "        " });
        s.push_str(&hex(chunk));
        s.push('\n');
    }
    s
}

/// Asserts that docs/PROTOCOL.md holds the exact hex of every frame (and prints the
/// blocks, to paste after a body type changed).
fn assert_in_protocol_md(frames: Vec<(&'static str, Frame)>) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md")).unwrap();
    let mut missing = Vec::new();
    for (name, frame) in frames {
        let b = block(&frame);
        println!("{name} ({} bytes)\n```text\n{b}```\n", frame.to_bytes().len());
        if !doc.contains(&b) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/PROTOCOL.md does not contain the exact hex of {missing:?}"
    );
}

#[test]
fn worked_example_matches_protocol_md() {
    assert_in_protocol_md(example());
}

#[test]
fn worked_example_decodes() {
    let frames = example();
    let req: Request = frames[2].1.body().unwrap();
    assert_eq!(req.params, vec![Value::Int(41)]);
    let rows: Rows = frames[4].1.body().unwrap();
    assert_eq!(rows.rows, vec![vec![Value::Int(42)]]);
}

/// The "minimal equivalent body" of the REQUEST given in the doc decodes to the same request.
#[test]
fn minimal_request_body_from_the_doc() {
    let hex = "82 a3 73 71 6c ac 53 45 4c 45 43 54 20 3f 20 2b 20 31 a6 70 61 72 61 6d 73 91 29";
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md")).unwrap();
    assert!(doc.contains(hex));
    let bytes: Vec<u8> = hex.split(' ').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
    let frame = Frame {
        kind: Kind::Request,
        flags: 0,
        stream: 1,
        payload: bytes.into(),
    };
    let full: Request = example()[2].1.body().unwrap();
    assert_eq!(frame.body::<Request>().unwrap(), full);
}

/// The session example (protocol 1.5) in docs/PROTOCOL.md, section 9a: open a session on
/// stream 3, `BEGIN` in it on stream 5, close it.
fn session_example() -> Vec<(&'static str, Frame)> {
    vec![
        (
            "REQUEST open_session",
            Frame::new(
                Kind::Request,
                3,
                &Request {
                    open_session: true,
                    ..Default::default()
                },
            ),
        ),
        (
            "SESSION",
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
            "REQUEST in session",
            Frame::new(
                Kind::Request,
                5,
                &Request {
                    session: Some(3),
                    ..Request::sql("BEGIN")
                },
            ),
        ),
        (
            "END in_transaction",
            Frame::new(
                Kind::End,
                5,
                &End {
                    server_time_us: 95,
                    queue_time_us: 12,
                    in_transaction: true,
                    ..Default::default()
                },
            ),
        ),
        (
            "CANCEL (close)",
            Frame::new(Kind::Cancel, 3, &Cancel { reason: "close".into() }),
        ),
        ("END (closed)", Frame::new(Kind::End, 3, &End::default())),
    ]
}

#[test]
fn session_example_matches_protocol_md() {
    assert_in_protocol_md(session_example());
    let frames = session_example();
    let open: Request = frames[0].1.body().unwrap();
    assert!(open.open_session && open.validate().is_ok());
    let stmt: Request = frames[2].1.body().unwrap();
    assert_eq!(stmt.session, Some(3));
    let end: End = frames[3].1.body().unwrap();
    assert!(end.in_transaction);
}

/// The `RAW_ROWS` example (protocol 1.8) in docs/PROTOCOL.md: `SELECT 42, NULL` asked with
/// `raw_rows`, its one text-protocol row as the server sent it.
fn raw_rows_example() -> Vec<(&'static str, Frame)> {
    let row: &[u8] = &[0x02, b'4', b'2', 0xFB];
    vec![
        (
            "REQUEST raw_rows",
            Frame::new(
                Kind::Request,
                1,
                &Request {
                    raw_rows: true,
                    ..Request::sql("SELECT 42, NULL")
                },
            ),
        ),
        (
            "RAW_ROWS",
            Frame::with_payload(Kind::RawRows, 1, raw_rows::encode(&[row]).into()),
        ),
    ]
}

#[test]
fn raw_rows_example_matches_protocol_md() {
    assert_in_protocol_md(raw_rows_example());
    let frames = raw_rows_example();
    let req: Request = frames[0].1.body().unwrap();
    assert!(req.raw_rows && req.validate().is_ok());
    assert_eq!(
        raw_rows::decode(&frames[1].1.payload).unwrap(),
        vec![&[0x02, b'4', b'2', 0xFB][..]]
    );
}

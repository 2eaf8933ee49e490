//! Every frame kind and body type survives encode → codec → decode, over arbitrary values.

mod common;

use common::*;
use osprey_protocol::*;
use proptest::prelude::*;
use serde::Serialize;

fn opt_string() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(any::<String>())
}

fn arb_hello() -> impl Strategy<Value = Hello> {
    (
        any::<u16>(),
        any::<u16>(),
        prop_oneof![Just(Role::Client), Just(Role::Worker)],
        opt_string(),
        opt_string(),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u32>()),
        opt_string(),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(
            |(version_major, version_minor, role, token, secret, slot, pid, name, stream_window)| Hello {
                version_major,
                version_minor,
                role,
                token,
                secret,
                slot,
                pid,
                name,
                stream_window,
            },
        )
}

fn arb_backend() -> impl Strategy<Value = Backend> {
    (
        any::<String>(),
        any::<String>(),
        any::<u16>(),
        any::<String>(),
        any::<String>(),
        opt_string(),
    )
        .prop_map(|(name, host, port, user, password, database)| Backend {
            name,
            host,
            port,
            user,
            password,
            database,
        })
}

fn arb_worker_settings() -> impl Strategy<Value = WorkerSettings> {
    (
        arb_backend(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        prop_oneof![Just(SessionReset::Auto), Just(SessionReset::Always)],
        proptest::option::of((
            prop_oneof![
                Just(SslMode::Disabled),
                Just(SslMode::Preferred),
                Just(SslMode::Required),
                Just(SslMode::VerifyCa),
                Just(SslMode::VerifyIdentity)
            ],
            proptest::option::of(".{0,20}"),
            proptest::option::of("[a-z.]{0,20}"),
        )),
    )
        .prop_map(
            |(backend, max_requests, max_age_ms, batch_rows, batch_bytes, connect_timeout_ms, session_reset, tls)| {
                WorkerSettings {
                    backend,
                    max_requests,
                    max_age_ms,
                    batch_rows,
                    batch_bytes,
                    connect_timeout_ms,
                    session_reset,
                    backend_tls: tls.map(|(mode, ca_file, server_name)| BackendTls {
                        mode,
                        ca_file,
                        server_name,
                    }),
                }
            },
        )
}

fn arb_hello_ack() -> impl Strategy<Value = HelloAck> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<String>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        proptest::option::of(arb_worker_settings()),
        any::<u32>(),
    )
        .prop_map(
            |(
                version_major,
                version_minor,
                server,
                connection_id,
                max_payload,
                max_streams,
                keepalive_interval_ms,
                worker,
                stream_window,
            )| {
                HelloAck {
                    version_major,
                    version_minor,
                    server,
                    connection_id,
                    max_payload,
                    max_streams,
                    keepalive_interval_ms,
                    worker,
                    stream_window,
                }
            },
        )
}

fn arb_statement() -> impl Strategy<Value = Statement> {
    (any::<String>(), prop::collection::vec(arb_value(), 0..5)).prop_map(|(sql, params)| Statement { sql, params })
}

fn arb_request() -> impl Strategy<Value = Request> {
    (
        any::<String>(),
        prop::collection::vec(arb_value(), 0..8),
        prop::collection::vec(arb_statement(), 0..4),
        any::<(bool, bool, bool)>(),
        any::<u64>(),
        prop::option::of(any::<String>()),
        prop::option::of(any::<String>()),
        (any::<bool>(), prop::option::of(any::<u32>())),
        (
            any::<bool>(),
            prop::option::of(any::<String>()),
            prop::collection::vec(any::<(String, String)>(), 0..3),
            any::<(bool, bool, bool, bool)>(),
        ),
    )
        .prop_map(
            |(
                sql,
                params,
                batch,
                (read_only, idempotent, force_primary),
                timeout_ms,
                cluster,
                causal_gtid,
                (open_session, session),
                (text_rows, schema, vars, (prepared, prepare_only, multi_results, raw_rows)),
            )| Request {
                sql,
                params,
                batch,
                read_only,
                idempotent,
                force_primary,
                timeout_ms,
                cluster,
                causal_gtid,
                open_session,
                session,
                text_rows,
                prepared,
                prepare_only,
                multi_results,
                raw_rows,
                blob_params: Vec::new(),
                schema,
                vars,
                // Not on the wire: a decoded request always has None.
                read_your_writes: None,
            },
        )
}

fn arb_column() -> impl Strategy<Value = Column> {
    (
        any::<String>(),
        any::<String>(),
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        any::<u8>(),
    )
        .prop_map(|(name, table, column_type, flags, charset, length, decimals)| Column {
            name,
            table,
            column_type,
            flags,
            charset,
            length,
            decimals,
        })
}

fn arb_end() -> impl Strategy<Value = End> {
    (
        any::<u64>(),
        proptest::option::of(any::<u64>()),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        (
            opt_string(),
            any::<bool>(),
            opt_string(),
            proptest::option::of(any::<bool>()),
        ),
    )
        .prop_map(
            |(
                affected_rows,
                last_insert_id,
                warnings,
                rows,
                server_time_us,
                queue_time_us,
                (gtid, in_transaction, info, autocommit),
            )| {
                End {
                    affected_rows,
                    last_insert_id,
                    warnings,
                    rows,
                    server_time_us,
                    queue_time_us,
                    gtid,
                    in_transaction,
                    info,
                    autocommit,
                }
            },
        )
}

fn arb_error_body() -> impl Strategy<Value = ErrorBody> {
    (
        arb_origin(),
        arb_error_code(),
        proptest::option::of(any::<u16>()),
        opt_string(),
        any::<String>(),
        any::<bool>(),
        (
            any::<bool>(),
            prop::option::of(prop_oneof![
                Just(TransactionOutcome::RolledBack),
                Just(TransactionOutcome::Unknown)
            ]),
        ),
    )
        .prop_map(
            |(origin, code, errno, sqlstate, message, dispatched, (retryable, transaction))| ErrorBody {
                origin,
                code,
                errno,
                sqlstate,
                message,
                dispatched,
                retryable,
                transaction,
            },
        )
}

proptest! {
    #[test]
    fn value_roundtrip(v in arb_value()) {
        let bytes = rmp_serde::to_vec_named(&v).unwrap();
        let back: Value = rmp_serde::from_slice(&bytes).unwrap();
        prop_assert!(same_value(&v, &back), "{v:?} came back as {back:?}");
    }

    #[test]
    fn hello(b in arb_hello()) {
        prop_assert_eq!(roundtrip(Kind::Hello, 0, &b), b);
    }

    #[test]
    fn hello_ack(b in arb_hello_ack()) {
        prop_assert_eq!(roundtrip(Kind::HelloAck, 0, &b), b);
    }

    #[test]
    fn ping_pong(nonce in any::<u64>()) {
        let b = Ping { nonce };
        prop_assert_eq!(roundtrip(Kind::Ping, 0, &b), b);
        prop_assert_eq!(roundtrip(Kind::Pong, 0, &b), b);
    }

    #[test]
    fn goaway(code in arb_error_code(), message in any::<String>()) {
        let b = GoAway { code, message };
        prop_assert_eq!(roundtrip(Kind::GoAway, 0, &b), b);
    }

    #[test]
    fn quit_request(reason in any::<String>(), requests_served in any::<u64>(), age_ms in any::<u64>()) {
        let b = QuitRequest { reason, requests_served, age_ms };
        prop_assert_eq!(roundtrip(Kind::QuitRequest, 0, &b), b);
    }

    #[test]
    fn session_opened(member in any::<String>(), slot in any::<u32>(), read_only in any::<bool>()) {
        let b = SessionOpened { member, slot, read_only };
        prop_assert_eq!(roundtrip(Kind::Session, 1, &b), b);
    }

    #[test]
    fn result_end(
        affected_rows in any::<u64>(),
        last_insert_id in proptest::option::of(any::<u64>()),
        warnings in any::<u32>(),
        info in proptest::option::of(any::<String>()),
        in_transaction in any::<bool>(),
        autocommit in proptest::option::of(any::<bool>()),
    ) {
        let b = ResultEnd { affected_rows, last_insert_id, warnings, info, in_transaction, autocommit };
        prop_assert_eq!(roundtrip(Kind::ResultEnd, 1, &b), b);
    }

    #[test]
    fn ready(db_connection_id in any::<u32>(), server_version in any::<String>()) {
        let b = Ready { db_connection_id, server_version };
        prop_assert_eq!(roundtrip(Kind::Ready, 0, &b), b);
    }

    #[test]
    fn cancel(stream in arb_data_stream(), reason in any::<String>()) {
        let b = Cancel { reason };
        prop_assert_eq!(roundtrip(Kind::Cancel, stream, &b), b);
    }

    #[test]
    fn request(stream in arb_data_stream(), b in arb_request()) {
        let back = roundtrip(Kind::Request, stream, &b);
        prop_assert!(same_request(&b, &back), "{b:?} came back as {back:?}");
    }

    #[test]
    fn columns(stream in arb_data_stream(), result_set in any::<u32>(), columns in prop::collection::vec(arb_column(), 0..6)) {
        let b = Columns { result_set, columns };
        prop_assert_eq!(roundtrip(Kind::Columns, stream, &b), b);
    }

    #[test]
    fn rows(stream in arb_data_stream(), rows in prop::collection::vec(prop::collection::vec(arb_value(), 0..6), 0..6)) {
        let b = Rows { rows };
        let back = roundtrip(Kind::Rows, stream, &b);
        prop_assert!(same_rows(&b, &back), "{b:?} came back as {back:?}");
    }

    #[test]
    fn end(stream in arb_data_stream(), b in arb_end()) {
        prop_assert_eq!(roundtrip(Kind::End, stream, &b), b);
    }

    /// `End::encode` (by hand, the hot path) gives serde's bytes exactly, integers of every
    /// width included (each shifted right by an arbitrary amount).
    #[test]
    fn end_encoded_by_hand_is_serdes(b in arb_end(), shifts in proptest::array::uniform6(0u32..64)) {
        let b = shifted(b, shifts);
        prop_assert_eq!(b.encode(), rmp_serde::to_vec_named(&b).unwrap());
        let frame = b.to_frame(7);
        prop_assert_eq!((frame.kind, frame.stream), (Kind::End, 7));
        prop_assert_eq!(frame.body::<End>().unwrap(), b);
    }

    /// `Rows::encode` (by hand, the worker's hot path) gives serde's bytes exactly, values
    /// of every kind and integers of every width included.
    #[test]
    fn rows_encoded_by_hand_are_serdes(
        stream in arb_data_stream(),
        rows in prop::collection::vec(prop::collection::vec(arb_value_any_width(), 0..20), 0..20),
    ) {
        prop_assert_eq!(Rows::encode(&rows), rmp_serde::to_vec_named(&Rows { rows: rows.clone() }).unwrap());
        let frame = Rows::to_frame(&rows, stream);
        prop_assert_eq!((frame.kind, frame.stream), (Kind::Rows, stream));
        let back: Rows = frame.body().unwrap();
        let sent = Rows { rows };
        prop_assert!(same_rows(&sent, &back), "{sent:?} came back as {back:?}");
    }

    /// `Request::encode` (by hand, the SDK's and the MySQL front end's hot path) gives
    /// serde's bytes exactly, every optional field present or absent.
    #[test]
    fn request_encoded_by_hand_is_serdes(
        stream in arb_data_stream(),
        b in arb_request(),
        params in prop::collection::vec(arb_value_any_width(), 0..20),
        blob_params in prop::collection::vec(any::<u16>(), 0..20),
        read_your_writes in prop::option::of(any::<bool>()),
    ) {
        let b = Request { params, blob_params, read_your_writes, ..b };
        prop_assert_eq!(b.encode(), rmp_serde::to_vec_named(&b).unwrap());
        let frame = b.to_frame(stream);
        prop_assert_eq!((frame.kind, frame.stream), (Kind::Request, stream));
        let back: Request = frame.body().unwrap();
        let sent = Request { read_your_writes: None, ..b };
        prop_assert!(same_request(&sent, &back), "{sent:?} came back as {back:?}");
    }

    /// `End::decode_common` (by hand, the dispatcher's hot path) reads what `End::encode`
    /// writes, integers of every width included, without falling back to serde.
    #[test]
    fn end_decoded_by_hand_is_serdes(b in arb_end(), shifts in proptest::array::uniform6(0u32..64)) {
        let b = shifted(b, shifts);
        prop_assert_eq!(End::decode_common(&b.encode()), Some(b.clone()));
        prop_assert_eq!(End::from_frame(&b.to_frame(3)).unwrap(), b);
    }

    /// A worker's END as a map, then changed entry by entry: entries dropped, repeated,
    /// reordered, given values of every MessagePack type that could stand there (and some
    /// that could not), another field added, the map's count off by one. The fast path
    /// takes what serde takes, and refuses what serde would read differently (a duplicate,
    /// a missing required field, a negative or too wide integer, bad UTF-8…).
    #[test]
    fn end_decoded_by_hand_agrees_on_any_map(
        b in arb_end(),
        edits in prop::collection::vec((0u8..6, any::<prop::sample::Index>(), 0usize..ODD_VALUES), 0..4),
        count_off in prop::sample::select(vec![0i32, 0, 0, -1, 1]),
    ) {
        let mut entries = map_entries(&b.encode());
        edit_entries(&mut entries, &edits);
        let payload = map_payload(&entries, entries.len() as i32 + count_off);
        end_agrees(&payload);
    }

    /// `Request::decode_common` (by hand: the dispatcher's and the worker's hot path) reads a
    /// request in its common form (no batch, vars, blob_params or tagged values) without
    /// falling back to serde, and reads it as serde does.
    #[test]
    fn request_decoded_by_hand_is_serdes(b in arb_request()) {
        let mut b = b;
        b.batch.clear();
        b.vars.clear();
        b.blob_params.clear();
        b.params.retain(|v| matches!(
            v,
            Value::Null | Value::Int(_) | Value::Float(_) | Value::Double(_) | Value::Bytes(_) | Value::Text(_)
        ));
        let frame = Frame::new(Kind::Request, 1, &b);
        let fast = Request::decode_common(&frame.payload);
        prop_assert!(fast.is_some(), "{:02x?}", &frame.payload[..]);
        prop_assert_eq!(named(&fast.unwrap()), named(&frame.body::<Request>().unwrap()));
    }

    /// Any request (batches, tagged values… included): the fast path reads it as serde
    /// does, or leaves it to serde.
    #[test]
    fn request_decoded_by_hand_agrees_on_any_request(b in arb_request()) {
        request_agrees(&Frame::new(Kind::Request, 1, &b).payload);
    }

    /// A request as a map, then changed entry by entry as END's above (entries dropped,
    /// repeated, reordered, given odd values, another field added, the count off by one),
    /// and its params array given odd values.
    #[test]
    fn request_decoded_by_hand_agrees_on_any_map(
        b in arb_request(),
        edits in prop::collection::vec((0u8..6, any::<prop::sample::Index>(), 0usize..ODD_VALUES), 0..4),
        count_off in prop::sample::select(vec![0i32, 0, 0, -1, 1]),
    ) {
        let mut b = b;
        b.batch.clear();
        let mut entries = map_entries(&rmp_serde::to_vec_named(&b).unwrap());
        edit_entries(&mut entries, &edits);
        let payload = map_payload(&entries, entries.len() as i32 + count_off);
        request_agrees(&payload);
    }

    /// Whatever the bytes, the fast path says what serde says or leaves it to serde: a
    /// worker's END mangled at one place (a byte replaced, the body cut short, a byte
    /// inserted) and arbitrary bytes.
    #[test]
    fn end_decoded_by_hand_never_disagrees_with_serde(
        b in arb_end(),
        mangle in (any::<prop::sample::Index>(), any::<u8>(), 0u8..3),
        noise in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        end_agrees(&mangled(b.encode(), mangle));
        end_agrees(&noise);
    }

    /// The same for a client's REQUEST mangled at one place (inside a value, a count, a
    /// field name…).
    #[test]
    fn request_decoded_by_hand_never_disagrees_with_serde(
        b in arb_request(),
        mangle in (any::<prop::sample::Index>(), any::<u8>(), 0u8..3),
    ) {
        request_agrees(&mangled(rmp_serde::to_vec_named(&b).unwrap(), mangle));
    }

    /// `Columns::decode_common` (by hand: the SDK's and the MySQL front end's hot path)
    /// reads what a worker writes, integers of every width included, without falling back
    /// to serde.
    #[test]
    fn columns_decoded_by_hand_are_serdes(
        result_set in any::<u32>(),
        columns in prop::collection::vec((arb_column(), proptest::array::uniform4(0u32..32)), 0..20),
        shift in 0u32..32,
    ) {
        let columns = columns
            .into_iter()
            .map(|(c, s)| Column {
                flags: c.flags >> (s[0] % 16),
                charset: c.charset >> (s[1] % 16),
                length: c.length >> s[2],
                column_type: c.column_type >> (s[3] % 8),
                ..c
            })
            .collect();
        let b = Columns { result_set: result_set >> shift, columns };
        let frame = Frame::new(Kind::Columns, 3, &b);
        prop_assert_eq!(Columns::decode_common(&frame.payload), Some(b.clone()));
        prop_assert_eq!(Columns::from_frame(&frame).unwrap(), b);
    }

    /// COLUMNS as a map, and one of its columns as a map, changed entry by entry as END's
    /// above: the fast path takes what serde takes, and refuses what serde would read
    /// differently.
    #[test]
    fn columns_decoded_by_hand_agree_on_any_map(
        b in arb_columns(),
        edits in prop::collection::vec((0u8..6, any::<prop::sample::Index>(), 0usize..ODD_VALUES), 0..4),
        column_edits in prop::collection::vec((0u8..6, any::<prop::sample::Index>(), 0usize..ODD_VALUES), 0..4),
        which in any::<prop::sample::Index>(),
        count_off in prop::sample::select(vec![0i32, 0, 0, -1, 1]),
        column_count_off in prop::sample::select(vec![0i32, 0, 0, -1, 1]),
    ) {
        let mut entries = map_entries(&rmp_serde::to_vec_named(&b).unwrap());
        if !b.columns.is_empty() {
            let i = which.index(b.columns.len());
            let mut column = map_entries(&rmp_serde::to_vec_named(&b.columns[i]).unwrap());
            edit_entries(&mut column, &column_edits);
            let mut list = [vec![0xDC], (b.columns.len() as u16).to_be_bytes().to_vec()].concat();
            for (j, c) in b.columns.iter().enumerate() {
                match j == i {
                    true => list.extend(map_payload(&column, column.len() as i32 + column_count_off)),
                    false => list.extend(rmp_serde::to_vec_named(c).unwrap()),
                }
            }
            let at = entries.iter().position(|(name, _)| name == "columns").unwrap();
            entries[at].1 = list;
        }
        edit_entries(&mut entries, &edits);
        columns_agree(&map_payload(&entries, entries.len() as i32 + count_off));
    }

    /// Whatever the bytes, the fast path says what serde says or leaves it to serde: a
    /// worker's COLUMNS mangled at one place, and arbitrary bytes.
    #[test]
    fn columns_decoded_by_hand_never_disagree_with_serde(
        b in arb_columns(),
        mangle in (any::<prop::sample::Index>(), any::<u8>(), 0u8..3),
        noise in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        columns_agree(&mangled(rmp_serde::to_vec_named(&b).unwrap(), mangle));
        columns_agree(&noise);
    }

    #[test]
    fn error_on_stream_and_on_stream_zero(stream in arb_data_stream(), b in arb_error_body()) {
        prop_assert_eq!(roundtrip(Kind::Error, stream, &b), b.clone());
        prop_assert_eq!(roundtrip(Kind::Error, 0, &b), b);
    }

    #[test]
    fn error_code_strings(code in arb_error_code()) {
        prop_assert_eq!(ErrorCode::parse(code.as_str()), code);
        // On the wire an ErrorCode is a plain MessagePack str.
        let bytes = rmp_serde::to_vec_named(&code).unwrap();
        let s: String = rmp_serde::from_slice(&bytes).unwrap();
        prop_assert_eq!(s.as_str(), code.as_str());
        prop_assert_eq!(rmp_serde::from_slice::<ErrorCode>(&bytes).unwrap(), code);
    }

    /// Unknown codes from newer peers decode as UNKNOWN instead of failing the body.
    #[test]
    fn unknown_error_code_strings(s in "[A-Z_]{1,24}") {
        let bytes = rmp_serde::to_vec_named(&s).unwrap();
        let code: ErrorCode = rmp_serde::from_slice(&bytes).unwrap();
        let expected = ErrorCode::ALL.iter().copied().find(|c| c.as_str() == s).unwrap_or(ErrorCode::Unknown);
        prop_assert_eq!(code, expected);
    }
}

#[test]
fn quit_now_is_an_empty_map() {
    let frame = Frame::new(Kind::QuitNow, 0, &QuitNow {});
    assert_eq!(&frame.payload[..], &[0x80]);
    assert_eq!(roundtrip(Kind::QuitNow, 0, &QuitNow {}), QuitNow {});
}

#[test]
fn every_error_code_string_is_distinct() {
    let mut seen = std::collections::HashSet::new();
    for code in ErrorCode::ALL {
        assert!(seen.insert(code.as_str()), "duplicate wire string {}", code.as_str());
        assert_eq!(code.as_str(), code.as_str().to_ascii_uppercase());
    }
}

#[test]
fn value_edge_cases() {
    let nan32 = f32::from_bits(0x7fc0_0001);
    let nan64 = f64::from_bits(0xfff8_0000_0000_0042);
    let values = vec![
        Value::Null,
        Value::Int(i64::MIN),
        Value::Int(i64::MAX),
        Value::Int(-1),
        Value::Int(0),
        Value::UInt(u64::MAX),
        Value::UInt(0),
        Value::Float(nan32),
        Value::Double(nan64),
        Value::Double(-0.0),
        Value::Decimal("-12.340".into()),
        Value::Bytes(vec![0, 0, 0]),
        Value::Bytes(vec![]),
        Value::Text(String::new()),
        Value::Text("nul\0inside".into()),
        Value::Date {
            year: 0,
            month: 0,
            day: 0,
            hour: 0,
            minute: 0,
            second: 0,
            micro: 0,
        },
        Value::Time {
            negative: true,
            days: 34,
            hours: 22,
            minutes: 59,
            seconds: 59,
            micros: 999_999,
        },
        Value::Bit(vec![0x01, 0x00]),
        Value::Json("{\"a\":[1,null]}".into()),
    ];
    let rows = Rows {
        rows: vec![values.clone()],
    };
    let back = roundtrip(Kind::Rows, 1, &rows);
    assert!(same_rows(&rows, &back), "{back:?}");
    assert!(matches!(back.rows[0][7], Value::Float(f) if f.to_bits() == nan32.to_bits()));
    assert!(matches!(back.rows[0][8], Value::Double(f) if f.to_bits() == nan64.to_bits()));
}

/// The exact MessagePack of each value form, as documented in the Value table.
#[test]
fn value_wire_forms() {
    let enc = |v: Value| rmp_serde::to_vec_named(&v).unwrap();
    assert_eq!(enc(Value::Null), [0xc0]);
    assert_eq!(enc(Value::Int(5)), [0x05]);
    assert_eq!(enc(Value::Int(-1)), [0xff]);
    assert_eq!(enc(Value::Int(300)), [0xcd, 0x01, 0x2c]);
    assert_eq!(
        enc(Value::UInt(u64::MAX)),
        [0x92, 0x02, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
    );
    assert_eq!(enc(Value::Float(1.5)), [0xca, 0x3f, 0xc0, 0x00, 0x00]);
    assert_eq!(enc(Value::Double(1.5)), [0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
    assert_eq!(enc(Value::Decimal("1.5".into())), [0x92, 0x05, 0xa3, b'1', b'.', b'5']);
    assert_eq!(enc(Value::Bytes(vec![0, 1])), [0xc4, 0x02, 0x00, 0x01]);
    assert_eq!(enc(Value::Text("hi".into())), [0xa2, b'h', b'i']);
    assert_eq!(
        enc(Value::Date {
            year: 2024,
            month: 2,
            day: 29,
            hour: 13,
            minute: 5,
            second: 9,
            micro: 0
        }),
        [0x98, 0x06, 0xcd, 0x07, 0xe8, 0x02, 0x1d, 0x0d, 0x05, 0x09, 0x00]
    );
    assert_eq!(
        enc(Value::Time {
            negative: true,
            days: 1,
            hours: 2,
            minutes: 3,
            seconds: 4,
            micros: 5
        }),
        [0x97, 0x07, 0xc3, 0x01, 0x02, 0x03, 0x04, 0x05]
    );
    assert_eq!(enc(Value::Bit(vec![0x80])), [0x92, 0x08, 0xc4, 0x01, 0x80]);
    assert_eq!(enc(Value::Json("1".into())), [0x92, 0x09, 0xa1, b'1']);
}

/// Other encoders may pick wider markers than needed; receivers accept them.
#[test]
fn value_accepts_non_minimal_encodings() {
    let dec = |b: &[u8]| rmp_serde::from_slice::<Value>(b).unwrap();
    assert_eq!(dec(&[0xd3, 0, 0, 0, 0, 0, 0, 0, 7]), Value::Int(7)); // int 64
    assert_eq!(dec(&[0xcf, 0, 0, 0, 0, 0, 0, 0, 7]), Value::Int(7)); // uint 64
    assert_eq!(dec(&[0xd0, 0xfe]), Value::Int(-2)); // int 8
    assert_eq!(dec(&[0x92, 0x02, 0x07]), Value::UInt(7)); // tagged uint, fixint
    assert_eq!(dec(&[0xd9, 0x01, b'x']), Value::Text("x".into())); // str 8
    assert_eq!(dec(&[0xdc, 0x00, 0x02, 0x09, 0xa1, b'1']), Value::Json("1".into())); // array 16
                                                                                     // An untagged integer above i64::MAX is an error: unsigned values use [2, uint].
    assert!(rmp_serde::from_slice::<Value>(&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err());
    // Unknown tags, missing and surplus elements are errors.
    assert!(rmp_serde::from_slice::<Value>(&[0x92, 0x03, 0x00]).is_err());
    assert!(rmp_serde::from_slice::<Value>(&[0x91, 0x02]).is_err());
    assert!(rmp_serde::from_slice::<Value>(&[0x93, 0x02, 0x01, 0x01]).is_err());
}

/// Encodes a struct that has only some of a body's fields, decodes it as the real body.
/// `Backend` with only its required fields.
#[derive(Serialize)]
struct BackendMin {
    name: &'static str,
    host: &'static str,
    port: u16,
    user: &'static str,
    password: &'static str,
}

fn decode_partial<P: Serialize, T: serde::de::DeserializeOwned>(kind: Kind, stream: u32, partial: &P) -> T {
    Frame::new(kind, stream, partial)
        .body::<T>()
        .expect("partial body decodes")
}

#[test]
fn optional_fields_may_be_absent() {
    #[derive(Serialize)]
    struct HelloMin {
        version_major: u16,
        version_minor: u16,
        role: &'static str,
    }
    let h: Hello = decode_partial(
        Kind::Hello,
        0,
        &HelloMin {
            version_major: 1,
            version_minor: 0,
            role: "client",
        },
    );
    assert_eq!(
        h,
        Hello {
            version_major: 1,
            version_minor: 0,
            role: Role::Client,
            token: None,
            secret: None,
            slot: None,
            pid: None,
            name: None,
            stream_window: None,
        }
    );

    #[derive(Serialize)]
    struct AckMin {
        version_major: u16,
        version_minor: u16,
        server: &'static str,
        connection_id: u64,
        max_payload: u32,
        max_streams: u32,
        keepalive_interval_ms: u64,
    }
    let a: HelloAck = decode_partial(
        Kind::HelloAck,
        0,
        &AckMin {
            version_major: 1,
            version_minor: 0,
            server: "osprey",
            connection_id: 7,
            max_payload: 1 << 24,
            max_streams: 100,
            keepalive_interval_ms: 10_000,
        },
    );
    assert_eq!(a.worker, None);

    #[derive(Serialize)]
    struct RequestMin {
        sql: &'static str,
    }
    let r: Request = decode_partial(Kind::Request, 1, &RequestMin { sql: "SELECT 1" });
    assert_eq!(r, Request::sql("SELECT 1"));

    #[derive(Serialize)]
    struct BatchOnly {
        batch: Vec<RequestMin>,
    }
    let r: Request = decode_partial(
        Kind::Request,
        1,
        &BatchOnly {
            batch: vec![RequestMin { sql: "DELETE FROM t" }],
        },
    );
    assert_eq!(r.sql, "");
    assert_eq!(
        r.batch,
        vec![Statement {
            sql: "DELETE FROM t".into(),
            params: vec![]
        }]
    );

    #[derive(Serialize)]
    struct Empty {}
    let c: Cancel = decode_partial(Kind::Cancel, 3, &Empty {});
    assert_eq!(c, Cancel::default());
    let q: QuitNow = decode_partial(Kind::QuitNow, 0, &Empty {});
    assert_eq!(q, QuitNow {});

    #[derive(Serialize)]
    struct EndMin {
        affected_rows: u64,
        warnings: u32,
        rows: u64,
        server_time_us: u64,
        queue_time_us: u64,
    }
    let e: End = decode_partial(
        Kind::End,
        1,
        &EndMin {
            affected_rows: 1,
            warnings: 0,
            rows: 0,
            server_time_us: 5,
            queue_time_us: 1,
        },
    );
    assert_eq!(e.last_insert_id, None);

    #[derive(Serialize)]
    struct ErrorMin {
        origin: &'static str,
        code: &'static str,
        message: &'static str,
        dispatched: bool,
        retryable: bool,
    }
    let e: ErrorBody = decode_partial(
        Kind::Error,
        1,
        &ErrorMin {
            origin: "dispatcher",
            code: "QUEUE_FULL",
            message: "full",
            dispatched: false,
            retryable: true,
        },
    );
    assert_eq!(
        e,
        ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::QueueFull, "full")
    );

    #[derive(Serialize)]
    struct ColumnMin {
        name: &'static str,
        column_type: u8,
        flags: u16,
        charset: u16,
        length: u32,
        decimals: u8,
    }
    let c: Column = decode_partial(
        Kind::Columns,
        1,
        &ColumnMin {
            name: "x",
            column_type: 3,
            flags: 0,
            charset: 63,
            length: 11,
            decimals: 0,
        },
    );
    assert_eq!(c.table, "");

    let b: Backend = decode_partial(
        Kind::HelloAck,
        0,
        &BackendMin {
            name: "primary",
            host: "127.0.0.1",
            port: 3306,
            user: "u",
            password: "p",
        },
    );
    assert_eq!(b.database, None);
}

/// nil is accepted wherever an optional field may be absent.
#[test]
fn optional_fields_may_be_nil() {
    let h = Hello {
        version_major: 1,
        version_minor: 0,
        role: Role::Worker,
        token: None,
        secret: Some("s".into()),
        slot: Some(3),
        pid: None,
        name: None,
        stream_window: None,
    };
    let frame = Frame::new(Kind::Hello, 0, &h);
    // "token" key followed by nil (0xc0).
    assert!(frame
        .payload
        .windows(7)
        .any(|w| w == [0xa5, b't', b'o', b'k', b'e', b'n', 0xc0]));
    assert_eq!(frame.body::<Hello>().unwrap(), h);
}

/// Receivers ignore fields they do not know (a newer minor version may add some).
#[test]
fn unknown_fields_are_ignored() {
    #[derive(Serialize)]
    struct PingPlus {
        nonce: u64,
        future_field: Vec<u32>,
        another: &'static str,
    }
    let p: Ping = decode_partial(
        Kind::Ping,
        0,
        &PingPlus {
            nonce: 9,
            future_field: vec![1, 2],
            another: "x",
        },
    );
    assert_eq!(p, Ping { nonce: 9 });
}

#[test]
fn session_reset_is_a_lowercase_string_and_defaults_to_auto() {
    #[derive(Serialize)]
    struct SettingsMin {
        backend: BackendMin,
        max_requests: u64,
        max_age_ms: u64,
        batch_rows: u32,
        batch_bytes: u32,
        connect_timeout_ms: u64,
    }
    let s: WorkerSettings = decode_partial(
        Kind::HelloAck,
        0,
        &SettingsMin {
            backend: BackendMin {
                name: "primary",
                host: "127.0.0.1",
                port: 3306,
                user: "app",
                password: "",
            },
            max_requests: 0,
            max_age_ms: 0,
            batch_rows: 1,
            batch_bytes: 1,
            connect_timeout_ms: 1,
        },
    );
    assert_eq!(s.session_reset, SessionReset::Auto);
    assert_eq!(
        s.backend_tls, None,
        "settings from a dispatcher without TLS decode as plain TCP"
    );
    for (v, wire) in [(SessionReset::Auto, "auto"), (SessionReset::Always, "always")] {
        let bytes = rmp_serde::to_vec_named(&v).unwrap();
        assert_eq!(rmp_serde::from_slice::<String>(&bytes).unwrap(), wire);
    }
}

/// Issue 9, item 6. Every body is a MessagePack map (section 4); `rmp_serde` also filled
/// a struct from an array, by position, so `[1, 1, "client", ...]` passed as a HELLO.
/// An array where a named-field body (or a nested one) belongs is `BAD_BODY`.
#[test]
fn bodies_sent_as_arrays_are_bad_bodies() {
    fn positional<T: Serialize + serde::de::DeserializeOwned + std::fmt::Debug>(kind: Kind, stream: u32, body: &T) {
        // `to_vec` (not `to_vec_named`) writes a struct as an array of its fields.
        let payload = rmp_serde::to_vec(body).unwrap();
        assert!(payload[0] & 0xf0 == 0x90 || payload[0] == 0xdc, "{payload:02x?}");
        let frame = Frame {
            kind,
            flags: 0,
            stream,
            payload: payload.into(),
        };
        match frame.body::<T>() {
            Err(e @ ProtocolError::BadBody { .. }) => assert_eq!(e.code(), ErrorCode::BadBody),
            other => panic!("{} as an array: {other:?}", kind.name()),
        }
        // The same body as a map is fine.
        Frame::new(kind, stream, body).body::<T>().unwrap();
    }
    let hello = Hello {
        version_major: 1,
        version_minor: 1,
        role: Role::Client,
        token: Some("t".into()),
        secret: None,
        slot: None,
        pid: None,
        name: None,
        stream_window: Some(8),
    };
    positional(Kind::Hello, 0, &hello);
    let ack = HelloAck {
        version_major: 1,
        version_minor: 1,
        server: "s".into(),
        connection_id: 1,
        max_payload: 1024,
        max_streams: 1,
        keepalive_interval_ms: 1,
        worker: None,
        stream_window: 0,
    };
    positional(Kind::HelloAck, 0, &ack);
    positional(Kind::Ping, 0, &Ping { nonce: 1 });
    positional(Kind::Pong, 0, &Ping { nonce: 1 });
    positional(
        Kind::GoAway,
        0,
        &GoAway {
            code: ErrorCode::ShuttingDown,
            message: "m".into(),
        },
    );
    positional(Kind::QuitNow, 0, &QuitNow {});
    positional(Kind::Cancel, 1, &Cancel { reason: "r".into() });
    positional(Kind::Window, 1, &Window { increment: 1 });
    positional(Kind::Request, 1, &Request::sql("SELECT 1"));
    positional(Kind::End, 1, &End::default());
    positional(
        Kind::Rows,
        1,
        &Rows {
            rows: vec![vec![Value::Int(1)]],
        },
    );
    positional(
        Kind::Error,
        0,
        &ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::Internal, "x"),
    );
}

/// The same inside a body: a batch statement or a column sent as an array.
#[test]
fn nested_bodies_sent_as_arrays_are_bad_bodies() {
    #[derive(Serialize)]
    struct BatchOfTuples {
        batch: Vec<(&'static str, Vec<i32>)>,
    }
    let f = Frame::new(
        Kind::Request,
        1,
        &BatchOfTuples {
            batch: vec![("SELECT 1", vec![])],
        },
    );
    assert!(matches!(f.body::<Request>(), Err(ProtocolError::BadBody { .. })));
    #[derive(Serialize)]
    struct ColumnsOfTuples {
        result_set: u32,
        columns: Vec<(&'static str, &'static str, u8, u16, u16, u32, u8)>,
    }
    let f = Frame::new(
        Kind::Columns,
        1,
        &ColumnsOfTuples {
            result_set: 0,
            columns: vec![("a", "", 3, 0, 63, 11, 0)],
        },
    );
    assert!(matches!(f.body::<Columns>(), Err(ProtocolError::BadBody { .. })));
}

/// Spec gap (issue 9): an origin or role string the receiver does not know decodes as
/// `Unknown` (the ERROR is kept; the HELLO is refused by the dispatcher as a wrong role),
/// never as a malformed body.
#[test]
fn unknown_origin_and_role_strings_decode_as_unknown() {
    #[derive(Serialize)]
    struct ErrorWire {
        origin: &'static str,
        code: &'static str,
        message: &'static str,
        dispatched: bool,
        retryable: bool,
    }
    let e: ErrorBody = decode_partial(
        Kind::Error,
        1,
        &ErrorWire {
            origin: "proxy",
            code: "QUEUE_FULL",
            message: "m",
            dispatched: false,
            retryable: true,
        },
    );
    assert_eq!(e.origin, Origin::Unknown);
    assert_eq!(e.code, ErrorCode::QueueFull);
    assert!(e.retryable);
    #[derive(Serialize)]
    struct HelloWire {
        version_major: u16,
        version_minor: u16,
        role: &'static str,
    }
    let h: Hello = decode_partial(
        Kind::Hello,
        0,
        &HelloWire {
            version_major: 1,
            version_minor: 1,
            role: "observer",
        },
    );
    assert_eq!(h.role, Role::Unknown);
}

/// Section 4: text is `str`. A `HELLO` whose role, token, secret or name is a `bin`
/// (even of valid UTF-8) is `BAD_BODY` naming the field; nil is "none" (issue 20, item 5:
/// a token sent as bytes was accepted).
#[test]
fn hello_texts_must_be_str() {
    enum T {
        S(&'static str),
        B(&'static [u8]),
        Nil,
    }
    impl Serialize for T {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self {
                T::S(t) => s.serialize_str(t),
                T::B(b) => s.serialize_bytes(b),
                T::Nil => s.serialize_none(),
            }
        }
    }
    #[derive(Serialize)]
    struct HelloWire {
        version_major: u16,
        version_minor: u16,
        role: T,
        token: T,
        secret: T,
        name: T,
    }
    let decode = |h: HelloWire| Frame::new(Kind::Hello, 0, &h).body::<Hello>();
    let good = || HelloWire {
        version_major: 1,
        version_minor: 3,
        role: T::S("client"),
        token: T::S("tok"),
        secret: T::Nil,
        name: T::S("n"),
    };
    let h = decode(good()).expect("all str");
    assert_eq!(
        (h.role, h.token.as_deref(), h.secret, h.name.as_deref()),
        (Role::Client, Some("tok"), None, Some("n"))
    );
    let cases: [(&str, HelloWire); 4] = [
        (
            "role",
            HelloWire {
                role: T::B(b"client"),
                ..good()
            },
        ),
        (
            "token",
            HelloWire {
                token: T::B(b"tok"),
                ..good()
            },
        ),
        (
            "secret",
            HelloWire {
                secret: T::B(b"s"),
                ..good()
            },
        ),
        (
            "name",
            HelloWire {
                name: T::B(b"n"),
                ..good()
            },
        ),
    ];
    for (field, h) in cases {
        match decode(h) {
            Err(e @ ProtocolError::BadBody { .. }) => {
                assert_eq!(e.code(), ErrorCode::BadBody);
                assert!(e.to_string().contains(&format!("`{field}`")), "{field}: {e}");
            }
            other => panic!("{field} as bin: {other:?}"),
        }
    }
    // The same for the texts of a REQUEST other than its SQL (which may be a bin of UTF-8).
    #[derive(Serialize)]
    struct RequestWire {
        sql: T,
        cluster: T,
        causal_gtid: T,
    }
    let decode = |r: RequestWire| Frame::new(Kind::Request, 1, &r).body::<Request>();
    let r = decode(RequestWire {
        sql: T::B(b"SELECT 1"),
        cluster: T::S("c"),
        causal_gtid: T::Nil,
    })
    .expect("sql as bin, the rest str");
    assert_eq!((r.sql.as_str(), r.cluster.as_deref()), ("SELECT 1", Some("c")));
    for field in ["cluster", "causal_gtid"] {
        let r = RequestWire {
            sql: T::S("SELECT 1"),
            cluster: if field == "cluster" { T::B(b"c") } else { T::Nil },
            causal_gtid: if field == "causal_gtid" { T::B(b"0-1-1") } else { T::Nil },
        };
        match decode(r) {
            Err(e @ ProtocolError::BadBody { .. }) => assert!(e.to_string().contains(&format!("`{field}`")), "{e}"),
            other => panic!("{field} as bin: {other:?}"),
        }
    }
}

#[test]
fn backend_tls_is_left_out_when_absent_and_modes_are_snake_case() {
    let mut s = WorkerSettings {
        backend: Backend {
            name: "primary".into(),
            host: "db".into(),
            port: 3306,
            user: "app".into(),
            password: String::new(),
            database: None,
        },
        max_requests: 0,
        max_age_ms: 0,
        batch_rows: 1,
        batch_bytes: 1,
        connect_timeout_ms: 1,
        session_reset: SessionReset::Auto,
        backend_tls: None,
    };
    let plain = rmp_serde::to_vec_named(&s).unwrap();
    let map: std::collections::BTreeMap<String, serde::de::IgnoredAny> = rmp_serde::from_slice(&plain).unwrap();
    assert!(
        !map.contains_key("backend_tls"),
        "an older worker sees the same keys as before"
    );
    s.backend_tls = Some(BackendTls {
        mode: SslMode::VerifyIdentity,
        ca_file: None,
        server_name: None,
    });
    let back: WorkerSettings = rmp_serde::from_slice(&rmp_serde::to_vec_named(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    for (v, wire) in [
        (SslMode::Disabled, "disabled"),
        (SslMode::Preferred, "preferred"),
        (SslMode::Required, "required"),
        (SslMode::VerifyCa, "verify_ca"),
        (SslMode::VerifyIdentity, "verify_identity"),
    ] {
        let bytes = rmp_serde::to_vec_named(&v).unwrap();
        assert_eq!(rmp_serde::from_slice::<String>(&bytes).unwrap(), wire);
    }
}

/// Protocol 1.3's fields are left out when absent, so a 1.2 peer sees the keys it knew;
/// and bodies from a 1.2 peer (without them) decode with `None`.
#[test]
fn read_your_writes_fields_are_optional_and_left_out_when_absent() {
    fn keys(payload: &[u8]) -> std::collections::BTreeSet<String> {
        let map: std::collections::BTreeMap<String, serde::de::IgnoredAny> = rmp_serde::from_slice(payload).unwrap();
        map.into_keys().collect()
    }
    let end = End {
        affected_rows: 1,
        ..Default::default()
    };
    let plain = Frame::new(Kind::End, 1, &end);
    assert!(!keys(&plain.payload).contains("gtid"));
    let with = End {
        gtid: Some("0-1-42".into()),
        ..end.clone()
    };
    let frame = Frame::new(Kind::End, 1, &with);
    assert!(keys(&frame.payload).contains("gtid"));
    assert_eq!(frame.body::<End>().unwrap(), with);

    let req = Request::sql("SELECT 1");
    let plain = Frame::new(Kind::Request, 1, &req);
    assert!(!keys(&plain.payload).contains("causal_gtid"));
    let with = Request {
        causal_gtid: Some("0-1-42,1-2-7".into()),
        cluster: Some("main".into()),
        ..req.clone()
    };
    let frame = Frame::new(Kind::Request, 1, &with);
    assert!(keys(&frame.payload).contains("causal_gtid"));
    assert_eq!(frame.body::<Request>().unwrap(), with);
    // The SDK's per-request switch never travels.
    let local = Request {
        read_your_writes: Some(true),
        ..req.clone()
    };
    let frame = Frame::new(Kind::Request, 1, &local);
    assert!(!keys(&frame.payload).contains("read_your_writes"));
    assert_eq!(frame.body::<Request>().unwrap(), req);

    // A 1.2 END and a 1.2 REQUEST, every field they had.
    #[derive(Serialize)]
    struct End12 {
        affected_rows: u64,
        last_insert_id: Option<u64>,
        warnings: u32,
        rows: u64,
        server_time_us: u64,
        queue_time_us: u64,
    }
    let e: End = decode_partial(
        Kind::End,
        1,
        &End12 {
            affected_rows: 2,
            last_insert_id: Some(9),
            warnings: 0,
            rows: 0,
            server_time_us: 10,
            queue_time_us: 3,
        },
    );
    assert_eq!(e.gtid, None);
    assert_eq!(e.last_insert_id, Some(9));
    #[derive(Serialize)]
    struct Request12 {
        sql: &'static str,
        params: Vec<Value>,
        batch: Vec<Statement>,
        read_only: bool,
        idempotent: bool,
        force_primary: bool,
        timeout_ms: u64,
        cluster: Option<&'static str>,
    }
    let r: Request = decode_partial(
        Kind::Request,
        1,
        &Request12 {
            sql: "SELECT 1",
            params: vec![],
            batch: vec![],
            read_only: true,
            idempotent: false,
            force_primary: false,
            timeout_ms: 0,
            cluster: Some("b"),
        },
    );
    assert_eq!(r.causal_gtid, None);
    assert_eq!(r.cluster.as_deref(), Some("b"));
    // nil is as good as absent.
    #[derive(Serialize)]
    struct NilGtid {
        sql: &'static str,
        causal_gtid: Option<&'static str>,
    }
    let r: Request = decode_partial(
        Kind::Request,
        1,
        &NilGtid {
            sql: "SELECT 1",
            causal_gtid: None,
        },
    );
    assert_eq!(r, Request::sql("SELECT 1"));
}

#[test]
fn a_causal_gtid_that_is_no_position_fails_validation() {
    let ok = Request {
        causal_gtid: Some("0-1-5, 1-1-2".into()),
        ..Request::sql("SELECT 1")
    };
    assert_eq!(ok.validate(), Ok(()));
    for bad in ["0-1", "0-1-5,0-2-6", "x"] {
        let r = Request {
            causal_gtid: Some(bad.into()),
            ..Request::sql("SELECT 1")
        };
        let e = r.validate().unwrap_err();
        assert!(e.starts_with("causal_gtid: "), "{e}");
    }
}

/// `End::encode` and serde agree on strings of every header size: fixstr, str8, str16,
/// and the long ones it hands to serde.
#[test]
fn end_encoded_by_hand_is_serdes_for_every_string_length() {
    for len in [0, 31, 32, 255, 256, 65_535, 65_536, 70_000] {
        let text = "x".repeat(len);
        for (gtid, info) in [
            (Some(text.clone()), None),
            (None, Some(text.clone())),
            (Some(text.clone()), Some(text.clone())),
        ] {
            let b = End {
                gtid,
                info,
                in_transaction: true,
                autocommit: Some(false),
                ..End::default()
            };
            assert_eq!(b.encode(), rmp_serde::to_vec_named(&b).unwrap(), "length {len}");
        }
    }
}

/// ... and on every integer at the edges of its header sizes.
#[test]
fn end_encoded_by_hand_is_serdes_at_every_integer_edge() {
    let edges = [
        0,
        1,
        127,
        128,
        255,
        256,
        65_535,
        65_536,
        u64::from(u32::MAX),
        u64::from(u32::MAX) + 1,
        u64::MAX,
    ];
    for v in edges {
        let b = End {
            affected_rows: v,
            last_insert_id: Some(v),
            warnings: u32::try_from(v).unwrap_or(u32::MAX),
            rows: v,
            server_time_us: v,
            queue_time_us: v,
            ..End::default()
        };
        assert_eq!(b.encode(), rmp_serde::to_vec_named(&b).unwrap(), "value {v}");
    }
}

/// Every field of a full END removed, repeated, and given each of [`odd_value`]'s values in
/// turn: the fast path agrees with serde on each (proptest above covers combinations).
#[test]
fn end_decoded_by_hand_agrees_for_every_field_and_value() {
    let b = End {
        affected_rows: 1,
        last_insert_id: Some(2),
        warnings: 3,
        rows: 4,
        server_time_us: 5,
        queue_time_us: 6,
        gtid: Some("0-1-7".into()),
        in_transaction: true,
        info: Some("Rows matched: 1".into()),
        autocommit: Some(false),
    };
    let entries = map_entries(&b.encode());
    assert_eq!(entries.len(), 10);
    each_field_changed(&entries, |entries| {
        end_agrees(&map_payload(entries, entries.len() as i32))
    });
}

/// Every field of a request that sets them all removed, repeated, and given each of
/// [`odd_value`]'s values in turn; its params each pair of those values: the fast path
/// agrees with serde on each.
#[test]
fn request_decoded_by_hand_agrees_for_every_field_and_value() {
    // The fast path takes no batch, blob_params or vars.
    let b = Request {
        params: vec![Value::Int(-1), Value::Text("x".into())],
        batch: Vec::new(),
        blob_params: Vec::new(),
        vars: Vec::new(),
        ..every_field()
    };
    let full = rmp_serde::to_vec_named(&b).unwrap();
    assert!(Request::decode_common(&full).is_some());
    let entries = map_entries(&full);
    let check = |entries: &[(String, Vec<u8>)]| request_agrees(&map_payload(entries, entries.len() as i32));
    each_field_changed(&entries, check);
    let params = entries.iter().position(|(name, _)| name == "params").unwrap();
    for v in 0..ODD_VALUES {
        for w in 0..ODD_VALUES {
            let mut other = entries.clone();
            other[params].1 = [vec![0x92], odd_value(v), odd_value(w)].concat();
            check(&other);
        }
    }
    // Last in the map, where a value misread short would leave nothing behind to trip on
    // (serde ignores trailing bytes): params of one odd value, and params as an odd value.
    let mut last = entries.clone();
    let p = last.remove(params);
    last.push(p);
    for v in 0..ODD_VALUES {
        for value in [[vec![0x91], odd_value(v)].concat(), odd_value(v)] {
            let mut other = last.clone();
            other.last_mut().unwrap().1 = value;
            check(&other);
        }
    }
}

/// How many values [`odd_value`] knows.
const ODD_VALUES: usize = 36;

/// A MessagePack value for END's fuzzing: every form an END field's value could take, and
/// some it could not.
fn odd_value(i: usize) -> Vec<u8> {
    match i {
        0 => vec![0x00],
        1 => vec![0x7F],
        2 => vec![0xCC, 0xFF],
        3 => vec![0xCD, 0x12, 0x34],
        4 => vec![0xCE, 0xFF, 0xFF, 0xFF, 0xFF],
        5 => vec![0xCF, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00],
        6 => vec![0xCF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF],
        7 => vec![0xFF],       // -1
        8 => vec![0xD0, 0x05], // int 8, positive
        9 => vec![0xC0],       // nil
        10 => vec![0xC2],
        11 => vec![0xC3],
        12 => vec![0xA3, b'1', b'-', b'2'],
        13 => vec![0xD9, 0x02, b'o', b'k'],
        14 => vec![0xDA, 0x00, 0x01, b'x'],
        15 => vec![0xA2, 0xC3, 0x28],             // bad UTF-8
        16 => vec![0xC4, 0x01, b'x'],             // bin
        17 => vec![0xCA, 0x3F, 0x80, 0x00, 0x00], // float 1.0
        18 => vec![0x90],                         // []
        19 => vec![0x91, 0x01],                   // [1]
        20 => vec![0xDB, 0x00, 0x00, 0x00, 0x01, b'y'],
        21 => vec![0xA0], // ""
        22 => vec![0x01],
        23 => vec![0xCF, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00], // i64::MAX + 1
        24 => vec![0xD3, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00], // i64::MIN
        25 => vec![0xD1, 0xFF, 0x38],                                     // -200
        26 => vec![0xCB, 0x40, 0x09, 0x21, 0xFB, 0x54, 0x44, 0x2D, 0x18], // pi
        27 => vec![0xE0],                                                 // -32
        28 => vec![0xD0, 0x9C],                                           // -100
        29 => vec![0xD2, 0xFF, 0xFF, 0xFF, 0x00],                         // -256
        30 => vec![0xD2, 0x00, 0x01, 0x00, 0x00],                         // 65536
        31 => vec![0xC5, 0x00, 0x01, b'x'],                               // bin 16
        32 => vec![0xC6, 0x00, 0x00, 0x00, 0x01, b'y'],                   // bin 32
        33 => vec![0xDC, 0x00, 0x01, 0x01],                               // array 16: [1]
        34 => vec![0xDD, 0xFF, 0xFF, 0xFF, 0xFF],                         // array 32, cut short
        _ => vec![0xDC, 0x00, 0x00],                                      // array 16: []
    }
}

/// The length of the MessagePack value at the start of `b`.
fn msgpack_len(b: &[u8]) -> usize {
    let be = |n: usize| b[1..1 + n].iter().fold(0usize, |a, &x| a << 8 | usize::from(x));
    let items = |head: usize, n: usize| {
        let mut at = head;
        for _ in 0..n {
            at += msgpack_len(&b[at..]);
        }
        at
    };
    match b[0] {
        0x00..=0x7F | 0xE0..=0xFF | 0xC0 | 0xC2 | 0xC3 => 1,
        h @ 0x80..=0x8F => items(1, 2 * usize::from(h & 0x0F)),
        h @ 0x90..=0x9F => items(1, usize::from(h & 0x0F)),
        h @ 0xA0..=0xBF => 1 + usize::from(h & 0x1F),
        0xC4 | 0xD9 => 2 + be(1),
        0xC5 | 0xDA => 3 + be(2),
        0xC6 | 0xDB => 5 + be(4),
        0xCC | 0xD0 => 2,
        0xCD | 0xD1 => 3,
        0xCE | 0xD2 | 0xCA => 5,
        0xCF | 0xD3 | 0xCB => 9,
        0xDC => items(3, be(2)),
        0xDD => items(5, be(4)),
        0xDE => items(3, 2 * be(2)),
        0xDF => items(5, 2 * be(4)),
        h => panic!("no such value in our bodies: {h:#x}"),
    }
}

/// A body's named encoding: compares two decoded bodies whole, NaN included.
fn named<T: serde::Serialize>(b: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(b).unwrap()
}

/// The fast path reads `payload` as serde does, or leaves it to serde.
fn request_agrees(payload: &[u8]) {
    let frame = Frame::with_payload(Kind::Request, 1, bytes::Bytes::from(payload.to_vec()));
    let serde = frame.body::<Request>().map(|r| named(&r)).map_err(|e| e.to_string());
    if let Some(fast) = Request::decode_common(payload) {
        assert_eq!(Ok(named(&fast)), serde, "{payload:02x?}");
    }
    assert_eq!(
        Request::from_frame(&frame)
            .map(|r| named(&r))
            .map_err(|e| e.to_string()),
        serde
    );
}

/// The entries (name, value's bytes) of a map with fixstr names, as serde writes bodies.
fn map_entries(full: &[u8]) -> Vec<(String, Vec<u8>)> {
    let (n, mut rest) = match full[0] {
        h @ 0x80..=0x8F => (usize::from(h & 0x0F), &full[1..]),
        0xDE => (usize::from(u16::from_be_bytes([full[1], full[2]])), &full[3..]),
        h => panic!("not a map: {h:#x}"),
    };
    let mut entries = Vec::new();
    for _ in 0..n {
        let name_len = usize::from(rest[0] & 0x1F);
        let name = String::from_utf8(rest[1..1 + name_len].to_vec()).unwrap();
        rest = &rest[1 + name_len..];
        let len = msgpack_len(rest);
        entries.push((name, rest[..len].to_vec()));
        rest = &rest[len..];
    }
    entries
}

/// Entries of a map edited as `(what, where, odd value)` says: removed, repeated, given an
/// odd value, preceded by an unknown field or by a `params` of two odd values, moved last.
fn edit_entries(entries: &mut Vec<(String, Vec<u8>)>, edits: &[(u8, prop::sample::Index, usize)]) {
    for (what, at, value) in edits {
        if entries.is_empty() {
            return;
        }
        let i = at.index(entries.len());
        match what {
            0 => drop(entries.remove(i)),
            1 => entries.push(entries[i].clone()),
            2 => entries[i].1 = odd_value(*value),
            3 => entries.insert(i, ("other".into(), odd_value(*value))),
            4 => {
                let params = [vec![0x92], odd_value(*value), odd_value(i % ODD_VALUES)].concat();
                entries.insert(i, ("params".into(), params));
            }
            _ => {
                let e = entries.remove(i);
                entries.push(e);
            }
        }
    }
}

/// A map of `entries` whose header says `count` entries (clamped to what a map 16 holds).
fn map_payload(entries: &[(String, Vec<u8>)], count: i32) -> Vec<u8> {
    let count = count.clamp(0, i32::from(u16::MAX)) as u16;
    let mut payload = if count < 16 {
        vec![0x80 | count as u8]
    } else {
        [vec![0xDE], count.to_be_bytes().to_vec()].concat()
    };
    for (name, value) in entries {
        payload.push(0xA0 | name.len() as u8);
        payload.extend_from_slice(name.as_bytes());
        payload.extend_from_slice(value);
    }
    payload
}

/// The fast path reads `payload` as serde does, or leaves it to serde.
fn end_agrees(payload: &[u8]) {
    fast_path_agrees(Kind::End, payload, End::decode_common, End::from_frame);
}

/// A hand-written decoder (`fast`, and `from_frame` over it) reads `payload` as serde does,
/// or leaves it to serde.
fn fast_path_agrees<T: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
    kind: Kind,
    payload: &[u8],
    fast: fn(&[u8]) -> Option<T>,
    from_frame: fn(&Frame) -> Result<T, ProtocolError>,
) {
    let frame = Frame::with_payload(kind, 1, bytes::Bytes::from(payload.to_vec()));
    let serde = frame.body::<T>().map_err(|e| e.to_string());
    if let Some(fast) = fast(payload) {
        assert_eq!(Ok(fast), serde, "{payload:02x?}");
    }
    assert_eq!(from_frame(&frame).map_err(|e| e.to_string()), serde);
}

/// `check` on `entries`, then on them with each entry removed, repeated, and given each of
/// [`odd_value`]'s values in turn.
fn each_field_changed(entries: &[(String, Vec<u8>)], check: impl Fn(&[(String, Vec<u8>)])) {
    check(entries);
    for i in 0..entries.len() {
        let mut fewer = entries.to_vec();
        fewer.remove(i);
        check(&fewer);
        let mut twice = entries.to_vec();
        twice.push(entries[i].clone());
        check(&twice);
        for v in 0..ODD_VALUES {
            let mut other = entries.to_vec();
            other[i].1 = odd_value(v);
            check(&other);
        }
    }
}

/// `b` with each integer shifted right by its amount: integers of every width.
fn shifted(mut b: End, shifts: [u32; 6]) -> End {
    b.affected_rows >>= shifts[0];
    b.last_insert_id = b.last_insert_id.map(|v| v >> shifts[1]);
    b.warnings >>= shifts[2] % 32;
    b.rows >>= shifts[3];
    b.server_time_us >>= shifts[4];
    b.queue_time_us >>= shifts[5];
    b
}

/// `bytes` with the byte at `at` replaced by `byte` (`how` 0), cut there (1), or `byte`
/// inserted there (2).
fn mangled(mut bytes: Vec<u8>, (at, byte, how): (prop::sample::Index, u8, u8)) -> Vec<u8> {
    let i = at.index(bytes.len());
    match how {
        0 => bytes[i] = byte,
        1 => bytes.truncate(i),
        _ => bytes.insert(i, byte),
    }
    bytes
}

/// [`arb_value`], with integers often small (an arbitrary one shifted right): every header
/// width of both signs comes up.
fn arb_value_any_width() -> impl Strategy<Value = Value> {
    prop_oneof![
        arb_value(),
        (any::<i64>(), 0u32..64).prop_map(|(v, s)| Value::Int(v >> s)),
        (any::<u64>(), 0u32..64).prop_map(|(v, s)| Value::UInt(v >> s)),
        (any::<(u16, u32)>(), proptest::array::uniform7(0u32..32)).prop_map(|((y, u), s)| Value::Date {
            year: y >> (s[0] % 16),
            month: 200 >> (s[1] % 8),
            day: 31 >> (s[2] % 8),
            hour: 255 >> (s[3] % 8),
            minute: 59,
            second: 128,
            micro: u >> s[6],
        }),
        (any::<(bool, u32, u32)>(), proptest::array::uniform4(0u32..32)).prop_map(|((n, d, u), s)| Value::Time {
            negative: n,
            days: d >> s[0],
            hours: 255 >> (s[1] % 8),
            minutes: 127,
            seconds: 128 >> (s[2] % 8),
            micros: u >> s[3],
        }),
    ]
}

/// `Rows::encode` and serde agree at every edge of an integer's, a string's, a binary's and
/// an array's header sizes.
#[test]
fn rows_encoded_by_hand_are_serdes_at_every_edge() {
    let same = |rows: Vec<Vec<Value>>, what: &str| {
        assert_eq!(
            Rows::encode(&rows),
            rmp_serde::to_vec_named(&Rows { rows }).unwrap(),
            "{what}"
        );
    };
    let ints = [
        i64::MIN,
        -(1 << 31) - 1,
        -(1 << 31),
        -32_769,
        -32_768,
        -129,
        -128,
        -33,
        -32,
        -1,
        0,
        1,
        127,
        128,
        255,
        256,
        65_535,
        65_536,
        (1 << 32) - 1,
        1 << 32,
        i64::MAX,
    ];
    for v in ints {
        same(
            vec![vec![Value::Int(v), Value::UInt(v as u64)]],
            &format!("integer {v}"),
        );
    }
    for len in [0, 15, 16, 31, 32, 255, 256, 65_535, 65_536, 70_000] {
        let text = "x".repeat(len);
        let values = vec![
            Value::Text(text.clone()),
            Value::Bytes(text.clone().into_bytes()),
            Value::Decimal(text.clone()),
            Value::Json(text.clone()),
            Value::Bit(text.into_bytes()),
        ];
        same(vec![values], &format!("length {len}"));
        same(vec![vec![Value::Null; len]], &format!("a row of {len} values"));
        same(vec![Vec::new(); len], &format!("{len} rows"));
    }
}

/// `Request::encode` and serde agree with every optional field present (a map of more
/// than 15 entries: map 16), with none, and at every header size of its texts and arrays.
#[test]
fn request_encoded_by_hand_is_serdes_at_every_edge() {
    for b in [every_field(), Request::default(), Request::sql("SELECT 1")] {
        assert_eq!(b.encode(), rmp_serde::to_vec_named(&b).unwrap(), "{b:?}");
    }
    for len in [0, 15, 16, 31, 32, 255, 256, 65_535, 65_536, 70_000] {
        let text = "y".repeat(len);
        let b = Request {
            sql: text.clone(),
            params: vec![Value::Null; len],
            batch: vec![
                Statement {
                    sql: text.clone(),
                    params: Vec::new(),
                };
                len.min(300)
            ],
            schema: Some(text.clone()),
            vars: vec![(text.clone(), text); len.min(20)],
            blob_params: vec![7; len],
            ..Request::default()
        };
        assert_eq!(b.encode(), rmp_serde::to_vec_named(&b).unwrap(), "length {len}");
    }
}

fn arb_columns() -> impl Strategy<Value = Columns> {
    (any::<u32>(), prop::collection::vec(arb_column(), 0..5))
        .prop_map(|(result_set, columns)| Columns { result_set, columns })
}

/// The fast path reads `payload` as serde does, or leaves it to serde.
fn columns_agree(payload: &[u8]) {
    fast_path_agrees(Kind::Columns, payload, Columns::decode_common, Columns::from_frame);
}

/// Every field of COLUMNS and of its column removed, repeated, and given each of
/// [`odd_value`]'s values in turn: the fast path agrees with serde on each.
#[test]
fn columns_decoded_by_hand_agree_for_every_field_and_value() {
    let column = Column {
        name: "c".into(),
        table: "t".into(),
        column_type: 253,
        flags: 4097,
        charset: 45,
        length: 480,
        decimals: 39,
    };
    let b = Columns {
        result_set: 1,
        columns: vec![column.clone()],
    };
    let full = rmp_serde::to_vec_named(&b).unwrap();
    assert_eq!(Columns::decode_common(&full), Some(b));
    let entries = map_entries(&full);
    let check = |entries: &[(String, Vec<u8>)]| columns_agree(&map_payload(entries, entries.len() as i32));
    each_field_changed(&entries, check);
    let at = entries.iter().position(|(name, _)| name == "columns").unwrap();
    each_field_changed(&map_entries(&rmp_serde::to_vec_named(&column).unwrap()), |c| {
        let mut outer = entries.clone();
        outer[at].1 = [vec![0x91], map_payload(c, c.len() as i32)].concat();
        check(&outer);
    });
}

/// A request with every field set (`read_your_writes` too, which is not on the wire).
fn every_field() -> Request {
    Request {
        sql: "SELECT ?".into(),
        params: vec![Value::Int(-33)],
        batch: vec![Statement {
            sql: "SELECT 1".into(),
            params: vec![Value::Null],
        }],
        read_only: true,
        idempotent: true,
        force_primary: true,
        timeout_ms: 65_536,
        cluster: Some("c".into()),
        causal_gtid: Some("0-1-2".into()),
        open_session: true,
        session: Some(u32::MAX),
        text_rows: true,
        prepared: true,
        blob_params: vec![0, 65_535],
        prepare_only: true,
        multi_results: true,
        raw_rows: true,
        schema: Some("db".into()),
        vars: vec![("names".into(), "utf8mb4".into())],
        read_your_writes: Some(true),
    }
}

#[test]
fn started_body_is_what_serde_writes() {
    let frame = Frame::new(Kind::Started, 9, &Started {});
    assert_eq!(&frame.payload[..], Started::BODY);
    assert_eq!(frame.body::<Started>().unwrap(), Started {});
}

//! Strategies and helpers shared by the protocol tests.
#![allow(dead_code)]

use bytes::BytesMut;
use osprey_protocol::*;
use proptest::prelude::*;
use serde::{de::DeserializeOwned, Serialize};
use tokio_util::codec::{Decoder, Encoder};

pub fn arb_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<f32>(),
        any::<u32>().prop_map(f32::from_bits),
        Just(f32::NAN),
        Just(-0.0f32)
    ]
}

pub fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        any::<u64>().prop_map(f64::from_bits),
        Just(f64::NAN),
        Just(f64::INFINITY)
    ]
}

/// Byte strings that often contain zero bytes.
pub fn arb_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..48)
}

pub fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::Int),
        prop_oneof![any::<u64>(), Just(u64::MAX), Just(i64::MAX as u64 + 1), Just(0)].prop_map(Value::UInt),
        arb_f32().prop_map(Value::Float),
        arb_f64().prop_map(Value::Double),
        "-?[0-9]{1,40}(\\.[0-9]{1,30})?".prop_map(Value::Decimal),
        arb_bytes().prop_map(Value::Bytes),
        any::<String>().prop_map(Value::Text),
        Just(Value::Date {
            year: 0,
            month: 0,
            day: 0,
            hour: 0,
            minute: 0,
            second: 0,
            micro: 0
        }),
        (
            any::<u16>(),
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<u32>()
        )
            .prop_map(|(year, month, day, hour, minute, second, micro)| Value::Date {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micro
            }),
        (
            any::<bool>(),
            any::<u32>(),
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<u32>()
        )
            .prop_map(|(negative, days, hours, minutes, seconds, micros)| Value::Time {
                negative,
                days,
                hours,
                minutes,
                seconds,
                micros
            }),
        // -838:59:59, the MySQL minimum, and 34 days 22 h (> 24 h).
        Just(Value::Time {
            negative: true,
            days: 34,
            hours: 22,
            minutes: 59,
            seconds: 59,
            micros: 0
        }),
        arb_bytes().prop_map(Value::Bit),
        any::<String>().prop_map(Value::Json),
    ]
}

/// Values compared bit for bit (so that NaN equals the same NaN).
pub fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Double(x), Value::Double(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

pub fn same_values(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_value(x, y))
}

pub fn same_statement(a: &Statement, b: &Statement) -> bool {
    a.sql == b.sql && same_values(&a.params, &b.params)
}

pub fn same_request(a: &Request, b: &Request) -> bool {
    a.sql == b.sql
        && same_values(&a.params, &b.params)
        && a.batch.len() == b.batch.len()
        && a.batch.iter().zip(&b.batch).all(|(x, y)| same_statement(x, y))
        && a.read_only == b.read_only
        && a.idempotent == b.idempotent
        && a.force_primary == b.force_primary
        && a.timeout_ms == b.timeout_ms
}

pub fn same_rows(a: &Rows, b: &Rows) -> bool {
    a.rows.len() == b.rows.len() && a.rows.iter().zip(&b.rows).all(|(x, y)| same_values(x, y))
}

pub fn arb_error_code() -> impl Strategy<Value = ErrorCode> {
    prop::sample::select(ErrorCode::ALL)
}

pub fn arb_origin() -> impl Strategy<Value = Origin> {
    prop::sample::select(&[Origin::Database, Origin::Worker, Origin::Dispatcher, Origin::Client][..])
}

pub fn arb_data_stream() -> impl Strategy<Value = u32> {
    prop_oneof![1..=u32::MAX, Just(1u32), Just(u32::MAX)]
}

/// Encodes `body` as a frame, pushes it through the codec and decodes it again,
/// checking the header survives; returns the decoded body.
pub fn roundtrip<T: Serialize + DeserializeOwned>(kind: Kind, stream: u32, body: &T) -> T {
    let frame = Frame::new(kind, stream, body);
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    codec.encode(&frame, &mut buf).expect("encode");
    assert_eq!(buf.len(), HEADER_LEN + frame.payload.len());
    let decoded = codec.decode(&mut buf).expect("decode").expect("a whole frame");
    assert!(buf.is_empty(), "decoder left {} bytes", buf.len());
    assert_eq!(decoded, frame);
    decoded.body::<T>().expect("body decodes")
}

/// Decodes everything in `buf`, panicking on an error.
pub fn decode_all(codec: &mut FrameCodec, buf: &mut BytesMut, out: &mut Vec<Frame>) {
    while let Some(f) = codec.decode(buf).expect("valid stream") {
        out.push(f);
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

//! Codec microbenchmarks: encode (body → MessagePack → frame bytes) and decode
//! (bytes → frame → body) of a point-select REQUEST and of a 100-row ROWS frame.
//!
//! `cargo bench -p osprey-protocol --bench codec -- --warm-up-time 1 --measurement-time 3`
//! Results are recorded in docs/BENCHMARKS.md.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use osprey_protocol::*;
use serde::{de::DeserializeOwned, Serialize};
use tokio_util::codec::{Decoder, Encoder};

fn point_select() -> Request {
    Request {
        params: vec![Value::Int(4711)],
        read_only: true,
        ..Request::sql("SELECT id, k, c, pad FROM sbtest1 WHERE id = ?")
    }
}

/// 100 rows of five mixed columns: int, ~20-byte text, double, datetime, NULL.
fn hundred_rows() -> Rows {
    let rows = (0..100i64)
        .map(|i| {
            vec![
                Value::Int(1_000_000 + i),
                Value::Text(format!("customer-name-{i:06}")),
                Value::Double(i as f64 * 3.25 + 0.125),
                Value::Date {
                    year: 2024,
                    month: 5,
                    day: (i % 28 + 1) as u8,
                    hour: 13,
                    minute: 7,
                    second: 42,
                    micro: 0,
                },
                Value::Null,
            ]
        })
        .collect();
    Rows { rows }
}

fn encode<T: Serialize>(codec: &mut FrameCodec, out: &mut BytesMut, kind: Kind, body: &T) {
    out.clear();
    let frame = Frame::new(kind, 1, body);
    codec.encode(frame, out).unwrap();
}

fn decode<T: DeserializeOwned>(codec: &mut FrameCodec, buf: &mut BytesMut, wire: &[u8]) -> T {
    buf.extend_from_slice(wire);
    let frame = codec.decode(buf).unwrap().unwrap();
    frame.body::<T>().unwrap()
}

fn bench_frame<T: Serialize + DeserializeOwned>(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    kind: Kind,
    body: &T,
) {
    let mut codec = FrameCodec::default();
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut inbuf = BytesMut::with_capacity(64 * 1024);
    let wire = Frame::new(kind, 1, body).to_bytes();

    g.bench_function("encode", |b| {
        b.iter(|| {
            encode(&mut codec, &mut out, kind, black_box(body));
            black_box(out.len())
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| black_box(decode::<T>(&mut codec, &mut inbuf, black_box(&wire))))
    });
    g.bench_function("encode+decode", |b| {
        b.iter(|| {
            encode(&mut codec, &mut out, kind, black_box(body));
            black_box(decode::<T>(&mut codec, &mut inbuf, &out))
        })
    });
}

fn codec(c: &mut Criterion) {
    let request = point_select();
    let rows = hundred_rows();
    let request_len = Frame::new(Kind::Request, 1, &request).to_bytes().len() as u64;
    let rows_len = Frame::new(Kind::Rows, 1, &rows).to_bytes().len() as u64;
    eprintln!("REQUEST frame: {request_len} bytes; ROWS frame (100 rows): {rows_len} bytes");

    // Elements = frames, so criterion reports frames/s.
    let mut g = c.benchmark_group("request/frames");
    g.throughput(Throughput::Elements(1));
    bench_frame(&mut g, Kind::Request, &request);
    g.finish();

    let mut g = c.benchmark_group("request/bytes");
    g.throughput(Throughput::Bytes(request_len));
    bench_frame(&mut g, Kind::Request, &request);
    g.finish();

    let mut g = c.benchmark_group("rows100/frames");
    g.throughput(Throughput::Elements(1));
    bench_frame(&mut g, Kind::Rows, &rows);
    g.finish();

    let mut g = c.benchmark_group("rows100/bytes");
    g.throughput(Throughput::Bytes(rows_len));
    bench_frame(&mut g, Kind::Rows, &rows);
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);

//! Digest + bitmap check per request: the work the interception stage adds to every
//! request (goal ≤ 1 µs for a 200-byte statement; docs/BENCHMARKS.md).
//!
//! The bitmap check is the same operation as the dispatcher's `policy::intercept`
//! (`Intercept::check`'s fast path): one relaxed atomic load of the word holding bit
//! `hash & (2^20 - 1)` of a 2^20-bit table. It is written out here so that this crate's
//! bench does not depend on the dispatcher.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const BITS: u64 = 1 << 20;

fn check(bitmap: &[AtomicU64], hash: u64) -> bool {
    let bit = hash & (BITS - 1);
    bitmap[(bit / 64) as usize].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0
}

fn bench(c: &mut Criterion) {
    // 200 bytes: a typical ORM select with a few literals and an IN list.
    let sql = "SELECT u.id, u.name, u.email, o.total FROM users u JOIN orders o ON o.user_id = u.id \
               WHERE u.status = 'active' AND o.created_at > '2026-01-01' AND o.id IN (17, 42, 991) \
               ORDER BY o.total DESC LIMIT 200";
    assert_eq!(sql.len(), 200, "the statement is {} bytes", sql.len());
    let bitmap: Vec<AtomicU64> = (0..BITS / 64).map(|_| AtomicU64::new(0)).collect();
    // A few bits set, as with some blocked digests.
    for h in [1u64, 12345, 987654321] {
        bitmap[((h & (BITS - 1)) / 64) as usize].fetch_or(1 << (h % 64), Ordering::Relaxed);
    }
    let mut g = c.benchmark_group("digest");
    g.throughput(Throughput::Bytes(sql.len() as u64));
    g.bench_function("digest_200B", |b| b.iter(|| osprey_sql::digest(black_box(sql))));
    g.bench_function("digest_and_bitmap_check_200B", |b| {
        b.iter(|| {
            let d = osprey_sql::digest(black_box(sql));
            black_box(check(&bitmap, d.hash))
        })
    });
    let short = "SELECT * FROM t WHERE id = 1";
    g.throughput(Throughput::Bytes(short.len() as u64));
    g.bench_function("digest_point_select", |b| {
        b.iter(|| osprey_sql::digest(black_box(short)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

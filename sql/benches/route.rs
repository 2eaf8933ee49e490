//! Read/write classification per request: the work the router adds to every request
//! (`osprey_sql::classify::classify`, one pass of the lexer; docs/BENCHMARKS.md).
//! `cargo bench -p osprey-sql --bench route`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use osprey_sql::classify::{classify, Route};

fn bench(c: &mut Criterion) {
    let point = "SELECT * FROM t WHERE id = 1";
    // 200 bytes: the digest bench's ORM select with a join.
    let join = "SELECT u.id, u.name, u.email, o.total FROM users u JOIN orders o ON o.user_id = u.id \
                WHERE u.status = 'active' AND o.created_at > '2026-01-01' AND o.id IN (17, 42, 991) \
                ORDER BY o.total DESC LIMIT 200";
    // ~1 KB: a reporting select with several joins, a subquery, functions and a comment.
    let long = "/* report: orders by region */ SELECT r.name AS region, c.name AS country, \
                COUNT(DISTINCT o.id) AS orders, SUM(oi.quantity * oi.unit_price) AS revenue, \
                AVG(oi.quantity) AS avg_qty, MAX(o.created_at) AS last_order, \
                GROUP_CONCAT(DISTINCT p.category ORDER BY p.category SEPARATOR ', ') AS categories \
                FROM orders o JOIN order_items oi ON oi.order_id = o.id \
                JOIN products p ON p.id = oi.product_id JOIN customers cu ON cu.id = o.customer_id \
                JOIN addresses a ON a.id = cu.billing_address_id JOIN countries c ON c.code = a.country_code \
                JOIN regions r ON r.id = c.region_id LEFT JOIN refunds rf ON rf.order_id = o.id \
                WHERE o.created_at >= '2026-01-01' AND o.created_at < '2026-07-01' \
                AND o.status IN ('paid', 'shipped', 'delivered') AND rf.id IS NULL \
                AND cu.id NOT IN (SELECT customer_id FROM blocked_customers WHERE reason <> 'test') \
                AND p.category LIKE 'home%' AND COALESCE(o.discount, 0) < 0.5 \
                GROUP BY r.name, c.name HAVING SUM(oi.quantity * oi.unit_price) > 1000 \
                ORDER BY revenue DESC, region, country LIMIT 100";
    let insert = "INSERT INTO orders (customer_id, status, total, created_at) VALUES (42, 'paid', 99.50, NOW())";
    let locking = "SELECT * FROM accounts WHERE id = 7 FOR UPDATE";
    let hinted = "/* osprey:primary */ SELECT * FROM t WHERE id = 1";
    for (sql, route) in [
        (point, Route::Replica),
        (join, Route::Replica),
        (long, Route::Replica),
        (insert, Route::Primary),
        (locking, Route::Primary),
        (hinted, Route::Primary),
    ] {
        assert_eq!(classify(sql).route, route, "{sql}");
    }
    let mut g = c.benchmark_group("classify");
    for (name, sql) in [
        ("point_select", point),
        ("join_select_200B", join),
        ("long_select_1KB", long),
        ("insert", insert),
        ("locking_select", locking),
        ("hinted_select", hinted),
    ] {
        g.throughput(Throughput::Bytes(sql.len() as u64));
        g.bench_function(name, |b| b.iter(|| classify(black_box(sql))));
    }
    g.finish();
    // The lexer's share: the pieces alone, without looking at the code.
    let mut g = c.benchmark_group("pieces");
    for (name, sql) in [
        ("point_select", point),
        ("join_select_200B", join),
        ("long_select_1KB", long),
    ] {
        g.throughput(Throughput::Bytes(sql.len() as u64));
        g.bench_function(name, |b| b.iter(|| osprey_sql::pieces(black_box(sql)).count()));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

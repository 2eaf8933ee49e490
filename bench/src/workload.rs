//! The schema, the data load and the closed-loop client task.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::ValueEnum;
use hdrhistogram::Histogram;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool};
use osprey_client::{Client, Value};
use osprey_sandbox::Instance;

pub const WARMUP: u8 = 0;
pub const MEASURE: u8 = 1;
pub const STOP: u8 = 2;

/// Same SQL, same parameters, for every target (prepared statements on every path: the
/// worker and `mysql_async` both use `exec` with a statement cache).
pub const POINT_SQL: &str = "SELECT c FROM sbtest1 WHERE id = ?";
pub const RANGE_SQL: &str = "SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ?+99";
pub const INSERT_SQL: &str = "INSERT INTO sbtest_insert (k, c, pad) VALUES (?, ?, ?)";
/// sysbench `oltp_read_write`'s writes, on `sbtest1` (the delete and the insert use one id,
/// so the table keeps its rows).
pub const INDEX_UPDATE_SQL: &str = "UPDATE sbtest1 SET k = k + 1 WHERE id = ?";
pub const NON_INDEX_UPDATE_SQL: &str = "UPDATE sbtest1 SET c = ? WHERE id = ?";
pub const DELETE_SQL: &str = "DELETE FROM sbtest1 WHERE id = ?";
pub const REINSERT_SQL: &str = "INSERT INTO sbtest1 (id, k, c, pad) VALUES (?, ?, ?, ?)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// `SELECT c FROM sbtest1 WHERE id = ?`
    PointSelect,
    /// `SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ?+99` (100 rows)
    RangeSelect,
    /// A single-row INSERT into `sbtest_insert`.
    Insert,
    /// One insert for every four point selects.
    Mix,
    /// One transaction of sysbench `oltp_read_write`'s shape: BEGIN, 10 point selects, 4
    /// range selects (100 rows each), 2 updates, a delete, an insert, COMMIT. Through
    /// Osprey each is `Client::transaction()` (a session opened and a worker pinned for
    /// it, reset after it); direct and HAProxy take a pooled connection for it. A request
    /// here is a whole transaction.
    Transaction,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::PointSelect => "point-select",
            Workload::RangeSelect => "range-select",
            Workload::Insert => "insert",
            Workload::Mix => "mix",
            Workload::Transaction => "transaction",
        }
    }

    pub fn writes(self) -> bool {
        matches!(self, Workload::Insert | Workload::Mix | Workload::Transaction)
    }
}

/// xorshift64*: cheap, deterministic, good enough to spread keys.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// sysbench-style `###########-###########-...` with `groups` groups of 11 digits.
    pub fn digits(&mut self, groups: usize) -> String {
        let mut s = String::with_capacity(groups * 12);
        for g in 0..groups {
            if g > 0 {
                s.push('-');
            }
            for _ in 0..11 {
                s.push(char::from(b'0' + self.below(10) as u8));
            }
        }
        s
    }
}

/// Creates and fills `sbtest1` (multi-row INSERTs of 1000 rows) and creates `sbtest_insert`.
/// Returns the server version.
pub async fn load(primary: &Instance, rows: u32) -> anyhow::Result<String> {
    let started = Instant::now();
    let mut conn = primary.conn().await.context("connecting to the sandbox")?;
    let version: String = conn.query_first("SELECT VERSION()").await?.unwrap_or_default();
    for table in ["sbtest1", "sbtest_insert"] {
        conn.query_drop(format!(
            "CREATE TABLE {table} (id INT PRIMARY KEY AUTO_INCREMENT, k INT NOT NULL DEFAULT 0, \
             c CHAR(120) NOT NULL DEFAULT '', pad CHAR(60) NOT NULL DEFAULT '', KEY k_1 (k)) ENGINE=InnoDB"
        ))
        .await?;
    }
    let mut rng = Rng::new(42);
    let mut done = 0u32;
    while done < rows {
        let n = (rows - done).min(1000);
        let mut sql = String::with_capacity(n as usize * 200 + 64);
        sql.push_str("INSERT INTO sbtest1 (id, k, c, pad) VALUES ");
        for i in 0..n {
            if i > 0 {
                sql.push(',');
            }
            let id = done + i + 1;
            let k = rng.below(rows as u64) + 1;
            sql.push_str(&format!("({id},{k},'{}','{}')", rng.digits(10), rng.digits(5)));
        }
        conn.query_drop(sql).await?;
        done += n;
    }
    conn.query_drop("ANALYZE TABLE sbtest1").await?;
    conn.disconnect().await?;
    eprintln!(
        "loaded {rows} rows into sbtest1 in {:.1?} ({version})",
        started.elapsed()
    );
    Ok(version)
}

/// How a client task reaches the database.
pub enum Handle {
    Pool(Pool),
    Conn(Conn),
    Client(Client),
}

enum Op {
    Point(i64),
    Range(i64),
    Insert(i64),
    /// 10 point ids, 4 range starts, the 2 updated ids, the deleted-and-reinserted id.
    Txn(Box<TxnIds>),
}

struct TxnIds {
    points: [i64; 10],
    ranges: [i64; 4],
    updates: [i64; 2],
    moved: i64,
}

impl TxnIds {
    fn new(rng: &mut Rng, rows: u32) -> TxnIds {
        let mut id = || rng.below(rows as u64) as i64 + 1;
        TxnIds {
            points: std::array::from_fn(|_| id()),
            ranges: std::array::from_fn(|_| id().min(rows as i64 - 99)),
            updates: [id(), id()],
            moved: id(),
        }
    }
}

/// What one or more client tasks measured in the timed window.
pub struct TaskOut {
    pub hist: Histogram<u64>,
    pub ok: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
}

const MAX_LATENCY_US: u64 = 600_000_000;

impl TaskOut {
    pub fn new() -> TaskOut {
        TaskOut {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("histogram bounds"),
            ok: 0,
            errors: 0,
            first_errors: Vec::new(),
        }
    }

    pub fn merge(&mut self, other: TaskOut) {
        self.hist.add(&other.hist).expect("same bounds");
        self.ok += other.ok;
        self.errors += other.errors;
        for e in other.first_errors {
            if self.first_errors.len() < 5 && !self.first_errors.contains(&e) {
                self.first_errors.push(e);
            }
        }
    }
}

async fn exec_mysql(conn: &mut Conn, op: &Op, c: &str, pad: &str) -> Result<u64, mysql_async::Error> {
    if let Op::Txn(ids) = op {
        {
            conn.query_drop("BEGIN").await?;
            let mut rows = 0;
            for id in ids.points {
                rows += conn.exec::<mysql_async::Row, _, _>(POINT_SQL, (id,)).await?.len();
            }
            for id in ids.ranges {
                rows += conn.exec::<mysql_async::Row, _, _>(RANGE_SQL, (id, id)).await?.len();
            }
            conn.exec_drop(INDEX_UPDATE_SQL, (ids.updates[0],)).await?;
            conn.exec_drop(NON_INDEX_UPDATE_SQL, (c, ids.updates[1])).await?;
            conn.exec_drop(DELETE_SQL, (ids.moved,)).await?;
            conn.exec_drop(REINSERT_SQL, (ids.moved, ids.moved, c, pad)).await?;
            conn.query_drop("COMMIT").await?;
            return Ok(u64::from(rows == 10 + 400));
        }
    }
    match *op {
        Op::Txn(_) => unreachable!("above"),
        Op::Point(id) => Ok(conn.exec::<mysql_async::Row, _, _>(POINT_SQL, (id,)).await?.len() as u64),
        Op::Range(id) => Ok(conn.exec::<mysql_async::Row, _, _>(RANGE_SQL, (id, id)).await?.len() as u64),
        Op::Insert(k) => {
            conn.exec_drop(INSERT_SQL, (k, c, pad)).await?;
            Ok(conn.affected_rows())
        }
    }
}

async fn exec_osprey(client: &Client, op: &Op, c: &str, pad: &str) -> Result<u64, osprey_client::Error> {
    if let Op::Txn(ids) = op {
        let tx = client.transaction().await?;
        let mut rows = 0;
        for id in ids.points {
            rows += tx.query(POINT_SQL, &[Value::Int(id)]).await?.rows().len();
        }
        for id in ids.ranges {
            rows += tx
                .query(RANGE_SQL, &[Value::Int(id), Value::Int(id)])
                .await?
                .rows()
                .len();
        }
        tx.execute(INDEX_UPDATE_SQL, &[Value::Int(ids.updates[0])]).await?;
        tx.execute(
            NON_INDEX_UPDATE_SQL,
            &[Value::Text(c.to_owned()), Value::Int(ids.updates[1])],
        )
        .await?;
        tx.execute(DELETE_SQL, &[Value::Int(ids.moved)]).await?;
        tx.execute(
            REINSERT_SQL,
            &[
                Value::Int(ids.moved),
                Value::Int(ids.moved),
                Value::Text(c.to_owned()),
                Value::Text(pad.to_owned()),
            ],
        )
        .await?;
        tx.commit().await?;
        return Ok(u64::from(rows == 10 + 400));
    }
    match *op {
        Op::Txn(_) => unreachable!("above"),
        Op::Point(id) => Ok(client.query(POINT_SQL, &[Value::Int(id)]).await?.rows().len() as u64),
        Op::Range(id) => Ok(client
            .query(RANGE_SQL, &[Value::Int(id), Value::Int(id)])
            .await?
            .rows()
            .len() as u64),
        Op::Insert(k) => Ok(client
            .execute(
                INSERT_SQL,
                &[Value::Int(k), Value::Text(c.to_owned()), Value::Text(pad.to_owned())],
            )
            .await?
            .affected_rows),
    }
}

async fn exec(h: &mut Handle, op: &Op, c: &str, pad: &str) -> Result<u64, String> {
    match h {
        Handle::Pool(pool) => {
            let mut conn = pool.get_conn().await.map_err(|e| e.to_string())?;
            exec_mysql(&mut conn, op, c, pad).await.map_err(|e| e.to_string())
        }
        Handle::Conn(conn) => exec_mysql(conn, op, c, pad).await.map_err(|e| e.to_string()),
        Handle::Client(client) => exec_osprey(client, op, c, pad).await.map_err(|e| e.to_string()),
    }
}

/// One closed-loop client: one request in flight at a time until the phase is `STOP`.
/// Requests that complete while the phase is `MEASURE` are counted.
pub async fn client_task(mut h: Handle, wl: Workload, rows: u32, seed: u64, phase: Arc<AtomicU8>) -> (TaskOut, Handle) {
    let mut out = TaskOut::new();
    let mut rng = Rng::new(seed);
    let c = rng.digits(10);
    let pad = rng.digits(5);
    // Position in the mix's cycle of five requests (one insert, four selects).
    let mut cycle: u64 = rng.below(5);
    loop {
        if phase.load(Ordering::Relaxed) == STOP {
            break;
        }
        cycle = (cycle + 1) % 5;
        let op = match wl {
            Workload::PointSelect => Op::Point(rng.below(rows as u64) as i64 + 1),
            Workload::RangeSelect => Op::Range(rng.below(rows as u64 - 99) as i64 + 1),
            Workload::Insert => Op::Insert(rng.below(rows as u64) as i64 + 1),
            Workload::Mix if cycle == 0 => Op::Insert(rng.below(rows as u64) as i64 + 1),
            Workload::Mix => Op::Point(rng.below(rows as u64) as i64 + 1),
            Workload::Transaction => Op::Txn(Box::new(TxnIds::new(&mut rng, rows))),
        };
        let expected = match op {
            Op::Range(_) => 100,
            _ => 1,
        };
        let t0 = Instant::now();
        let r = exec(&mut h, &op, &c, &pad).await;
        let us = t0.elapsed().as_micros() as u64;
        if phase.load(Ordering::Relaxed) != MEASURE {
            continue;
        }
        let r = r.and_then(|n| {
            if n == expected {
                Ok(())
            } else {
                Err(format!("expected {expected} rows, got {n}"))
            }
        });
        match r {
            Ok(()) => {
                out.ok += 1;
                out.hist.saturating_record(us.clamp(1, MAX_LATENCY_US));
            }
            Err(e) => {
                out.errors += 1;
                if out.first_errors.is_empty() {
                    out.first_errors.push(e);
                }
            }
        }
    }
    (out, h)
}

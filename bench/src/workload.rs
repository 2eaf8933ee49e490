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
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::PointSelect => "point-select",
            Workload::RangeSelect => "range-select",
            Workload::Insert => "insert",
            Workload::Mix => "mix",
        }
    }

    pub fn writes(self) -> bool {
        matches!(self, Workload::Insert | Workload::Mix)
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
    match *op {
        Op::Point(id) => Ok(conn.exec::<mysql_async::Row, _, _>(POINT_SQL, (id,)).await?.len() as u64),
        Op::Range(id) => Ok(conn.exec::<mysql_async::Row, _, _>(RANGE_SQL, (id, id)).await?.len() as u64),
        Op::Insert(k) => {
            conn.exec_drop(INSERT_SQL, (k, c, pad)).await?;
            Ok(conn.affected_rows())
        }
    }
}

async fn exec_osprey(client: &Client, op: &Op, c: &str, pad: &str) -> Result<u64, osprey_client::Error> {
    match *op {
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

//! Point selects on ONE session: one at a time, then pipelined in groups of 4, 8 and 16
//! (send the group, then read its responses), through the binary (prepared) and the text
//! protocol; mysql_async one at a time for reference. Against a fresh sandbox MariaDB.
//! Besides q/s (which another load on the machine skews), CPU per query of this process and
//! of the server (from /proc, 100 Hz ticks), which such load skews much less.
//!
//! `cargo run --release -p osprey-wire --example pipeline_bench [-- SECONDS]`

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_sandbox::Sandbox;
use osprey_wire::{Event, Opts, Session, Value};

const ROWS: i64 = 10_000;

/// User + system CPU of a process, in seconds (`/proc/PID/stat`, fields 14 and 15).
fn cpu_secs(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of the whole line: 11 and 12 after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

struct Meter {
    server: String,
    started: Instant,
    client_cpu: f64,
    server_cpu: f64,
}

impl Meter {
    fn start(server: &str) -> Meter {
        Meter {
            server: server.to_owned(),
            started: Instant::now(),
            client_cpu: cpu_secs("self"),
            server_cpu: cpu_secs(server),
        }
    }

    fn report(&self, label: &str, queries: u64) {
        let secs = self.started.elapsed().as_secs_f64();
        let per = |cpu: f64| cpu * 1e6 / queries as f64;
        println!(
            "{label:<28} {:>9.0} q/s   client {:>5.1} µs/q   server {:>5.1} µs/q",
            queries as f64 / secs,
            per(cpu_secs("self") - self.client_cpu),
            per(cpu_secs(&self.server) - self.server_cpu),
        );
    }
}

async fn read_one(s: &mut Session) -> Result<usize, osprey_wire::Error> {
    let mut rows = 0;
    loop {
        match s.next_event().await? {
            Event::Row(_) => rows += 1,
            Event::End {
                more_results: false, ..
            } => return Ok(rows),
            _ => {}
        }
    }
}

async fn run(s: &mut Session, depth: usize, binary: bool, secs: f64) -> anyhow::Result<u64> {
    let stmt = s.prepare("SELECT c FROM sbtest WHERE id = ?").await?;
    let mut id: i64 = 0;
    let mut done = 0u64;
    let started = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    while started.elapsed() < limit {
        for _ in 0..depth {
            id = id % ROWS + 1;
            if binary {
                s.send_execute(&stmt, &[Value::Int(id)])?;
            } else {
                s.send_query(&format!("SELECT c FROM sbtest WHERE id = {id}"))?;
            }
        }
        for _ in 0..depth {
            let rows = read_one(s).await?;
            anyhow::ensure!(rows == 1, "a point select returned {rows} rows");
            done += 1;
        }
    }
    Ok(done)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let secs: f64 = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(3.0);
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut db = p.conn().await?;
    db.query_drop("CREATE TABLE sbtest (id INT PRIMARY KEY, k INT, c CHAR(120), pad CHAR(60))")
        .await?;
    db.query_drop(format!(
        "INSERT INTO sbtest SELECT seq, seq % 1000, REPEAT(CHAR(97 + seq % 26), 120), REPEAT('p', 60) \
         FROM seq_1_to_{ROWS}"
    ))
    .await?;

    let opts = Opts::new(p.host(), p.port(), p.user(), p.password()).database(p.database());
    let mut s = Session::connect(&opts).await?;
    // Warm-up.
    run(&mut s, 8, true, 0.5).await?;

    println!(
        "point select, one session, {secs} s per line (MariaDB {})",
        s.server_version_text()
    );
    let server = p.pid().map(|p| p.to_string()).unwrap_or_default();
    let stmt = db.prep("SELECT c FROM sbtest WHERE id = ?").await?;
    // mysql_async first and last: the spread between the two shows the run's noise.
    for round in 0..2 {
        if round == 1 {
            for binary in [true, false] {
                for depth in [1, 4, 8, 16] {
                    let meter = Meter::start(&server);
                    let done = run(&mut s, depth, binary, secs).await?;
                    let label = format!("{} depth {depth}", if binary { "binary" } else { "text" });
                    meter.report(&label, done);
                }
            }
        }
        let meter = Meter::start(&server);
        let mut n = 0u64;
        while meter.started.elapsed().as_secs_f64() < secs {
            let _: Option<String> = db.exec_first(&stmt, (n as i64 % ROWS + 1,)).await?;
            n += 1;
        }
        meter.report("mysql_async, one at a time", n);
    }
    Ok(())
}

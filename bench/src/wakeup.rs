//! The machine's cost of waking another thread, measured at the start of a run: every
//! ratio between the targets depends on it (a direct query wakes two processes, one
//! through HAProxy four, one through Osprey six), and it differs from guest to guest.
//!
//! Built in: two threads ping-pong one byte over a Unix socketpair, each blocking in
//! `read` until the other writes, so a round trip is two wake-ups (what `perf bench sched
//! pipe` measures between two processes; the scheduler places the threads as it likes).
//! Beside it, `perf bench sched pipe` itself when a `perf` binary is on `PATH`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

/// Batches the rounds are split into, to show how steady the figure is.
const BATCHES: u64 = 5;

#[derive(Debug, Clone, Serialize)]
pub struct WakeupCost {
    /// Round trips timed (after 1/10 as many untimed).
    pub rounds: u64,
    /// Mean µs per round trip over all rounds.
    pub round_trip_us: f64,
    /// Half a round trip: one wake-up of a blocked thread by another.
    pub wakeup_us: f64,
    /// µs per round trip of each of the batches, lowest and highest.
    pub batch_min_us: f64,
    pub batch_max_us: f64,
    /// `perf bench sched pipe`, when `perf` is on `PATH`.
    pub perf_sched_pipe: Option<PerfPipe>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PerfPipe {
    pub command: String,
    /// Its `usecs/op`: µs per round trip between two processes over two pipes.
    pub round_trip_us: Option<f64>,
    /// Why there is no figure (perf failed, or printed none).
    pub error: Option<String>,
}

impl WakeupCost {
    /// One line for the header of the report.
    pub fn text(&self) -> String {
        let mut s = format!(
            "wake-up cost (at start): {:.1} µs per round trip between two threads over a socketpair, \
             {:.1} µs per wake-up ({} round trips, batches {:.1}..{:.1} µs)",
            self.round_trip_us, self.wakeup_us, self.rounds, self.batch_min_us, self.batch_max_us
        );
        match &self.perf_sched_pipe {
            Some(PerfPipe {
                command,
                round_trip_us: Some(us),
                ..
            }) => s.push_str(&format!("; `{command}`: {us:.1} µs per round trip")),
            Some(PerfPipe {
                command,
                error: Some(e),
                ..
            }) => s.push_str(&format!("; `{command}` failed: {e}")),
            _ => s.push_str("; perf not found"),
        }
        s
    }
}

/// Ping-pongs a byte `rounds` times (split in batches) and runs `perf bench sched pipe`
/// for as many loops if `perf` is there.
pub fn measure(rounds: u64) -> anyhow::Result<WakeupCost> {
    let batch = (rounds / BATCHES).max(1);
    let (mut a, mut b) = UnixStream::pair().context("socketpair")?;
    let echo = std::thread::Builder::new()
        .name("wakeup-echo".into())
        .spawn(move || -> std::io::Result<()> {
            let mut byte = [0u8; 1];
            loop {
                if b.read(&mut byte)? == 0 {
                    return Ok(());
                }
                b.write_all(&byte)?;
            }
        })
        .context("spawning the echo thread")?;
    let mut round_trips = |n: u64| -> anyhow::Result<f64> {
        let mut byte = [7u8; 1];
        let t0 = Instant::now();
        for _ in 0..n {
            a.write_all(&byte)?;
            a.read_exact(&mut byte)?;
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    round_trips((batch * BATCHES / 10).max(1))?;
    let batches = (0..BATCHES)
        .map(|_| round_trips(batch))
        .collect::<anyhow::Result<Vec<f64>>>()?;
    drop(a);
    echo.join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))?
        .context("echo thread")?;
    let round_trip_us = batches.iter().sum::<f64>() / batches.len() as f64;
    Ok(WakeupCost {
        rounds: batch * BATCHES,
        round_trip_us,
        wakeup_us: round_trip_us / 2.0,
        batch_min_us: batches.iter().copied().fold(f64::INFINITY, f64::min),
        batch_max_us: batches.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        perf_sched_pipe: perf_binary().map(|perf| perf_sched_pipe(&perf, batch * BATCHES)),
    })
}

fn perf_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("perf"))
        .find(|p| p.is_file())
}

fn perf_sched_pipe(perf: &std::path::Path, loops: u64) -> PerfPipe {
    let loops = loops.to_string();
    let args = ["bench", "sched", "pipe", "-l", &loops];
    let command = format!("perf {}", args.join(" "));
    match Command::new(perf).args(args).output() {
        Ok(o) => {
            let stdout = String::from_utf8_lossy(&o.stdout);
            match parse_usecs_per_op(&stdout) {
                Some(us) if o.status.success() => PerfPipe {
                    command,
                    round_trip_us: Some(us),
                    error: None,
                },
                _ => PerfPipe {
                    command,
                    round_trip_us: None,
                    error: Some(format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim())),
                },
            }
        }
        Err(e) => PerfPipe {
            command,
            round_trip_us: None,
            error: Some(e.to_string()),
        },
    }
}

/// The `N usecs/op` figure of `perf bench sched pipe`'s output.
pub fn parse_usecs_per_op(out: &str) -> Option<f64> {
    out.lines()
        .find_map(|l| l.trim().strip_suffix("usecs/op"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_output() {
        let out = "# Running 'sched/pipe' benchmark:\n\
                   # Executed 1000 pipe operations between two processes\n\n     \
                   Total time: 0.047 [sec]\n\n      47.948000 usecs/op\n          20855 ops/sec\n";
        assert_eq!(parse_usecs_per_op(out), Some(47.948));
        assert_eq!(parse_usecs_per_op("Total time: 0.047 [sec]\n"), None);
    }

    #[test]
    fn a_short_measurement() {
        let w = measure(500).expect("measure");
        assert_eq!(w.rounds, 500);
        assert!(w.round_trip_us > 0.0 && w.round_trip_us.is_finite(), "{w:?}");
        assert!(
            w.batch_min_us <= w.round_trip_us && w.round_trip_us <= w.batch_max_us,
            "{w:?}"
        );
        assert_eq!(w.wakeup_us, w.round_trip_us / 2.0);
        assert!(w.text().contains("µs per wake-up"));
    }
}

//! CPU time of processes from `/proc/<pid>/stat` (fields 14 `utime` and 15 `stime`, in
//! clock ticks), and the discovery of the dispatcher's worker processes.

use std::collections::HashMap;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, usually 100).
pub fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Fields of `/proc/<pid>/stat` after the `(comm)` field: index 0 is field 3 (`state`).
fn stat_fields(pid: &str) -> Option<(String, Vec<String>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let rest = stat[close + 1..].split_whitespace().map(str::to_owned).collect();
    Some((comm, rest))
}

/// utime + stime of one process (all its threads), in ticks.
pub fn ticks(pid: u32) -> Option<u64> {
    ticks_of(&pid.to_string())
}

/// utime + stime of this process.
pub fn self_ticks() -> u64 {
    ticks_of("self").unwrap_or(0)
}

fn ticks_of(pid: &str) -> Option<u64> {
    let (_, f) = stat_fields(pid)?;
    // Field 14 is utime, 15 stime; f[0] is field 3.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `osprey-worker` processes whose parent is `parent`, with their ticks.
pub fn worker_ticks(parent: u32) -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(pid) = name.parse::<u32>() else { continue };
        let Some((comm, f)) = stat_fields(name) else { continue };
        if comm != "osprey-worker" {
            continue;
        }
        // f[1] is field 4, the parent pid.
        if f.get(1).and_then(|p| p.parse::<u32>().ok()) != Some(parent) {
            continue;
        }
        let t = f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        out.insert(pid, t);
    }
    out
}

/// Machine-wide busy and steal ticks (all CPUs) from the `cpu` line of `/proc/stat`:
/// busy = user + nice + system + irq + softirq.
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    (at(0) + at(1) + at(2) + at(5) + at(6), at(7))
}

/// The processes whose CPU time a run accounts for.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    pub dispatcher: Option<u32>,
    pub mariadb: Option<u32>,
    pub haproxy: Option<u32>,
}

/// CPU ticks of every watched process at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    loadgen: u64,
    dispatcher: Option<u64>,
    workers: HashMap<u32, u64>,
    mariadb: Option<u64>,
    haproxy: Option<u64>,
    machine_busy: u64,
    machine_steal: u64,
}

impl Snapshot {
    pub fn take(w: &Watched) -> Snapshot {
        Snapshot {
            loadgen: self_ticks(),
            dispatcher: w.dispatcher.and_then(ticks),
            workers: w.dispatcher.map(worker_ticks).unwrap_or_default(),
            mariadb: w.mariadb.and_then(ticks),
            haproxy: w.haproxy.and_then(ticks),
            machine_busy: machine_ticks().0,
            machine_steal: machine_ticks().1,
        }
    }
}

/// CPU seconds spent by each watched process between two snapshots.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSeconds {
    pub loadgen: f64,
    pub dispatcher: Option<f64>,
    pub workers: Option<f64>,
    pub mariadb: Option<f64>,
    pub haproxy: Option<f64>,
    /// CPU seconds used by every other process on the machine (other engineers' builds
    /// and tests): machine-wide busy time minus all the processes above.
    pub background: f64,
    /// CPU seconds stolen by the hypervisor.
    pub steal: f64,
}

pub fn delta(a: &Snapshot, b: &Snapshot) -> CpuSeconds {
    let hz = clk_tck() as f64;
    let d = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (Some(x), Some(y)) => Some(y.saturating_sub(x) as f64 / hz),
        _ => None,
    };
    let workers = if b.workers.is_empty() && a.workers.is_empty() {
        None
    } else {
        // A worker started inside the window counts from zero.
        let t: u64 = b
            .workers
            .iter()
            .map(|(pid, end)| end.saturating_sub(a.workers.get(pid).copied().unwrap_or(0)))
            .sum();
        Some(t as f64 / hz)
    };
    let loadgen = b.loadgen.saturating_sub(a.loadgen) as f64 / hz;
    let dispatcher = d(a.dispatcher, b.dispatcher);
    let mariadb = d(a.mariadb, b.mariadb);
    let haproxy = d(a.haproxy, b.haproxy);
    let ours = loadgen
        + [dispatcher, workers, mariadb, haproxy]
            .iter()
            .map(|x| x.unwrap_or(0.0))
            .sum::<f64>();
    let busy = b.machine_busy.saturating_sub(a.machine_busy) as f64 / hz;
    CpuSeconds {
        loadgen,
        dispatcher,
        workers,
        mariadb,
        haproxy,
        background: (busy - ours).max(0.0),
        steal: b.machine_steal.saturating_sub(a.machine_steal) as f64 / hz,
    }
}

/// `/proc/loadavg`'s 1-minute figure.
pub fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ticks_are_readable() {
        assert!(ticks(std::process::id()).is_some());
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(self_ticks() > 0);
    }
}

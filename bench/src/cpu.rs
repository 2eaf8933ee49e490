//! What each process group of a run spent between two snapshots: user and system CPU time
//! and context switches (voluntary and involuntary, every thread), and the machine's
//! busy time, steal and context switches.
//!
//! The groups: the load generator (this process, from `getrusage(RUSAGE_SELF)`, which
//! counts its exited threads too), the dispatcher, its `osprey-worker` children, `mariadbd`
//! and HAProxy (from `/proc`, see [`crate::procstat`]).

use std::collections::HashMap;

use crate::procstat::{self, Switches};

/// The processes whose usage a run accounts for.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    pub dispatcher: Option<u32>,
    pub mariadb: Option<u32>,
    pub haproxy: Option<u32>,
}

/// What a group of processes spent between two snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub user_s: f64,
    pub system_s: f64,
    pub voluntary: u64,
    pub involuntary: u64,
}

impl Usage {
    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.system_s
    }
}

/// One group's counters at one instant: each process's CPU ticks (user, system) by pid,
/// each live thread's context switches by thread id.
#[derive(Debug, Clone, Default)]
pub struct GroupSample {
    procs: HashMap<u32, (u64, u64)>,
    threads: HashMap<u32, Switches>,
}

impl GroupSample {
    pub fn take(pids: &[u32]) -> GroupSample {
        let mut g = GroupSample::default();
        for &pid in pids {
            if let Some(s) = procstat::stat(pid) {
                g.procs.insert(pid, (s.utime, s.stime));
                g.threads.extend(procstat::thread_switches(pid));
            }
        }
        g
    }

    /// Usage from `before` to `self`. A process or thread that appeared in between counts
    /// from zero; one that is gone at the end counts nothing (its last counts are lost with
    /// it, so the figure may be low, never negative).
    pub fn since(&self, before: &GroupSample, hz: f64) -> Usage {
        let mut user = 0u64;
        let mut system = 0u64;
        for (pid, &(u, s)) in &self.procs {
            let (u0, s0) = before.procs.get(pid).copied().unwrap_or((0, 0));
            user += u.saturating_sub(u0);
            system += s.saturating_sub(s0);
        }
        let mut switches = Switches::default();
        for (tid, end) in &self.threads {
            let start = before.threads.get(tid).copied().unwrap_or_default();
            switches.voluntary += end.voluntary.saturating_sub(start.voluntary);
            switches.involuntary += end.involuntary.saturating_sub(start.involuntary);
        }
        Usage {
            user_s: user as f64 / hz,
            system_s: system as f64 / hz,
            voluntary: switches.voluntary,
            involuntary: switches.involuntary,
        }
    }
}

/// This process's own usage, every thread (live and exited), µs precision.
#[derive(Debug, Clone, Copy, Default)]
struct SelfSample {
    user_us: u64,
    system_us: u64,
    switches: Switches,
}

impl SelfSample {
    fn take() -> SelfSample {
        // SAFETY: getrusage writes the struct it is given; a zeroed rusage is valid.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return SelfSample::default();
        }
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        SelfSample {
            user_us: us(ru.ru_utime),
            system_us: us(ru.ru_stime),
            switches: Switches {
                voluntary: ru.ru_nvcsw as u64,
                involuntary: ru.ru_nivcsw as u64,
            },
        }
    }

    fn since(&self, before: &SelfSample) -> Usage {
        Usage {
            user_s: self.user_us.saturating_sub(before.user_us) as f64 / 1e6,
            system_s: self.system_us.saturating_sub(before.system_us) as f64 / 1e6,
            voluntary: self.switches.voluntary.saturating_sub(before.switches.voluntary),
            involuntary: self.switches.involuntary.saturating_sub(before.switches.involuntary),
        }
    }
}

/// Every watched group's counters at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    loadgen: SelfSample,
    dispatcher: Option<GroupSample>,
    workers: Option<GroupSample>,
    mariadb: Option<GroupSample>,
    haproxy: Option<GroupSample>,
    machine: procstat::Machine,
}

impl Snapshot {
    pub fn take(w: &Watched) -> Snapshot {
        let one = |pid: Option<u32>| pid.map(|p| GroupSample::take(&[p]));
        Snapshot {
            loadgen: SelfSample::take(),
            dispatcher: one(w.dispatcher),
            workers: w
                .dispatcher
                .map(|d| GroupSample::take(&procstat::children_named(d, "osprey-worker"))),
            mariadb: one(w.mariadb),
            haproxy: one(w.haproxy),
            machine: procstat::machine(),
        }
    }
}

/// What each watched group spent between two snapshots (`None`: not watched).
#[derive(Debug, Clone, Copy, Default)]
pub struct Delta {
    pub loadgen: Usage,
    pub dispatcher: Option<Usage>,
    pub workers: Option<Usage>,
    pub mariadb: Option<Usage>,
    pub haproxy: Option<Usage>,
    /// CPU seconds used by every other process on the machine (other engineers' builds
    /// and tests): machine-wide busy time minus all the groups above.
    pub background: f64,
    /// CPU seconds stolen by the hypervisor.
    pub steal: f64,
    /// Context switches of the whole machine (`/proc/stat` `ctxt`), every process.
    pub machine_ctxt: u64,
}

pub fn delta(a: &Snapshot, b: &Snapshot) -> Delta {
    let hz = procstat::clk_tck() as f64;
    let group = |x: &Option<GroupSample>, y: &Option<GroupSample>| match (x, y) {
        (Some(x), Some(y)) => Some(y.since(x, hz)),
        _ => None,
    };
    let loadgen = b.loadgen.since(&a.loadgen);
    let dispatcher = group(&a.dispatcher, &b.dispatcher);
    let workers = group(&a.workers, &b.workers);
    let mariadb = group(&a.mariadb, &b.mariadb);
    let haproxy = group(&a.haproxy, &b.haproxy);
    let ours = loadgen.cpu_s()
        + [dispatcher, workers, mariadb, haproxy]
            .iter()
            .flatten()
            .map(Usage::cpu_s)
            .sum::<f64>();
    let busy = b.machine.busy.saturating_sub(a.machine.busy) as f64 / hz;
    Delta {
        loadgen,
        dispatcher,
        workers,
        mariadb,
        haproxy,
        background: (busy - ours).max(0.0),
        steal: b.machine.steal.saturating_sub(a.machine.steal) as f64 / hz,
        machine_ctxt: b.machine.ctxt.saturating_sub(a.machine.ctxt),
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

    fn sample(procs: &[(u32, u64, u64)], threads: &[(u32, u64, u64)]) -> GroupSample {
        GroupSample {
            procs: procs.iter().map(|&(p, u, s)| (p, (u, s))).collect(),
            threads: threads
                .iter()
                .map(|&(t, v, i)| {
                    (
                        t,
                        Switches {
                            voluntary: v,
                            involuntary: i,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn group_usage_counts_new_threads_from_zero_and_gone_ones_as_nothing() {
        // pid 10 (threads 10, 11) throughout; thread 12 exits; pid 20 (thread 20) starts
        // inside the window.
        let before = sample(&[(10, 100, 50)], &[(10, 5, 1), (11, 7, 0), (12, 1000, 9)]);
        let after = sample(&[(10, 130, 60), (20, 4, 2)], &[(10, 9, 1), (11, 17, 3), (20, 6, 1)]);
        let u = after.since(&before, 100.0);
        assert_eq!(
            u,
            Usage {
                user_s: (30 + 4) as f64 / 100.0,
                system_s: (10 + 2) as f64 / 100.0,
                voluntary: 4 + 10 + 6,
                involuntary: 3 + 1,
            }
        );
        // Backwards: counters that fell count nothing (never negative); thread 12, only in
        // the end sample here, counts whole.
        let u = before.since(&after, 100.0);
        assert_eq!((u.voluntary, u.involuntary), (1000, 9));
        assert_eq!(u.user_s, 0.0);
    }

    #[test]
    fn own_usage_is_readable() {
        let w = Watched {
            mariadb: Some(std::process::id()),
            ..Watched::default()
        };
        let a = Snapshot::take(&w);
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let d = delta(&a, &Snapshot::take(&w));
        assert!(d.loadgen.cpu_s() > 0.0, "{d:?}");
        assert!(d.loadgen.voluntary >= 1, "the sleep is a voluntary switch: {d:?}");
        assert!(d.mariadb.is_some() && d.dispatcher.is_none() && d.workers.is_none());
        assert!(d.machine_ctxt >= 1, "{d:?}");
    }
}

//! Reading `/proc`: a process's user and system CPU time (`/proc/<pid>/stat`), each of its
//! threads' context switches (`/proc/<pid>/task/<tid>/status`), the machine's
//! (`/proc/stat`), and the children of a process by name. The parsers take the text, so
//! that they can be tested without the files.

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

/// What `/proc/<pid>/stat` says of a process (all its threads, the exited ones included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub comm: String,
    pub ppid: u32,
    /// Field 14, clock ticks.
    pub utime: u64,
    /// Field 15, clock ticks.
    pub stime: u64,
}

/// Parses one `/proc/<pid>/stat` line. `comm` may hold spaces and parentheses: it runs
/// from the first `(` to the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    // f[0] is field 3 (state): field n is f[n - 3].
    let f: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    Some(Stat {
        comm,
        ppid: f.get(1)?.parse().ok()?,
        utime: f.get(11)?.parse().ok()?,
        stime: f.get(12)?.parse().ok()?,
    })
}

pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Context switches of one thread: voluntary (it blocked, and something had to wake it)
/// and involuntary (preempted while runnable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Switches {
    pub voluntary: u64,
    pub involuntary: u64,
}

/// `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of a `/proc/.../status` text.
pub fn parse_status_switches(text: &str) -> Option<Switches> {
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(Switches {
        voluntary: field("voluntary_ctxt_switches")?,
        involuntary: field("nonvoluntary_ctxt_switches")?,
    })
}

/// Every live thread of `pid` with its context switches, by thread id. `/proc/<pid>/status`
/// alone would give the main thread's only; a thread that exited is gone from here.
pub fn thread_switches(pid: u32) -> HashMap<u32, Switches> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        if let Some(s) = parse_status_switches(&text) {
            out.insert(tid, s);
        }
    }
    out
}

/// What `/proc/stat` says of the whole machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Machine {
    /// user + nice + system + irq + softirq over all CPUs, ticks.
    pub busy: u64,
    /// Time stolen by the hypervisor, ticks.
    pub steal: u64,
    /// Context switches since boot, all CPUs (`ctxt`).
    pub ctxt: u64,
}

pub fn parse_machine(text: &str) -> Machine {
    let mut m = Machine::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cpu ") {
            let f: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            let at = |i: usize| f.get(i).copied().unwrap_or(0);
            m.busy = at(0) + at(1) + at(2) + at(5) + at(6);
            m.steal = at(7);
        } else if let Some(rest) = line.strip_prefix("ctxt ") {
            m.ctxt = rest.trim().parse().unwrap_or(0);
        }
    }
    m
}

pub fn machine() -> Machine {
    parse_machine(&std::fs::read_to_string("/proc/stat").unwrap_or_default())
}

/// Processes named `comm` whose parent is `parent`.
pub fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|s| s.comm == comm && s.ppid == parent))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_a_tricky_comm() {
        let line = "4242 (osprey (x) w) S 17 4242 17 0 -1 4194560 1190 0 0 0 731 205 0 0 20 0 2 0 \
                    9999 12345678 2000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                comm: "osprey (x) w".into(),
                ppid: 17,
                utime: 731,
                stime: 205,
            })
        );
        assert_eq!(parse_stat("4242 (cut) S 1 2"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn status_switches() {
        let text = "Name:\tmariadbd\nState:\tS (sleeping)\nThreads:\t21\n\
                    voluntary_ctxt_switches:\t123456\nnonvoluntary_ctxt_switches:\t789\n";
        assert_eq!(
            parse_status_switches(text),
            Some(Switches {
                voluntary: 123_456,
                involuntary: 789
            })
        );
        // A kernel without the fields, or a truncated read.
        assert_eq!(parse_status_switches("Name:\tx\nvoluntary_ctxt_switches:\t1\n"), None);
        assert_eq!(parse_status_switches(""), None);
    }

    #[test]
    fn machine_line() {
        let text = "cpu  100 5 50 9000 7 3 2 11 0 0\ncpu0 50 2 25 4500 3 1 1 5 0 0\n\
                    intr 1 2 3\nctxt 987654321\nbtime 1700000000\nprocesses 4242\n";
        assert_eq!(
            parse_machine(text),
            Machine {
                busy: 100 + 5 + 50 + 3 + 2,
                steal: 11,
                ctxt: 987_654_321
            }
        );
        assert_eq!(parse_machine(""), Machine::default());
    }

    #[test]
    fn this_process_is_readable() {
        let me = stat(std::process::id()).expect("own stat");
        assert!(!me.comm.is_empty());
        let threads = thread_switches(std::process::id());
        assert!(threads.contains_key(&std::process::id()), "{threads:?}");
        assert!(machine().ctxt > 0);
    }
}

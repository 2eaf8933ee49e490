//! File descriptors. The soft `RLIMIT_NOFILE` is raised to the hard limit at start, and
//! a reserve is kept out of the client cap for what the dispatcher itself needs — worker
//! sockets and processes, respawns, the admin port — so that no number of clients can
//! make a respawn fail with EMFILE (seen from outside: 20k idle admin connections left a
//! killed worker unreplaced and new clients without HELLO_ACK).
//!
//! ```text
//! reserve                        = FIXED_MARGIN + admin.max_connections
//!                                  + PER_SLOT * (max(MIN_RESERVED_SLOTS, pool.size, pool.max) * clusters
//!                                                + read slots)
//! default max_client_connections = RLIMIT_NOFILE - reserve
//! ```

use std::io;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{info, warn};

use crate::config::Config;
use crate::metrics::Metrics;

/// Descriptors for everything that is neither a client, an admin connection nor a slot:
/// stdio, the three listeners, the runtime's epoll/eventfd/signal pipe, the embedded
/// sandbox's processes and files, the credentials file, and the one descriptor a
/// connection over a cap takes between accept and close.
pub const FIXED_MARGIN: usize = 64;
/// Per slot: the worker's socket and its process handle (pidfd) while it runs, plus
/// what a spawn holds for a moment (the exec-error pipe, the stdin pipe, /dev/null),
/// with room to spare. Measured: 2 per running worker (`docs/OPERATIONS.md`).
pub const PER_SLOT: usize = 8;
/// Write slots per cluster reserved for even when the configured pool is smaller, so
/// that the pool can be grown live (admin `POST /pool/size`) to this size without
/// lowering the client cap. The read slots come on top: a resize leaves them as they are.
pub const MIN_RESERVED_SLOTS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum FdError {
    #[error(
        "limits.max_client_connections = {configured} leaves no file descriptors in reserve: the file limit \
         (RLIMIT_NOFILE) is {limit} and the dispatcher keeps {reserve} for itself ({FIXED_MARGIN} + \
         admin.max_connections {admin} + {PER_SLOT} x {slots} slots), so at most {max} client connections fit; \
         lower it, raise the hard limit (systemd LimitNOFILE=, ulimit -Hn), or leave it out to derive it"
    )]
    NoReserve {
        configured: usize,
        limit: usize,
        reserve: usize,
        admin: usize,
        slots: usize,
        max: usize,
    },
    #[error(
        "the file limit (RLIMIT_NOFILE) {limit} is below the dispatcher's own reserve of {reserve} \
         ({FIXED_MARGIN} + admin.max_connections {admin} + {PER_SLOT} x {slots} slots): no client could \
         connect; raise the hard limit (systemd LimitNOFILE=, ulimit -Hn) or shrink the pool"
    )]
    LimitTooLow {
        limit: usize,
        reserve: usize,
        admin: usize,
        slots: usize,
    },
}

/// The soft and hard `RLIMIT_NOFILE`, before and after [`raise_nofile_limit`].
#[derive(Debug, Clone, Copy)]
pub struct NofileLimit {
    pub soft_before: u64,
    pub hard: u64,
    pub soft: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (an unlimited hard limit is capped
/// at `fs.nr_open`, above which the kernel refuses). A failure leaves the soft limit as
/// it was and is returned in `soft`.
pub fn raise_nofile_limit() -> io::Result<NofileLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let soft_before = lim.rlim_cur;
    let mut target = lim.rlim_max;
    if target == libc::RLIM_INFINITY {
        target = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20);
    }
    let mut soft = soft_before;
    if target > lim.rlim_cur {
        let new = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            soft = target;
        } else {
            warn!(
                "cannot raise the soft file limit from {soft_before} to {target}: {}",
                io::Error::last_os_error()
            );
        }
    }
    Ok(NofileLimit {
        soft_before,
        hard: lim.rlim_max,
        soft,
    })
}

/// The file-descriptor plan the dispatcher runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FdBudget {
    /// The soft `RLIMIT_NOFILE` (after raising it).
    pub limit: usize,
    /// Descriptors kept out of the client cap (see the module docs).
    pub reserve: usize,
    /// Client connections held at once.
    pub max_client_connections: usize,
}

/// Slots the reserve is sized for when each cluster may run `size` write slots: at least
/// [`MIN_RESERVED_SLOTS`] write slots per cluster, plus every read slot. (The read slots
/// were once inside the 64: the embedded default's 4 + 8 slots reserved 640, and a live
/// resize to 64, which needs 64 + 8, was refused.)
fn reserved_slots(config: &Config, size: usize) -> usize {
    size.max(MIN_RESERVED_SLOTS)
        .saturating_mul(config.slot_groups())
        .saturating_add(config.max_read_slots())
}

/// The reserve for `config` with up to `size` write slots per cluster. Saturating:
/// `pool.size` has no upper bound in the config, and a pool whose reserve overflows must
/// come out as "does not fit", not as a panic or a wrapped, tiny reserve.
pub fn reserve_for(config: &Config, size: usize) -> usize {
    FIXED_MARGIN
        .saturating_add(config.admin.max_connections)
        .saturating_add(PER_SLOT.saturating_mul(reserved_slots(config, size)))
}

impl FdBudget {
    /// The budget of `config` under a file limit of `limit`: the client cap is the
    /// configured one if it leaves the reserve, else an error; absent, the limit minus
    /// the reserve.
    pub fn plan(config: &Config, limit: u64) -> Result<FdBudget, FdError> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let size = config.max_write_slots();
        let reserve = reserve_for(config, size);
        let room = limit.saturating_sub(reserve);
        if room == 0 {
            return Err(FdError::LimitTooLow {
                limit,
                reserve,
                admin: config.admin.max_connections,
                slots: reserved_slots(config, size),
            });
        }
        let max_client_connections = match config.limits.max_client_connections {
            None => room,
            Some(c) if c <= room => c,
            Some(c) => {
                return Err(FdError::NoReserve {
                    configured: c,
                    limit,
                    reserve,
                    admin: config.admin.max_connections,
                    slots: reserved_slots(config, size),
                    max: room,
                })
            }
        };
        Ok(FdBudget {
            limit,
            reserve,
            max_client_connections,
        })
    }

    /// Whether a pool of `size` write slots per cluster (the read slots as configured)
    /// still keeps its reserve beside this budget's client cap (a live resize, or a
    /// SIGHUP reload that keeps the running client cap).
    pub fn fits(&self, config: &Config, size: usize) -> Result<(), FdError> {
        let reserve = reserve_for(config, size);
        if self.max_client_connections.saturating_add(reserve) <= self.limit {
            return Ok(());
        }
        Err(FdError::NoReserve {
            configured: self.max_client_connections,
            limit: self.limit,
            reserve,
            admin: config.admin.max_connections,
            slots: reserved_slots(config, size),
            max: self.limit.saturating_sub(reserve),
        })
    }

    /// Whether a SIGHUP may apply `new` while `running` is what the process started with.
    /// The client cap and `[admin]` stay as started until a restart, so the new file's own
    /// plan must be sound and its pool must fit beside the running client cap and the
    /// running admin cap (the new file's `admin.max_connections` is not in force yet).
    pub fn check_reload(&self, running: &Config, new: &Config) -> Result<(), FdError> {
        FdBudget::plan(new, self.limit as u64)?;
        self.fits(running, new.max_write_slots())
    }
}

/// Descriptors this process holds now (entries of `/proc/self/fd`, less the one the
/// listing itself opens).
pub fn open_count() -> Option<usize> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count();
    Some(n.saturating_sub(1))
}

/// Pause after an accept() that failed for lack of a resource: the pending connection
/// stays in the backlog, so retrying at once fails the same way at full CPU.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Lets a log line through at most once a second, counting the events in between: a
/// flood must not turn into a flood of log lines.
#[derive(Default)]
pub struct LogThrottle {
    last: Option<Instant>,
    events: u64,
}

impl LogThrottle {
    /// Counts one event; `Some(events since the last line)` when a line may be logged now.
    pub fn event(&mut self) -> Option<u64> {
        self.events += 1;
        if self.last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.events))
    }
}

/// What an accept loop does when accept() fails: EMFILE, ENFILE, ENOBUFS, ENOMEM and
/// any error not known to concern one connection pause for [`ACCEPT_BACKOFF`] and go
/// on; an error that concerns only the one connection (ECONNABORTED, a reset before
/// accept, see [`pauses_after`]) goes on at once. Either is counted
/// in `osprey_accept_errors_total{listener}` and logged at most once a second. The loop
/// never ends on an error.
pub struct AcceptErrors {
    listener: &'static str,
    log: LogThrottle,
}

impl AcceptErrors {
    pub fn new(listener: &'static str) -> AcceptErrors {
        AcceptErrors {
            listener,
            log: LogThrottle::default(),
        }
    }

    pub async fn failed(&mut self, e: &io::Error, metrics: &Metrics) {
        metrics.accept_error(self.listener);
        let exhausted = pauses_after(e);
        if let Some(failures) = self.log.event() {
            warn!(
                listener = self.listener,
                failures,
                "accept failed: {e}{}",
                if exhausted {
                    "; pausing before the next accept"
                } else {
                    ""
                }
            );
        }
        if exhausted {
            tokio::time::sleep(ACCEPT_BACKOFF).await;
        }
    }
}

/// Whether an accept loop pauses after `e`: always, except after an error about the one
/// pending connection (aborted or reset before accept, or a network error Linux passes
/// on from it, see accept(2)), after which the next accept may well succeed. An error
/// not known to be per-connection may fail every call the same way (EBADF, EINVAL...):
/// retrying it at once would spin at full CPU.
fn pauses_after(e: &io::Error) -> bool {
    !matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::ECONNRESET
                | libc::EPROTO
                | libc::EPERM
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
                | libc::ETIMEDOUT
        )
    )
}

/// Raises the soft file limit, logs both limits, and plans the budget for `config`.
pub fn start(config: &Config) -> anyhow::Result<FdBudget> {
    let limit = match raise_nofile_limit() {
        Ok(l) => {
            info!(
                soft_before = l.soft_before,
                hard = l.hard,
                soft = l.soft,
                "file limit (RLIMIT_NOFILE)"
            );
            l.soft
        }
        Err(e) => anyhow::bail!("cannot read the file limit (RLIMIT_NOFILE): {e}"),
    };
    let budget = FdBudget::plan(config, limit)?;
    info!(
        limit = budget.limit,
        reserve = budget.reserve,
        max_client_connections = budget.max_client_connections,
        derived = config.limits.max_client_connections.is_none(),
        "file descriptors planned"
    );
    Ok(budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with one `[backend]` (write slots only) and `toml`.
    fn config(toml: &str) -> Config {
        let c: Config = toml::from_str(&format!("{toml}\n[backend]\nhost = \"127.0.0.1\"\nuser = \"app\"\n")).unwrap();
        c.validate().unwrap();
        c
    }

    /// The embedded default (a sandbox primary and two replicas, read/write split on)
    /// reserves for its read slots too: `replica_size` (default `size`) on each replica.
    #[test]
    fn the_embedded_defaults_read_slots_are_in_the_reserve() {
        let c: Config = toml::from_str("[pool]\nsize = 100\n").unwrap();
        c.validate().unwrap();
        assert_eq!(
            FdBudget::plan(&c, 20_000).unwrap().reserve,
            64 + 64 + 8 * (100 + 2 * 100)
        );
        let c: Config = toml::from_str("[pool]\nsize = 100\nreplica_size = 10\n").unwrap();
        assert_eq!(
            FdBudget::plan(&c, 20_000).unwrap().reserve,
            64 + 64 + 8 * (100 + 2 * 10)
        );
    }

    /// Issue 20: CONFIG.md says the embedded default (4 write slots, 2 replicas x 4 read
    /// slots) can grow to 64 live; its reserve (640) left out the 8 read slots, and
    /// `POST /pool/size {"size":64}` was refused (it needs 8 x 72). The resize handler
    /// asks `fits` exactly this.
    #[test]
    fn the_embedded_default_grows_to_64_live() {
        let c: Config = toml::from_str("").unwrap();
        c.validate().unwrap();
        assert_eq!(c.max_read_slots(), 8);
        let b = FdBudget::plan(&c, 20_000).unwrap();
        assert_eq!(b.reserve, 64 + 64 + 8 * (64 + 8));
        assert_eq!(b.max_client_connections, 20_000 - 704);
        b.fits(&c, 64).unwrap();
        assert!(b.fits(&c, 65).is_err());
        // Under a small limit too: the cap leaves room for the documented growth.
        let b = FdBudget::plan(&c, 1024).unwrap();
        b.fits(&c, 64).unwrap();
        // Each cluster can grow to 64: two clusters reserve 2 x 64 write slots.
        let one = "[[cluster]]\nname = \"a\"\nuser = \"u\"\n[[cluster.member]]\nname = \"m\"\nhost = \"h\"\n";
        let two = format!("{one}{}", one.replace("\"a\"", "\"b\""));
        let c: Config = toml::from_str(&two).unwrap();
        c.validate().unwrap();
        let b = FdBudget::plan(&c, 20_000).unwrap();
        assert_eq!(b.reserve, 64 + 64 + 8 * 128);
        b.fits(&c, 64).unwrap();
    }

    #[test]
    fn default_cap_is_the_limit_minus_the_reserve() {
        let c = config("");
        let b = FdBudget::plan(&c, 20_000).unwrap();
        // 64 + 64 admin + 8 x max(64, 4) slots.
        assert_eq!(b.reserve, 64 + 64 + 8 * 64);
        assert_eq!(b.max_client_connections, 20_000 - 640);
        // A bigger pool grows the reserve.
        let c = config("[pool]\nsize = 200\n");
        let b = FdBudget::plan(&c, 20_000).unwrap();
        assert_eq!(b.reserve, 64 + 64 + 8 * 200);
        let c = config("[pool]\nmin = 2\nmax = 100\n[admin]\nmax_connections = 10\n");
        assert_eq!(FdBudget::plan(&c, 20_000).unwrap().reserve, 64 + 10 + 800);
    }

    #[test]
    fn a_cap_that_leaves_no_reserve_is_refused() {
        // Today's default on these machines: soft = hard = 20 000 and 20 000 clients.
        let c = config("[limits]\nmax_client_connections = 20000\n");
        let e = FdBudget::plan(&c, 20_000).unwrap_err().to_string();
        assert!(
            e.contains("max_client_connections = 20000") && e.contains("at most 19360"),
            "{e}"
        );
        let c = config("[limits]\nmax_client_connections = 19360\n");
        assert_eq!(FdBudget::plan(&c, 20_000).unwrap().max_client_connections, 19_360);
        let e = FdBudget::plan(&config(""), 640).unwrap_err().to_string();
        assert!(e.contains("below the dispatcher's own reserve of 640"), "{e}");
    }

    #[test]
    fn resizing_keeps_the_reserve() {
        let c = config("");
        let b = FdBudget::plan(&c, 1024).unwrap();
        assert_eq!(b.max_client_connections, 1024 - 640);
        b.fits(&c, 64).unwrap();
        assert!(b.fits(&c, 65).is_err());
        // A reserve that overflows usize does not fit (and does not panic).
        assert!(b.fits(&c, usize::MAX / 2).is_err());
        let c2 = config("[limits]\nmax_client_connections = 100\n");
        let b = FdBudget::plan(&c2, 1024).unwrap();
        // (1024 - 100 - 128) / 8 = 99 slots.
        b.fits(&c2, 99).unwrap();
        assert!(b.fits(&c2, 100).is_err());
    }

    #[test]
    fn accept_loops_pause_unless_the_error_is_about_one_connection() {
        let pauses = |errno| pauses_after(&io::Error::from_raw_os_error(errno));
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(pauses(errno), "errno {errno}");
        }
        // Errors about the one pending connection: the next accept may well succeed.
        for errno in [
            libc::ECONNABORTED,
            libc::ECONNRESET,
            libc::EPROTO,
            libc::EPERM,
            libc::ENETUNREACH,
        ] {
            assert!(!pauses(errno), "errno {errno}");
        }
        // Anything else may fail the same way on every call: never retried at full CPU.
        for errno in [libc::EINVAL, libc::EBADF, libc::ENOTSOCK, libc::EFAULT] {
            assert!(pauses(errno), "errno {errno}");
        }
        assert!(pauses_after(&io::Error::other("not an OS error")));
    }

    #[test]
    fn a_reload_is_checked_against_the_admin_cap_in_force() {
        let running = config("");
        let b = FdBudget::plan(&running, 1024).unwrap();
        // 384 clients + 64 + 64 admin + 8 x 64 slots = 1024: a pool of 64 fits, 65 does not.
        b.check_reload(&running, &config("[pool]\nsize = 64\n")).unwrap();
        assert!(b.check_reload(&running, &config("[pool]\nsize = 65\n")).is_err());
        // A smaller admin cap in the new file needs a restart, so it frees no descriptor
        // for a bigger pool now: 64 + 1 + 8 x 71 = 633 would fit beside 384, but the 64
        // admin connections still allowed need 64 + 64 + 8 x 71 = 696.
        let e = b
            .check_reload(&running, &config("[pool]\nsize = 71\n[admin]\nmax_connections = 1\n"))
            .unwrap_err();
        assert!(e.to_string().contains("admin.max_connections 64"), "{e}");
        // A bigger one, not in force either, does not refuse a pool that fits.
        b.check_reload(&running, &config("[pool]\nsize = 64\n[admin]\nmax_connections = 100\n"))
            .unwrap();
    }
}

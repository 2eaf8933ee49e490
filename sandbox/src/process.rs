//! Starting `mariadbd` so that it cannot outlive the owning process, and signalling it.
//!
//! Every server is started with `PR_SET_PDEATHSIG(SIGKILL)`, so the kernel kills it when its
//! parent goes away, even when the owner is `kill -9`'d and no `Drop` runs.
//!
//! Caveat (see CRATE-NOTES): the parent-death signal fires when the *thread* that forked the
//! child exits, not when the process does. A `#[tokio::test]` runtime thread, a
//! `spawn_blocking` thread or a multi-threaded runtime worker can all end while the sandbox
//! lives on (for example a sandbox shared between tests, or one restarted from another
//! runtime), which would SIGKILL the server behind our back. So all spawning happens on one
//! dedicated thread that lives as long as the process; async callers hand it the command
//! and await the child. After setting the signal the child re-checks `getppid()`: if the
//! parent already died between `fork` and `prctl`, the signal would never come, so the
//! child refuses to exec.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

type Job = Box<dyn FnOnce() + Send>;

fn spawner() -> &'static mpsc::Sender<Job> {
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("osprey-sandbox-spawner".into())
            .spawn(move || {
                // Runs until the process exits: the sender lives in a static and is never dropped.
                for job in rx {
                    job();
                }
            })
            .expect("spawning the osprey-sandbox spawner thread");
        tx
    })
}

/// Spawns `cmd` on the long-lived spawner thread with the parent-death signal set.
pub(crate) async fn spawn(cmd: Command) -> io::Result<Child> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    spawner()
        .send(Box::new(move || {
            // If the caller's future was dropped meanwhile, nobody owns the child: kill it.
            if let Err(Ok(mut orphan)) = tx.send(spawn_with_pdeathsig(cmd)) {
                let _ = orphan.kill();
                let _ = orphan.wait();
            }
        }))
        .map_err(|_| io::Error::other("the osprey-sandbox spawner thread is gone"))?;
    rx.await
        .map_err(|_| io::Error::other("the osprey-sandbox spawner thread dropped a request"))?
}

fn spawn_with_pdeathsig(mut cmd: Command) -> io::Result<Child> {
    let parent = std::process::id();
    // Own process group: a Ctrl-C in the owner's terminal must not reach the servers;
    // the owner decides when they stop.
    cmd.process_group(0);
    // SAFETY: the closure runs between fork and exec and only calls the async-signal-safe
    // `prctl` and `getppid`; it does not allocate (errors are built from raw OS codes).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends SIGSTOP to `pid` and waits until every one of its threads is stopped, up to
/// `timeout`. `kill(2)` returns once the signal is queued; the process stops only when a
/// thread of it is scheduled and takes the signal, and the others follow. On a loaded
/// machine that takes milliseconds, long enough for a server thread that was woken by a
/// query to answer it: a "hung" server that still serves is a test that proves nothing.
/// Returns whether the process is fully stopped (false also when it is gone).
pub(crate) fn stop_and_wait(pid: u32, timeout: Duration) -> bool {
    signal(pid, Signal::SIGSTOP);
    let deadline = Instant::now() + timeout;
    loop {
        match all_threads_stopped(pid) {
            Some(true) => return true,
            None => return false,
            Some(false) if Instant::now() >= deadline => return false,
            Some(false) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
}

/// Whether no thread of `pid` can run: each is stopped (`T`, or `t` under a tracer) or
/// already dead (`Z`, `X`); `None` when the process is gone.
fn all_threads_stopped(pid: u32) -> Option<bool> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for task in tasks {
        let Ok(task) = task else { continue };
        // A thread that exits between read_dir and here is not running either.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // The state follows the parenthesised command name, which may itself hold ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if !matches!(state, Some('T' | 't' | 'Z' | 'X')) {
            return Some(false);
        }
    }
    Some(true)
}

/// Sends `signal` to `pid`, ignoring a process that is already gone.
pub(crate) fn signal(pid: u32, signal: Signal) {
    if let Err(e) = kill(Pid::from_raw(pid as i32), signal) {
        tracing::debug!(pid, ?signal, error = %e, "signal not delivered");
    }
}

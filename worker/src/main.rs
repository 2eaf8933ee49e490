//! `osprey-worker`: one process per pool slot, holding one database session and running
//! one request at a time for the dispatcher.
//!
//! # Invocation
//!
//! `osprey-worker --socket <unix socket path> --slot <n>`; the per-boot secret is the first
//! line of stdin (so it shows neither in `ps` nor in `/proc/PID/environ`); the rest of stdin
//! is ignored. Logs go to stderr, filtered by `RUST_LOG` (default `info`).
//!
//! # Life cycle
//!
//! 1. Connect to the socket, send `HELLO {role: worker, secret, slot, pid}`, wait for
//!    `HELLO_ACK` carrying `WorkerSettings`.
//! 2. Open the database session (within `connect_timeout_ms`), then send
//!    `READY {db_connection_id, server_version}`. If it cannot be opened: `ERROR` on stream 0
//!    (origin `worker`, `BACKEND_UNAVAILABLE`) and exit 3.
//! 3. Serve `REQUEST`s one at a time; answer `PING` at once and act on `CANCEL` even while a
//!    statement runs; send a `PING` when nothing was written for `keepalive_interval_ms`.
//! 4. Past `max_requests` or `max_age_ms`, send `QUIT_REQUEST` once, keep serving, exit 0 on
//!    `QUIT_NOW` (or on `GOAWAY`, which is handled once the requests before it are answered).
//!
//! # Exit codes (the dispatcher relies on them)
//!
//! | code | meaning |
//! |---|---|
//! | 0 | normal: `QUIT_NOW`/`GOAWAY`, the link closed, or nothing heard for 3 × keepalive |
//! | 1 | internal or protocol error (bad arguments, no secret, bad input from the dispatcher) |
//! | 2 | fatal database error, after the request in flight was answered (`DATABASE_FATAL`) |
//! | 3 | database unreachable at start (after `ERROR BACKEND_UNAVAILABLE` on stream 0) |
//! | 4 | registration refused (`ERROR` on stream 0 instead of `HELLO_ACK`) |

mod cancel;
mod convert;
mod execute;
mod link;
mod recycle;
mod session;

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use osprey_protocol::{
    ErrorBody, ErrorCode, Frame, Hello, Kind, Origin, QuitRequest, Ready, Role, WorkerSettings, PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
};
use tokio::time::Instant;
use tracing::{error, info, info_span, warn, Instrument};

use crate::cancel::Tracker;
use crate::execute::{BatchLimits, Executor, Outcome};
use crate::link::{Event, Link, LinkEnd, LinkOut, RegisterError, Wake};
use crate::recycle::Recycler;
use crate::session::Killer;

/// Process exit codes.
pub mod exit {
    pub const OK: i32 = 0;
    pub const INTERNAL: i32 = 1;
    pub const DATABASE_FATAL: i32 = 2;
    pub const DATABASE_UNREACHABLE: i32 = 3;
    pub const REFUSED: i32 = 4;
}

/// An idle session is checked with `COM_PING` this often at least (catches a session the
/// server closed, e.g. by `wait_timeout`, before a request is sent on it).
const MIN_IDLE_CHECK: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Args {
    socket: PathBuf,
    slot: u32,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let (mut socket, mut slot) = (None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = Some(PathBuf::from(args.next().context("--socket needs a path")?)),
            "--slot" => {
                slot = Some(
                    args.next()
                        .context("--slot needs a number")?
                        .parse()
                        .context("--slot")?,
                )
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(Args {
        socket: socket.context("--socket is required")?,
        slot: slot.context("--slot is required")?,
    })
}

fn read_secret() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the secret from stdin")?;
    let secret = line.trim_end_matches(['\n', '\r']).to_owned();
    if secret.is_empty() {
        bail!("no secret on stdin");
    }
    Ok(secret)
}

// mimalloc: the hot path allocates many small, short-lived buffers (frames, rows, SQL
// texts); glibc malloc took ~7 % of a worker's CPU under load (perf), mimalloc's
// per-thread free lists make those cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let started = Instant::now();
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            error!("{e:#}; usage: osprey-worker --socket <path> --slot <n> (secret on stdin)");
            std::process::exit(exit::INTERNAL);
        }
    };
    let secret = match read_secret() {
        Ok(s) => s,
        Err(e) => {
            error!("{e:#}");
            std::process::exit(exit::INTERNAL);
        }
    };
    let span = info_span!("worker", slot = args.slot);
    let code = run(args, secret, started).instrument(span).await;
    std::process::exit(code);
}

async fn run(args: Args, secret: String, started: Instant) -> i32 {
    let hello = Hello {
        version_major: PROTOCOL_MAJOR,
        version_minor: PROTOCOL_MINOR,
        role: Role::Worker,
        token: None,
        secret: Some(secret),
        slot: Some(args.slot),
        pid: Some(std::process::id()),
        name: Some(format!("osprey-worker/{}", args.slot)),
        stream_window: None,
    };
    let reg = match link::register(&args.socket, &hello).await {
        Ok(r) => r,
        Err(RegisterError::Refused(body)) => {
            error!(%body, "registration refused");
            return exit::REFUSED;
        }
        Err(e) => {
            error!(error = %e, "registration failed");
            return exit::INTERNAL;
        }
    };
    let Some(settings) = reg.ack.worker.clone() else {
        return exit::INTERNAL; // register() checked it
    };
    info!(connection_id = reg.ack.connection_id, backend = %settings.backend.name, "registered");

    // 0 would mean "no keepalive"; treat it as "very long" rather than spin.
    let keepalive = match reg.ack.keepalive_interval_ms {
        0 => Duration::from_secs(3600),
        ms => Duration::from_millis(ms),
    };
    let max_payload = reg.ack.max_payload as usize;
    let tracker = Tracker::default();
    // One future does everything (reads, executes, writes): no reader/writer tasks, no
    // channels, so a request costs no task hand-offs and its answer one write.
    let (reader, out) = match link::split_registered(reg.reader, reg.writer) {
        Ok(parts) => parts,
        Err(e) => {
            error!(error = %e, "cannot set up the link");
            return exit::INTERNAL;
        }
    };
    let mut link = Link::new(reader, tracker.clone(), keepalive, keepalive * 3);
    let terms = Terms {
        keepalive,
        max_payload,
        // STARTED, which pipelining needs, is a 1.4 frame.
        pipelining: reg.ack.version_minor >= 4,
    };
    match serve(settings, &mut link, &out, tracker, started, terms).await {
        Ok(code) => code,
        Err(end) => end.exit_code(),
    }
}

/// What the dispatcher's `HELLO_ACK` settled for the link.
struct Terms {
    keepalive: Duration,
    max_payload: usize,
    /// The dispatcher speaks 1.4 or later: statements may be pipelined (`STARTED`).
    pipelining: bool,
}

async fn serve(
    settings: WorkerSettings,
    link: &mut Link,
    out: &LinkOut,
    tracker: Tracker,
    started: Instant,
    terms: Terms,
) -> Result<i32, LinkEnd> {
    let Terms {
        keepalive,
        max_payload,
        pipelining,
    } = terms;
    let backend = &settings.backend;
    let connect_timeout = Duration::from_millis(settings.connect_timeout_ms.max(1));
    let opened = async {
        let (mut conn, opts) = session::open(backend, settings.backend_tls.as_ref(), connect_timeout).await?;
        let rows = session::query_rows(&mut conn, "SELECT VERSION(), @@max_allowed_packet")
            .await
            .map_err(|source| session::SessionError::Connect {
                backend: backend.name.clone(),
                source,
            })?;
        let info: (String, u64) = rows
            .first()
            .map(|r| {
                (
                    r.first().and_then(session::text).unwrap_or_default(),
                    r.get(1)
                        .and_then(session::text)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                )
            })
            .unwrap_or_default();
        // MySQL has no last_gtid (its GTIDs are another format): GTIDs in END are MariaDB's.
        let track_gtid = info.0.contains("MariaDB")
            && session::track_last_gtid(&mut conn)
                .await
                .map_err(|source| session::SessionError::Connect {
                    backend: backend.name.clone(),
                    source,
                })?;
        Ok::<_, session::SessionError>((conn, opts, info, track_gtid))
    };
    let (conn, opts, (server_version, max_packet), track_gtid) = match link.drive(out, opened).await? {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "database unreachable");
            let body = ErrorBody::undispatched(Origin::Worker, ErrorCode::BackendUnavailable, e.to_string());
            let _ = out.send(&Frame::new(Kind::Error, 0, &body)).await;
            return Ok(exit::DATABASE_UNREACHABLE);
        }
    };
    let db_connection_id = conn.connection_id();
    info!(db_connection_id, %server_version, max_packet, "database session open");
    tracker.set_killer(Killer {
        opts: opts.clone(),
        conn_id: db_connection_id,
        timeout: connect_timeout,
    });
    let mariadb = server_version.contains("MariaDB");
    out.send(&Frame::new(
        Kind::Ready,
        0,
        &Ready {
            db_connection_id,
            server_version,
        },
    ))
    .await?;

    let limits = BatchLimits {
        rows: settings.batch_rows as usize,
        bytes: settings.batch_bytes as usize,
        max_payload,
    };
    // 0 would refuse everything: an unreadable value means the server's default (MariaDB's 16 MiB).
    let max_packet = match max_packet {
        0 => 16 * 1024 * 1024,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let mut exec = Executor::new(
        conn,
        tracker,
        limits,
        mariadb,
        settings.session_reset,
        max_packet,
        track_gtid,
    )
    .with_pipelining(pipelining);
    let mut recycler = Recycler::new(settings.max_requests, settings.max_age_ms, started);
    let idle_check = keepalive.max(MIN_IDLE_CHECK);
    let mut last_db_use = Instant::now();
    // The link's timer also wakes us for the age limit and the idle check; it is re-armed
    // when it fires (firing early is harmless: both deadlines only move later).
    let deadline = |recycler: &Recycler, last_db_use: Instant| {
        let idle = last_db_use + idle_check;
        Some(recycler.deadline().map_or(idle, |age| age.min(idle)))
    };
    link.set_extra(deadline(&recycler, last_db_use), out);

    loop {
        match link.next(out).await? {
            Wake::Event(Event::Request(frame)) => {
                let queue = link.queue();
                exec.limit_pipeline(recycler.remaining());
                let (outcome, answered) = link.drive(out, exec.serve(frame, &queue, out)).await??;
                last_db_use = Instant::now();
                for _ in 0..answered {
                    recycler.served_one();
                }
                if outcome == Outcome::Fatal {
                    out.flush().await?;
                    return Ok(exit::DATABASE_FATAL);
                }
                ask_to_quit(&mut recycler, out, "").await?;
            }
            Wake::Event(Event::Reset(stream)) => {
                let outcome = link.drive(out, exec.end_session(stream, out)).await??;
                last_db_use = Instant::now();
                if outcome == Outcome::Fatal {
                    out.flush().await?;
                    return Ok(exit::DATABASE_FATAL);
                }
                ask_to_quit(&mut recycler, out, "").await?;
            }
            Wake::Event(ev @ (Event::QuitNow | Event::GoAway)) => {
                info!(event = ?ev, served = recycler.served(), "quitting");
                link.drive(out, exec.close()).await?;
                out.flush().await?;
                return Ok(exit::OK);
            }
            Wake::Timer => {
                let now = Instant::now();
                if recycler.deadline().is_some_and(|d| now >= d) {
                    ask_to_quit(&mut recycler, out, "").await?;
                }
                if now >= last_db_use + idle_check {
                    last_db_use = now;
                    if let Err(e) = link.drive(out, exec.check_idle()).await? {
                        warn!(error = %e, "idle database session lost");
                        ask_to_quit(&mut recycler, out, "database_lost").await?;
                    }
                }
                link.set_extra(deadline(&recycler, last_db_use), out);
            }
        }
    }
}

/// Sends `QUIT_REQUEST` once: for `forced` if non-empty, else if the recycling policy says so.
async fn ask_to_quit(recycler: &mut Recycler, out: &LinkOut, forced: &'static str) -> Result<(), link::LinkGone> {
    let now = Instant::now();
    let reason = match (forced, recycler.due(now)) {
        ("", None) => return Ok(()),
        ("", Some(r)) => r,
        (_, _) if recycler.asked() => return Ok(()),
        (f, _) => f,
    };
    recycler.mark_asked();
    let age_ms = recycler.age(now).as_millis() as u64;
    info!(reason, served = recycler.served(), age_ms, "asking to retire");
    let body = QuitRequest {
        reason: reason.to_owned(),
        requests_served: recycler.served(),
        age_ms,
    };
    out.send(&Frame::new(Kind::QuitRequest, 0, &body)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> anyhow::Result<Args> {
        parse_args(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments() {
        let a = args(&["--socket", "/tmp/x.sock", "--slot", "3"]).unwrap();
        assert_eq!(a.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(a.slot, 3);
        assert!(args(&["--socket", "/tmp/x.sock"]).is_err());
        assert!(args(&["--slot", "x", "--socket", "/s"]).is_err());
        assert!(args(&["--bogus"]).is_err());
    }
}

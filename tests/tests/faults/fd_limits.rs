//! File descriptors under a flood (issue 9, item 3). From outside, ~20k request-less
//! connections to the admin port were never closed; the dispatcher hit its file limit and
//! new clients got no HELLO_ACK, a killed worker was not respawned ("Too many open
//! files") and `/status` timed out. Here the dispatcher runs with RLIMIT_NOFILE 1024
//! (set for the child alone, so the flood is cheap) and every default of `[admin]` and
//! `[limits]`: the admin port gets more idle, half-sent and trickled connections than its
//! cap and the whole file limit; the client port gets more HELLO-less connections than
//! its cap. Clients, respawns and `/status` must keep working, and the admin timeouts
//! must close every flood connection.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use osprey_sandbox::Sandbox;
use osprey_tests::harness::{wait_for, workers_of, Dispatcher};
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::{describe, metric, ms, serial};

/// The dispatcher's file limit (soft and hard) in these tests.
const NOFILE: u64 = 1024;
/// Connections per flood: more than the admin cap, the client cap and the file limit.
const FLOOD: usize = 1200;
/// Every wait is bounded by this on top of the timeout it waits for (loaded 2-core CI).
const MARGIN: Duration = Duration::from_secs(10);
/// A new admin connection must send its first request head within this
/// (`admin.first_head_timeout_ms` default).
const FIRST_HEAD_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Connects and sends nothing.
    Idle,
    /// Sends part of a request head, then nothing.
    HalfHead,
    /// Sends a request head one byte a second, never finishing it (slowloris).
    Trickle,
}

/// How one flood connection ended: after how long the dispatcher closed it.
struct Ended {
    kind: Kind,
    closed_after: Option<Duration>,
}

/// Connections opened at once by [`flood`]: below the listeners' backlog (1024).
const FLOOD_BATCH: usize = 64;

/// Connections the kernel completed but the listener on `addr` has not accepted yet (its
/// accept queue: `rx_queue` of the LISTEN socket in /proc/net/tcp).
fn accept_queue(addr: std::net::SocketAddr) -> Option<usize> {
    let std::net::SocketAddr::V4(a) = addr else {
        return None;
    };
    let local = format!("{:08X}:{:04X}", u32::from_le_bytes(a.ip().octets()), a.port());
    std::fs::read_to_string("/proc/net/tcp").ok()?.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 4 && f[1] == local && f[3] == "0A" {
            usize::from_str_radix(f[4].split(':').nth(1)?, 16).ok()
        } else {
            None
        }
    })
}

/// Opens `n` connections to `addr` (the i-th of kind `kinds[i % kinds.len()]`) and keeps
/// each until the peer closes it or `hold` passes. Returns, once every connect has
/// succeeded or given up, how many connected, and the tasks, whose results say when the
/// dispatcher closed each (`None` for a connect that failed).
///
/// They are opened [`FLOOD_BATCH`] at a time, each batch once the listener has accepted
/// the previous one: a connection completed past a full accept queue (with SYN cookies)
/// looks established to us but does not exist for the dispatcher, which can then never
/// close it.
async fn flood(
    addr: std::net::SocketAddr,
    n: usize,
    kinds: &[Kind],
    hold: Duration,
) -> (usize, JoinSet<Option<Ended>>) {
    let mut set = JoinSet::new();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let (mut connected, mut settled) = (0, 0);
    for i in 0..n {
        if i > 0 && i % FLOOD_BATCH == 0 {
            while settled < i {
                connected += usize::from(done_rx.recv().await.unwrap_or(false));
                settled += 1;
            }
            wait_for(MARGIN, "the flood's last batch accepted", || async {
                (accept_queue(addr)? < 16).then_some(())
            })
            .await
            .expect("the listener accepts the flood");
        }
        let kind = kinds[i % kinds.len()];
        let done = done_tx.clone();
        set.spawn(async move {
            // A SYN past a full backlog is retried by the kernel for a long time: give up.
            let connected = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr)).await;
            let _ = done.send(matches!(connected, Ok(Ok(_))));
            let Ok(Ok(mut s)) = connected else { return None };
            let start = Instant::now();
            let head = b"GET /status HTTP/1.1\r\nHost: osprey\r\nX-Slow: ";
            let mut sent = 0;
            let mut buf = [0u8; 512];
            let closed = tokio::time::timeout(hold, async {
                if kind == Kind::HalfHead {
                    let _ = s.write_all(&head[..head.len() - 10]).await;
                }
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tokio::select! {
                        r = s.read(&mut buf) => match r {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        },
                        _ = tick.tick(), if kind == Kind::Trickle => {
                            let byte = head.get(sent).copied().unwrap_or(b'a');
                            sent += 1;
                            if s.write_all(&[byte]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            })
            .await;
            Some(Ended {
                kind,
                closed_after: closed.ok().map(|()| start.elapsed()),
            })
        });
    }
    drop(done_tx);
    while settled < n {
        connected += usize::from(done_rx.recv().await.unwrap_or(false));
        settled += 1;
    }
    (connected, set)
}

/// A worker pid of `d` (from /proc: the admin port may not answer during a flood).
fn a_worker(d: &Dispatcher) -> u32 {
    *workers_of(d.pid()).first().expect("a worker process")
}

/// Kills `old` with SIGKILL and waits for the dispatcher to start a new worker process;
/// returns its pid and how long that took.
async fn kill_and_wait_respawn(d: &Dispatcher, old: u32, limit: Duration) -> anyhow::Result<(u32, Duration)> {
    let before = workers_of(d.pid());
    let t = Instant::now();
    kill(Pid::from_raw(old as i32), Signal::SIGKILL)?;
    let new = wait_for(limit, "a new worker process after kill -9", || async {
        workers_of(d.pid())
            .into_iter()
            .find(|p| *p != old && !before.contains(p))
    })
    .await?;
    Ok((new, t.elapsed()))
}

fn fds(status: &Json) -> String {
    format!("{}", status["fds"])
}

async fn backend() -> Sandbox {
    Sandbox::start(0).await.expect("sandbox starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_flood_leaves_clients_respawns_and_status_working() {
    let _serial = serial().await;
    let sandbox = backend().await;
    let config = Dispatcher::config_for(sandbox.primary(), "[pool]\nsize = 2\n");
    let d = Dispatcher::start_with_nofile(config, NOFILE)
        .await
        .expect("dispatcher starts");
    let admin = d.status().await.expect("status");
    println!("before the flood: fds = {}", fds(&admin));
    let header_timeout = Duration::from_millis(10_000); // admin.header_read_timeout_ms default

    // Taken before the flood, so that it holds a place: a request whose body never comes.
    // It showed the token, so the flood cannot evict it.
    let request_timeout = Duration::from_millis(10_000); // admin.request_timeout_ms default
    let mut stalled = TcpStream::connect(d.admin_addr).await.expect("connect");
    let head = format!(
        "POST /pool/size HTTP/1.1\r\nHost: osprey\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"si",
        d.admin_token
    );
    stalled
        .write_all(head.as_bytes())
        .await
        .expect("send a head and part of a body");
    let stalled = tokio::spawn(async move {
        let t = Instant::now();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(request_timeout + MARGIN * 2, stalled.read_to_end(&mut answer)).await;
        (t.elapsed(), String::from_utf8_lossy(&answer).into_owned())
    });

    let t = Instant::now();
    let (connected, mut flood) = flood(
        d.admin_addr,
        FLOOD,
        &[Kind::Idle, Kind::HalfHead, Kind::Trickle],
        header_timeout + MARGIN * 2,
    )
    .await;
    println!("admin flood: {connected}/{FLOOD} connections open after {} ms", ms(t));
    assert!(
        connected as u64 > NOFILE,
        "the flood must exceed the file limit: {connected}"
    );

    // A new SDK client is served while the flood is held.
    let t = Instant::now();
    let client = tokio::time::timeout(MARGIN, d.client())
        .await
        .expect("an SDK client connects within 10 s during the admin flood (HELLO_ACK)")
        .expect("an SDK client connects during the admin flood");
    let r = tokio::time::timeout(MARGIN, client.query("SELECT 1", &[]))
        .await
        .expect("a query within 10 s during the admin flood")
        .unwrap_or_else(|e| panic!("query during the admin flood: {}", describe(&e)));
    assert_eq!(r.rows()[0].get::<i64>(0).expect("an integer"), 1);
    println!("SDK connect + SELECT 1 during the admin flood: {} ms", ms(t));

    // A killed worker is respawned while the flood is held.
    let old = a_worker(&d);
    let (new, took) = kill_and_wait_respawn(&d, old, MARGIN)
        .await
        .expect("kill -9 of a worker is respawned during the admin flood");
    println!("worker {old} killed, {new} started after {} ms", took.as_millis());

    // /status answers while the flood is held: a new connection takes the place of the
    // oldest flood connection that has shown no token.
    let t = Instant::now();
    let status = wait_for(MARGIN, "GET /status during the admin flood", || async {
        d.status().await.ok()
    })
    .await
    .expect("/status answers within 10 s during the admin flood");
    println!("/status answered after {} ms: fds = {}", ms(t), fds(&status));
    let open = status["fds"]["open"].as_u64().expect("fds.open");
    assert!(open < NOFILE, "{open} descriptors open of {NOFILE}");
    let held = status["fds"]["admin_connections"].as_u64().expect("admin_connections");
    assert!(held <= 64, "{held} admin connections held (admin.max_connections = 64)");

    // Every flood connection was closed by the dispatcher: evicted for a newer one, or
    // by admin.first_head_timeout_ms (none ever sent a whole request head).
    let mut by_kind: Vec<(Kind, Vec<Duration>)> =
        vec![(Kind::Idle, vec![]), (Kind::HalfHead, vec![]), (Kind::Trickle, vec![])];
    while let Some(ended) = flood.join_next().await {
        let Some(ended) = ended.expect("flood task") else {
            continue;
        };
        let after = ended
            .closed_after
            .unwrap_or_else(|| panic!("a {:?} admin connection was never closed", ended.kind));
        if let Some((_, v)) = by_kind.iter_mut().find(|(k, _)| *k == ended.kind) {
            v.push(after);
        }
    }
    for (kind, v) in &by_kind {
        let (min, max) = (v.iter().min(), v.iter().max());
        let timed_out = v
            .iter()
            .filter(|d| **d + Duration::from_millis(300) >= FIRST_HEAD_TIMEOUT)
            .count();
        println!(
            "  {kind:?}: {} closed after {min:?} .. {max:?}, {timed_out} of them at the first-head timeout",
            v.len()
        );
        assert!(
            v.iter().all(|d| *d <= FIRST_HEAD_TIMEOUT + MARGIN),
            "{kind:?} held past admin.first_head_timeout_ms + 10 s: {max:?}"
        );
    }
    let evicted = metric(&d, "osprey_admin_connections_evicted_total").await;
    let rejected = metric(&d, "osprey_admin_connections_rejected_total").await;
    println!("admin flood: {evicted} evicted for newer connections, {rejected} closed at accept");
    assert!(
        evicted + rejected >= (connected - 64) as f64 * 0.9,
        "{evicted} evicted and {rejected} closed at accept of {connected}: the cap held more than 64"
    );
    // The stalled body: 503 after admin.request_timeout_ms (the idle timeout does not
    // cut a request being handled), and the connection closed.
    let (after, answer) = stalled.await.expect("stalled-body task");
    println!(
        "stalled request body answered after {after:?}: {:?}",
        answer.lines().next()
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "stalled body got {answer:?}");
    assert!(
        after + Duration::from_millis(300) >= request_timeout && after <= request_timeout + MARGIN,
        "stalled body answered after {after:?}"
    );
    // The respawned worker registered; the pool is whole.
    let s = d.wait_idle(2, MARGIN).await.expect("both slots idle after the flood");
    let pids: Vec<u64> = s["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .filter_map(|w| w["pid"].as_u64())
        .collect();
    assert!(
        pids.contains(&(new as u64)),
        "respawned worker {new} not registered: {pids:?}"
    );
    client.query("SELECT 2", &[]).await.expect("query after the flood");

    // A request head over 16 KiB is refused (431) rather than buffered.
    let mut big = TcpStream::connect(d.admin_addr).await.expect("connect");
    let head = format!(
        "GET /status HTTP/1.1\r\nHost: osprey\r\nAuthorization: Bearer {}\r\nX-Big: {}\r\n\r\n",
        d.admin_token,
        "a".repeat(20_000)
    );
    let _ = big.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(MARGIN, big.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "a 20 KB head got {answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_flood_keeps_the_reserve_for_respawns() {
    let _serial = serial().await;
    let sandbox = backend().await;
    // HELLO-less connections are held for 30 s: the reserve, not the handshake timeout,
    // must keep the respawn possible.
    let config = Dispatcher::config_for(
        sandbox.primary(),
        "[pool]\nsize = 2\n[timeouts]\nhandshake_timeout_ms = 30000\n",
    );
    let d = Dispatcher::start_with_nofile(config, NOFILE)
        .await
        .expect("dispatcher starts");

    let t = Instant::now();
    let (connected, flood) = flood(d.client_addr, FLOOD, &[Kind::Idle], Duration::from_secs(60)).await;
    println!(
        "client flood: {connected}/{FLOOD} HELLO-less connections open after {} ms",
        ms(t)
    );
    assert!(
        connected as u64 > NOFILE,
        "the flood must exceed the file limit: {connected}"
    );

    let old = a_worker(&d);
    let (new, took) = kill_and_wait_respawn(&d, old, MARGIN)
        .await
        .expect("kill -9 of a worker is respawned during the client flood");
    println!("worker {old} killed, {new} started after {} ms", took.as_millis());
    let s = wait_for(MARGIN, "the respawned worker registered", || async {
        let s = d.status().await.ok()?;
        let ok = s["slots"]
            .as_array()?
            .iter()
            .any(|w| w["pid"].as_u64() == Some(new as u64) && w["state"] == "idle");
        ok.then_some(s)
    })
    .await
    .expect("/status answers and shows the respawned worker idle during the client flood");
    println!("during the client flood: clients = {}, fds = {}", s["clients"], fds(&s));
    let cap = s["fds"]["max_client_connections"]
        .as_u64()
        .expect("max_client_connections");
    assert_eq!(cap, NOFILE - (64 + 64 + 8 * 64), "derived default client cap");
    // Not `as_u64() <= Some(cap)`: None (a missing field) would pass.
    let clients = s["clients"]["connections"].as_u64().expect("clients.connections");
    assert!(clients <= cap, "{clients} client connections held, cap {cap}");
    assert!(s["fds"]["open"].as_u64().expect("fds.open") < NOFILE);
    drop(flood);

    // A pool that would eat the reserve is refused, live and on SIGHUP.
    let e = d.resize(65).await.expect_err("a pool beyond the fd reserve is refused");
    assert!(
        e.to_string().contains("409") && e.to_string().contains("reserve"),
        "{e}"
    );
    let good = std::fs::read_to_string(&d.config_path).expect("config");
    let mut bad: toml::Table = good.parse().expect("config parses");
    bad["pool"]
        .as_table_mut()
        .expect("pool")
        .insert("size".into(), 4.into());
    bad.entry("limits")
        .or_insert_with(|| toml::Value::Table(Default::default()))
        .as_table_mut()
        .expect("limits")
        .insert("max_client_connections".into(), 1000.into());
    std::fs::write(&d.config_path, toml::to_string(&bad).expect("toml")).expect("write config");
    d.signal(Signal::SIGHUP);
    let grew = wait_for(Duration::from_secs(3), "pool size 4", || async {
        (d.status().await.ok()?["pool"]["size"] == 4).then_some(())
    })
    .await;
    assert!(
        grew.is_err(),
        "a reload whose client cap leaves no fd reserve was applied"
    );
    let mut fixed = bad.clone();
    fixed["limits"]
        .as_table_mut()
        .expect("limits")
        .remove("max_client_connections");
    std::fs::write(&d.config_path, toml::to_string(&fixed).expect("toml")).expect("write config");
    d.signal(Signal::SIGHUP);
    d.wait_idle(4, MARGIN * 2).await.expect("the corrected file is applied");
}

/// Sets the soft RLIMIT_NOFILE of another process (the hard one stays).
fn set_soft_nofile(pid: u32, soft: u64) {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit reads and writes structs we own.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0, "prlimit get: {}", std::io::Error::last_os_error());
    let new = libc::rlimit {
        rlim_cur: soft as libc::rlim_t,
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit set: {}", std::io::Error::last_os_error());
}

/// CPU time (user + system) of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .expect("stat fields")
        .split_whitespace()
        .collect();
    // After "(comm)": state is field 3 of the whole line, utime 14, stime 15.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// When accept() itself fails with EMFILE (the soft limit lowered under the dispatcher
/// from outside, below what it holds), the client and admin accept loops pause and go on:
/// no hot spin, no dead loop, service back as soon as descriptors are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_emfile_pauses_and_recovers() {
    let _serial = serial().await;
    let sandbox = backend().await;
    let config = Dispatcher::config_for(sandbox.primary(), "[pool]\nsize = 2\n");
    let d = Dispatcher::start_with_nofile(config, NOFILE)
        .await
        .expect("dispatcher starts");
    let open = d.status().await.expect("status")["fds"]["open"]
        .as_u64()
        .expect("fds.open");
    // Not one more descriptor: every accept fails with EMFILE.
    set_soft_nofile(d.pid(), open);
    let mut waiting = Vec::new();
    for addr in [d.client_addr, d.admin_addr] {
        for _ in 0..10 {
            // Completed by the kernel into the backlog; the dispatcher cannot accept them.
            waiting.push(TcpStream::connect(addr).await.expect("connect into the backlog"));
        }
    }
    let window = Duration::from_secs(2);
    let (t0, c0) = (Instant::now(), cpu_ticks(d.pid()));
    tokio::time::sleep(window).await;
    let (elapsed, ticks) = (t0.elapsed(), cpu_ticks(d.pid()) - c0);
    println!("EMFILE for {elapsed:?}: dispatcher used {ticks} clock ticks of CPU");
    set_soft_nofile(d.pid(), NOFILE);

    // Both loops are alive: a client is served, /status answers.
    let client = tokio::time::timeout(MARGIN, d.client())
        .await
        .expect("SDK connect after EMFILE within 10 s")
        .expect("SDK connect after EMFILE");
    client.query("SELECT 1", &[]).await.expect("query after EMFILE");
    d.status().await.expect("/status after EMFILE");
    // A pause of 100 ms per failure: ~20 failures per loop in 2 s, not millions.
    for listener in ["client", "admin"] {
        let n = metric(&d, &format!("osprey_accept_errors_total{{listener=\"{listener}\"}}")).await;
        println!("accept errors on the {listener} listener: {n}");
        assert!(
            n >= 1.0,
            "{listener}: accept never failed (the test did not provoke EMFILE)"
        );
        assert!(
            n <= 60.0,
            "{listener}: {n} failed accepts in {elapsed:?}: the loop spins"
        );
    }
    // A hot spin of two loops would burn ~2 cores' worth: 100 ticks/s each.
    assert!(ticks < 60, "{ticks} clock ticks of CPU in {elapsed:?} under EMFILE");
    drop(waiting);
}

/// A peer that sends requests but never reads the answers: once the socket buffers are
/// full, no byte moves, and the connection is closed after `admin.idle_timeout_ms`
/// (the requests were handled, so the handler's busy time does not hold it open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_peer_that_never_reads_its_answers_is_closed_when_idle() {
    let _serial = serial().await;
    let sandbox = backend().await;
    let config = Dispatcher::config_for(sandbox.primary(), "[pool]\nsize = 1\n");
    let d = Dispatcher::start_with(config).await.expect("dispatcher starts");
    let idle_timeout = Duration::from_millis(5_000); // admin.idle_timeout_ms default
    let request = format!(
        "GET /status HTTP/1.1\r\nHost: osprey\r\nAuthorization: Bearer {}\r\n\r\n",
        d.admin_token
    );
    // ~20 MB of answers pipelined: far more than loopback socket buffers hold.
    let requests = request.repeat(30_000);
    let s = TcpStream::connect(d.admin_addr).await.expect("connect");
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(requests.as_bytes()).await;
        wr
    });
    let open = || async { d.status().await.ok()?["fds"]["admin_connections"].as_i64() };
    // Held (this one and the /status asking) while the buffers fill...
    wait_for(MARGIN, "the pipelining connection held", || async {
        (open().await? >= 2).then_some(())
    })
    .await
    .expect("the connection that does not read is served");
    // ...then closed by the idle timeout, not held for ever by the unread answers.
    let t = Instant::now();
    wait_for(
        idle_timeout + MARGIN,
        "the connection that never reads closed",
        || async { (open().await? == 1).then_some(()) },
    )
    .await
    .expect("a peer that never reads is closed within idle_timeout + 10 s");
    println!("peer that never reads closed {} ms after it was seen held", ms(t));
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    // What was in flight arrives, then EOF or a reset: the dispatcher closed its end.
    loop {
        match tokio::time::timeout(MARGIN, rd.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got += n,
            Err(_) => panic!("the dispatcher's end is still open after {got} bytes"),
        }
    }
    println!("{got} bytes of answers were in the socket buffers");
    writer.abort();
}

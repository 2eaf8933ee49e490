//! Tests of the fault-injecting proxy against a small in-process echo server.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use osprey_tests::fault_proxy::{FaultProxy, Mode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// How long anything that should happen promptly may take on a loaded machine.
const PROMPT: Duration = Duration::from_secs(3);

/// An echo server counting the bytes it received and its open connections.
struct Echo {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
    open: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Echo {
    async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (rcv, opn) = (received.clone(), open.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut s, _)) = accepted else { continue };
                        opn.fetch_add(1, Ordering::SeqCst);
                        let guard = OpenGuard(opn.clone());
                        let rcv = rcv.clone();
                        conns.spawn(async move {
                            let _guard = guard;
                            let _ = s.set_nodelay(true);
                            let mut buf = vec![0u8; 64 * 1024];
                            loop {
                                match s.read(&mut buf).await {
                                    Ok(0) => {
                                        let _ = s.shutdown().await;
                                        return;
                                    }
                                    Ok(n) => {
                                        rcv.fetch_add(n as u64, Ordering::SeqCst);
                                        if s.write_all(&buf[..n]).await.is_err() {
                                            return;
                                        }
                                    }
                                    Err(_) => return,
                                }
                            }
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Echo {
            addr,
            received,
            open,
            task,
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

async fn setup() -> (Echo, FaultProxy) {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    (echo, proxy)
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let s = timeout(PROMPT, TcpStream::connect(addr))
        .await
        .expect("connect timed out")
        .unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Polls `cond` until it holds, failing the test after `limit`.
async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Writes `msg` and reads the same number of bytes back.
async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    timeout(PROMPT, s.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .unwrap();
    back
}

/// Asserts that the next read ends promptly with EOF or an error (not data, not a hang).
async fn expect_closed(s: &mut TcpStream) -> io::Result<usize> {
    let mut buf = [0u8; 64];
    let r = timeout(PROMPT, s.read(&mut buf))
        .await
        .expect("read did not end promptly");
    assert!(!matches!(r, Ok(n) if n > 0), "expected EOF or an error, got data");
    r
}

/// Asserts that a new connection is reset promptly: the kernel accepts it, so the connect may
/// succeed and the first read fail, or (when the RST lands before a non-blocking connect is
/// polled, as with tokio) the connect itself reports the reset.
async fn expect_reset_on_connect(addr: SocketAddr) {
    match timeout(PROMPT, TcpStream::connect(addr))
        .await
        .expect("connect timed out")
    {
        Ok(mut s) => {
            let r = expect_closed(&mut s).await;
            assert!(r.is_err(), "expected a reset, got {r:?}");
        }
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "unexpected error {e}"),
    }
}

/// Asserts that nothing arrives within `wait` while the connection stays open.
async fn expect_silence(s: &mut TcpStream, wait: Duration) {
    let mut buf = [0u8; 64];
    match timeout(wait, s.read(&mut buf)).await {
        Err(_) => {}
        Ok(r) => panic!("expected silence, got {r:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_echoes_and_forwards_half_close() {
    let (echo, proxy) = setup().await;
    assert_eq!(proxy.mode(), Mode::Pass);
    let mut s = connect(proxy.addr()).await;
    assert_eq!(roundtrip(&mut s, b"hello").await, b"hello");
    assert_eq!(proxy.accepted(), 1);
    assert_eq!(proxy.open_connections(), 1);

    // A payload much larger than the proxy's buffers, written and read concurrently.
    let payload: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = s.into_split();
    let expected = payload.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&payload).await.unwrap();
        w.shutdown().await.unwrap(); // FIN through the proxy to the echo server
        w
    });
    let mut back = Vec::new();
    timeout(Duration::from_secs(5), r.read_to_end(&mut back))
        .await
        .expect("echo timed out")
        .unwrap();
    assert!(back == expected, "echoed payload differs");
    let _w = writer.await.unwrap();
    // The echo server closed after our FIN, so the proxy closes its connection too.
    wait_for("proxy connection closed", PROMPT, || proxy.open_connections() == 0).await;
    wait_for("echo connection closed", PROMPT, || echo.open() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_delays_each_direction_and_keeps_order() {
    let (_echo, proxy) = setup().await;
    let mut s = connect(proxy.addr()).await;
    assert_eq!(roundtrip(&mut s, b"warm").await, b"warm");

    let delay = Duration::from_millis(100);
    proxy.set_mode(Mode::Latency(delay)); // applies to the open connection
    assert_eq!(proxy.mode(), Mode::Latency(delay));
    let started = Instant::now();
    assert_eq!(roundtrip(&mut s, b"ping").await, b"ping");
    let rtt = started.elapsed();
    assert!(
        rtt >= 2 * delay,
        "round trip {rtt:?} shorter than twice the latency {delay:?}"
    );

    // Several separate writes come back in order, each delayed.
    let started = Instant::now();
    let mut sent = Vec::new();
    for i in 0..20u8 {
        let msg = [i; 3];
        s.write_all(&msg).await.unwrap();
        sent.extend_from_slice(&msg);
        sleep(Duration::from_millis(2)).await;
    }
    let mut back = vec![0u8; sent.len()];
    timeout(PROMPT, s.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .unwrap();
    assert_eq!(back, sent);
    assert!(started.elapsed() >= 2 * delay);

    proxy.set_mode(Mode::Pass);
    assert_eq!(roundtrip(&mut s, b"fast").await, b"fast");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_drops_bytes_but_keeps_the_connection() {
    let (echo, proxy) = setup().await;
    let mut s = connect(proxy.addr()).await;
    assert_eq!(roundtrip(&mut s, b"before").await, b"before");
    let received_before = echo.received();
    assert_eq!(received_before, 6);

    proxy.set_mode(Mode::Blackhole);
    // Writes succeed, even far more than socket buffers hold: the proxy keeps reading.
    s.write_all(b"lost").await.unwrap();
    let bulk = vec![7u8; 4 * 1024 * 1024];
    timeout(PROMPT, s.write_all(&bulk))
        .await
        .expect("writes into a blackhole stalled")
        .unwrap();
    expect_silence(&mut s, Duration::from_millis(300)).await;
    assert_eq!(proxy.open_connections(), 1);
    assert_eq!(echo.open(), 1, "the upstream connection stays open");
    assert_eq!(
        echo.received(),
        received_before,
        "no blackholed byte reached the upstream"
    );

    // Back to Pass on the same connection: it works again, and the lost bytes stay lost.
    proxy.set_mode(Mode::Pass);
    assert_eq!(roundtrip(&mut s, b"after").await, b"after");
    assert_eq!(echo.received(), received_before + 5);
    expect_silence(&mut s, Duration::from_millis(50)).await;
    assert_eq!(proxy.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_drops_bytes_queued_by_latency() {
    let (echo, proxy) = setup().await;
    let mut s = connect(proxy.addr()).await;
    proxy.set_mode(Mode::Latency(Duration::from_millis(400)));
    s.write_all(b"queued").await.unwrap();
    // The proxy reads the bytes at once and holds them until their deadline.
    sleep(Duration::from_millis(50)).await;
    proxy.set_mode(Mode::Blackhole);
    sleep(Duration::from_millis(500)).await; // past the deadline
    assert_eq!(echo.received(), 0, "queued bytes were dropped");
    proxy.set_mode(Mode::Pass);
    assert_eq!(roundtrip(&mut s, b"next").await, b"next");
    assert_eq!(echo.received(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_mode_resets_open_and_new_connections() {
    let (echo, proxy) = setup().await;
    let mut a = connect(proxy.addr()).await;
    let mut b = connect(proxy.addr()).await;
    assert_eq!(roundtrip(&mut a, b"a").await, b"a");
    assert_eq!(roundtrip(&mut b, b"b").await, b"b");
    assert_eq!(echo.open(), 2);

    proxy.set_mode(Mode::Reset);
    let ra = expect_closed(&mut a).await;
    let rb = expect_closed(&mut b).await;
    for r in [ra, rb] {
        if let Err(e) = r {
            assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "unexpected error {e}");
        }
    }
    wait_for("upstream connections closed", PROMPT, || echo.open() == 0).await;
    wait_for("proxy connections closed", PROMPT, || proxy.open_connections() == 0).await;

    // A new connection is accepted by the kernel, then reset without reaching the upstream.
    expect_reset_on_connect(proxy.addr()).await;
    assert_eq!(proxy.accepted(), 3);
    assert_eq!(proxy.open_connections(), 0);

    proxy.set_mode(Mode::Pass);
    let mut d = connect(proxy.addr()).await;
    assert_eq!(roundtrip(&mut d, b"again").await, b"again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_is_one_shot() {
    let (echo, proxy) = setup().await;
    let mut a = connect(proxy.addr()).await;
    assert_eq!(roundtrip(&mut a, b"a").await, b"a");
    proxy.reset_all();
    assert_eq!(proxy.mode(), Mode::Pass);
    expect_closed(&mut a).await.ok();
    wait_for("upstream connection closed", PROMPT, || echo.open() == 0).await;
    wait_for("proxy connection closed", PROMPT, || proxy.open_connections() == 0).await;

    let mut b = connect(proxy.addr()).await;
    assert_eq!(roundtrip(&mut b, b"b").await, b"b");
    assert_eq!(proxy.open_connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_fails_new_connects_while_open_ones_pass() {
    let (_echo, proxy) = setup().await;
    let addr = proxy.addr();
    let mut a = connect(addr).await;
    assert_eq!(roundtrip(&mut a, b"a").await, b"a");

    proxy.set_mode(Mode::Refuse);
    let started = Instant::now();
    let err = timeout(PROMPT, TcpStream::connect(addr))
        .await
        .expect("connect did not fail fast")
        .expect_err("connect should be refused");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "unexpected error {err}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(roundtrip(&mut a, b"still").await, b"still");
    assert_eq!(proxy.accepted(), 1);

    // Leaving Refuse listens again on the same address, while `a` still uses that port.
    proxy.set_mode(Mode::Pass);
    assert_eq!(proxy.addr(), addr);
    let mut b = connect(addr).await;
    assert_eq!(roundtrip(&mut b, b"b").await, b"b");
    assert_eq!(roundtrip(&mut a, b"a2").await, b"a2");
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.open_connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flap_lets_some_echoes_through_and_drops_others() {
    let (_echo, proxy) = setup().await;
    let s = connect(proxy.addr()).await;
    let (mut r, mut w) = s.into_split();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        loop {
            let mut b = [0u8; 8];
            timeout(Duration::from_secs(5), r.read_exact(&mut b))
                .await
                .expect("marker timed out")
                .unwrap();
            let i = u64::from_be_bytes(b);
            if i == u64::MAX {
                return got;
            }
            got.push(i);
        }
    });

    let phase = Duration::from_millis(100);
    proxy.set_mode(Mode::Flap {
        pass: phase,
        blackhole: phase,
    });
    let mut sent = 0u64;
    let end = Instant::now() + 8 * phase; // four pass/blackhole cycles
    while Instant::now() < end {
        w.write_all(&sent.to_be_bytes()).await.unwrap();
        sent += 1;
        sleep(Duration::from_millis(10)).await;
    }
    proxy.set_mode(Mode::Pass);
    w.write_all(&u64::MAX.to_be_bytes()).await.unwrap();
    let got = reader.await.unwrap();

    assert!(got.windows(2).all(|p| p[0] < p[1]), "echoes out of order: {got:?}");
    assert!(got.iter().all(|&i| i < sent));
    let lost = sent - got.len() as u64;
    assert!(got.len() >= 5, "too few echoes came through: {} of {sent}", got.len());
    assert!(lost >= 5, "too few echoes were dropped: {lost} of {sent}");
    // Drops come in runs (whole blackhole phases), not at random.
    let gaps = got.windows(2).filter(|p| p[1] > p[0] + 1).count();
    assert!(gaps >= 2, "expected several blackhole gaps, got {gaps}: {got:?}");
    assert_eq!(proxy.open_connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_resets_the_client() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = closed.local_addr().unwrap();
    drop(closed);
    let proxy = FaultProxy::start(upstream).await.unwrap();
    expect_reset_on_connect(proxy.addr()).await;
    wait_for("proxy connection closed", PROMPT, || proxy.open_connections() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_stops_listening_and_closes_connections() {
    let (echo, proxy) = setup().await;
    let addr = proxy.addr();
    let mut a = connect(addr).await;
    assert_eq!(roundtrip(&mut a, b"a").await, b"a");
    proxy.set_mode(Mode::Blackhole); // closing must not wait for the blackhole to end
    drop(proxy);
    let err = TcpStream::connect(addr)
        .await
        .expect_err("connect after drop should fail");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "unexpected error {err}");
    expect_closed(&mut a).await.ok();
    wait_for("upstream connection closed", PROMPT, || echo.open() == 0).await;
}

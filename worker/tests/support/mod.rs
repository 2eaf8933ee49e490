//! The harness shared by the worker's integration tests: the test plays the dispatcher
//! on a Unix socket, spawns the real `osprey-worker` binary and drives its link.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_protocol::{
    Backend, Columns, End, ErrorBody, Frame, FrameCodec, Hello, HelloAck, Kind, Ready, Request, Rows, SessionReset,
    Value, WorkerSettings, PROTOCOL_MAJOR,
};
use osprey_sandbox::Sandbox;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::time::{timeout, Instant};
use tokio_util::codec::{FramedRead, FramedWrite};

pub const SECRET: &str = "per-boot-secret-42";
pub const SLOT: u32 = 7;
pub const WAIT: Duration = Duration::from_secs(15);

pub fn settings(sandbox: &Sandbox) -> WorkerSettings {
    let p = sandbox.primary();
    WorkerSettings {
        backend: Backend {
            name: "primary".into(),
            host: p.host().into(),
            port: p.port(),
            user: p.user().into(),
            password: p.password().into(),
            database: Some(p.database().into()),
        },
        max_requests: 0,
        max_age_ms: 0,
        batch_rows: 100,
        batch_bytes: 64 * 1024,
        connect_timeout_ms: 5000,
        session_reset: SessionReset::Auto,
        backend_tls: None,
    }
}

pub fn ack(worker: WorkerSettings) -> HelloAck {
    HelloAck {
        version_major: PROTOCOL_MAJOR,
        version_minor: osprey_protocol::PROTOCOL_MINOR,
        server: "test-dispatcher".into(),
        connection_id: 1,
        max_payload: 16 * 1024 * 1024,
        max_streams: 1,
        keepalive_interval_ms: 5000,
        worker: Some(worker),
        stream_window: 0,
    }
}

/// A worker process and this test's end of its link.
pub struct Worker {
    pub child: Child,
    pub rx: FramedRead<OwnedReadHalf, FrameCodec>,
    pub tx: FramedWrite<OwnedWriteHalf, FrameCodec>,
    pub hello: Hello,
    pub _dir: tempfile::TempDir,
}

/// Spawns the binary and accepts its connection (before any answer to `HELLO`).
pub async fn spawn_worker() -> Worker {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("dispatcher.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_osprey-worker"))
        .args(["--socket", path.to_str().unwrap(), "--slot", &SLOT.to_string()])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{SECRET}\n").as_bytes()).await.unwrap();
    drop(stdin);
    let (sock, _) = timeout(WAIT, listener.accept())
        .await
        .expect("worker connects")
        .unwrap();
    let (r, w) = sock.into_split();
    let mut rx = FramedRead::new(r, FrameCodec::default());
    let tx = FramedWrite::new(w, FrameCodec::default());
    let f = timeout(WAIT, rx.next()).await.expect("HELLO in time").unwrap().unwrap();
    assert_eq!(f.kind, Kind::Hello);
    assert_eq!(f.stream, 0);
    let hello: Hello = f.body().unwrap();
    Worker {
        child,
        rx,
        tx,
        hello,
        _dir: dir,
    }
}

/// Spawns, registers with `settings` and waits for `READY`.
pub async fn start_worker(settings: WorkerSettings) -> (Worker, Ready) {
    start_worker_with(ack(settings)).await
}

pub async fn start_worker_with(ack: HelloAck) -> (Worker, Ready) {
    let mut w = spawn_worker().await;
    w.send(Frame::new(Kind::HelloAck, 0, &ack)).await;
    let f = w.next().await;
    assert_eq!(f.kind, Kind::Ready, "{f:?}");
    let ready: Ready = f.body().unwrap();
    (w, ready)
}

#[derive(Debug, Default)]
pub struct Response {
    pub columns: Vec<Columns>,
    /// Rows per result set.
    pub rows: Vec<Vec<Vec<Value>>>,
    pub error: Option<ErrorBody>,
    pub end: End,
}

impl Worker {
    pub async fn send(&mut self, f: Frame) {
        self.tx.send(f).await.unwrap();
    }

    /// The next frame, any kind.
    pub async fn next_any(&mut self) -> Frame {
        timeout(WAIT, self.rx.next())
            .await
            .expect("a frame in time")
            .expect("link open")
            .unwrap()
    }

    /// The next frame that is not a keepalive `PING` from the worker.
    pub async fn next(&mut self) -> Frame {
        loop {
            let f = self.next_any().await;
            if f.kind != Kind::Ping {
                return f;
            }
        }
    }

    pub async fn request(&mut self, stream: u32, req: &Request) -> Response {
        self.send(Frame::new(Kind::Request, stream, req)).await;
        self.response(stream).await
    }

    pub async fn response(&mut self, stream: u32) -> Response {
        let mut resp = Response::default();
        loop {
            let f = self.next().await;
            assert_eq!(f.stream, stream, "{f:?}");
            match f.kind {
                Kind::Columns => {
                    let c: Columns = f.body().unwrap();
                    assert_eq!(c.result_set as usize, resp.columns.len());
                    resp.columns.push(c);
                    resp.rows.push(Vec::new());
                }
                Kind::Rows => {
                    let r: Rows = f.body().unwrap();
                    resp.rows.last_mut().expect("ROWS after COLUMNS").extend(r.rows);
                }
                Kind::Error => {
                    assert!(resp.error.is_none(), "one ERROR per stream");
                    resp.error = Some(f.body().unwrap());
                }
                Kind::End => {
                    resp.end = f.body().unwrap();
                    return resp;
                }
                other => panic!("unexpected {other:?} on stream {stream}"),
            }
        }
    }

    pub async fn ok(&mut self, stream: u32, req: &Request) -> Response {
        let r = self.request(stream, req).await;
        assert!(r.error.is_none(), "{:?} failed: {:?}", req.sql, r.error);
        r
    }

    pub async fn exit_status(&mut self) -> ExitStatus {
        timeout(WAIT, self.child.wait())
            .await
            .expect("worker exits in time")
            .unwrap()
    }
}

/// Waits until `cond` holds, polling, up to `WAIT`.
pub async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

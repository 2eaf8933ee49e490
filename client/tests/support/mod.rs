//! A scripted fake dispatcher speaking the frame protocol, for testing the SDK's own
//! logic (no SQL is executed anywhere).
#![allow(dead_code)]

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_protocol::*;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

pub const TOKEN: &str = "test-token";
/// Upper bound for any wait in these tests.
pub const DEADLINE: Duration = Duration::from_secs(10);

pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(DEADLINE, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Polls `cond` until it holds or the deadline passes.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub max_streams: u32,
    pub keepalive_interval_ms: u64,
    /// Answer the client's PINGs (when reading with `recv`).
    pub answer_pings: bool,
    /// `HELLO_ACK.stream_window`: 0 plays a dispatcher without flow control.
    pub stream_window: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_streams: 64,
            keepalive_interval_ms: 10_000,
            answer_pings: true,
            stream_window: 0,
        }
    }
}

pub struct FakeServer {
    pub addr: String,
    conns: mpsc::Receiver<FakeConn>,
    accept: tokio::task::JoinHandle<()>,
}

impl FakeServer {
    pub async fn start(settings: Settings) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, conns) = mpsc::channel(16);
        let accept = tokio::spawn(async move {
            let mut next_id = 1;
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                let (r, w) = sock.into_split();
                let mut conn = FakeConn {
                    r: FramedRead::new(r, FrameCodec::default()),
                    w: FramedWrite::new(w, FrameCodec::default()),
                    hello: None,
                    settings: settings.clone(),
                    pings_seen: 0,
                };
                let Some(Ok(f)) = conn.r.next().await else { continue };
                assert_eq!(f.kind, Kind::Hello);
                let hello: Hello = f.body().unwrap();
                if hello.token.as_deref() != Some(TOKEN) {
                    let e = ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::AuthFailed, "bad token");
                    let _ = conn.w.send(Frame::new(Kind::Error, 0, &e)).await;
                    continue;
                }
                let ack = HelloAck {
                    version_major: PROTOCOL_MAJOR,
                    version_minor: PROTOCOL_MINOR,
                    server: "fake".into(),
                    connection_id: next_id,
                    max_payload: DEFAULT_MAX_PAYLOAD as u32,
                    max_streams: settings.max_streams,
                    keepalive_interval_ms: settings.keepalive_interval_ms,
                    worker: None,
                    stream_window: settings.stream_window,
                };
                next_id += 1;
                conn.w.send(Frame::new(Kind::HelloAck, 0, &ack)).await.unwrap();
                conn.hello = Some(hello);
                if tx.send(conn).await.is_err() {
                    return;
                }
            }
        });
        FakeServer { addr, conns, accept }
    }

    /// The next accepted (and handshaken) connection.
    pub async fn accept(&mut self) -> FakeConn {
        within("a client connection", self.conns.recv())
            .await
            .expect("listener alive")
    }

    /// Stops listening: later connection attempts are refused.
    pub fn stop(self) {
        self.accept.abort();
    }
}

pub struct FakeConn {
    r: FramedRead<OwnedReadHalf, FrameCodec>,
    w: FramedWrite<OwnedWriteHalf, FrameCodec>,
    pub hello: Option<Hello>,
    pub settings: Settings,
    pub pings_seen: u64,
}

impl FakeConn {
    /// The next frame, including PING/PONG; `None` at EOF.
    pub async fn recv_raw(&mut self) -> Option<Frame> {
        within("a frame", self.r.next()).await.map(|r| r.expect("valid frame"))
    }

    /// The next frame that is not PING/PONG (PINGs are answered if configured); `None` at EOF.
    pub async fn recv(&mut self) -> Option<Frame> {
        loop {
            let f = self.recv_raw().await?;
            match f.kind {
                Kind::Ping => {
                    self.pings_seen += 1;
                    if self.settings.answer_pings {
                        let p: Ping = f.body().unwrap();
                        self.send(Frame::new(Kind::Pong, 0, &p)).await;
                    }
                }
                Kind::Pong => {}
                _ => return Some(f),
            }
        }
    }

    /// Like `recv`, but `None` if nothing but pings arrives within `wait`.
    pub async fn try_recv_for(&mut self, wait: Duration) -> Option<Frame> {
        tokio::time::timeout(wait, self.recv()).await.ok().flatten()
    }

    /// The next frame, which must be a REQUEST: (stream, request).
    pub async fn request(&mut self) -> (u32, Request) {
        let f = self.recv().await.expect("connection open");
        assert_eq!(f.kind, Kind::Request, "expected REQUEST, got {:?}", f.kind);
        (f.stream, f.body().unwrap())
    }

    pub async fn send(&mut self, f: Frame) {
        let _ = self.w.send(f).await;
    }

    pub async fn columns(&mut self, stream: u32, names: &[&str]) {
        let columns = names
            .iter()
            .map(|n| Column {
                name: n.to_string(),
                table: "t".into(),
                column_type: 253,
                flags: 0,
                charset: 33,
                length: 255,
                decimals: 0,
            })
            .collect();
        self.send(Frame::new(Kind::Columns, stream, &Columns { result_set: 0, columns }))
            .await;
    }

    pub async fn rows(&mut self, stream: u32, rows: Vec<Vec<Value>>) {
        self.send(Frame::new(Kind::Rows, stream, &Rows { rows })).await;
    }

    pub async fn end(&mut self, stream: u32, end: End) {
        self.send(Frame::new(Kind::End, stream, &end)).await;
    }

    /// A whole one-column answer: COLUMNS, one ROWS batch, END.
    pub async fn answer(&mut self, stream: u32, column: &str, rows: Vec<Vec<Value>>) {
        let n = rows.len() as u64;
        self.columns(stream, &[column]).await;
        self.rows(stream, rows).await;
        self.end(
            stream,
            End {
                rows: n,
                ..Default::default()
            },
        )
        .await;
    }

    pub async fn error(&mut self, stream: u32, body: ErrorBody) {
        self.send(Frame::new(Kind::Error, stream, &body)).await;
        self.end(stream, End::default()).await;
    }

    pub async fn goaway(&mut self) {
        let g = GoAway {
            code: ErrorCode::ShuttingDown,
            message: "draining".into(),
        };
        self.send(Frame::new(Kind::GoAway, 0, &g)).await;
    }
}

pub fn config(addrs: &[&str]) -> osprey_client::ClientConfig {
    let mut c = osprey_client::ClientConfig::new(addrs[0], TOKEN).with_addrs(addrs.iter().copied());
    c.connect_timeout = Duration::from_secs(2);
    c.connection_wait = Duration::from_secs(5);
    c.backoff_min = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(100);
    c
}

pub fn err(code: ErrorCode, dispatched: bool) -> ErrorBody {
    let mut b = ErrorBody::undispatched(Origin::Dispatcher, code, format!("scripted {code}"));
    b.dispatched = dispatched;
    b
}

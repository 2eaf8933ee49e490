//! A raw-frame client: speaks the wire protocol frame by frame (or sends arbitrary bytes),
//! for what the SDK would hide or refuse to do.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use osprey_client::ErrorCode;
use osprey_protocol::{ErrorBody, Frame, FrameCodec, Hello, HelloAck, Kind, Request, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, FramedWrite};

pub type RawReader = FramedRead<OwnedReadHalf, FrameCodec>;
pub type RawWriter = FramedWrite<OwnedWriteHalf, FrameCodec>;

/// What a read brought.
#[derive(Debug)]
pub enum Got {
    Frame(Frame),
    /// The peer closed (EOF, reset, or the stream ended mid-frame).
    Closed,
}

pub struct Raw {
    pub rd: RawReader,
    pub wr: RawWriter,
}

pub fn hello(major: u16, token: &str) -> Hello {
    Hello {
        version_major: major,
        version_minor: 0,
        role: Role::Client,
        token: Some(token.to_owned()),
        secret: None,
        slot: None,
        pid: Some(std::process::id()),
        name: Some("faults-raw".into()),
        stream_window: None,
    }
}

pub fn request(stream: u32, sql: &str) -> Frame {
    Frame::new(Kind::Request, stream, &Request::sql(sql))
}

/// A 12-byte frame header (big endian: length, kind, flags, reserved, stream).
pub fn header(len: u32, kind: u8, stream: u32) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[..4].copy_from_slice(&len.to_be_bytes());
    h[4] = kind;
    h[8..].copy_from_slice(&stream.to_be_bytes());
    h
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw::from_socket(TcpStream::connect(addr).await.expect("tcp connect"))
    }

    fn from_socket(sock: TcpStream) -> Raw {
        sock.set_nodelay(true).expect("nodelay");
        let (r, w) = sock.into_split();
        Raw {
            rd: FramedRead::new(r, FrameCodec::default()),
            wr: FramedWrite::new(w, FrameCodec::default()),
        }
    }

    /// Connects and completes the handshake (no flow control).
    pub async fn open(addr: SocketAddr, token: &str) -> (Raw, HelloAck) {
        Raw::connect(addr).await.handshake(hello(1, token)).await
    }

    /// Connects and completes the handshake, asking for flow control with `window`.
    pub async fn open_with_window(addr: SocketAddr, token: &str, window: u32) -> (Raw, HelloAck) {
        // Flow control is a 1.1 feature: a 1.0 HELLO gets none.
        let hello = Hello {
            version_minor: 1,
            stream_window: Some(window),
            ..hello(1, token)
        };
        Raw::connect(addr).await.handshake(hello).await
    }

    /// Connects with a small receive buffer (a slow network path in effect: little in
    /// flight) and completes the handshake (no flow control).
    pub async fn open_small_rcvbuf(addr: SocketAddr, token: &str, rcvbuf: u32) -> (Raw, HelloAck) {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
        let sock = socket.connect(addr).await.expect("tcp connect");
        Raw::from_socket(sock).handshake(hello(1, token)).await
    }

    async fn handshake(mut self, hello: Hello) -> (Raw, HelloAck) {
        self.send(Frame::new(Kind::Hello, 0, &hello)).await;
        match self.next(Duration::from_secs(5)).await {
            Got::Frame(f) if f.kind == Kind::HelloAck => {
                let ack: HelloAck = f.body().expect("HELLO_ACK body");
                (self, ack)
            }
            other => panic!("expected HELLO_ACK, got {other:?}"),
        }
    }

    pub async fn send(&mut self, frame: Frame) {
        self.wr.send(frame).await.expect("send frame");
    }

    /// Writes bytes as they are (no framing).
    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        let sock = self.wr.get_mut();
        sock.write_all(bytes).await.expect("write bytes");
        sock.flush().await.expect("flush");
    }

    /// The next frame, or `Closed`; panics if nothing comes within `limit`.
    pub async fn next(&mut self, limit: Duration) -> Got {
        match tokio::time::timeout(limit, self.rd.next()).await {
            Err(_) => panic!("nothing received within {limit:?}"),
            Ok(Some(Ok(f))) => Got::Frame(f),
            Ok(None) | Ok(Some(Err(_))) => Got::Closed,
        }
    }

    /// The next frame that is not a PING/PONG on stream 0 (a PING is answered).
    pub async fn next_data(&mut self, limit: Duration) -> Got {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Got::Frame(f) if f.stream == 0 && f.kind == Kind::Ping => {
                    let pong = Frame { kind: Kind::Pong, ..f };
                    self.send(pong).await;
                }
                Got::Frame(f) if f.stream == 0 && f.kind == Kind::Pong => {}
                other => return other,
            }
        }
    }

    /// Expects a connection-level `ERROR` with `code` on stream 0, then the close.
    pub async fn expect_conn_error(&mut self, code: ErrorCode) -> ErrorBody {
        let body = match self.next_data(Duration::from_secs(5)).await {
            Got::Frame(f) if f.kind == Kind::Error && f.stream == 0 => f.body::<ErrorBody>().expect("ERROR body"),
            other => panic!("expected ERROR {code} on stream 0, got {other:?}"),
        };
        assert_eq!(body.code, code, "{body:?}");
        assert!(!body.dispatched, "{body:?}");
        self.expect_closed(Duration::from_secs(5)).await;
        body
    }

    /// Expects the dispatcher to close the connection (no frame but PINGs before that).
    pub async fn expect_closed(&mut self, limit: Duration) {
        match self.next_data(limit).await {
            Got::Closed => {}
            Got::Frame(f) => panic!("expected the connection to close, got {f:?}"),
        }
    }

    /// Runs `sql` on `stream` and expects success: COLUMNS, ROWS..., END on that stream.
    pub async fn expect_query_ok(&mut self, stream: u32, sql: &str) {
        self.send(request(stream, sql)).await;
        loop {
            match self.next_data(Duration::from_secs(10)).await {
                Got::Frame(f) if f.stream == stream && f.kind == Kind::End => return,
                Got::Frame(f) if f.stream == stream && matches!(f.kind, Kind::Columns | Kind::Rows) => {}
                other => panic!("{sql} on stream {stream}: unexpected {other:?}"),
            }
        }
    }
}

/// Reads from a plain socket until EOF or reset; returns the bytes read.
pub async fn read_to_close(sock: &mut TcpStream, limit: Duration) -> Option<usize> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    let work = async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    };
    tokio::time::timeout(limit, work).await.ok()
}

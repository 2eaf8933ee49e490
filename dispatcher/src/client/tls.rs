//! TLS on the client listener: the certificate (reloadable on SIGHUP), optional client
//! certificates, and the byte streams a client connection reads and writes, plain or TLS.
//!
//! TLS wraps the whole framed connection: the first bytes a client sends on a TLS port
//! are a TLS ClientHello (record type 0x16), never an Osprey frame, whose first byte is
//! the high byte of a length that the handshake limit keeps at 0. So the first byte tells
//! a plaintext client apart, and it is answered with a plain Osprey `ERROR` frame that
//! says the port requires TLS, instead of a TLS alert it could not read.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::SinkExt;
use osprey_protocol::{ErrorBody, ErrorCode, Frame, FrameCodec, Kind, Origin};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::info;

use crate::config::{ClientAuth, ListenTls};
use crate::metrics::Metrics;

/// First byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// After refusing a client (its plaintext, its TLS handshake), what it already sent is
/// read and dropped for at most this long and this many bytes (see [`linger`]).
const REFUSE_LINGER: Duration = Duration::from_secs(1);
const REFUSE_LINGER_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("{path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("{path}: no PEM certificate in the file")]
    NoCertificate { path: String },
    #[error("{path}: no usable PEM private key: {message}")]
    Key { path: String, message: String },
    #[error("certificate chain or key not usable: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA file {path}: {message}")]
    ClientCa { path: String, message: String },
}

fn read_err(path: &Path) -> impl FnOnce(io::Error) -> TlsConfigError + '_ {
    move |source| TlsConfigError::Read {
        path: path.display().to_string(),
        source,
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let pem = std::fs::read(path).map_err(read_err(path))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsConfigError::Read {
            path: path.display().to_string(),
            source: io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        })?;
    if certs.is_empty() {
        return Err(TlsConfigError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certs)
}

/// Reads the files named in `[listen.tls]` and builds a server configuration. Every
/// check rustls makes happens here, so a bad file is refused before it replaces anything.
pub fn load(cfg: &ListenTls) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = load_certs(&cfg.cert_file)?;
    let key_pem = std::fs::read(&cfg.key_file).map_err(read_err(&cfg.key_file))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsConfigError::Key {
        path: cfg.key_file.display().to_string(),
        message: e.to_string(),
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match &cfg.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let ca_err = |message: String| TlsConfigError::ClientCa {
                path: path.display().to_string(),
                message,
            };
            let mut roots = RootCertStore::empty();
            for cert in load_certs(path)? {
                roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match cfg.client_auth {
                ClientAuth::Require => verifier,
                ClientAuth::Optional => verifier.allow_unauthenticated(),
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| ca_err(e.to_string()))?)
        }
    };
    Ok(Arc::new(builder.with_single_cert(certs, key)?))
}

/// The client listener's TLS configuration; SIGHUP swaps it for new connections.
pub struct ServerTls {
    current: RwLock<Arc<ServerConfig>>,
}

impl ServerTls {
    pub fn new(cfg: &ListenTls) -> Result<Arc<ServerTls>, TlsConfigError> {
        Ok(Arc::new(ServerTls {
            current: RwLock::new(load(cfg)?),
        }))
    }

    /// Loads the files again. On error the configuration in use stays, and the error is
    /// returned for the log.
    pub fn reload(&self, cfg: &ListenTls) -> Result<(), TlsConfigError> {
        let new = load(cfg)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = new;
        Ok(())
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// What a client connection reads from: a plain TCP half or the read half of a TLS session.
pub enum ClientRead {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsStream<TcpStream>>),
    /// Nothing (its stream was taken, for a TLS upgrade): reads end at once.
    Closed,
}

/// What a client connection writes to, and when it last took bytes from us.
pub struct ClientWrite {
    io: WriteIo,
    progress: Progress,
}

enum WriteIo {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<TcpStream>>),
    Closed,
}

/// When a connection's socket last took bytes, shared with its writer task: the write
/// timeout counts from there, so a frame larger than what the client can take within the
/// timeout still goes out to a client that keeps reading.
#[derive(Clone)]
pub struct Progress {
    start: Instant,
    /// Milliseconds from `start` to the last write that took bytes.
    last_ms: Arc<AtomicU64>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn mark(&self) {
        let ms = self.start.elapsed().as_millis().min(u64::MAX as u128) as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The last time the socket took bytes (the connection's start if never).
    pub fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

impl ClientWrite {
    pub fn plain(w: OwnedWriteHalf) -> ClientWrite {
        ClientWrite {
            io: WriteIo::Plain(w),
            progress: Progress::new(),
        }
    }

    /// A writer with no stream (its stream was taken, for a TLS upgrade).
    pub fn closed() -> ClientWrite {
        ClientWrite {
            io: WriteIo::Closed,
            progress: Progress::new(),
        }
    }

    /// The plain TCP half, if it is one (a MySQL client's SSLRequest upgrades it).
    pub fn into_plain(self) -> Option<OwnedWriteHalf> {
        match self.io {
            WriteIo::Plain(w) => Some(w),
            _ => None,
        }
    }

    fn tls(w: WriteHalf<TlsStream<TcpStream>>) -> ClientWrite {
        ClientWrite {
            io: WriteIo::Tls(w),
            progress: Progress::new(),
        }
    }

    pub fn progress(&self) -> Progress {
        self.progress.clone()
    }
}

/// Marks progress when a write took bytes.
fn wrote(progress: &Progress, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
    if let Poll::Ready(Ok(n)) = &r {
        if *n > 0 {
            progress.mark();
        }
    }
    r
}

impl AsyncRead for ClientRead {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientRead::Plain(r) => Pin::new(r).poll_read(cx, buf),
            // A client that closes without TLS close_notify (a process that exits) ends the
            // connection as a plain EOF would: frames carry their length, so a cut
            // inside a frame is still seen as a truncated frame, not a clean end.
            ClientRead::Tls(r) => match Pin::new(r).poll_read(cx, buf) {
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
                other => other,
            },
            ClientRead::Closed => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for ClientWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            WriteIo::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteIo::Tls(w) => Pin::new(w).poll_write(cx, buf),
            WriteIo::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        };
        wrote(&this.progress, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.io {
            WriteIo::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteIo::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteIo::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        };
        wrote(&this.progress, r)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            WriteIo::Plain(w) => w.is_write_vectored(),
            WriteIo::Tls(w) => w.is_write_vectored(),
            WriteIo::Closed => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            WriteIo::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteIo::Tls(w) => Pin::new(w).poll_flush(cx),
            WriteIo::Closed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            WriteIo::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteIo::Tls(w) => Pin::new(w).poll_shutdown(cx),
            WriteIo::Closed => Poll::Ready(Ok(())),
        }
    }
}

/// Upgrades `socket` to TLS (a MySQL client's SSLRequest), within `limit`: the TLS
/// session's halves, or `None` (logged) when the handshake failed.
pub async fn upgrade(
    socket: TcpStream,
    tls: &ServerTls,
    limit: Duration,
    metrics: &Metrics,
) -> Option<(ClientRead, ClientWrite)> {
    match tokio::time::timeout(limit, tls.acceptor().accept(socket)).await {
        Ok(Ok(stream)) => {
            let (rd, wr) = tokio::io::split(stream);
            Some((ClientRead::Tls(rd), ClientWrite::tls(wr)))
        }
        Ok(Err(e)) => {
            info!("MySQL client refused: TLS handshake failed: {e}");
            metrics.tls_refused("handshake");
            None
        }
        Err(_) => {
            info!("MySQL client refused: TLS handshake not done within the handshake timeout");
            metrics.tls_refused("timeout");
            None
        }
    }
}

/// The connection's byte streams: the socket itself on a plain port; on a TLS port, the
/// TLS session once its handshake is done within `limit`. `None`: the connection was
/// refused and closed (logged here).
pub async fn open(
    socket: TcpStream,
    tls: Option<&ServerTls>,
    limit: Duration,
    metrics: &Metrics,
) -> Option<(ClientRead, ClientWrite)> {
    let Some(tls) = tls else {
        let (rd, wr) = socket.into_split();
        return Some((ClientRead::Plain(rd), ClientWrite::plain(wr)));
    };
    let deadline = Instant::now() + limit;
    let mut first = [0u8; 1];
    match timeout_at(deadline, socket.peek(&mut first)).await {
        Err(_) => {
            info!("client refused: no TLS handshake within the handshake timeout");
            metrics.tls_refused("timeout");
            return None;
        }
        Ok(Err(e)) => {
            info!("client refused: {e}");
            return None;
        }
        Ok(Ok(0)) => return None,
        Ok(Ok(_)) => {}
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        info!(
            "client refused: plaintext on a TLS port (first byte {:#04x}); told it to use TLS",
            first[0]
        );
        metrics.tls_refused("plaintext");
        refuse_plaintext(socket).await;
        return None;
    }
    match timeout_at(deadline, tls.acceptor().accept(socket).into_fallible()).await {
        Err(_) => {
            info!("client refused: TLS handshake not done within the handshake timeout");
            metrics.tls_refused("timeout");
            None
        }
        Ok(Err((e, socket))) => {
            info!("client refused: TLS handshake failed: {e}");
            metrics.tls_refused("handshake");
            // The alert was written; under TLS 1.3 a client that we refuse (its
            // certificate) has already sent HELLO, which must be read for the alert to arrive.
            linger(socket).await;
            None
        }
        Ok(Ok(stream)) => {
            let with_cert = stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
            tracing::debug!(client_certificate = with_cert, "TLS established");
            let (rd, wr) = tokio::io::split(stream);
            Some((ClientRead::Tls(rd), ClientWrite::tls(wr)))
        }
    }
}

/// Answers a plaintext client on a TLS port with a plain `ERROR` frame it can read.
async fn refuse_plaintext(mut socket: TcpStream) {
    let body = ErrorBody::undispatched(
        Origin::Dispatcher,
        ErrorCode::ProtocolViolation,
        "this port requires TLS: connect with TLS enabled",
    );
    let mut sink = tokio_util::codec::FramedWrite::new(&mut socket, FrameCodec::default());
    if timeout(REFUSE_LINGER, sink.send(Frame::new(Kind::Error, 0, &body)))
        .await
        .is_err()
    {
        return;
    }
    drop(sink);
    linger(socket).await;
}

/// Closes our side and reads what the client still sends, for a bounded time and number
/// of bytes, so that the close is a FIN after our last bytes rather than a RST that may
/// destroy them before the client reads them.
async fn linger(mut socket: TcpStream) {
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut socket).await;
    let deadline = Instant::now() + REFUSE_LINGER;
    let mut buf = [0u8; 4096];
    let mut seen = 0;
    while seen < REFUSE_LINGER_BYTES {
        match timeout_at(deadline, socket.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen += n,
            _ => break,
        }
    }
}

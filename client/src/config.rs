//! Client configuration.

use std::io;
use std::time::Duration;

use crate::local;
use crate::tls::TlsConfig;

/// Default dispatcher address for clients.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7400";
/// Default admin HTTP address.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:7401";

/// How to reach the dispatcher and how patient to be.
///
/// Build one with [`ClientConfig::new`] or [`ClientConfig::local`] and adjust the
/// public fields.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Dispatcher addresses (`host:port`), tried in order; on reconnect the next one is used.
    pub addrs: Vec<String>,
    /// Client token sent in `HELLO`.
    pub token: String,
    /// Free-form name for the dispatcher's logs and admin view.
    pub name: String,
    /// Limit for one connection attempt (TCP connect plus `HELLO`/`HELLO_ACK`). Default 5 s.
    pub connect_timeout: Duration,
    /// How long a request waits for a usable connection (while the SDK reconnects)
    /// before failing with `CONNECT_FAILED`. Default 10 s.
    pub connection_wait: Duration,
    /// Default per-request timeout: sent as `timeout_ms` and enforced locally over the
    /// whole call (waiting, retries, reading). `None`: no local limit, the dispatcher's
    /// `request_timeout` applies. A [`Request`](crate::Request) with a non-zero
    /// `timeout_ms` overrides it.
    pub request_timeout: Option<Duration>,
    /// Send `PING` this often (or more often if the dispatcher asks for it). Default 10 s.
    pub keepalive_interval: Duration,
    /// No frame from the dispatcher for this long means the connection is dead. Default 30 s.
    pub keepalive_timeout: Duration,
    /// Smallest reconnect / retry back-off. Default 50 ms.
    pub backoff_min: Duration,
    /// Largest reconnect / retry back-off. Default 5 s.
    pub backoff_max: Duration,
    /// How many times one request may be sent again (after a retryable undispatched
    /// error, or after a lost connection when it is idempotent). Default 3.
    pub max_retries: u32,
    /// Data frames buffered per stream between the connection task and the reader of
    /// that stream; also the flow-control window asked of the dispatcher. Default 16.
    /// See the crate docs on backpressure.
    pub stream_buffer: usize,
    /// Requests that may wait locally for a free stream (beyond the dispatcher's
    /// `max_streams`) before new ones fail with `QUEUE_FULL`. Default 10 000.
    pub max_waiting: usize,
    /// TLS to the dispatcher (`None`, the default: plain TCP). A dispatcher with
    /// `[listen.tls]` answers a plaintext client with `ERROR PROTOCOL_VIOLATION`
    /// "this port requires TLS".
    pub tls: Option<TlsConfig>,
    /// The cluster requests run on when they name none (`None`, the default: the
    /// dispatcher's first cluster).
    pub cluster: Option<String>,
    /// Read-your-writes (default `false`): every request carries the newest GTID
    /// position this [`Client`](crate::Client) has seen in an `END` for its cluster
    /// (`REQUEST.causal_gtid`), so the dispatcher serves a read only from a replica that
    /// has applied it, or from the primary. A request can override it with
    /// [`RequestExt::with_read_your_writes`](crate::RequestExt::with_read_your_writes).
    /// Needs a dispatcher of protocol 1.3 or later; an older one ignores it (a warning is
    /// logged at connect).
    pub read_your_writes: bool,
}

impl ClientConfig {
    /// One address and a token; every other setting at its default.
    pub fn new(addr: impl Into<String>, token: impl Into<String>) -> ClientConfig {
        ClientConfig {
            addrs: vec![addr.into()],
            token: token.into(),
            name: default_name(),
            connect_timeout: Duration::from_secs(5),
            connection_wait: Duration::from_secs(10),
            request_timeout: None,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(30),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            max_retries: 3,
            stream_buffer: 16,
            max_waiting: 10_000,
            tls: None,
            cluster: None,
            read_your_writes: false,
        }
    }

    /// The local dispatcher ([`DEFAULT_ADDR`]) with the client token from the
    /// credentials file in [`local::runtime_dir`].
    pub fn local() -> io::Result<ClientConfig> {
        let creds = local::Credentials::load(&local::runtime_dir())?;
        Ok(ClientConfig::new(DEFAULT_ADDR, creds.client_token))
    }

    /// Several addresses, tried in order.
    pub fn with_addrs<I, S>(mut self, addrs: I) -> ClientConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.addrs = addrs.into_iter().map(Into::into).collect();
        self
    }
}

fn default_name() -> String {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "osprey-client".into());
    format!("{exe}[{}]", std::process::id())
}

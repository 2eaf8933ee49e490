//! Errors: what can be wrong with a byte stream ([`ProtocolError`]) and the stable
//! error codes carried in `ERROR` frames ([`ErrorCode`]).

use serde::{Deserialize, Serialize};

/// Everything that can be wrong with an incoming byte stream or frame body.
/// Each variant maps to the [`ErrorCode`] sent to the peer before closing.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame payload of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    #[error("reserved header bytes must be zero")]
    ReservedNotZero,
    #[error("{kind} frame on stream {stream}: control frames use stream 0, stream frames a non-zero stream (ERROR may use either)")]
    WrongStream { kind: &'static str, stream: u32 },
    #[error("malformed {kind} body: {reason}")]
    BadBody { kind: &'static str, reason: String },
    #[error("SQL text is not valid UTF-8")]
    BadUtf8,
    #[error(
        "unsupported protocol version {major}.{minor} (this peer speaks {}.x)",
        crate::PROTOCOL_MAJOR
    )]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("connection closed in the middle of a frame ({0} bytes buffered)")]
    Truncated(usize),
}

impl ProtocolError {
    /// The wire error code that reports this problem to the peer.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::Io(_) | ProtocolError::Truncated(_) => ErrorCode::BadFrame,
            ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            ProtocolError::UnknownKind(_) => ErrorCode::UnknownKind,
            ProtocolError::ReservedNotZero | ProtocolError::WrongStream { .. } => ErrorCode::BadFrame,
            ProtocolError::BadBody { .. } => ErrorCode::BadBody,
            ProtocolError::BadUtf8 => ErrorCode::BadUtf8,
            ProtocolError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
        }
    }
}

/// Who produced an `ERROR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The MySQL/MariaDB server answered with an error.
    Database,
    /// The worker process (or its connection to the database) failed.
    Worker,
    /// The dispatcher refused or aborted the request.
    Dispatcher,
    /// The client SDK produced the error locally.
    Client,
    /// An origin string this peer does not know (sent by a newer peer): the error is kept,
    /// never turned into a malformed body. Never sent deliberately.
    #[serde(other)]
    Unknown,
}

macro_rules! codes {
    ($( $(#[$m:meta])* $name:ident = $wire:literal, )*) => {
        /// Stable error codes. On the wire: the upper-case string in the table of
        /// `docs/PROTOCOL.md`. Unknown strings from newer peers decode as [`ErrorCode::Unknown`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode { $( $(#[$m])* $name, )* }

        impl ErrorCode {
            /// Every code, in table order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            /// The wire string.
            pub fn as_str(self) -> &'static str {
                match self { $( ErrorCode::$name => $wire, )* }
            }

            /// Parses a wire string; unknown strings give [`ErrorCode::Unknown`].
            pub fn parse(s: &str) -> ErrorCode {
                match s { $( $wire => ErrorCode::$name, )* _ => ErrorCode::Unknown }
            }
        }
    };
}

codes! {
    /// A code this peer does not know (sent by a newer peer).
    Unknown = "UNKNOWN",
    /// Header or framing is invalid (reserved bytes, wrong stream for the kind, truncated).
    BadFrame = "BAD_FRAME",
    /// Payload length over the receiver's maximum.
    FrameTooLarge = "FRAME_TOO_LARGE",
    /// Unknown frame kind byte.
    UnknownKind = "UNKNOWN_KIND",
    /// A body is not valid MessagePack for its kind.
    BadBody = "BAD_BODY",
    /// SQL text is not valid UTF-8 (stream-level).
    BadUtf8 = "BAD_UTF8",
    /// Major protocol version not supported.
    UnsupportedVersion = "UNSUPPORTED_VERSION",
    /// Wrong token or worker secret, or wrong role.
    AuthFailed = "AUTH_FAILED",
    /// A frame arrived that the connection state does not allow (e.g. REQUEST before HELLO).
    ProtocolViolation = "PROTOCOL_VIOLATION",
    /// A REQUEST reused the id of a stream that is still open.
    DuplicateStream = "DUPLICATE_STREAM",
    /// Opening this stream would exceed the per-connection stream cap.
    TooManyStreams = "TOO_MANY_STREAMS",
    /// The request is malformed (empty SQL, both `sql` and `batch`, ...).
    InvalidRequest = "INVALID_REQUEST",
    /// The wait queue for a worker is full.
    QueueFull = "QUEUE_FULL",
    /// No worker became free within `queue_timeout`.
    QueueTimeout = "QUEUE_TIMEOUT",
    /// The dispatcher is draining and accepts no new streams.
    ShuttingDown = "SHUTTING_DOWN",
    /// The client cancelled the stream.
    Cancelled = "CANCELLED",
    /// The request ran past its timeout (or `request_timeout`) and was aborted.
    RequestTimeout = "REQUEST_TIMEOUT",
    /// The worker serving the stream died or its link broke.
    WorkerLost = "WORKER_LOST",
    /// The worker's database session failed in a way a retry on it would repeat.
    DatabaseFatal = "DATABASE_FATAL",
    /// The database answered with an error (errno/SQLSTATE filled in).
    Database = "DATABASE_ERROR",
    /// The REQUEST named a cluster this dispatcher does not front.
    UnknownCluster = "UNKNOWN_CLUSTER",
    /// The member's throttle (its `max_qps` token bucket) had no token within
    /// `throttle.wait_ms`, or its throttle queue was full. Never dispatched; retryable.
    Throttled = "THROTTLED",
    /// The statement's digest is blocked (slow-SQL interception or an operator's block).
    /// Never dispatched; the message names the digest id and how to unblock it.
    SqlBlocked = "SQL_BLOCKED",
    /// The worker could not reach the database at all.
    BackendUnavailable = "BACKEND_UNAVAILABLE",
    /// No session could be opened: the slot group's `sessions.max_per_group`, or the
    /// connection's `sessions.max_per_connection`, stayed full for `sessions.open_timeout_ms`
    /// (or the wait for one was full). Never dispatched; retryable.
    SessionLimit = "SESSION_LIMIT",
    /// The session ended without the client closing it (idle in a transaction, idle,
    /// its maximum duration, its worker or database session lost, a shutdown, an
    /// operator); `ErrorBody.transaction` says what became of an open transaction.
    SessionAborted = "SESSION_ABORTED",
    /// The peer did not answer pings within `keepalive_timeout`.
    KeepaliveTimeout = "KEEPALIVE_TIMEOUT",
    /// The client stopped reading a stream (flow control on) for `client_write_timeout`: it was cancelled.
    SlowConsumer = "SLOW_CONSUMER",
    /// An internal invariant failed.
    Internal = "INTERNAL",
    /// Client side: the connection broke after the request may have reached a database.
    OutcomeUnknown = "OUTCOME_UNKNOWN",
    /// Client side: could not connect to any dispatcher.
    ConnectFailed = "CONNECT_FAILED",
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s: std::borrow::Cow<'de, str> = Deserialize::deserialize(d)?;
        Ok(ErrorCode::parse(&s))
    }
}

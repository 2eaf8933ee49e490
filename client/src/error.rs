//! The SDK's one error type.
//!
//! Every failure a caller sees is an [`Error`]: errors the dispatcher sends in an
//! `ERROR` frame keep their origin, code, errno, SQLSTATE and `dispatched` flag;
//! errors the SDK produces itself have origin [`Origin::Client`].

use osprey_protocol::{ErrorBody, ErrorCode, Origin, ProtocolError};

/// An error from the dispatcher, a worker, the database, or the SDK itself.
///
/// Inspect it with [`code`](Error::code), [`origin`](Error::origin),
/// [`dispatched`](Error::dispatched) (whether the request may have reached a
/// database), [`errno`](Error::errno) and [`sqlstate`](Error::sqlstate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Error(Box<ErrorBody>);

impl Error {
    /// Wraps an `ERROR` body received from the dispatcher.
    pub fn from_body(body: ErrorBody) -> Error {
        Error(Box::new(body))
    }

    /// A client-side error (origin `client`).
    pub fn client(code: ErrorCode, dispatched: bool, message: impl Into<String>) -> Error {
        Error(Box::new(ErrorBody {
            origin: Origin::Client,
            code,
            errno: None,
            sqlstate: None,
            message: message.into(),
            dispatched,
            retryable: !dispatched,
            transaction: None,
        }))
    }

    /// A value or row could not be converted to the requested Rust type.
    /// Reported with code `BAD_BODY`, origin `client`.
    pub fn conversion(message: impl Into<String>) -> Error {
        let mut e = Error::client(ErrorCode::BadBody, true, message);
        e.0.retryable = false;
        e
    }

    pub(crate) fn protocol(err: &ProtocolError) -> Error {
        Error::client(err.code(), true, format!("protocol error from the dispatcher: {err}"))
    }

    /// The stable error code.
    pub fn code(&self) -> ErrorCode {
        self.0.code
    }

    /// Who produced the error.
    pub fn origin(&self) -> Origin {
        self.0.origin
    }

    /// Whether the request may have reached a database. `false` means it provably did not.
    pub fn dispatched(&self) -> bool {
        self.0.dispatched
    }

    /// Whether sending the same request again may succeed (as reported by the producer).
    pub fn retryable(&self) -> bool {
        self.0.retryable
    }

    /// MySQL error number, when the database produced the error.
    pub fn errno(&self) -> Option<u16> {
        self.0.errno
    }

    /// SQLSTATE, when the database produced the error.
    pub fn sqlstate(&self) -> Option<&str> {
        self.0.sqlstate.as_deref()
    }

    /// Human-readable message.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The full error body, as it would appear in an `ERROR` frame.
    pub fn body(&self) -> &ErrorBody {
        &self.0
    }
}

impl From<ErrorBody> for Error {
    fn from(body: ErrorBody) -> Error {
        Error::from_body(body)
    }
}

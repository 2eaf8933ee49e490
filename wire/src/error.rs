//! The session's errors: a server's ERR packet (the session goes on) against everything else
//! that breaks the session (it refuses further use).

use std::time::Duration;

/// An ERR packet from the server: the command failed, the session is fine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ERROR {code} ({state}): {message}")]
pub struct ServerError {
    /// The server's error number (e.g. 1064 for a syntax error).
    pub code: u16,
    /// SQLSTATE, five characters (`HY000` when the server sent none).
    pub state: String,
    /// The server's message (lossy UTF-8).
    pub message: String,
}

impl From<&mysql_common::packets::ServerError<'_>> for ServerError {
    fn from(e: &mysql_common::packets::ServerError<'_>) -> Self {
        ServerError {
            code: e.error_code(),
            state: e
                .sql_state_ref()
                .map(|s| s.as_str().into_owned())
                .unwrap_or_else(|| "HY000".into()),
            message: e.message_str().into_owned(),
        }
    }
}

/// Every error of the crate. [`Error::is_fatal`] tells whether the session is still usable.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered the command with an ERR packet. Not fatal: that command's response
    /// ends here and the next pipelined command's response follows.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The call was refused before anything was sent (wrong parameter count, a round trip
    /// asked for while responses are pending, a packet over the limit). Not fatal.
    #[error("refused: {0}")]
    Refused(String),
    /// The connection could not be set up within the connect timeout. Fatal.
    #[error("connect timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// Reading or writing the socket failed, or the server closed it. Fatal.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The server sent something the protocol does not allow here. Fatal.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// TLS could not be set up (handshake, certificate, configuration). Fatal.
    #[error("TLS: {0}")]
    Tls(String),
    /// Authentication could not proceed (unsupported plugin, caching_sha2_password full
    /// authentication without TLS). Fatal. A wrong password is a [`Error::Server`] from the
    /// server (1045) and ends the connection attempt as well.
    #[error("authentication: {0}")]
    Auth(String),
    /// An earlier fatal error broke the session; nothing more can be done on it.
    #[error("the session is broken by an earlier error")]
    Broken,
}

impl Error {
    /// `true` when the session can no longer be used (everything but [`Error::Server`] and
    /// [`Error::Refused`]).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, Error::Server(_) | Error::Refused(_))
    }

    /// The server error, if this is one.
    pub fn server(&self) -> Option<&ServerError> {
        match self {
            Error::Server(e) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn protocol(what: impl Into<String>) -> Error {
        Error::Protocol(what.into())
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Why a worker link ends: the relay's one error type. Every way out of the serving
//! loop is one of these; the slot group is told its text as the slot's loss reason.

use std::fmt;

/// Why the relay gave up a worker link. After any of these the link is closed and the
/// slot is settled with its group (respawn or kill); the request on it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// The worker closed its end: it is exiting by itself (its exit status is kept).
    WorkerClosed,
    /// The worker answered with a fatal database error: it exits next (status 2) and
    /// must not be given another request meanwhile.
    WorkerFatal,
    /// A write to the worker did not complete within `keepalive_timeout`.
    NotReading,
    /// The worker sent nothing (not even a PONG) within `keepalive_timeout`.
    KeepaliveTimeout,
    /// A frame that does not decode.
    BadFrame,
    /// A frame of a kind a worker never sends.
    UnexpectedKind,
    /// A response frame naming a stream the link did not write.
    WrongStream,
    /// A response frame for a request behind the one the worker runs.
    OutOfTurn,
    /// A response frame while the worker runs nothing.
    NoRequest,
    BadPing,
    BadPong,
    /// `request_timeout` passed: the worker was killed.
    RequestTimeout,
    /// A cancelled statement was still running at its hard bound: the worker was killed.
    CancelNotEnded,
    /// No PONG within `cancel_grace_ms` while a cancelled statement drained.
    HungAfterCancel,
    /// The dispatcher shuts down (its drain deadline passed).
    Shutdown,
    /// The slot group dropped the link's job channel.
    Dropped,
    /// The slot no longer belongs to this link (killed or exited).
    SlotTaken,
    /// A session's `RESET` was not answered within `keepalive_timeout`: the worker was killed.
    ResetTimeout,
}

impl LinkError {
    /// The reason as logged and as given to [`SlotGroup::link_lost`](crate::pool::SlotGroup::link_lost).
    pub fn as_str(self) -> &'static str {
        match self {
            LinkError::WorkerClosed => "worker closed the connection",
            LinkError::WorkerFatal => "worker reported a fatal database error",
            LinkError::NotReading => "worker does not read",
            LinkError::KeepaliveTimeout => "keepalive timeout",
            LinkError::BadFrame => "bad frame from worker",
            LinkError::UnexpectedKind => "unexpected frame kind from worker",
            LinkError::WrongStream => "response frame on the wrong stream",
            LinkError::OutOfTurn => "response frame out of turn",
            LinkError::NoRequest => "response frame without a request",
            LinkError::BadPing => "bad PING body",
            LinkError::BadPong => "bad PONG body",
            LinkError::RequestTimeout => "request timeout",
            LinkError::CancelNotEnded => "cancelled statement did not end",
            LinkError::HungAfterCancel => "worker hung after CANCEL",
            LinkError::Shutdown => "dispatcher shutdown",
            LinkError::Dropped => "pool dropped the link",
            LinkError::SlotTaken => "slot taken from the link",
            LinkError::ResetTimeout => "session reset not answered",
        }
    }

    /// The worker ends by itself: the link lets it exit instead of killing it.
    pub fn worker_exits(self) -> bool {
        matches!(self, LinkError::WorkerClosed | LinkError::WorkerFatal)
    }
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for LinkError {}

#[cfg(test)]
mod tests {
    use super::LinkError;

    #[test]
    fn only_a_closing_or_fatal_worker_exits_by_itself() {
        assert!(LinkError::WorkerClosed.worker_exits());
        assert!(LinkError::WorkerFatal.worker_exits());
        assert!(!LinkError::KeepaliveTimeout.worker_exits());
        assert!(!LinkError::RequestTimeout.worker_exits());
        assert_eq!(LinkError::WorkerClosed.to_string(), "worker closed the connection");
    }
}

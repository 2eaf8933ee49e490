//! The one answer of an admission stage that says no.

use std::borrow::Cow;

use osprey_protocol::{ErrorBody, ErrorCode, Origin};

use crate::policy::{Blocked, Throttled};

/// A stage refused a request before it reached a worker: what (`code`), who said it
/// (`origin`, the dispatcher for every stage today), why (`message`), and whether the
/// client may retry it as it is (`retryable`). Never dispatched: no stage runs after a
/// worker took the request. `outcome` is its `osprey_requests_total` label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub origin: Origin,
    pub retryable: bool,
    pub message: Cow<'static, str>,
    pub outcome: &'static str,
}

impl Refusal {
    /// A refusal of the dispatcher's, retryable as `ErrorBody::undispatched` says.
    pub fn new(outcome: &'static str, code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Refusal {
        let message = message.into();
        let retryable = ErrorBody::undispatched(Origin::Dispatcher, code, "").retryable;
        Refusal {
            code,
            origin: Origin::Dispatcher,
            retryable,
            message,
            outcome,
        }
    }

    /// A policy's own answer (its code, origin and retry advice kept as it says).
    fn from_body(outcome: &'static str, body: ErrorBody) -> Refusal {
        Refusal {
            code: body.code,
            origin: body.origin,
            retryable: body.retryable,
            message: body.message.into(),
            outcome,
        }
    }

    /// The `ERROR` body the stream ends with (dispatched = false).
    pub fn body(&self) -> ErrorBody {
        let mut body = ErrorBody::undispatched(self.origin, self.code, self.message.to_string());
        body.retryable = self.retryable;
        body
    }
}

impl From<Blocked> for Refusal {
    fn from(b: Blocked) -> Refusal {
        Refusal::from_body("sql_blocked", b.error_body())
    }
}

impl From<Throttled> for Refusal {
    fn from(t: Throttled) -> Refusal {
        Refusal::from_body("throttled", t.error_body())
    }
}

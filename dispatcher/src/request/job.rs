//! One client request on its way through the dispatcher. The client connection
//! builds it from a REQUEST; the pool's wait queue owns it until a worker link
//! takes it; that link then owns it until its END (see `pool/relay/`). There is no
//! task per request: the hand-offs between tasks were most of the dispatcher's
//! cost per request (docs/BENCHMARKS.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use osprey_protocol::{ErrorBody, ErrorCode, Frame, Origin};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::request::session::{GatePermit, Session};
use crate::request::streams::StreamGuard;

/// A worker link that could not deliver a job gives it back to the pool; after
/// this many tries it fails with WORKER_LOST (workers keep vanishing).
pub const MAX_DISPATCH_ATTEMPTS: u32 = 3;

pub struct Job {
    /// Owns the client stream: dropping the job answers the client.
    pub guard: StreamGuard,
    /// Cancelled by a client CANCEL or by the connection closing.
    pub cancel: CancellationToken,
    /// The REQUEST frame as received, relayed to the worker unchanged but for its stream id.
    pub frame: Frame,
    /// The client's own timeout, if any (capped by `request_timeout`).
    pub timeout: Option<Duration>,
    pub received: Instant,
    /// Past this, a job still waiting for a worker fails with QUEUE_TIMEOUT.
    pub queue_deadline: Instant,
    /// Workers that vanished before this job reached them.
    pub attempts: u32,
    /// The statement's digest, computed once at REQUEST (interception on, a single
    /// statement): END accounts the execution against it. `None` for a batch (END's time
    /// is the sum of its statements: it would count against an innocent one) or with
    /// interception off.
    pub digest: Option<osprey_sql::Digest>,
    /// This job opens a session (protocol 1.5): the link that takes it pins its worker
    /// and writes nothing to it.
    pub opens: Option<Box<Opening>>,
    /// A statement of a session: only its pinned worker may run it, never another.
    pub in_session: bool,
    /// Its REQUEST asked for each result apart (`multi_results`, protocol 1.7): only then
    /// may the worker send `RESULT_END` on it.
    pub multi_results: bool,
    /// Its REQUEST asked for rows undecoded (`raw_rows`, protocol 1.8): only then may the
    /// worker send `RAW_ROWS` on it (a worker before 1.8 sends `ROWS` still).
    pub raw_rows: bool,
}

/// What a job that opens a session carries to the worker link that pins it.
pub struct Opening {
    pub session: Arc<Session>,
    /// The session's statements, queued by admission for the worker that is pinned.
    pub jobs: tokio::sync::mpsc::Receiver<Job>,
    /// Its place under the slot group's `sessions.max_per_group`, held while it lives.
    pub permit: GatePermit,
    /// Its place under its connection's `sessions.max_per_connection`.
    pub conn_permit: GatePermit,
}

impl Job {
    /// The job of the REQUEST in `frame`, received now, that must reach a worker within
    /// `queue_wait`; `timeout`: the client's own.
    pub fn new(
        guard: StreamGuard,
        cancel: CancellationToken,
        frame: Frame,
        timeout: Option<Duration>,
        queue_wait: Duration,
        digest: Option<osprey_sql::Digest>,
    ) -> Job {
        let received = Instant::now();
        Job {
            guard,
            cancel,
            frame,
            timeout,
            received,
            queue_deadline: received + queue_wait,
            attempts: 0,
            digest,
            opens: None,
            in_session: false,
            multi_results: false,
            raw_rows: false,
        }
    }

    pub fn conn(&self) -> u64 {
        self.guard.shared().id
    }

    pub fn stream(&self) -> u32 {
        self.guard.stream()
    }

    /// Ends the request from the dispatcher's side (the error says whether it was dispatched).
    pub async fn fail(self, metrics: &Metrics, outcome: &'static str, code: ErrorCode, message: &str) {
        metrics.outcome(outcome);
        self.guard
            .fail(ErrorBody::undispatched(Origin::Dispatcher, code, message))
            .await;
    }
}

/// Fails jobs without making the caller wait for room in their clients' queues.
pub fn fail_later(
    jobs: Vec<Job>,
    metrics: Arc<Metrics>,
    outcome: &'static str,
    code: ErrorCode,
    message: impl Into<std::borrow::Cow<'static, str>>,
) {
    if jobs.is_empty() {
        return;
    }
    let message: Arc<str> = Arc::from(message.into().as_ref());
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            // One task each: a client that does not read must not hold up the others.
            for job in jobs {
                let (metrics, message) = (metrics.clone(), message.clone());
                runtime.spawn(async move { job.fail(&metrics, outcome, code, &message).await });
            }
        }
        // No runtime (tests, teardown): the guards' Drop still answers.
        Err(_) => drop(jobs),
    }
}

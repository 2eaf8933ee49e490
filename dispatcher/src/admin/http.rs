//! Admin HTTP API (axum): status, pool resize, drain, clusters, delay and Prometheus metrics,
//! and the operations page (`ui.rs`). The JSON of `/status`, `/cluster` and `/delay`, which
//! the page's snapshots carry too, and [`AdminState`] live in `views.rs`. Every route wants
//! `Authorization: Bearer <admin_token>`, but for the page's shell and assets (`/ui`,
//! `/ui/app.js`, `/ui/app.css`), which hold no data.
//!
//! The server is our own accept loop over hyper's HTTP/1 connection, not `axum::serve`,
//! which has no header-read timeout and no connection cap: request-less connections
//! to this port once held every file descriptor of the process (issue 9). Each
//! connection holds a place of `admin.max_connections` (and of its address's
//! `admin.max_connections_per_address`); when there is none, the oldest connection that
//! has not presented the admin token gives up its own (`admission.rs`), so that a flood
//! cannot lock the operator out (issue 20). A connection must send its first request
//! head within `admin.first_head_timeout_ms` and each later one within
//! `admin.header_read_timeout_ms`, is closed after `admin.idle_timeout_ms` with no byte
//! moving and no request being handled, and each request must be answered within
//! `admin.request_timeout_ms`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use osprey_admin_api::{SessionClient, SessionView};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::debug;

use super::views::{delay_of, reports_of, status_of, AdminState, Status};
use crate::admin::admission::{Admission, Admitted, Held};
use crate::config;
use crate::fds::AcceptErrors;
use crate::metrics::{GroupLabel, SlotLabel};
use crate::secrets::constant_time_eq;

/// Largest request head (start line and headers): admin requests are a few hundred
/// bytes. A larger head gets 431 and the connection is closed.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest read buffer hyper keeps per connection, and the largest request body a route
/// reads (larger: 413).
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// After the stop signal, a connection gets this long to finish its request.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
struct Resize {
    size: usize,
}

/// `?cluster=NAME` (absent: all clusters, or the first for commands).
#[derive(Deserialize)]
struct ClusterQuery {
    cluster: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchoverBody {
    #[serde(default)]
    cluster: Option<String>,
    /// The member to promote (absent: the most advanced eligible replica).
    #[serde(default)]
    to: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MaintenanceBody {
    #[serde(default)]
    cluster: Option<String>,
    member: String,
    on: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DelayResetBody {
    #[serde(default)]
    cluster: Option<String>,
    member: String,
}

pub fn router(state: AdminState) -> Router {
    let api = Router::new()
        .route("/status", get(status))
        .route("/pool/size", post(resize))
        .route("/drain", post(drain))
        .route("/cluster", get(clusters))
        .route("/cluster/events", get(cluster_events))
        .route("/cluster/switchover", post(switchover))
        .route("/cluster/maintenance", post(maintenance))
        .route("/delay", get(delay))
        .route("/delay/reset", post(delay_reset))
        .route("/metrics", get(metrics))
        .route("/sessions", get(sessions))
        .route("/sessions/kill", post(kill_session))
        .route("/digests", get(super::policy::top))
        .route("/digests/blocked", get(super::policy::blocked))
        .route("/digests/block", post(super::policy::block_sql))
        .route("/digests/{id}/block", post(super::policy::block_id))
        .route("/digests/{id}/unblock", post(super::policy::unblock))
        .route(
            "/throttle",
            get(super::policy::throttle).post(super::policy::set_throttle),
        )
        .route(super::ui::EVENTS_PATH, get(super::ui::events))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state);
    // The operations page's shell and assets hold no data: served without the token
    // (the page asks for it, and every data call sends it).
    api.merge(super::ui::pages())
}

async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    if has_token(request.headers(), &state.ctx.admin_token) {
        next.run(request).await
    } else {
        unauthorized()
    }
}

fn has_token(headers: &header::HeaderMap, admin_token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| constant_time_eq(token.as_bytes(), admin_token.as_bytes()))
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        "admin token required: Authorization: Bearer <token>\n",
    )
        .into_response()
}

/// `GET /sessions`: every session pinned to a worker now, oldest first.
async fn sessions(State(state): State<AdminState>) -> Json<Vec<SessionView>> {
    let mut all: Vec<SessionView> = state
        .ctx
        .groups
        .iter()
        .flat_map(|g| g.sessions.sessions())
        .filter_map(|s| {
            let pinned = s.pinned()?;
            Some(SessionView {
                conn: s.conn,
                session: s.stream,
                cluster: s.cluster.clone(),
                member: pinned.member,
                slot: pinned.slot,
                read_only: pinned.read_only,
                age_ms: s.opened.elapsed().as_millis() as u64,
                in_transaction: s.in_transaction(),
                transaction_ms: s.transaction_age().map_or(0, |d| d.as_millis() as u64),
                client: state.ctx.clients.get(s.conn).map(|c| SessionClient {
                    protocol: c.protocol.to_string(),
                    user: c.user.clone(),
                    peer: c.peer.map(|p| p.to_string()),
                    attrs: c.attrs.clone(),
                    pinned_by: c.pinned_by().map(str::to_string),
                    connected_ms: c.since.elapsed().as_millis() as u64,
                }),
            })
        })
        .collect();
    all.sort_by_key(|s| std::cmp::Reverse(s.age_ms));
    Json(all)
}

#[derive(Deserialize)]
struct KillBody {
    conn: u64,
    session: u32,
}

/// `POST /sessions/kill` `{"conn", "session"}`: ends that session as its client's would be
/// ended by an abort (`SESSION_ABORTED`, reason `operator`; an open transaction rolled back).
async fn kill_session(State(state): State<AdminState>, Json(body): Json<KillBody>) -> Response {
    let found = state
        .ctx
        .groups
        .iter()
        .flat_map(|g| g.sessions.sessions())
        .find(|s| s.conn == body.conn && s.stream == body.session);
    match found {
        Some(s) => {
            tracing::info!(
                conn = body.conn,
                session = body.session,
                "session ended through the admin API"
            );
            s.killed.cancel();
            Json(json!({"conn": body.conn, "session": body.session, "ended": true})).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            format!(
                "no session {} on connection {} holds a worker\n",
                body.session, body.conn
            ),
        )
            .into_response(),
    }
}

async fn status(State(state): State<AdminState>) -> Json<Status> {
    Json(status_of(&state.ctx, &state.fds))
}

async fn resize(State(state): State<AdminState>, Json(body): Json<Resize>) -> Response {
    if body.size == 0 || body.size > 4096 {
        return (StatusCode::BAD_REQUEST, "size must be between 1 and 4096\n").into_response();
    }
    if state.ctx.draining.is_cancelled() {
        return (StatusCode::CONFLICT, "the dispatcher is draining\n").into_response();
    }
    // Every cluster's write slots take the new size; the read slots stay as they are.
    if let Err(e) = state.fds.fits(&state.ctx.config, body.size) {
        return (StatusCode::CONFLICT, format!("pool size {} refused: {e}\n", body.size)).into_response();
    }
    state.supervisor.resize(body.size);
    Json(serde_json::json!({ "size": body.size })).into_response()
}

async fn clusters(State(state): State<AdminState>, Query(q): Query<ClusterQuery>) -> Response {
    let reports = reports_of(&state.ctx, q.cluster.as_deref());
    if reports.is_empty() {
        return unknown_cluster(q.cluster.as_deref());
    }
    Json(serde_json::json!({ "clusters": reports })).into_response()
}

async fn cluster_events(State(state): State<AdminState>, Query(q): Query<ClusterQuery>) -> Response {
    Json(serde_json::json!({ "events": state.ctx.events.list(q.cluster.as_deref()) })).into_response()
}

async fn switchover(State(state): State<AdminState>, Json(body): Json<SwitchoverBody>) -> Response {
    let Some(cluster) = state.ctx.cluster(body.cluster.as_deref()) else {
        return unknown_cluster(body.cluster.as_deref());
    };
    match cluster.switchover(body.to).await {
        Ok(event) => Json(event).into_response(),
        Err(e) => (StatusCode::CONFLICT, format!("switchover refused: {e}\n")).into_response(),
    }
}

async fn maintenance(State(state): State<AdminState>, Json(body): Json<MaintenanceBody>) -> Response {
    let Some(cluster) = state.ctx.cluster(body.cluster.as_deref()) else {
        return unknown_cluster(body.cluster.as_deref());
    };
    match cluster.set_maintenance(&body.member, body.on) {
        Ok(()) => Json(serde_json::json!({ "cluster": cluster.name, "member": body.member, "maintenance": body.on }))
            .into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
    }
}

/// `GET /delay`: each cluster's delay probe (`enabled: false` for a cluster without one),
/// with `eligible` as of now.
async fn delay(State(state): State<AdminState>, Query(q): Query<ClusterQuery>) -> Response {
    let clusters = delay_of(&state.ctx, q.cluster.as_deref());
    if clusters.is_empty() {
        return unknown_cluster(q.cluster.as_deref());
    }
    Json(serde_json::json!({ "clusters": clusters })).into_response()
}

/// `POST /delay/reset`: closes a member's probe session; the next round opens a new one.
async fn delay_reset(State(state): State<AdminState>, Json(body): Json<DelayResetBody>) -> Response {
    use crate::cluster::delay::DelayError;
    let Some(cluster) = state.ctx.cluster(body.cluster.as_deref()) else {
        return unknown_cluster(body.cluster.as_deref());
    };
    let Some(d) = cluster.delay.get() else {
        return (
            StatusCode::CONFLICT,
            format!(
                "cluster {} has no delay detection (delay_period_ms, delay_threshold_ms, delay_database)\n",
                cluster.name
            ),
        )
            .into_response();
    };
    match d.reset(&body.member) {
        Ok(()) => {
            Json(serde_json::json!({ "cluster": cluster.name, "member": body.member, "reset": true })).into_response()
        }
        Err(e @ DelayError::NoSuchMember(..)) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Err(e @ DelayError::Busy(_)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        Err(e @ DelayError::Stopped(_)) => (StatusCode::CONFLICT, format!("{e}\n")).into_response(),
    }
}

fn unknown_cluster(name: Option<&str>) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!("no cluster {:?}\n", name.unwrap_or_default()),
    )
        .into_response()
}

async fn drain(State(state): State<AdminState>) -> Response {
    state.ctx.draining.cancel();
    Json(serde_json::json!({ "draining": true })).into_response()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let mut slots = Vec::new();
    let mut groups = Vec::new();
    for g in &state.ctx.groups {
        let (pool, views) = g.view();
        groups.push((
            GroupLabel {
                cluster: pool.cluster.clone(),
                role: pool.role.name(),
                member: pool.member.clone().unwrap_or_default(),
            },
            pool.longest_wait_ms as f64 / 1000.0,
        ));
        slots.extend(views.into_iter().map(|s| {
            let label = SlotLabel {
                cluster: s.cluster,
                role: pool.role.name(),
                member: s.backend,
                slot: s.slot,
            };
            (label, s.pipeline)
        }));
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.ctx.metrics.encode_with_slots(slots, groups),
    )
        .into_response()
}

/// Serves the admin API on `listener` until `stop`; then stops accepting and gives open
/// connections [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(listener: TcpListener, state: AdminState, stop: CancellationToken) {
    let cfg = state.ctx.config.admin.clone();
    let metrics = state.ctx.metrics.clone();
    let admin_token: Arc<str> = state.ctx.admin_token.as_str().into();
    let app = router(state);
    let admission = Admission::new(cfg.max_connections, cfg.per_address());
    let mut errors = AcceptErrors::new("admin");
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.cancelled() => break,
        };
        while conns.try_join_next().is_some() {}
        let (socket, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                errors.failed(&e, &metrics).await;
                continue;
            }
        };
        // An operator's client writes its request right after connecting: under a flood
        // its bytes are usually waiting by the time it is accepted, which puts it behind
        // every silent connection in the eviction order from the start.
        let sent = has_bytes_waiting(&socket);
        let held = tokio::select! {
            a = admission.admit(peer.ip(), sent) => a,
            _ = stop.cancelled() => break,
        };
        let held = match held {
            Admitted::Held { held, evicted } => {
                if evicted > 0 {
                    metrics.admin_evicted.inc_by(evicted as u64);
                    debug!(%peer, evicted, "admin connections without the token closed to make room");
                }
                held
            }
            Admitted::Full => {
                // No connection in the way may make room for this one (token holders,
                // or ones that sent bytes while this one has not). Closed at once rather
                // than left in the backlog: the peer learns at once, and the descriptor
                // is back before the next accept.
                metrics.admin_rejected.inc();
                debug!(%peer, sent, "no admin connection may make room; closing a new one");
                continue;
            }
        };
        conns.spawn(connection(
            socket,
            app.clone(),
            cfg.clone(),
            held,
            admin_token.clone(),
            stop.clone(),
            metrics.clone(),
        ));
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE * 2, async { while conns.join_next().await.is_some() {} }).await;
}

/// Whether the peer's first bytes are already in the socket (a peek: nothing is taken).
fn has_bytes_waiting(socket: &TcpStream) -> bool {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    // The socket is non-blocking: nothing there is WouldBlock, not a wait.
    matches!(socket2::SockRef::from(socket).peek(&mut buf), Ok(n) if n > 0)
}

async fn connection(
    socket: TcpStream,
    app: Router,
    cfg: config::Admin,
    held: Held,
    admin_token: Arc<str>,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
) {
    metrics.admin_connections.inc();
    let _open = scopeguard(move || {
        metrics.admin_connections.dec();
    });
    let _ = socket.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let standing = held.standing.clone();
    let io = TokioIo::new(Tracked {
        inner: socket,
        activity: activity.clone(),
        standing: standing.clone(),
    });
    let request_timeout = Duration::from_millis(cfg.request_timeout_ms);
    let service = hyper::service::service_fn({
        let activity = activity.clone();
        move |req: hyper::Request<Incoming>| {
            let app = app.clone();
            let busy = activity.busy();
            // Seen with the token once: the connection is an operator's, never evicted.
            // (The router checks the token of every request all the same.)
            if has_token(req.headers(), &admin_token) {
                if req.uri().path() == super::ui::EVENTS_PATH {
                    // A feed never ends: it must not hold its place for good.
                    standing.feed();
                } else {
                    standing.trust();
                }
            }
            async move {
                let _busy = busy;
                match tokio::time::timeout(request_timeout, app.oneshot(req)).await {
                    Ok(Ok(response)) => Ok::<_, Infallible>(response),
                    Ok(Err(never)) => match never {},
                    Err(_) => Ok((
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::CONNECTION, "close")],
                        "admin request not answered within admin.request_timeout_ms\n",
                    )
                        .into_response()),
                }
            }
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(cfg.header_read_timeout_ms))
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_REQUEST_BYTES);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let idle = Duration::from_millis(cfg.idle_timeout_ms);
    let first_head = Duration::from_millis(cfg.first_head_timeout_ms);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                debug!("admin connection ended: {e}");
            }
        }
        _ = activity.idle_for(idle) => debug!("admin connection idle for admin.idle_timeout_ms; closed"),
        _ = activity.no_request_within(first_head) => {
            debug!("no request head within admin.first_head_timeout_ms; closed");
        }
        _ = held.evicted.cancelled() => debug!("admin connection without the token evicted for a new one"),
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
        }
    }
    // `held`, a parameter, is dropped after the connection (a local), so its socket is
    // closed before its place is given up: the cap counts descriptors.
}

/// Runs `f` on drop.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// When bytes last moved on a connection, and how many of its requests are being handled.
struct Activity {
    base: Instant,
    last_ms: AtomicU64,
    busy: AtomicUsize,
    /// Set once a complete request head has come.
    requested: std::sync::atomic::AtomicBool,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            requested: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Held while a request is handled: the request timeout bounds that time, not the
    /// idle timeout (a handler moves no bytes).
    fn busy(self: &Arc<Self>) -> impl Drop + Send + 'static {
        self.requested.store(true, Ordering::Relaxed);
        self.busy.fetch_add(1, Ordering::Relaxed);
        let this = self.clone();
        scopeguard(move || {
            this.touch();
            this.busy.fetch_sub(1, Ordering::Relaxed);
        })
    }

    /// Completes at `limit` after accept if no complete request head has come by then;
    /// otherwise never.
    async fn no_request_within(&self, limit: Duration) {
        tokio::time::sleep(limit).await;
        if self.requested.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    }

    /// Completes once no byte has moved for `limit` while no request was being handled.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let since = self
                .base
                .elapsed()
                .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)));
            let wait = if self.busy.load(Ordering::Relaxed) > 0 {
                limit
            } else if since >= limit {
                return;
            } else {
                limit - since
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// A socket that records in [`Activity`] every read or write that moved bytes, and in
/// its [`Standing`](crate::admin::admission::Standing) that the peer has sent some.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
    standing: Arc<crate::admin::admission::Standing>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
            self.standing.sent();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

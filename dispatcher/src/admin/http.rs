//! Admin HTTP API (axum): status, pool resize, drain, clusters, delay and Prometheus metrics.
//! Every route wants `Authorization: Bearer <admin_token>`.
//!
//! The server is our own accept loop over hyper's HTTP/1 connection, not `axum::serve`,
//! which has no header-read timeout and no connection cap: request-less connections
//! to this port once held every file descriptor of the process (issue 9). Each
//! connection holds a permit of `admin.max_connections` (one more is closed at
//! accept), must send its request head within `admin.header_read_timeout_ms`, is
//! closed after `admin.idle_timeout_ms` with no byte moving and no request being
//! handled, and each request must be answered within `admin.request_timeout_ms`. A few
//! permits are token slots ([`MAX_TOKEN_SLOTS`]), held only briefly by anyone without
//! the admin token, so that a flood of the others does not lock the operator out.

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
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::debug;

use crate::config;
use crate::ctx::{constant_time_eq, Ctx};
use crate::fds::{self, AcceptErrors, FdBudget};
use crate::metrics::{GroupLabel, SlotLabel};
use crate::pool::supervisor::Supervisor;
use crate::pool::{PoolView, SlotView};

/// Largest request head (start line and headers): admin requests are a few hundred
/// bytes. A larger head gets 431 and the connection is closed.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest read buffer hyper keeps per connection, and the largest request body a route
/// reads (larger: 413).
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// After the stop signal, a connection gets this long to finish its request.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// Slots of `admin.max_connections` kept for when every other one is held (a flood):
/// `min(4, max_connections / 2)`. A connection on one must send each request head within
/// [`TOKEN_SLOT_HEAD_TIMEOUT`] and present the admin token in each request, else it is
/// closed; so a flood holds one only that long, and an operator's `/status` gets in
/// once the flood stops coming instead of when its connections time out.
const MAX_TOKEN_SLOTS: usize = 4;
/// An operator's client sends its whole request at once.
const TOKEN_SLOT_HEAD_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct AdminState {
    pub ctx: Arc<Ctx>,
    pub supervisor: Arc<Supervisor>,
    /// The file-descriptor plan: a resize must keep its reserve.
    pub fds: FdBudget,
}

#[derive(Serialize)]
pub struct Status {
    pub version: &'static str,
    pub pid: u32,
    pub uptime_s: f64,
    pub draining: bool,
    /// The first cluster's write slots.
    pub pool: PoolView,
    /// Every slot of every group.
    pub slots: Vec<SlotView>,
    /// Every slot group (one per cluster: its write slots).
    pub groups: Vec<PoolView>,
    pub clusters: Vec<ClusterSummary>,
    pub clients: Clients,
    pub streams: Streams,
    pub fds: Fds,
}

#[derive(Serialize)]
pub struct Fds {
    /// The soft RLIMIT_NOFILE the dispatcher runs with.
    pub limit: usize,
    /// Descriptors kept out of the client cap for workers, respawns and the admin port.
    pub reserve: usize,
    pub max_client_connections: usize,
    /// Descriptors open now.
    pub open: Option<usize>,
    pub admin_connections: i64,
}

#[derive(Serialize)]
pub struct Clients {
    pub connections: i64,
    pub open_streams: i64,
}

#[derive(Serialize)]
pub struct Streams {
    pub opened: u64,
    pub closed: u64,
}

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

/// One line per cluster in `/status`.
#[derive(Serialize)]
pub struct ClusterSummary {
    pub name: String,
    pub topology: &'static str,
    pub primary: Option<String>,
    pub status: crate::cluster::ClusterStatus,
    pub epoch: u64,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
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
        .route("/digests", get(super::policy::top))
        .route("/digests/blocked", get(super::policy::blocked))
        .route("/digests/block", post(super::policy::block_sql))
        .route("/digests/{id}/block", post(super::policy::block_id))
        .route("/digests/{id}/unblock", post(super::policy::unblock))
        .route(
            "/throttle",
            get(super::policy::throttle).post(super::policy::set_throttle),
        )
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    if has_token(request.headers(), &state.ctx.admin_token) {
        next.run(request).await
    } else {
        unauthorized(false)
    }
}

fn has_token(headers: &header::HeaderMap, admin_token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| constant_time_eq(token.as_bytes(), admin_token.as_bytes()))
}

fn unauthorized(close: bool) -> Response {
    let mut response = (
        StatusCode::UNAUTHORIZED,
        "admin token required: Authorization: Bearer <token>\n",
    )
        .into_response();
    if close {
        response
            .headers_mut()
            .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    response
}

pub fn status_of(ctx: &Ctx, budget: &FdBudget) -> Status {
    let (pool, _) = ctx.pool.view();
    let mut slots = Vec::new();
    let mut groups = Vec::new();
    for g in &ctx.groups {
        let (view, s) = g.view();
        groups.push(view);
        slots.extend(s);
    }
    let clusters = ctx
        .clusters
        .iter()
        .map(|c| {
            let v = c.provider.view.borrow();
            ClusterSummary {
                name: c.name.clone(),
                topology: v.topology,
                primary: v.primary.clone(),
                status: v.status.clone(),
                epoch: v.epoch,
            }
        })
        .collect();
    Status {
        groups,
        clusters,
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        uptime_s: ctx.started.elapsed().as_secs_f64(),
        draining: ctx.draining.is_cancelled(),
        pool,
        slots,
        clients: Clients {
            connections: ctx.metrics.client_connections.get(),
            open_streams: ctx.metrics.streams_open.get(),
        },
        streams: Streams {
            opened: ctx.metrics.streams_opened.get(),
            closed: ctx.metrics.streams_closed.get(),
        },
        fds: Fds {
            limit: budget.limit,
            reserve: budget.reserve,
            max_client_connections: budget.max_client_connections,
            open: fds::open_count(),
            admin_connections: ctx.metrics.admin_connections.get(),
        },
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
    let reports: Vec<_> = state
        .ctx
        .clusters
        .iter()
        .filter(|c| q.cluster.as_deref().is_none_or(|n| n == c.name))
        .map(|c| c.report())
        .collect();
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
    let clusters: Vec<serde_json::Value> = state
        .ctx
        .clusters
        .iter()
        .filter(|c| q.cluster.as_deref().is_none_or(|n| n == c.name))
        .map(|c| match c.delay.get() {
            Some(d) => {
                let mut view = d.view.borrow().clone();
                let now: Vec<bool> = view.replicas.iter().map(|r| view.eligible(&r.name)).collect();
                for (r, eligible) in view.replicas.iter_mut().zip(now) {
                    r.eligible = eligible;
                }
                let mut v = serde_json::to_value(view).unwrap_or_default();
                v["enabled"] = true.into();
                v
            }
            None => serde_json::json!({ "cluster": c.name, "enabled": false }),
        })
        .collect();
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
                role: pool.role,
                member: pool.member.clone().unwrap_or_default(),
            },
            pool.longest_wait_ms as f64 / 1000.0,
        ));
        slots.extend(views.into_iter().map(|s| {
            let label = SlotLabel {
                cluster: s.cluster,
                role: pool.role,
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
    let token_slots = MAX_TOKEN_SLOTS.min(cfg.max_connections / 2);
    let permits = Arc::new(Semaphore::new(cfg.max_connections - token_slots));
    let token_permits = Arc::new(Semaphore::new(token_slots));
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
        let (permit, token_slot) = match permits.clone().try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => match token_permits.clone().try_acquire_owned() {
                Ok(p) => (p, true),
                Err(_) => {
                    // Closed at once rather than left in the backlog: the peer learns at
                    // once, and the descriptor is back before the next accept.
                    metrics.admin_rejected.inc();
                    debug!(%peer, "admin.max_connections open; closing a new admin connection");
                    continue;
                }
            },
        };
        conns.spawn(connection(
            socket,
            app.clone(),
            cfg.clone(),
            Slot {
                _permit: permit,
                token_only: token_slot.then(|| admin_token.clone()),
            },
            stop.clone(),
            metrics.clone(),
        ));
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE * 2, async { while conns.join_next().await.is_some() {} }).await;
}

/// What an admin connection holds of `admin.max_connections`.
struct Slot {
    _permit: OwnedSemaphorePermit,
    /// On a token slot: the admin token each request must present.
    token_only: Option<Arc<str>>,
}

async fn connection(
    socket: TcpStream,
    app: Router,
    cfg: config::Admin,
    slot: Slot,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
) {
    metrics.admin_connections.inc();
    let _open = scopeguard(move || {
        metrics.admin_connections.dec();
    });
    let _ = socket.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: socket,
        activity: activity.clone(),
    });
    let request_timeout = Duration::from_millis(cfg.request_timeout_ms);
    let mut header_read_timeout = Duration::from_millis(cfg.header_read_timeout_ms);
    if slot.token_only.is_some() {
        header_read_timeout = header_read_timeout.min(TOKEN_SLOT_HEAD_TIMEOUT);
    }
    let token_only = slot.token_only.clone();
    let service = hyper::service::service_fn({
        let activity = activity.clone();
        move |req: hyper::Request<Incoming>| {
            let app = app.clone();
            let busy = activity.busy();
            // Refused before the router reads a byte of the body.
            let refused = token_only
                .as_deref()
                .is_some_and(|token| !has_token(req.headers(), token));
            async move {
                let _busy = busy;
                if refused {
                    return Ok(unauthorized(true));
                }
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
        .header_read_timeout(header_read_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_REQUEST_BYTES);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let idle = Duration::from_millis(cfg.idle_timeout_ms);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                debug!("admin connection ended: {e}");
            }
        }
        _ = activity.idle_for(idle) => debug!("admin connection idle for admin.idle_timeout_ms; closed"),
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
        }
    }
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
}

impl Activity {
    fn new() -> Activity {
        Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Held while a request is handled: the request timeout bounds that time, not the
    /// idle timeout (a handler moves no bytes).
    fn busy(self: &Arc<Self>) -> impl Drop + Send + 'static {
        self.busy.fetch_add(1, Ordering::Relaxed);
        let this = self.clone();
        scopeguard(move || {
            this.touch();
            this.busy.fetch_sub(1, Ordering::Relaxed);
        })
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

/// A socket that records in [`Activity`] every read or write that moved bytes.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
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

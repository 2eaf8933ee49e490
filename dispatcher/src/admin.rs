//! Admin HTTP API (axum): status, pool resize, drain and Prometheus metrics.
//! Every route wants `Authorization: Bearer <admin_token>`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::ctx::{constant_time_eq, Ctx};
use crate::pool::{PoolView, SlotView};
use crate::supervisor::Supervisor;

#[derive(Clone)]
pub struct AdminState {
    pub ctx: Arc<Ctx>,
    pub supervisor: Arc<Supervisor>,
}

#[derive(Serialize)]
pub struct Status {
    pub version: &'static str,
    pub pid: u32,
    pub uptime_s: f64,
    pub draining: bool,
    pub pool: PoolView,
    pub slots: Vec<SlotView>,
    pub clients: Clients,
    pub streams: Streams,
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

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/pool/size", post(resize))
        .route("/drain", post(drain))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), state.ctx.admin_token.as_bytes()) => next.run(request).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            "admin token required: Authorization: Bearer <token>\n",
        )
            .into_response(),
    }
}

pub fn status_of(ctx: &Ctx) -> Status {
    let (pool, slots) = ctx.pool.view();
    Status {
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
    }
}

async fn status(State(state): State<AdminState>) -> Json<Status> {
    Json(status_of(&state.ctx))
}

async fn resize(State(state): State<AdminState>, Json(body): Json<Resize>) -> Response {
    if body.size == 0 || body.size > 4096 {
        return (StatusCode::BAD_REQUEST, "size must be between 1 and 4096\n").into_response();
    }
    if state.ctx.draining.is_cancelled() {
        return (StatusCode::CONFLICT, "the dispatcher is draining\n").into_response();
    }
    state.supervisor.resize(body.size);
    Json(serde_json::json!({ "size": body.size })).into_response()
}

async fn drain(State(state): State<AdminState>) -> Response {
    state.ctx.draining.cancel();
    Json(serde_json::json!({ "draining": true })).into_response()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.ctx.metrics.encode(),
    )
        .into_response()
}

//! Admin API of the request policy: digests (top, blocked, block, unblock) and the
//! per-member throttle (status, live limits). Routes are mounted by `http.rs`.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use osprey_sql::{digest_id, parse_digest_id};
use serde::Deserialize;
use serde_json::json;

use super::AdminState;
use crate::ctx::Ctx;
use crate::policy::{Limit, TopBy};

/// Rows of each top list by default, and at most.
const TOP_DEFAULT: usize = 20;
const TOP_MAX: usize = 1000;

#[derive(Deserialize)]
pub struct TopQuery {
    limit: Option<usize>,
}

/// `GET /digests`: the top digests by count and by total time, each with its state
/// (`ok`, `counting`, `blocked`), and the settings in force.
pub async fn top(State(state): State<AdminState>, Query(q): Query<TopQuery>) -> Response {
    let limit = q.limit.unwrap_or(TOP_DEFAULT).clamp(1, TOP_MAX);
    Json(top_of(&state.ctx, limit)).into_response()
}

/// What `GET /digests` answers, with `limit` rows in each top list.
pub(super) fn top_of(ctx: &Ctx, limit: usize) -> serde_json::Value {
    let i = &ctx.policy.intercept;
    let s = i.settings();
    json!({
        "enabled": s.enabled,
        "slow_threshold_ms": s.slow_threshold.as_millis() as u64,
        "slow_count": s.slow_count,
        "slow_window_s": s.slow_window.as_secs(),
        "block_ttl_s": s.block_ttl.map_or(0, |t| t.as_secs()),
        "by_count": i.top(TopBy::Count, limit),
        "by_time": i.top(TopBy::Time, limit),
        "blocked": i.blocked(),
    })
}

/// `GET /digests/blocked`.
pub async fn blocked(State(state): State<AdminState>) -> Response {
    Json(json!({ "blocked": state.ctx.policy.intercept.blocked() })).into_response()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BlockBody {
    /// The statement to block (`POST /digests/block`); its digest is what is blocked.
    #[serde(default)]
    sql: Option<String>,
    /// Seconds the block lasts; absent or 0: until unblocked.
    #[serde(default)]
    ttl_s: Option<u64>,
}

fn ttl(body: &BlockBody) -> Option<Duration> {
    body.ttl_s.filter(|&s| s > 0).map(Duration::from_secs)
}

fn bad_id(id: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        format!("{id:?} is not a digest id (16 hex digits)\n"),
    )
        .into_response()
}

/// `POST /digests/{id}/block` (body optional: `{"ttl_s": N}`).
pub async fn block_id(
    State(state): State<AdminState>,
    Path(id): Path<String>,
    body: Option<Json<BlockBody>>,
) -> Response {
    let Some(hash) = parse_digest_id(&id) else {
        return bad_id(&id);
    };
    let body = body.map(|Json(b)| b).unwrap_or_default();
    if body.sql.is_some() {
        return (StatusCode::BAD_REQUEST, "sql goes to POST /digests/block\n").into_response();
    }
    state.ctx.policy.intercept.block_hash(hash, None, ttl(&body));
    Json(json!({ "id": digest_id(hash), "blocked": true, "ttl_s": body.ttl_s.unwrap_or(0) })).into_response()
}

/// `POST /digests/block` `{"sql": "...", "ttl_s"?: N}`: blocks the statement's digest.
pub async fn block_sql(State(state): State<AdminState>, Json(body): Json<BlockBody>) -> Response {
    let Some(sql) = body.sql.as_deref().filter(|s| !s.trim().is_empty()) else {
        return (StatusCode::BAD_REQUEST, "body needs {\"sql\": \"...\"}\n").into_response();
    };
    let d = osprey_sql::digest(sql);
    state.ctx.policy.intercept.block(&d, ttl(&body));
    Json(json!({ "id": d.id(), "text": d.text, "blocked": true, "ttl_s": body.ttl_s.unwrap_or(0) })).into_response()
}

/// `POST /digests/{id}/unblock`: 404 when it was not blocked.
pub async fn unblock(State(state): State<AdminState>, Path(id): Path<String>) -> Response {
    let Some(hash) = parse_digest_id(&id) else {
        return bad_id(&id);
    };
    if state.ctx.policy.intercept.unblock(hash) {
        Json(json!({ "id": digest_id(hash), "blocked": false })).into_response()
    } else {
        (
            StatusCode::NOT_FOUND,
            format!("digest {} is not blocked\n", digest_id(hash)),
        )
            .into_response()
    }
}

/// `GET /throttle`: every throttled member (`cluster/member`), and the wait settings.
pub async fn throttle(State(state): State<AdminState>) -> Response {
    Json(throttle_of(&state.ctx)).into_response()
}

/// What `GET /throttle` answers.
pub(super) fn throttle_of(ctx: &Ctx) -> serde_json::Value {
    let t = &ctx.policy.throttle;
    let s = t.settings();
    json!({
        "wait_ms": s.wait.as_millis() as u64,
        "queue_capacity": s.queue_capacity,
        "members": t.status(),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleBody {
    #[serde(default)]
    cluster: Option<String>,
    member: String,
    /// 0 or null: no limit.
    #[serde(default)]
    max_qps: Option<f64>,
    #[serde(default)]
    burst: Option<f64>,
}

/// `POST /throttle` `{"cluster"?, "member", "max_qps", "burst"?}`: a live limit (until
/// the next SIGHUP, which applies the file's).
pub async fn set_throttle(State(state): State<AdminState>, Json(body): Json<ThrottleBody>) -> Response {
    let Some(cluster) = state.ctx.cluster(body.cluster.as_deref()) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no cluster {:?}\n", body.cluster.unwrap_or_default()),
        )
            .into_response();
    };
    let known = cluster.config().borrow().members.iter().any(|m| m.name == body.member);
    if !known {
        return (
            StatusCode::NOT_FOUND,
            format!("cluster {} has no member {:?}\n", cluster.name, body.member),
        )
            .into_response();
    }
    let rate = body.max_qps.filter(|q| *q > 0.0);
    if rate.is_some_and(|q| !q.is_finite()) || body.burst.is_some_and(|b| !b.is_finite() || b < 0.0) {
        return (StatusCode::BAD_REQUEST, "max_qps and burst must be finite, >= 0\n").into_response();
    }
    let key = Ctx::throttle_key(&cluster.name, &body.member);
    let limit = rate.map(|q| Limit::new(q, body.burst.filter(|b| *b > 0.0)));
    state.ctx.policy.throttle.set_limit(&key, limit);
    tracing::info!(member = %key, max_qps = ?limit.map(|l| l.max_qps), "throttle limit set through the admin API");
    Json(json!({
        "member": key,
        "max_qps": limit.map(|l| l.max_qps),
        "burst": limit.map(|l| l.burst),
    }))
    .into_response()
}

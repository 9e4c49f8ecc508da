//! The admin HTTP server.
//!
//! Endpoints:
//! - `POST /json`: a `RateLimitRequest` in proto3 JSON → the `RateLimitResponse`; 200 OK,
//!   429 over limit, 400 bad input (with the reason), 503 store unavailable;
//! - `GET /healthcheck`: 200 `OK` while serving, 503 from the moment shutdown starts, 500
//!   while `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` finds no domain (as the reference);
//! - `GET /ready`: 200 once the policy is loaded and until draining starts, else 503;
//! - `GET /rlconfig`: the loaded rules, sorted, then `#` lines on the config and the store;
//! - `GET /metrics`: Prometheus text exposition;
//! - `POST /explain`, `GET /counters`, `DELETE /counters`: the admin API ([`api`]) as JSON.
//!
//! The admin API itself, `sluice.admin.v1.Admin`, is served on the gRPC port ([`api`]).

pub mod api;
pub mod counters;
pub mod json;
mod reset;
mod top;

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::health::Health;
use crate::limiter::Limiter;
use crate::metrics::Exposition;
use crate::rls::RlsService;
use crate::source::SharedConfigInfo;

pub use crate::source::ConfigInfo;
pub use api::AdminService;
pub use reset::{
    MAX_TOKEN_BYTES, Refusal, ResetAccess, ResetSettings, TOKEN_READ_DEADLINE,
    TOKEN_STARTUP_DEADLINE, read_token, read_token_within,
};

/// What the admin handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The gRPC service, whose request path `/json` reuses.
    pub rls: RlsService,
    /// The limiter, for the policy and store status.
    pub limiter: Arc<Limiter>,
    /// Serving state.
    pub health: Arc<Health>,
    /// The loaded config's origin and the last reload's outcome.
    pub config: SharedConfigInfo,
    /// Metrics, served at `/metrics`.
    pub metrics: Arc<dyn Exposition>,
    /// Who may reset counters (`DELETE /counters`).
    pub reset: Arc<ResetAccess>,
    /// The RLQS face, for its `/rlconfig` lines.
    pub rlqs: Option<Arc<crate::quota::Quotas>>,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/json", post(json_check))
        .route("/healthcheck", get(healthcheck))
        .route("/ready", get(ready))
        .route("/rlconfig", get(rlconfig))
        .route("/metrics", get(metrics))
        .route("/explain", post(counters::explain))
        .route("/counters", get(counters::get).delete(counters::delete))
        .route("/top", get(top::get))
        .with_state(state)
}

async fn json_check(
    State(state): State<AdminState>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let span = state.rls.span(crate::traces::Method::Json, &headers);
    let request = serde_json::from_slice::<json::JsonRequest>(&body)
        .map_err(|e| e.to_string())
        .and_then(|r| r.into_proto().map_err(|e| e.to_string()));
    let request = match request {
        Ok(request) => request,
        Err(e) => {
            let message = format!("invalid RateLimitRequest JSON: {e}");
            if let Some(span) = span {
                span.end("InvalidArgument", Some(&message));
            }
            return bad_request(message);
        }
    };
    match state.rls.answer_counted("json", request, None, span).await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(json::response_to_json(&response))).into_response()
        }
        Err(status) => {
            let code = match status.code() {
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (code, format!("{}\n", status.message())).into_response()
        }
    }
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response()
}

async fn healthcheck(State(state): State<AdminState>) -> Response {
    if state.health.is_serving() {
        (StatusCode::OK, "OK").into_response()
    } else if state.health.waits_for_config() {
        // No domain loaded under HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: 500, as the
        // reference's health handler answers it.
        (StatusCode::INTERNAL_SERVER_ERROR, state.health.reason()).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, state.health.reason()).into_response()
    }
}

async fn ready(State(state): State<AdminState>) -> Response {
    if let Some(seconds) = state.health.busy_for() {
        // Readiness only: liveness stays, a restart would not help a fleet short of turns.
        let body = format!(
            "not ready\nbusy: every gRPC request turn (GRPC_MAX_IN_FLIGHT) taken, with requests waiting, for {seconds} s\n"
        );
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    if state.health.is_serving() {
        // A full store still serves (evicting the counters it can best spare), but the
        // operator must see it: it means the cap is too small for the traffic.
        let store = state.limiter.store().status();
        if store.full {
            let body = format!(
                "ready\nstore full: {} of at most {} counters tracked, {} live counters evicted; raise MEMORY_MAX_KEYS or use a shared store\n",
                store.tracked_keys.unwrap_or(0),
                store.max_keys.unwrap_or(0),
                store.evicted_keys
            );
            return (StatusCode::OK, body).into_response();
        }
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    metrics_text(&*state.metrics)
}

/// The Prometheus text exposition (also served on `PROMETHEUS_ADDR` when set).
pub fn metrics_text(metrics: &dyn Exposition) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render(),
    )
        .into_response()
}

async fn rlconfig(State(state): State<AdminState>) -> Response {
    let policy = state.limiter.policy();
    let mut out = policy.dump();
    let config = state.config.read().clone();
    let _ = writeln!(
        out,
        "# config: {} domains from {} files in {}: {}",
        policy.domain_count(),
        config.files.len(),
        config.directory,
        config.files.join(", ")
    );
    if let Some(reload) = &config.last_reload {
        let _ = writeln!(out, "# last reload: {reload}");
    }
    if let Some(connection) = &config.connection {
        let _ = writeln!(out, "# source: {connection}");
    }
    let store = state.limiter.store().status();
    let _ = write!(out, "# store: {}", store.kind);
    if let (Some(tracked), Some(max)) = (store.tracked_keys, store.max_keys) {
        let _ = write!(out, ", {tracked} keys tracked of at most {max}");
    }
    if store.tracked_keys.is_some() {
        let _ = write!(out, ", {} live keys evicted", store.evicted_keys);
    }
    if let Some(bytes) = store.bytes {
        let _ = write!(out, ", {bytes} bytes");
    }
    if store.full {
        let _ = write!(out, ", full");
    }
    if let Some(detail) = &store.detail {
        let _ = write!(out, ", {detail}");
    }
    if state.limiter.options().reference_keys {
        let _ = write!(out, ", key format: reference");
    }
    out.push('\n');
    if let Some(leases) = &store.leases {
        write_leases(&mut out, leases);
    }
    if let Some(region) = &store.region {
        let _ = writeln!(
            out,
            "# root: region {} of {}, the root {} (last round trip {} ms); {} units granted, {} handed back, {} late; {} calls, {} failed; {} global counters",
            region.region,
            region.regions,
            if region.root_reachable {
                "answers"
            } else {
                "does not answer"
            },
            region.round_trip.div_ceil(1000),
            region.units_granted,
            region.units_returned,
            region.units_late,
            region.root_calls_ok + region.root_calls_failed,
            region.root_calls_failed,
            region.pools
        );
        for pool in &region.top {
            let _ = writeln!(
                out,
                "# pool: {}: {} units free, ends in {} ms (as last seen)",
                pool.key,
                pool.free,
                pool.ends_in.div_ceil(1000)
            );
        }
    }
    if let Some(quotas) = &state.rlqs {
        for line in quotas.dump().lines() {
            let _ = writeln!(out, "# {line}");
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response()
}

/// The `# leases` lines of `/rlconfig`: this instance's blocks, the largest first.
fn write_leases(out: &mut String, leases: &crate::store::lease::LeaseStatus) {
    let _ = writeln!(
        out,
        "# leases: instance {} of {} taking leases, {} blocks holding {} units; {} leased, {} handed back in {} calls; {} hand-backs waiting to be retried",
        leases.instance,
        leases.instances,
        leases.blocks,
        leases.outstanding,
        leases.units_leased,
        leases.units_returned,
        leases.calls,
        leases.give_backs_waiting
    );
    for block in &leases.top {
        let _ = writeln!(
            out,
            "# lease: {} ({}): {} units, ends in {} ms",
            block.key,
            block.algorithm.as_str(),
            block.units,
            block.ends_in.div_ceil(1000)
        );
    }
}

#[cfg(test)]
mod tests;

//! The HTTP server: configuration, binding, the router, the cross-cutting middleware (API key,
//! request metrics), the small endpoints (`/health`, `/metrics`, `/v1/models`) and graceful
//! shutdown.
//!
//! Shutdown in three steps: when the caller's `shutdown` future resolves the listener stops
//! accepting and idle connections close; in-flight requests get `grace_period` to finish;
//! then every remaining generation is cancelled (its backend stream dropped, the client told
//! why) and the server returns once connections are closed, or [`CANCEL_DRAIN`] later.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::extract::MatchedPath;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use crate::backend::Backend;
use crate::error::{ApiError, Dialect};
use crate::metrics::ServerMetrics;
use crate::models::ModelNames;
use crate::{anthropic, openai};

/// How long to wait for connections to close after in-flight generations were cancelled.
pub const CANCEL_DRAIN: Duration = Duration::from_secs(5);

/// Server settings. `Default` binds 127.0.0.1:8080 without an API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address or host name to bind (`--host`).
    pub host: String,
    /// TCP port (`--port`); 0 picks a free one (see [`Server::local_addr`]).
    pub port: u16,
    /// When set, every `/v1` route requires `Authorization: Bearer <key>` (or Anthropic's
    /// `x-api-key: <key>`); `/health` and `/metrics` stay open.
    pub api_key: Option<String>,
    /// Largest accepted request body; larger ones get 413 (`--max-body-bytes`).
    pub max_body_bytes: usize,
    /// After shutdown is requested, how long in-flight requests may run before they are
    /// cancelled.
    pub grace_period: Duration,
    /// Longest a generation may run, from arrival to its last token (`--request-timeout`);
    /// past it the request is cancelled (its blocks freed within one engine step) and the
    /// client gets 504 `request_timeout`. `None`: no limit.
    pub request_timeout: Option<Duration>,
    /// The names the model answers to (`--served-model-name`): the first is reported by
    /// `/v1/models`, any is accepted in requests, `*` accepts every name. Empty: the backend's
    /// [`Backend::model_id`] only.
    pub served_model_names: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".to_string(),
            port: 8080,
            api_key: None,
            max_body_bytes: 4 << 20,
            grace_period: Duration::from_secs(10),
            request_timeout: None,
            served_model_names: Vec::new(),
        }
    }
}

/// Failures of the server itself (not of a request).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("server I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Shared state of every handler.
pub(crate) struct AppState {
    pub(crate) backend: Arc<dyn Backend>,
    /// The names requests may give in `model`.
    pub(crate) models: ModelNames,
    pub(crate) metrics: ServerMetrics,
    pub(crate) api_key: Option<String>,
    pub(crate) max_body_bytes: usize,
    /// Becomes `true` when the grace period is over: generations stop and report it.
    pub(crate) cancel: watch::Receiver<bool>,
    pub(crate) request_timeout: Option<Duration>,
    /// Set when shutdown was requested (`/health` answers 503 from then on).
    pub(crate) draining: AtomicBool,
    /// Unix time of start, reported as the model's `created`.
    pub(crate) started_unix: u64,
    /// Source of request ids.
    next_id: AtomicU64,
}

impl AppState {
    /// A new request id like `chatcmpl-18c3f2a9b0e4d1-7` (unique per process and start).
    pub(crate) fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}{:x}{n:x}", self.started_unix)
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A bound, not yet running server. Binding first lets callers (and tests, with port 0)
/// learn the address before serving.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
    cancel_tx: watch::Sender<bool>,
    grace_period: Duration,
}

impl Server {
    /// Binds `config.host:config.port`.
    pub async fn bind(config: ServerConfig, backend: Arc<dyn Backend>) -> Result<Server, ServerError> {
        let addr = format!("{}:{}", config.host, config.port);
        let listener = TcpListener::bind((config.host.as_str(), config.port))
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let (cancel_tx, cancel) = watch::channel(false);
        let models = ModelNames::new(&config.served_model_names, backend.model_id());
        let state = Arc::new(AppState {
            backend,
            models,
            metrics: ServerMetrics::default(),
            api_key: config.api_key,
            max_body_bytes: config.max_body_bytes,
            cancel,
            request_timeout: config.request_timeout,
            draining: AtomicBool::new(false),
            started_unix: unix_now(),
            next_id: AtomicU64::new(0),
        });
        Ok(Server { listener, state, cancel_tx, grace_period: config.grace_period })
    }

    /// The bound address (the real port when 0 was asked for).
    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` resolves, then shuts down gracefully (see the module docs).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        let Server { listener, state, cancel_tx, grace_period } = self;
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, model = state.models.reported(), "serving");
        }
        let (signalled_tx, signalled_rx) = oneshot::channel::<()>();
        let draining_state = state.clone();
        let signal = async move {
            shutdown.await;
            draining_state.draining.store(true, Ordering::Relaxed);
            let _ = signalled_tx.send(());
        };
        let listener = listener.tap_io(|tcp| {
            // Tokens are small writes: send each at once.
            let _ = tcp.set_nodelay(true);
        });
        let app = router(state);
        let mut server = axum::serve(listener, app).with_graceful_shutdown(signal).into_future();

        tokio::select! {
            result = &mut server => return Ok(result?),
            _ = signalled_rx => {}
        }
        tracing::info!(?grace_period, "shutdown requested: draining in-flight requests");
        if let Ok(result) = tokio::time::timeout(grace_period, &mut server).await {
            return Ok(result?);
        }
        tracing::warn!("grace period over: cancelling in-flight requests");
        cancel_tx.send_replace(true);
        match tokio::time::timeout(CANCEL_DRAIN, &mut server).await {
            Ok(result) => Ok(result?),
            Err(_) => {
                tracing::warn!("connections still open after cancellation; stopping anyway");
                Ok(())
            }
        }
    }
}

/// Binds and serves until `shutdown` resolves; see [`Server`] to learn the address first.
pub async fn serve(
    config: ServerConfig,
    backend: Arc<dyn Backend>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    Server::bind(config, backend).await?.run(shutdown).await
}

/// All routes with their middleware.
fn router(state: Arc<AppState>) -> Router {
    let max_body = state.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{*model}", get(get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .with_state(state)
}

/// The error dialect of a path: Anthropic's on `/v1/messages`, OpenAI's elsewhere.
pub(crate) fn dialect_of(path: &str) -> Dialect {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    }
}

/// Counts every response by route template and status.
async fn count_requests(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let response = next.run(req).await;
    state.metrics.record_request(&endpoint, response.status().as_u16());
    response
}

/// Enforces the API key on `/v1` routes.
async fn require_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let guarded = path == "/v1" || path.starts_with("/v1/");
    if let (true, Some(key)) = (guarded, state.api_key.as_deref()) {
        if !presented_key_matches(req.headers(), key) {
            return ApiError::unauthorized().into_response_as(dialect_of(path));
        }
    }
    next.run(req).await
}

/// `Authorization: Bearer <key>` (scheme case-insensitive) or `x-api-key: <key>`.
fn presented_key_matches(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
        let (scheme, token) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    [bearer, x_api_key].into_iter().flatten().any(|presented| constant_time_eq(presented.as_bytes(), key.as_bytes()))
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "draining"}))).into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let backend = state.backend.metrics();
    let text = state.metrics.render(state.models.reported(), &backend);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

fn model_object(state: &AppState, id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "object": "model",
        "created": state.started_unix,
        "owned_by": "pagekv",
        "max_model_len": state.backend.context_window(),
    })
}

async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [model_object(&state, state.models.reported())]})).into_response()
}

async fn get_model(State(state): State<Arc<AppState>>, Path(model): Path<String>) -> Response {
    if state.models.accepts(&model) {
        Json(model_object(&state, &model)).into_response()
    } else {
        ApiError::model_not_found(&model).into_response()
    }
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(StatusCode::NOT_FOUND, format!("Unknown route: {} {path}", req.method()))
        .with_code("unknown_url")
        .into_response_as(dialect_of(&path))
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("Method {} is not allowed on {path}", req.method()))
        .with_code("method_not_allowed")
        .into_response_as(dialect_of(&path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_forms() {
        let mut h = HeaderMap::new();
        assert!(!presented_key_matches(&h, "k"));
        h.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        assert!(presented_key_matches(&h, "k"));
        h.insert(header::AUTHORIZATION, "bearer  k ".parse().unwrap());
        assert!(presented_key_matches(&h, "k"));
        h.insert(header::AUTHORIZATION, "Basic k".parse().unwrap());
        assert!(!presented_key_matches(&h, "k"));
        h.insert(header::AUTHORIZATION, "Bearer kk".parse().unwrap());
        assert!(!presented_key_matches(&h, "k"));
        h.insert("x-api-key", "k".parse().unwrap());
        assert!(presented_key_matches(&h, "k"));
    }
}

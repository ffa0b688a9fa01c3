//! Client-facing errors: one [`ApiError`] type, rendered in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`) or, on `/v1/messages`, in Anthropic's
//! (`{"type": "error", "error": {"type", "message"}}`).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::backend::{BackendError, BackendErrorKind};

/// An error returned to an HTTP client. Every bad input becomes one of these; none panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (`"messages[2].role"`), when there is one.
    pub param: Option<String>,
    /// A stable machine-readable code (`"model_not_found"`, `"context_length_exceeded"`).
    pub code: Option<&'static str>,
}

/// Which API's error shape to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, code: None }
    }

    /// 400 about one request field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.into()), ..ApiError::new(StatusCode::BAD_REQUEST, message) }
    }

    /// 400 without a particular field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "Invalid or missing API key: send `Authorization: Bearer <key>`.")
            .with_code("invalid_api_key")
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            ..ApiError::new(StatusCode::NOT_FOUND, format!("The model `{model}` does not exist."))
        }
        .with_code("model_not_found")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn shutting_down() -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "The server is shutting down; the request was cancelled.")
            .with_code("shutting_down")
    }

    /// 504: the generation ran past the server's `--request-timeout` and was cancelled.
    pub fn timed_out(limit: std::time::Duration) -> Self {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "The request ran longer than the server's limit of {:.3} s and was cancelled.",
                limit.as_secs_f64()
            ),
        )
        .with_code("request_timeout")
    }

    /// OpenAI's `type` for this status (OpenAI uses `invalid_request_error` for every client
    /// error, 401 and 404 included, and tells them apart by `code`).
    fn openai_type(&self) -> &'static str {
        if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        }
    }

    /// Anthropic's `type` for this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body in the given dialect.
    pub fn body(&self, dialect: Dialect) -> serde_json::Value {
        match dialect {
            Dialect::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.openai_type(),
                    "param": self.param,
                    "code": self.code,
                }
            }),
            Dialect::Anthropic => json!({
                "type": "error",
                "error": { "type": self.anthropic_type(), "message": self.message },
            }),
        }
    }

    /// A complete response in the given dialect.
    pub fn into_response_as(self, dialect: Dialect) -> Response {
        let body = self.body(dialect).to_string();
        (self.status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_response_as(Dialect::OpenAi)
    }
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        let status = match e.kind {
            BackendErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            BackendErrorKind::Overloaded | BackendErrorKind::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            BackendErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError { code: e.code, ..ApiError::new(status, e.message) }
    }
}

/// An [`ApiError`] rendered in Anthropic's shape (handlers of `/v1/messages` return this).
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_response_as(Dialect::Anthropic)
    }
}

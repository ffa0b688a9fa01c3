//! The HTTP client the server's tests (over a fake backend) and the binary's tests (over a real
//! `pagekv serve` process) share: one request per fresh HTTP/1.1 connection over hyper
//! ([`send`], [`request`]), complete replies ([`Reply`]) with OpenAI-shape assertions, a
//! server-sent-events reader ([`SseReader`]) and a Prometheus text parser ([`Metrics`]).
//!
//! [`default_model`] says where tests find the default model ([`dev`]: the harness's switches).
//!
//! Every wait is bounded by a limit the caller gives: a stalled server fails the test instead of
//! hanging it. Test code: failures panic with what was expected and what arrived.

pub mod dev;

pub use dev::{default_model, default_model_location};

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// Fails the test if `fut` takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("stalled for {limit:?}: {what}"),
    }
}

/// Sends one request on a fresh connection and returns the response with its body unread.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> hyper::Response<Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut builder = Request::builder().method(method).uri(path).header("host", addr.to_string());
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    sender.send_request(builder.body(Full::new(body)).expect("request")).await.expect("send request")
}

/// One request on a fresh connection; waits (at most `limit`) for the whole body.
pub async fn send(
    limit: Duration,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Reply {
    within(limit, &format!("{method} {path}"), async {
        let response = request(addr, method, path, headers, body).await;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.expect("read body").to_bytes();
        Reply { status, headers, body }
    })
    .await
}

/// Starts a streaming JSON POST (waiting at most `limit` for the headers) and returns the status,
/// the `content-type` and the open body.
pub async fn open_stream(limit: Duration, addr: SocketAddr, path: &str, body: &Value) -> (u16, String, SseReader) {
    let headers = [("content-type", "application/json")];
    let response =
        within(limit, "stream headers", request(addr, "POST", path, &headers, body.to_string().into())).await;
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    (status, content_type, SseReader { body: response.into_body(), buffer: String::new() })
}

/// A complete response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts a 200 and returns the JSON body.
    pub fn ok(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.text());
        self.json()
    }

    /// Asserts OpenAI's error shape with `status` and returns the error object.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let e = self.json()["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "no message: {e}");
        assert!(e["type"].is_string(), "no type: {e}");
        let keys = e.as_object().expect("error is an object");
        assert!(keys.contains_key("param") && keys.contains_key("code"), "missing param/code: {e}");
        e
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

impl SseEvent {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {}", self.data))
    }
}

/// Reads server-sent events from a streaming body as they arrive.
pub struct SseReader {
    body: Incoming,
    /// Bytes received and not yet parsed into events.
    buffer: String,
}

impl SseReader {
    /// The next event, or `None` at the end of the body. Comment lines (`:`) are skipped; any
    /// other line than `event:` and `data:` fails the test.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = SseEvent { event: None, data: String::new() };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event.event = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        event.data.push_str(v);
                    } else if !(line.is_empty() || line.starts_with(':')) {
                        panic!("unexpected SSE line: {line:?}");
                    }
                }
                return Some(event);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.push_str(std::str::from_utf8(&data).expect("SSE is UTF-8"));
                    }
                }
                Some(Err(e)) => panic!("stream body error: {e}"),
                None => {
                    assert!(self.buffer.is_empty(), "truncated event: {:?}", self.buffer);
                    return None;
                }
            }
        }
    }

    /// Every event to the end of the body.
    pub async fn read_all(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(e) = self.next().await {
            events.push(e);
        }
        events
    }

    /// The next event's `data`, or `None` at the end of the body.
    pub async fn next_data(&mut self) -> Option<String> {
        self.next().await.map(|e| e.data)
    }

    /// The next event's JSON; `None` at `[DONE]`.
    pub async fn next_json(&mut self) -> Option<Value> {
        let data = self.next_data().await.expect("the stream ended without data: [DONE]");
        if data == "[DONE]" {
            return None;
        }
        Some(serde_json::from_str(&data).unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data}")))
    }

    /// Every event up to `[DONE]`, then checks that nothing follows it.
    pub async fn read_to_done(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        while let Some(v) = self.next_json().await {
            events.push(v);
        }
        assert_eq!(self.next_data().await, None, "data after [DONE]");
        events
    }
}

/// `/metrics` as `series → value`, where a series is the name with its labels as rendered
/// (`pagekv_generations_finished_total{reason="cancelled"}`).
#[derive(Debug, Clone)]
pub struct Metrics(BTreeMap<String, f64>);

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut m = BTreeMap::new();
        for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad metrics line {line:?}"));
            let v = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|e| panic!("bad value in {line:?}: {e}")),
            };
            m.insert(series.to_string(), v);
        }
        Metrics(m)
    }

    /// The value of `series`; fails if the server does not export it.
    pub fn get(&self, series: &str) -> f64 {
        *self.0.get(series).unwrap_or_else(|| panic!("no series {series} in /metrics"))
    }

    /// The value of `series`, if exported.
    pub fn try_get(&self, series: &str) -> Option<f64> {
        self.0.get(series).copied()
    }

    /// The gauges and counters that matter when a test fails (no histogram buckets).
    pub fn summary(&self) -> String {
        self.0
            .iter()
            .filter(|(k, _)| !k.contains("_bucket{"))
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse_series_with_labels_and_infinities() {
        let m = Metrics::parse("# HELP x\nx_total 3\ny{reason=\"stop\"} 1.5\nh_bucket{le=\"+Inf\"} +Inf\n");
        assert_eq!(m.get("x_total"), 3.0);
        assert_eq!(m.get("y{reason=\"stop\"}"), 1.5);
        assert_eq!(m.try_get("h_bucket{le=\"+Inf\"}"), Some(f64::INFINITY));
        assert_eq!(m.try_get("z"), None);
        assert!(!m.summary().contains("_bucket"));
    }
}

//! A small HTTP/1.1 client over hyper (one connection per request), an SSE parser, and the
//! test server harness. Every wait is bounded: a stalled server fails the test instead of
//! hanging it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::Request;
use hyper_util::rt::TokioIo;
use pagekv_server::{Server, ServerConfig, ServerError};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::fake::{FakeBackend, FakeConfig};

/// Fails the test if `fut` takes longer than 10 s (the server stalled).
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(10), fut).await {
        Ok(v) => v,
        Err(_) => panic!("stalled: {what}"),
    }
}

/// A running server over a fake backend.
pub struct TestServer {
    pub addr: SocketAddr,
    pub backend: Arc<FakeBackend>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), ServerError>>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::with(ServerConfig::default(), FakeConfig::default()).await
    }

    pub async fn with(mut config: ServerConfig, fake: FakeConfig) -> TestServer {
        config.host = "127.0.0.1".into();
        config.port = 0;
        let backend = FakeBackend::new(fake);
        let server = Server::bind(config, backend.clone()).await.expect("bind");
        let addr = server.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel();
        let handle = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        TestServer { addr, backend, shutdown: Some(tx), handle }
    }

    /// Requests shutdown without waiting.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Requests shutdown and waits for `run` to return.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        self.begin_shutdown();
        within("server shutdown", &mut self.handle).await.expect("server task panicked")
    }

    pub async fn get(&self, path: &str) -> Reply {
        send(self.addr, "GET", path, &[], Bytes::new()).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_raw(path, &[], body.to_string()).await
    }

    pub async fn post_raw(&self, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        send(self.addr, "POST", path, &h, body.into()).await
    }

    /// Starts a streaming POST and returns the status and the open body.
    pub async fn open_stream(&self, path: &str, body: &Value) -> (u16, SseReader) {
        let response = within(
            "stream headers",
            request(self.addr, "POST", path, &[("content-type", "application/json")], Bytes::from(body.to_string())),
        )
        .await;
        let status = response.status().as_u16();
        let content_type =
            response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        if status == 200 {
            assert_eq!(content_type, "text/event-stream");
        }
        (status, SseReader { body: response.into_body(), buffer: String::new() })
    }

    /// A complete streaming POST, parsed into events.
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<SseEvent> {
        let (status, mut reader) = self.open_stream(path, body).await;
        assert_eq!(status, 200, "streaming request failed");
        within("whole stream", reader.read_all()).await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.begin_shutdown();
    }
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
        String::from_utf8(self.body.to_vec()).expect("response is not UTF-8")
    }
}

async fn request(
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
    let req = builder.body(Full::new(body)).expect("request");
    sender.send_request(req).await.expect("send request")
}

/// One request on a fresh connection; waits for the whole body.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
    within(&format!("{method} {path}"), async {
        let response = request(addr, method, path, headers, body).await;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.expect("read body").to_bytes();
        Reply { status, headers, body }
    })
    .await
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
    buffer: String,
}

impl SseReader {
    /// The next event, or `None` at the end of the body.
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
                    } else if !line.is_empty() {
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

    pub async fn read_all(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(e) = self.next().await {
            events.push(e);
        }
        events
    }
}

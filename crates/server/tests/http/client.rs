//! The test server harness: a server over the fake backend on 127.0.0.1, driven by the shared
//! HTTP test client (`pagekv_testkit`). Every wait is bounded (10 s): a stalled server fails the
//! test instead of hanging it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pagekv_server::{Server, ServerConfig, ServerError};
pub use pagekv_testkit::{Reply, SseEvent, SseReader};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::fake::{FakeBackend, FakeConfig};

/// Longest a request or stream may take against the fake backend.
const LIMIT: Duration = Duration::from_secs(10);

/// Fails the test if `fut` takes longer than 10 s (the server stalled).
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    pagekv_testkit::within(LIMIT, what, fut).await
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
        let (status, content_type, reader) = pagekv_testkit::open_stream(LIMIT, self.addr, path, body).await;
        if status == 200 {
            assert_eq!(content_type, "text/event-stream");
        }
        (status, reader)
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

/// One request on a fresh connection; waits for the whole body.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
    pagekv_testkit::send(LIMIT, addr, method, path, headers, body).await
}

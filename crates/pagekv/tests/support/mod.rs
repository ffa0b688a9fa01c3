//! Harness for driving a real `pagekv serve` process: [`ServerProcess`] spawns the binary on
//! 127.0.0.1 with `--port 0`, reads the address it prints on stderr, and kills it on drop; it is
//! driven by the shared HTTP test client (`pagekv_testkit`: requests, SSE, `/metrics`), plus
//! raw-socket requests for disconnect tests.
//!
//! Every wait is bounded: a stalled server fails the test instead of hanging it. The servers
//! of one test binary run one at a time (a process-wide lock held by each [`ServerProcess`]):
//! the machine has few cores, and tests that compare pool gauges must not share them.

#![allow(dead_code)] // Each test binary uses a different part of the harness.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
pub use pagekv_testkit::{Metrics, Reply, SseReader};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest a single request or stream may take on a loaded two-core machine.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(180);
/// Longest the server may take to load the model and bind.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// One server at a time per test binary.
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the lock that [`ServerProcess`] holds, for tests that run a server another way.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fails the test if `fut` takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    pagekv_testkit::within(limit, what, fut).await
}

/// A running `pagekv serve` child process.
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    /// The id clients must pass as `model` (the file name without `.gguf`).
    pub model: String,
    /// Everything the server printed on stderr so far.
    stderr: Arc<Mutex<String>>,
    _serial: MutexGuard<'static, ()>,
}

impl ServerProcess {
    /// Starts `pagekv serve` on the default model with `args` after the defaults
    /// (127.0.0.1, port 0, the model). `None` when the model is absent (the test is skipped
    /// visibly; with PAGEKV_REQUIRE_MODEL=1 absence fails).
    pub fn start(test: &str, args: &[&str]) -> Option<ServerProcess> {
        Self::start_with_env(test, args, &[])
    }

    pub fn start_with_env(test: &str, args: &[&str], env: &[(&str, &str)]) -> Option<ServerProcess> {
        let model_path = pagekv_testkit::default_model(test)?;
        Some(Self::start_model(&model_path, args, env))
    }

    /// Starts `pagekv serve` on the model file `model_path`.
    pub fn start_model(model_path: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        let model_path = model_path.to_path_buf();
        let serial = serial();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pagekv"));
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--model"]).arg(&model_path).args(args);
        // The settings of the environment the tests run in must not leak into the server.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("PAGEKV_") {
                cmd.env_remove(&k);
            }
        }
        cmd.envs(env.iter().copied());
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn pagekv serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr is piped");
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("pagekv: listening on http://") {
                    let _ = tx.send(addr.trim().to_string());
                }
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(START_TIMEOUT) {
            Ok(a) => a.parse().unwrap_or_else(|e| panic!("bad listening address {a:?}: {e}")),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!("pagekv serve did not start ({status:?}): {}", stderr.lock().unwrap_or_else(|e| e.into_inner()));
            }
        };
        let model = model_id(&model_path);
        ServerProcess { child, addr, model, stderr, _serial: serial }
    }

    /// What the server printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit (at most `limit`).
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("wait for pagekv") {
                return s;
            }
            if start.elapsed() > limit {
                panic!("pagekv serve did not exit within {limit:?}: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        send(self.addr, "GET", path, &[], Bytes::new()).await
    }

    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        send(self.addr, "GET", path, headers, Bytes::new()).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_raw(path, &[], body.to_string()).await
    }

    pub async fn post_raw(&self, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        send(self.addr, "POST", path, &h, body.into()).await
    }

    /// A complete streaming POST: the JSON of every `data:` event before `[DONE]`. Fails if
    /// the status is not 200 or the stream does not end with `data: [DONE]`.
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let (status, mut reader) = self.open_stream(path, body).await;
        assert_eq!(status, 200, "streaming request failed");
        within(REQUEST_TIMEOUT, "whole stream", reader.read_to_done()).await
    }

    /// Starts a streaming POST and returns the status and the open body.
    pub async fn open_stream(&self, path: &str, body: &Value) -> (u16, SseReader) {
        open_stream_at(self.addr, path, body).await
    }

    /// `/metrics`, parsed.
    pub async fn metrics(&self) -> Metrics {
        let r = self.get("/metrics").await;
        assert_eq!(r.status, 200);
        Metrics::parse(&r.text())
    }

    /// Polls `/metrics` until `ok` holds (at most `limit`); returns the metrics that satisfied it.
    pub async fn wait_metrics(&self, limit: Duration, what: &str, ok: impl Fn(&Metrics) -> bool) -> Metrics {
        let start = Instant::now();
        loop {
            let m = self.metrics().await;
            if ok(&m) {
                return m;
            }
            if start.elapsed() > limit {
                panic!("not within {limit:?}: {what}; metrics:\n{}", m.summary());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Sends `head` + `body` on a fresh socket and returns it (for disconnect tests).
    pub async fn raw_post(&self, path: &str, body: &Value) -> TcpStream {
        let body = body.to_string();
        let mut s = TcpStream::connect(self.addr).await.expect("connect");
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.expect("write request");
        s
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads from `s` until `marker` has arrived; returns what was read.
pub async fn read_until(s: &mut TcpStream, marker: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    within(REQUEST_TIMEOUT, &format!("{marker:?} on the wire"), async {
        while !String::from_utf8_lossy(&seen).contains(marker) {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed before {marker:?}: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8_lossy(&seen).into_owned()
}

/// The file name without `.gguf`, as `pagekv serve` names the model.
fn model_id(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

/// One request on a fresh connection; waits for the whole body.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
    pagekv_testkit::send(REQUEST_TIMEOUT, addr, method, path, headers, body).await
}

/// A JSON POST to `addr` (for client tasks that cannot borrow the server).
pub async fn send_json(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    send(addr, "POST", path, &[("content-type", "application/json")], Bytes::from(body.to_string())).await
}

/// Starts a streaming JSON POST to `addr` and returns the status and the open body.
pub async fn open_stream_at(addr: SocketAddr, path: &str, body: &Value) -> (u16, SseReader) {
    let (status, _, reader) = pagekv_testkit::open_stream(REQUEST_TIMEOUT, addr, path, body).await;
    (status, reader)
}

/// The generated text of a non-streaming `/v1/chat/completions` or `/v1/completions` reply.
pub fn reply_text(v: &Value) -> String {
    let c = &v["choices"][0];
    c["message"]["content"].as_str().or_else(|| c["text"].as_str()).unwrap_or_else(|| panic!("no text in {v}")).into()
}

/// The text of a streamed chat or completions reply: every chunk's delta joined.
pub fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"].get(0))
        .filter_map(|c| c["delta"]["content"].as_str().or_else(|| c["text"].as_str()))
        .collect()
}

/// The `finish_reason` of a streamed reply (the one chunk that has it).
pub fn streamed_finish(events: &[Value]) -> String {
    let reasons: Vec<&str> =
        events.iter().filter_map(|e| e["choices"].get(0)).filter_map(|c| c["finish_reason"].as_str()).collect();
    assert_eq!(reasons.len(), 1, "one finish_reason expected: {events:?}");
    reasons[0].to_string()
}

/// The `usage` object of a streamed reply with `include_usage` (the last chunk's).
pub fn streamed_usage(events: &[Value]) -> Value {
    let last = events.last().expect("no events");
    assert!(last["choices"].as_array().is_some_and(|c| c.is_empty()), "usage chunk has choices: {last}");
    assert!(last["usage"].is_object(), "no usage in the last chunk: {last}");
    last["usage"].clone()
}

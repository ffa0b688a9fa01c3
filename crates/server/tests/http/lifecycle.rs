//! Connection and server lifecycle: client disconnects cancel the backend stream, /metrics
//! parses as Prometheus text and its counters move, concurrent streams, graceful shutdown.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use pagekv_server::ServerConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::{within, TestServer};
use crate::fake::{expected_text, FakeConfig};

fn slow(eos_after: usize, delay_ms: u64) -> FakeConfig {
    FakeConfig {
        context_window: 1 << 20,
        eos_after,
        token_delay: Duration::from_millis(delay_ms),
        ..Default::default()
    }
}

fn chat(stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

/// Sends a raw HTTP/1.1 POST and reads until `marker` appears in the response.
async fn post_and_read_until(server: &TestServer, body: &Value, marker: &str) -> TcpStream {
    let body = body.to_string();
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    within("first token on the wire", async {
        while !String::from_utf8_lossy(&seen).contains(marker) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_stream_cancels_the_backend_stream() {
    let server = TestServer::with(ServerConfig::default(), slow(100_000, 10)).await;
    let socket = post_and_read_until(&server, &chat(true), "\"content\":\"Hello\"").await;
    assert_eq!(server.backend.cancellations(), 0);
    drop(socket);
    server.backend.wait_until("backend sees the cancellation", |b| b.cancellations() == 1).await;
    assert_eq!(server.backend.running(), 0);
    let metrics = parse_metrics(&server.get("/metrics").await.text());
    assert_eq!(metrics.value("pagekv_generations_finished_total", &[("reason", "cancelled")]), 1.0);
    assert_eq!(metrics.value("pagekv_generations_in_flight", &[]), 0.0);
    assert_eq!(metrics.value("pagekv_running_sequences", &[]), 0.0);
    // And the server still serves.
    let r = server
        .post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}))
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_while_waiting_for_a_non_streaming_answer_cancels() {
    let server = TestServer::with(ServerConfig::default(), slow(100_000, 10)).await;
    let body = chat(false).to_string();
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    server.backend.wait_until("request submitted", |b| b.running() == 1).await;
    drop(s);
    server.backend.wait_until("backend sees the cancellation", |b| b.cancellations() == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_all_complete() {
    let server = std::sync::Arc::new(TestServer::with(ServerConfig::default(), slow(8, 2)).await);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"messages": [{"role": "user", "content": format!("user {i}")}],
                              "stream": true});
            let events = server.stream("/v1/chat/completions", &body).await;
            events[1..events.len() - 2]
                .iter()
                .map(|e| e.json()["choices"][0]["delta"]["content"].as_str().unwrap().to_string())
                .collect::<String>()
        }));
    }
    for t in tasks {
        assert_eq!(within("stream task", t).await.unwrap(), expected_text(8));
    }
    assert_eq!(server.backend.completed(), 8);
}

// ---------------------------------------------------------------------------------------------
// /metrics

/// A parsed exposition: family → (help, type), and samples by name and sorted labels.
#[derive(Debug, Default)]
struct Metrics {
    families: HashMap<String, (String, String)>,
    /// (sample name, labels) → value, in exposition order.
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Metrics {
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.samples
            .iter()
            .find(|(n, l, _)| n == name && *l == want)
            .map(|s| s.2)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
    }

    fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.samples.iter().any(|(n, l, _)| n == name && *l == want)
    }

    /// (le, cumulative count) of a histogram, with its _sum and _count.
    fn histogram(&self, name: &str) -> (Vec<(String, f64)>, f64, f64) {
        let buckets = self
            .samples
            .iter()
            .filter(|(n, _, _)| *n == format!("{name}_bucket"))
            .map(|(_, l, v)| (l["le"].clone(), *v))
            .collect();
        (buckets, self.value(&format!("{name}_sum"), &[]), self.value(&format!("{name}_count"), &[]))
    }
}

/// Parses Prometheus text format 0.0.4 strictly enough to catch format mistakes: HELP then
/// TYPE before a family's samples, no duplicate families, valid names, quoted and escaped
/// label values, numeric values, histogram series complete and cumulative.
fn parse_metrics(text: &str) -> Metrics {
    let mut m = Metrics::default();
    let mut current: Option<String> = None;
    let valid_name = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    assert!(text.ends_with('\n'), "exposition ends with a newline");
    let mut pending_help: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP has text");
            assert!(valid_name(name), "bad name {name}");
            assert!(!m.families.contains_key(name), "duplicate family {name}");
            pending_help = Some((name.to_string(), help.to_string()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a type");
            let (help_name, help) = pending_help.take().expect("HELP before TYPE");
            assert_eq!(help_name, name, "HELP and TYPE name the same family");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "type {kind}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "counter {name} ends in _total");
            }
            m.families.insert(name.to_string(), (help, kind.to_string()));
            current = Some(name.to_string());
        } else {
            assert!(!line.starts_with('#'), "stray comment {line}");
            let (name, labels, value) = parse_sample(line);
            let family = current.as_deref().expect("sample after TYPE");
            let kind = &m.families[family].1;
            if kind == "histogram" {
                let suffix = name.strip_prefix(family).unwrap_or_else(|| panic!("{name} in {family}"));
                assert!(["_bucket", "_sum", "_count"].contains(&suffix), "{name}");
                assert_eq!(suffix == "_bucket", labels.contains_key("le"), "{line}");
            } else {
                assert_eq!(name, family, "sample {name} under family {family}");
            }
            assert!(value.is_finite() && value >= 0.0, "{line}");
            m.samples.push((name, labels, value));
        }
    }
    for (family, (_, kind)) in &m.families {
        if kind == "histogram" {
            let (buckets, sum, count) = m.histogram(family);
            assert_eq!(buckets.last().unwrap().0, "+Inf", "{family}");
            let mut prev_le = f64::NEG_INFINITY;
            let mut prev_count = 0.0;
            for (le, c) in &buckets {
                let le: f64 = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
                assert!(le > prev_le, "{family}: le ascending");
                assert!(*c >= prev_count, "{family}: buckets cumulative");
                prev_le = le;
                prev_count = *c;
            }
            assert_eq!(prev_count, count, "{family}: +Inf bucket equals _count");
            assert!(count > 0.0 || sum == 0.0);
        }
    }
    m
}

fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("bad sample {line}"));
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(mut r) = rest.strip_prefix('{') {
        loop {
            let eq = r.find('=').unwrap_or_else(|| panic!("label without '=': {line}"));
            let key = r[..eq].to_string();
            let quoted = r[eq + 1..].strip_prefix('"').unwrap_or_else(|| panic!("unquoted label value: {line}"));
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let after_quote = loop {
                let (i, c) = chars.next().unwrap_or_else(|| panic!("no closing quote: {line}"));
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(c @ ('\\' | '"')) => value.push(c),
                        other => panic!("bad escape {other:?} in {line}"),
                    },
                    '"' => break i + 1,
                    c => value.push(c),
                }
            };
            assert!(labels.insert(key, value).is_none(), "duplicate label: {line}");
            let tail = &quoted[after_quote..];
            if let Some(t) = tail.strip_prefix(',') {
                r = t;
                continue;
            }
            rest = tail.strip_prefix('}').unwrap_or_else(|| panic!("expected '}}' after labels: {line}"));
            break;
        }
    }
    let value = rest.strip_prefix(' ').expect("space before value");
    let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
    (name, labels, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_valid_prometheus_and_counters_move() {
    let server = TestServer::start().await;
    let r = server.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let before = parse_metrics(&r.text());
    assert_eq!(before.histogram("pagekv_time_to_first_token_seconds").2, 0.0);
    assert_eq!(before.value("pagekv_session_bank_hit_rate", &[]), 0.0);
    for family in [
        "pagekv_http_requests_total",
        "pagekv_prompt_tokens_total",
        "pagekv_generation_tokens_total",
        "pagekv_time_to_first_token_seconds",
        "pagekv_inter_token_latency_seconds",
        "pagekv_running_sequences",
        "pagekv_waiting_sequences",
        "pagekv_kv_blocks_capacity",
        "pagekv_kv_blocks_used",
        "pagekv_kv_blocks_free",
        "pagekv_kv_blocks_cached",
        "pagekv_session_bank_hits_total",
        "pagekv_session_bank_misses_total",
        "pagekv_session_bank_evictions_total",
        "pagekv_session_bank_hit_rate",
        "pagekv_preemptions_total",
        "pagekv_attention_calls_total",
        "pagekv_attention_fallbacks_total",
    ] {
        assert!(before.families.contains_key(family), "missing {family}");
    }
    assert_eq!(before.value("pagekv_kv_blocks_capacity", &[]), 64.0);
    assert!(before.has("pagekv_attention_fallbacks_total", &[("reason", "no \"fast\" path")]));

    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(server.post("/v1/chat/completions", &body).await.status, 200);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    server.stream("/v1/chat/completions", &streamed).await;
    let bad = server.post("/v1/chat/completions", &json!({"messages": []})).await;
    assert_eq!(bad.status, 400);
    server.get("/health").await;

    let after = parse_metrics(&server.get("/metrics").await.text());
    let requests = |endpoint: &str, status: &str| {
        after.value("pagekv_http_requests_total", &[("endpoint", endpoint), ("status", status)])
    };
    assert_eq!(requests("/v1/chat/completions", "200"), 2.0);
    assert_eq!(requests("/v1/chat/completions", "400"), 1.0);
    assert_eq!(requests("/health", "200"), 1.0);
    assert_eq!(requests("/metrics", "200"), 1.0);
    assert_eq!(after.value("pagekv_generation_tokens_total", &[]), 16.0);
    let p = "<|user|>hi\n<|assistant|>".chars().count() as f64;
    assert_eq!(after.value("pagekv_prompt_tokens_total", &[]), 2.0 * p);
    assert_eq!(after.value("pagekv_prompt_cached_tokens_total", &[]), p);
    assert_eq!(after.value("pagekv_generations_finished_total", &[("reason", "stop")]), 2.0);
    assert_eq!(after.histogram("pagekv_time_to_first_token_seconds").2, 2.0);
    assert_eq!(after.histogram("pagekv_inter_token_latency_seconds").2, 14.0);
    assert_eq!(after.histogram("pagekv_generation_duration_seconds").2, 2.0);
    assert_eq!(after.value("pagekv_session_bank_hits_total", &[]), p);
    assert_eq!(after.value("pagekv_session_bank_misses_total", &[]), p);
    assert_eq!(after.value("pagekv_session_bank_hit_rate", &[]), 0.5);
    assert_eq!(after.value("pagekv_attention_calls_total", &[("route", "primitive"), ("format", "f16")]), 16.0);
}

// ---------------------------------------------------------------------------------------------
// Graceful shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish_within_the_grace_period() {
    let config = ServerConfig { grace_period: Duration::from_secs(10), ..Default::default() };
    let mut server = TestServer::with(config, slow(10, 20)).await;
    let (status, mut reader) = server.open_stream("/v1/chat/completions", &chat(true)).await;
    assert_eq!(status, 200);
    let role = within("role chunk", reader.next()).await.unwrap();
    assert_eq!(role.json()["choices"][0]["delta"]["role"], "assistant");
    server.begin_shutdown();
    // New connections are refused once the listener is closed.
    within("listener closes", async {
        while TcpStream::connect(server.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let rest = within("rest of the stream", reader.read_all()).await;
    assert_eq!(rest.last().unwrap().data, "[DONE]");
    let text: String = rest[..rest.len() - 2]
        .iter()
        .map(|e| e.json()["choices"][0]["delta"]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, expected_text(10));
    assert_eq!(rest[rest.len() - 2].json()["choices"][0]["finish_reason"], "stop");
    let backend = server.backend.clone();
    server.shutdown().await.expect("clean shutdown");
    assert_eq!(backend.cancellations(), 0);
    assert_eq!(backend.completed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_what_outlives_the_grace_period() {
    let config = ServerConfig { grace_period: Duration::from_millis(200), ..Default::default() };
    let mut server = TestServer::with(config, slow(1_000_000, 10)).await;
    let (status, mut reader) = server.open_stream("/v1/chat/completions", &chat(true)).await;
    assert_eq!(status, 200);
    within("role chunk", reader.next()).await.unwrap();
    let addr = server.addr;
    let waiting = tokio::spawn(async move {
        crate::client::send(
            addr,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            chat(false).to_string().into(),
        )
        .await
    });
    server.backend.wait_until("both generations running", |b| b.running() == 2).await;
    server.begin_shutdown();
    let rest = within("stream ends after the grace period", reader.read_all()).await;
    let (done, rest) = rest.split_last().unwrap();
    assert_eq!(done.data, "[DONE]");
    let error = rest.last().unwrap().json();
    assert_eq!(error["error"]["code"], "shutting_down", "{error}");
    let r = within("non-streaming answer", waiting).await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "shutting_down");
    let backend = server.backend.clone();
    server.shutdown().await.expect("clean shutdown");
    backend.wait_until("backend sees both cancellations", |b| b.cancellations() == 2).await;
}

// ---------------------------------------------------------------------------------------------
// Request timeout

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_timeout_are_cancelled_and_answered_504() {
    let config = ServerConfig { request_timeout: Some(Duration::from_millis(300)), ..Default::default() };
    let server = TestServer::with(config, slow(1_000_000, 10)).await;
    // Not streaming: 504 with the OpenAI error shape, and the backend sees the cancellation.
    let r = within("non-streaming answer", server.post("/v1/chat/completions", &chat(false))).await;
    assert_eq!(r.status, 504, "{}", r.text());
    let e = r.json();
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["type"].as_str()),
        (Some("request_timeout"), Some("server_error"))
    );
    server.backend.wait_until("backend sees the cancellation", |b| b.cancellations() == 1).await;
    // Streaming: tokens flow until the deadline, then an error event and [DONE].
    let (status, mut reader) = server.open_stream("/v1/chat/completions", &chat(true)).await;
    assert_eq!(status, 200);
    let events = within("stream ends at the deadline", reader.read_all()).await;
    let (done, rest) = events.split_last().unwrap();
    assert_eq!(done.data, "[DONE]");
    assert!(rest.len() > 2, "some tokens came before the deadline: {}", rest.len());
    assert_eq!(rest.last().unwrap().json()["error"]["code"], "request_timeout");
    server.backend.wait_until("backend sees both cancellations", |b| b.cancellations() == 2).await;
    let m = parse_metrics(&server.get("/metrics").await.text());
    assert_eq!(m.value("pagekv_generations_finished_total", &[("reason", "timeout")]), 2.0);
    // A request that finishes in time is unaffected.
    drop(server);
    let config = ServerConfig { request_timeout: Some(Duration::from_secs(30)), ..Default::default() };
    let server = TestServer::with(config, slow(5, 1)).await;
    let r = server.post("/v1/chat/completions", &chat(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], expected_text(5));
}

//! Bad input: every case gets the right status and OpenAI's error shape
//! (`{"error": {"message", "type", "param", "code"}}`), and the server keeps serving.
//! API keys guard every /v1 route.

use std::time::Duration;

use pagekv_server::ServerConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::{send, within, Reply, TestServer};
use crate::fake::FakeConfig;

/// Asserts OpenAI's error shape, the status, and (when given) the param and code.
fn assert_openai_error(r: &Reply, status: u16, param: Option<&str>, code: Option<&str>, case: &str) {
    assert_eq!(r.status, status, "{case}: {}", r.text());
    assert_eq!(r.headers["content-type"], "application/json", "{case}");
    let v = r.json();
    let obj = v.as_object().expect("object");
    assert_eq!(obj.len(), 1, "{case}: only `error` at the top");
    let e = v["error"].as_object().unwrap_or_else(|| panic!("{case}: no error object"));
    let mut keys: Vec<&str> = e.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["code", "message", "param", "type"], "{case}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{case}");
    let expected_type = if status >= 500 { "server_error" } else { "invalid_request_error" };
    assert_eq!(e["type"], expected_type, "{case}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{case}");
    }
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{case}");
    }
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

async fn assert_healthy(server: &TestServer) {
    let r = server.get("/health").await;
    assert_eq!(r.status, 200, "server stopped serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_bodies() {
    let config = ServerConfig { max_body_bytes: 16 * 1024, ..Default::default() };
    let fake = FakeConfig { context_window: 64, ..Default::default() };
    let server = TestServer::with(config, fake).await;
    // (case, body, status, code)
    let raw: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("malformed JSON", b"{\"messages\": [".to_vec(), 400, "invalid_json"),
        ("not an object", b"[1, 2]".to_vec(), 400, "invalid_json"),
        ("empty body", Vec::new(), 400, "invalid_json"),
        (
            "invalid UTF-8",
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(),
            400,
            "invalid_utf8",
        ),
        (
            "body over the limit",
            format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}", "x".repeat(20_000)).into_bytes(),
            413,
            "request_too_large",
        ),
    ];
    for (case, body, status, code) in raw {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let r = server.post_raw(path, &[], body.clone()).await;
            assert_openai_error(&r, status, None, Some(code), &format!("{case} on {path}"));
        }
        assert_healthy(&server).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chat_parameters() {
    let fake = FakeConfig { context_window: 64, ..Default::default() };
    let server = TestServer::with(ServerConfig::default(), fake).await;
    let long = "y".repeat(80);
    let cases: Vec<(&str, Value, u16, &str, Option<&str>)> = vec![
        ("wrong type", chat(json!({"temperature": "hot"})), 400, "temperature", Some("invalid_type")),
        ("wrong type messages", json!({"messages": {"role": "user"}}), 400, "messages", None),
        ("wrong type stream", chat(json!({"stream": "yes"})), 400, "stream", Some("invalid_type")),
        ("unknown model", chat(json!({"model": "gpt-9"})), 404, "model", Some("model_not_found")),
        ("missing messages", json!({}), 400, "messages", None),
        ("empty messages", json!({"messages": []}), 400, "messages", None),
        (
            "tool result without its call",
            json!({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}),
            400,
            "messages[0].tool_call_id",
            Some("invalid_value"),
        ),
        ("unknown role", json!({"messages": [{"role": "robot", "content": "x"}]}), 400, "messages[0].role", None),
        (
            "image content",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            400,
            "messages[0].content[0].type",
            Some("unsupported_parameter"),
        ),
        ("negative max_tokens", chat(json!({"max_tokens": -1})), 400, "max_tokens", Some("invalid_value")),
        ("zero max_tokens", chat(json!({"max_completion_tokens": 0})), 400, "max_completion_tokens", None),
        (
            "huge max_tokens",
            chat(json!({"max_tokens": 1_000_000_000_000i64})),
            400,
            "max_tokens",
            Some("invalid_value"),
        ),
        ("max_tokens beyond u64", chat(json!({"max_tokens": 1e30})), 400, "max_tokens", Some("invalid_type")),
        (
            "prompt + max_tokens over the window",
            chat(json!({"max_tokens": 60})),
            400,
            "max_tokens",
            Some("context_length_exceeded"),
        ),
        (
            "prompt over the context window",
            json!({"messages": [{"role": "user", "content": long}]}),
            400,
            "messages",
            Some("context_length_exceeded"),
        ),
        ("n > 16", chat(json!({"n": 17})), 400, "n", Some("invalid_value")),
        ("tools", chat(json!({"tools": [{"type": "function"}]})), 400, "tools[0].function", Some("invalid_value")),
        (
            "bad response_format",
            chat(json!({"response_format": {"type": "yaml"}})),
            400,
            "response_format.type",
            Some("invalid_value"),
        ),
        ("unknown parameter", chat(json!({"temprature": 0.5})), 400, "temprature", Some("unknown_parameter")),
        ("temperature range", chat(json!({"temperature": 3})), 400, "temperature", Some("invalid_value")),
        ("top_p range", chat(json!({"top_p": 1.5})), 400, "top_p", None),
        ("empty stop", chat(json!({"stop": [""]})), 400, "stop[0]", None),
        ("stop type", chat(json!({"stop": 5})), 400, "stop", Some("invalid_type")),
        ("top_logprobs without logprobs", chat(json!({"top_logprobs": 2})), 400, "top_logprobs", None),
        (
            "stream_options without stream",
            chat(json!({"stream_options": {"include_usage": true}})),
            400,
            "stream_options",
            None,
        ),
    ];
    for (case, body, status, param, code) in cases {
        let r = server.post("/v1/chat/completions", &body).await;
        assert_openai_error(&r, status, Some(param), code, case);
    }
    assert_healthy(&server).await;
    // Streaming requests are validated before the stream starts: a plain JSON error.
    let r = server.post("/v1/chat/completions", &chat(json!({"stream": true, "n": 0}))).await;
    assert_openai_error(&r, 400, Some("n"), None, "streaming n < 1");
    // Nothing reached the backend.
    assert!(server.backend.submitted.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_completion_parameters() {
    let fake = FakeConfig { context_window: 64, ..Default::default() };
    let server = TestServer::with(ServerConfig::default(), fake).await;
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("missing prompt", json!({}), 400, "prompt"),
        ("prompt type", json!({"prompt": 5}), 400, "prompt"),
        ("batch of prompts", json!({"prompt": ["a", "b"]}), 400, "prompt"),
        ("negative token id", json!({"prompt": [1, -2]}), 400, "prompt[1]"),
        ("prompt over the window", json!({"prompt": "z".repeat(64)}), 400, "prompt"),
        ("max_tokens over the window", json!({"prompt": "z", "max_tokens": 64}), 400, "max_tokens"),
        ("echo", json!({"prompt": "z", "echo": true}), 400, "echo"),
        ("best_of", json!({"prompt": "z", "best_of": 2}), 400, "best_of"),
        ("n", json!({"prompt": "z", "n": 17}), 400, "n"),
        ("logprobs type", json!({"prompt": "z", "logprobs": true}), 400, "logprobs"),
        ("unknown model", json!({"prompt": "z", "model": "m2"}), 404, "model"),
        ("empty prompt", json!({"prompt": ""}), 400, "prompt"),
    ];
    for (case, body, status, param) in cases {
        let r = server.post("/v1/completions", &body).await;
        assert_openai_error(&r, status, Some(param), None, case);
    }
    assert_healthy(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods() {
    let server = TestServer::start().await;
    let r = server.get("/v1/nothing").await;
    assert_openai_error(&r, 404, None, Some("unknown_url"), "unknown route");
    let r = server.get("/v1/chat/completions").await;
    assert_openai_error(&r, 405, None, Some("method_not_allowed"), "GET on a POST route");
    assert_healthy(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_socket_does_not_hurt() {
    let server = TestServer::start().await;
    // Not HTTP at all, then a request line with a bogus length, then a half request that
    // stays open: none may stop the server from answering others.
    for junk in
        [&b"\x00\x01\x02 hello\r\n\r\n"[..], b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: nope\r\n\r\n"]
    {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(junk).await.unwrap();
        let mut buf = Vec::new();
        let _ = within("junk answered or closed", s.read_to_end(&mut buf)).await;
    }
    let mut half_open = TcpStream::connect(server.addr).await.unwrap();
    half_open
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_healthy(&server).await;
    let r = server.post("/v1/chat/completions", &chat(json!({"max_tokens": 1}))).await;
    assert_eq!(r.status, 200);
    drop(half_open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_v1_routes() {
    let config = ServerConfig { api_key: Some("sekret".into()), ..Default::default() };
    let server = TestServer::with(config, FakeConfig::default()).await;
    let addr = server.addr;
    let body = chat(json!({"max_tokens": 1})).to_string();
    let post = |headers: Vec<(&'static str, &'static str)>, path: &'static str| {
        let mut h = vec![("content-type", "application/json")];
        h.extend(headers);
        let body = body.clone();
        async move { send(addr, "POST", path, &h, body.into()).await }
    };

    for path in ["/v1/chat/completions", "/v1/completions"] {
        let r = post(vec![], path).await;
        assert_openai_error(&r, 401, None, Some("invalid_api_key"), "no key");
        let r = post(vec![("authorization", "Bearer wrong")], path).await;
        assert_openai_error(&r, 401, None, Some("invalid_api_key"), "wrong key");
        let r = post(vec![("authorization", "sekret")], path).await;
        assert_openai_error(&r, 401, None, Some("invalid_api_key"), "no scheme");
    }
    let r = send(addr, "GET", "/v1/models", &[], Default::default()).await;
    assert_openai_error(&r, 401, None, Some("invalid_api_key"), "models without key");
    let r = send(addr, "GET", "/v1/nothing", &[], Default::default()).await;
    assert_eq!(r.status, 401, "unknown /v1 routes are guarded too");

    let r = post(vec![("authorization", "Bearer sekret")], "/v1/chat/completions").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(addr, "GET", "/v1/models", &[("x-api-key", "sekret")], Default::default()).await;
    assert_eq!(r.status, 200);

    // /v1/messages answers in Anthropic's shape.
    let r = send(
        addr,
        "POST",
        "/v1/messages",
        &[("content-type", "application/json")],
        json!({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).to_string().into(),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");

    // Health and metrics stay open.
    assert_eq!(server.get("/health").await.status, 200);
    assert_eq!(server.get("/metrics").await.status, 200);
    // Only the authorized requests reached the backend.
    assert_eq!(server.backend.submitted.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_is_413() {
    let config = ServerConfig { max_body_bytes: 1024, ..Default::default() };
    let server = TestServer::with(config, FakeConfig::default()).await;
    // No content-length: the limit must hold while the body streams in.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let mut req = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        req.extend_from_slice(format!("400\r\n{}\r\n", "a".repeat(0x400)).as_bytes());
    }
    req.extend_from_slice(b"0\r\n\r\n");
    s.write_all(&req).await.unwrap();
    let mut buf = Vec::new();
    let _ = within("413 answer", s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("\"code\":\"request_too_large\""), "{text}");
    assert_healthy(&server).await;
}

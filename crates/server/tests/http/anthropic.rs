//! Anthropic Messages API against the fake backend.

use serde_json::{json, Value};

use crate::client::TestServer;
use crate::fake::{expected_text, MODEL};

fn body(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_non_streaming() {
    let server = TestServer::start().await;
    let r = server
        .post(
            "/v1/messages",
            &body(json!({"system": "be brief", "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "again"}]})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["content"], json!([{"type": "text", "text": expected_text(8)}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    let prompt = "<|system|>be brief\n<|user|>hi\n<|assistant|>ok\n<|user|>again\n<|assistant|>";
    let n = prompt.chars().count();
    assert_eq!(
        v["usage"],
        json!({"input_tokens": n, "output_tokens": 8, "cache_read_input_tokens": 0,
               "cache_creation_input_tokens": 0})
    );
    let req = server.backend.last_request();
    let sent: String = req.prompt.iter().map(|&c| char::from_u32(c).unwrap()).collect();
    assert_eq!(sent, prompt);
    assert_eq!(req.max_tokens, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_stop_reasons() {
    let server = TestServer::start().await;
    let v = server.post("/v1/messages", &body(json!({"stop_sequences": [" is"]}))).await.json();
    assert_eq!(v["content"][0]["text"], "Hello world, this");
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], " is");

    let v = server.post("/v1/messages", &body(json!({"max_tokens": 3}))).await.json();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 3);

    // Second identical prompt: the fake session bank reports the whole prompt cached.
    let v = server.post("/v1/messages", &body(json!({"max_tokens": 3}))).await.json();
    assert_eq!(v["usage"]["input_tokens"], 0);
    assert!(v["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_streaming_events() {
    let server = TestServer::start().await;
    let events = server.stream("/v1/messages", &body(json!({"stream": true, "temperature": 0.7, "top_k": 5}))).await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().expect("named event")).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 8]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    for e in &events {
        assert_eq!(e.json()["type"], e.event.as_deref().unwrap(), "type matches event name");
    }
    let start = events[0].json();
    assert_eq!(start["message"]["role"], "assistant");
    assert_eq!(start["message"]["content"], json!([]));
    assert_eq!(start["message"]["stop_reason"], Value::Null);
    assert_eq!(start["message"]["usage"]["output_tokens"], 0);
    assert_eq!(events[1].json()["content_block"], json!({"type": "text", "text": ""}));
    let text: String = events[3..11]
        .iter()
        .map(|e| {
            let v = e.json();
            assert_eq!(v["index"], 0);
            assert_eq!(v["delta"]["type"], "text_delta");
            v["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, expected_text(8));
    let delta = events[12].json();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 8);
    let req = server.backend.last_request();
    assert_eq!(req.sampling.temperature, 0.7);
    assert_eq!(req.sampling.top_k, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_errors_use_anthropic_shape() {
    let server = TestServer::start().await;
    let check = |r: crate::client::Reply, status: u16, kind: &str| {
        assert_eq!(r.status, status, "{}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], kind);
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert_eq!(v.as_object().unwrap().len(), 2);
    };
    let no_max = json!({"messages": [{"role": "user", "content": "hi"}]});
    check(server.post("/v1/messages", &no_max).await, 400, "invalid_request_error");
    check(server.post("/v1/messages", &body(json!({"model": "claude-x"}))).await, 404, "not_found_error");
    check(server.post_raw("/v1/messages", &[], "{not json").await, 400, "invalid_request_error");
    check(
        server.post("/v1/messages", &body(json!({"messages": [{"role": "system", "content": "x"}]}))).await,
        400,
        "invalid_request_error",
    );
    check(
        server.post("/v1/messages", &body(json!({"messages": [{"role": "user", "content": "FAIL_SUBMIT"}]}))).await,
        503,
        "overloaded_error",
    );
    // Mid-stream failure: an `error` event ends the stream.
    let events = server
        .stream(
            "/v1/messages",
            &body(json!({"stream": true, "messages": [{"role": "user", "content": "FAIL_MIDWAY"}]})),
        )
        .await;
    let last = events.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"));
    assert_eq!(last.json()["error"]["type"], "api_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_counts_the_prompt_messages_would_send() {
    // The same system and messages as `messages_non_streaming`: the count is the prompt's
    // length there (its `input_tokens`), with Claude Code's request shape accepted (system as a
    // list of blocks with cache_control, metadata).
    let server = TestServer::start().await;
    let r = server
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": MODEL,
                    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                        {"role": "assistant", "content": "ok"},
                        {"role": "user", "content": "again"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let prompt = "<|system|>be brief\n<|user|>hi\n<|assistant|>ok\n<|user|>again\n<|assistant|>";
    assert_eq!(r.json(), json!({"input_tokens": prompt.chars().count()}));
    // Nothing was generated.
    assert_eq!(server.backend.submitted_count(), 0, "count_tokens submitted a generation");

    // Errors in Anthropic's shape: no messages, an unknown model, a field it does not take.
    let r = server.post("/v1/messages/count_tokens", &json!({"model": MODEL})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = server
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = server
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 2}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

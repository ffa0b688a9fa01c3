//! OpenAI endpoints against the fake backend.

use pagekv_server::{ChatMessage, Role};
use serde_json::{json, Value};

use crate::client::{SseEvent, TestServer};
use crate::fake::{expected_text, render_chat, MODEL};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn prompt_len(text: &str) -> usize {
    render_chat(&[ChatMessage::new(Role::User, text)]).chars().count()
}

/// The `data` payloads of a chat/completions stream, checking it ends with `[DONE]`.
fn chunks(events: &[SseEvent]) -> Vec<Value> {
    let (last, rest) = events.split_last().expect("empty stream");
    assert_eq!(last.data, "[DONE]");
    assert!(events.iter().all(|e| e.event.is_none()));
    rest.iter().map(SseEvent::json).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_non_streaming_shape_and_usage() {
    let server = TestServer::start().await;
    let r = server.post("/v1/chat/completions", &json!({"model": MODEL, "messages": user("hi")})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["model"], MODEL);
    let choice = &v["choices"][0];
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], expected_text(8));
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["logprobs"], Value::Null);
    let p = prompt_len("hi");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": p, "completion_tokens": 8, "total_tokens": p + 8,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    // Without max_tokens the budget is the rest of the context window.
    assert_eq!(server.backend.last_request().max_tokens, 256 - p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streaming_chunks() {
    let server = TestServer::start().await;
    let events = server.stream("/v1/chat/completions", &json!({"messages": user("hi"), "stream": true})).await;
    let chunks = chunks(&events);
    let id = chunks[0]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("chatcmpl-"));
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], id.as_str());
        assert_eq!(c["model"], MODEL);
        assert!(c.get("usage").is_none(), "usage only with include_usage");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let (last, middle) = chunks[1..].split_last().unwrap();
    assert_eq!(middle.len(), 8, "one chunk per token");
    let text: String = middle
        .iter()
        .map(|c| {
            assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
            c["choices"][0]["delta"]["content"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, expected_text(8));
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streaming_include_usage_and_length() {
    let server = TestServer::start().await;
    let events = server
        .stream(
            "/v1/chat/completions",
            &json!({"messages": user("hi"), "stream": true, "max_tokens": 3,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    let chunks = chunks(&events);
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    for c in rest {
        assert_eq!(c["usage"], Value::Null);
    }
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "length");
    assert_eq!(usage_chunk["choices"], json!([]));
    let p = prompt_len("hi");
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], p);
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 3);
    assert_eq!(usage_chunk["usage"]["total_tokens"], p + 3);
    let text: String =
        rest[1..rest.len() - 1].iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, expected_text(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_and_length_pass_through() {
    let server = TestServer::start().await;
    let v = server.post("/v1/chat/completions", &json!({"messages": user("hi"), "stop": " fake"})).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world, this is a");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(server.backend.last_request().stop, vec![" fake"]);

    let v =
        server.post("/v1/chat/completions", &json!({"messages": user("hi"), "max_completion_tokens": 2})).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_parameters_reach_the_backend() {
    let server = TestServer::start().await;
    let r = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("hi"), "temperature": 0.5, "top_p": 0.9, "top_k": 40,
                    "min_p": 0.05, "seed": 7, "presence_penalty": 0.5,
                    "frequency_penalty": -0.5, "stop": ["a", "b"], "max_tokens": 5, "n": 1,
                    "user": "someone", "logprobs": true, "top_logprobs": 3}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let req = server.backend.last_request();
    assert_eq!(req.max_tokens, 5);
    assert_eq!(req.sampling.temperature, 0.5);
    assert_eq!(req.sampling.top_p, 0.9);
    assert_eq!(req.sampling.top_k, Some(40));
    assert_eq!(req.sampling.min_p, 0.05);
    assert_eq!(req.sampling.seed, Some(7));
    assert_eq!(req.sampling.presence_penalty, 0.5);
    assert_eq!(req.sampling.frequency_penalty, -0.5);
    assert_eq!(req.stop, vec!["a", "b"]);
    assert_eq!(req.logprobs, Some(3));
    let prompt: String = req.prompt.iter().map(|&c| char::from_u32(c).unwrap()).collect();
    assert_eq!(prompt, "<|user|>hi\n<|assistant|>");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs() {
    let server = TestServer::start().await;
    let v = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("hi"), "logprobs": true, "top_logprobs": 2, "max_tokens": 2}),
        )
        .await
        .json();
    let content = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(content.as_array().unwrap().len(), 2);
    assert_eq!(
        content[1],
        json!({"token": " world", "logprob": -0.25, "bytes": " world".as_bytes(),
               "top_logprobs": [
                   {"token": " world", "logprob": -0.25, "bytes": " world".as_bytes()},
                   {"token": "alt1", "logprob": -2.0, "bytes": "alt1".as_bytes()}]})
    );

    let events = server
        .stream(
            "/v1/chat/completions",
            &json!({"messages": user("hi"), "logprobs": true, "max_tokens": 1, "stream": true}),
        )
        .await;
    let chunks = chunks(&events);
    assert_eq!(chunks[1]["choices"][0]["logprobs"]["content"][0]["token"], "Hello");
    assert_eq!(chunks[1]["choices"][0]["logprobs"]["content"][0]["top_logprobs"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_are_reported() {
    let server = TestServer::start().await;
    let body = json!({"messages": user("a long shared prefix"), "max_tokens": 1});
    let first = server.post("/v1/chat/completions", &body).await.json();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = server.post("/v1/chat/completions", &body).await.json();
    let p = prompt_len("a long shared prefix");
    assert_eq!(second["usage"]["prompt_tokens"], p);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_non_streaming_and_streaming() {
    let server = TestServer::start().await;
    let v = server.post("/v1/completions", &json!({"model": MODEL, "prompt": "Once"})).await.json();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], expected_text(8));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["total_tokens"], 12);
    // OpenAI's default budget for completions is 16 tokens.
    assert_eq!(server.backend.last_request().max_tokens, 16);

    let events = server
        .stream(
            "/v1/completions",
            &json!({"prompt": "Once", "stream": true, "max_tokens": 4,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    let chunks = chunks(&events);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert_eq!(usage["choices"], json!([]));
    let (fin, tokens) = rest.split_last().unwrap();
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let text: String = tokens.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, expected_text(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_token_prompt_and_logprobs() {
    let server = TestServer::start().await;
    let v = server
        .post("/v1/completions", &json!({"prompt": [72, 105], "max_tokens": 2, "logprobs": 1, "stop": ["\n"]}))
        .await
        .json();
    assert_eq!(server.backend.last_request().prompt, vec![72, 105]);
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(
        v["choices"][0]["logprobs"],
        json!({"tokens": ["Hello", " world"], "token_logprobs": [-0.25, -0.25],
               "top_logprobs": [{"Hello": -0.25}, {" world": -0.25}], "text_offset": [0, 5]})
    );
    // A token id the backend's vocabulary lacks is the client's error.
    let r = server.post("/v1/completions", &json!({"prompt": [4_000_000_000u32]})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("outside the vocabulary"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_errors_become_api_errors() {
    let server = TestServer::start().await;
    let r = server.post("/v1/chat/completions", &json!({"messages": user("FAIL_SUBMIT")})).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["type"], "server_error");

    let r = server.post("/v1/chat/completions", &json!({"messages": user("FAIL_MIDWAY")})).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["message"], "the fake engine broke");

    // Mid-stream: the tokens so far, then an error chunk, then [DONE].
    let events = server.stream("/v1/chat/completions", &json!({"messages": user("FAIL_MIDWAY"), "stream": true})).await;
    let chunks = chunks(&events);
    assert_eq!(chunks.len(), 4, "{chunks:?}");
    assert_eq!(chunks[2]["choices"][0]["delta"]["content"], " world");
    assert_eq!(chunks[3]["error"]["message"], "the fake engine broke");
    assert_eq!(chunks[3]["error"]["type"], "server_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_health() {
    let server = TestServer::start().await;
    let v = server.get("/v1/models").await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["owned_by"], "pagekv");
    assert_eq!(v["data"][0]["max_model_len"], 256);

    let one = server.get(&format!("/v1/models/{MODEL}")).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["id"], MODEL);
    let missing = server.get("/v1/models/nope").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "model_not_found");

    let h = server.get("/health").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json(), json!({"status": "ok"}));
}

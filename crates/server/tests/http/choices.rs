//! `n` choices on both OpenAI endpoints against the fake backend (whose default `submit_n`
//! submits one request per choice, seeded `seed + i`): `choices` indexed 0..n, usage with the
//! prompt once and the completions summed, streams interleaving every choice's chunks with its
//! index and its own finish chunk before one usage chunk and `[DONE]`, `n` out of range a 400
//! naming `n`, a client disconnect cancelling every choice, and tool calls parsed per choice.

use std::collections::BTreeMap;
use std::time::Duration;

use pagekv_server::{ChatMessage, Role, ServerConfig};
use serde_json::{json, Value};

use crate::client::{within, SseEvent, TestServer};
use crate::fake::{expected_text, render_chat, FakeConfig};

fn chat(n: usize, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "n": n, "seed": 40});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

fn prompt_len() -> usize {
    render_chat(&[ChatMessage::new(Role::User, "hi")]).chars().count()
}

/// The `data` payloads of a stream, checking it ends with one `[DONE]`.
fn chunks(events: &[SseEvent]) -> Vec<Value> {
    let (last, rest) = events.split_last().expect("empty stream");
    assert_eq!(last.data, "[DONE]");
    assert!(rest.iter().all(|e| e.data != "[DONE]"), "one [DONE] only");
    rest.iter().map(SseEvent::json).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_choices_are_indexed_and_usage_sums_completions() {
    let server = TestServer::start().await;
    let r = server.post("/v1/chat/completions", &chat(4, json!({"max_tokens": 5}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], expected_text(5));
        assert_eq!(c["finish_reason"], "length");
    }
    let p = prompt_len();
    assert_eq!(v["usage"]["prompt_tokens"], p, "the prompt is counted once");
    assert_eq!(v["usage"]["completion_tokens"], 20);
    assert_eq!(v["usage"]["total_tokens"], p + 20);
    // Each choice samples with its own seed.
    let submitted = server.backend.submitted.lock().unwrap().clone();
    let seeds: Vec<Option<u64>> = submitted.iter().map(|r| r.sampling.seed).collect();
    assert_eq!(seeds, [Some(40), Some(41), Some(42), Some(43)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_choices_streamed_and_not() {
    let server = TestServer::start().await;
    let body = json!({"prompt": "abc", "max_tokens": 3, "n": 3});
    let v = server.post("/v1/completions", &body).await.ok();
    let texts: Vec<&str> = v["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, vec![expected_text(3).as_str(); 3]);
    assert_eq!(v["usage"]["completion_tokens"], 9);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&server.stream("/v1/completions", &streamed).await);
    let mut texts: BTreeMap<u64, String> = BTreeMap::new();
    let mut finished = Vec::new();
    for c in &chunks[..chunks.len() - 1] {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap();
        texts.entry(i).or_default().push_str(choice["text"].as_str().unwrap());
        if !choice["finish_reason"].is_null() {
            finished.push(i);
        }
        assert_eq!(c["usage"], Value::Null, "usage only in the last chunk");
    }
    assert_eq!(texts.into_values().collect::<Vec<_>>(), vec![expected_text(3); 3]);
    finished.sort_unstable();
    assert_eq!(finished, [0, 1, 2], "each choice has its own finish chunk");
    let last = chunks.last().unwrap();
    assert_eq!((last["choices"].clone(), last["usage"]["completion_tokens"].clone()), (json!([]), json!(9)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_interleaves_choices_with_their_index() {
    let server = TestServer::with(ServerConfig::default(), FakeConfig { eos_after: 4, ..FakeConfig::default() }).await;
    let body = chat(3, json!({"stream": true, "stream_options": {"include_usage": true}}));
    let chunks = chunks(&server.stream("/v1/chat/completions", &body).await);
    let mut content: BTreeMap<u64, String> = BTreeMap::new();
    let mut roles = Vec::new();
    let mut finishes = Vec::new();
    let id = chunks[0]["id"].clone();
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!(c["id"], id, "one id for the whole stream");
        assert_eq!(c["object"], "chat.completion.chunk");
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap();
        if choice["delta"]["role"] == "assistant" {
            roles.push(i);
        }
        content.entry(i).or_default().push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if let Some(reason) = choice["finish_reason"].as_str() {
            assert_eq!(reason, "stop");
            finishes.push(i);
        }
    }
    assert_eq!(roles, [0, 1, 2], "each choice announces its role");
    assert_eq!(content.into_values().collect::<Vec<_>>(), vec![expected_text(4); 3]);
    finishes.sort_unstable();
    assert_eq!(finishes, [0, 1, 2]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!((usage["prompt_tokens"].clone(), usage["completion_tokens"].clone()), (json!(prompt_len()), json!(12)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_out_of_range_is_a_400_naming_n() {
    let server = TestServer::start().await;
    for n in [json!(0), json!(17), json!(-2), json!("2")] {
        for (path, mut body) in [
            ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}]})),
            ("/v1/completions", json!({"prompt": "x"})),
        ] {
            body["n"] = n.clone();
            let e = server.post(path, &body).await.error(400);
            assert_eq!(e["param"], "n", "{path} n={n}: {e}");
        }
    }
    assert_eq!(server.backend.submitted_count(), 0);
    let v = server.post("/v1/completions", &json!({"prompt": "x", "n": 16, "max_tokens": 1})).await.ok();
    assert_eq!(v["choices"].as_array().unwrap().len(), 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_cancels_every_choice() {
    let fake = FakeConfig {
        context_window: 1 << 20,
        eos_after: 100_000,
        token_delay: Duration::from_millis(10),
        ..FakeConfig::default()
    };
    let server = TestServer::with(ServerConfig::default(), fake).await;
    let (status, mut reader) = server.open_stream("/v1/chat/completions", &chat(3, json!({"stream": true}))).await;
    assert_eq!(status, 200);
    within("a few chunks", async {
        for _ in 0..6 {
            assert!(reader.next().await.is_some());
        }
    })
    .await;
    drop(reader);
    server.backend.wait_until("every choice cancelled", |b| b.cancellations() == 3).await;
    assert_eq!(server.backend.running(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_parsed_per_choice() {
    let server = TestServer::start().await;
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
         "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    ]);
    let body = json!({"messages": [{"role": "user", "content": "CALL_TOOLS please"}], "tools": tools, "n": 2});
    let v = server.post("/v1/chat/completions", &body).await.ok();
    let mut ids = std::collections::BTreeSet::new();
    for (i, choice) in v["choices"].as_array().unwrap().iter().enumerate() {
        for call in choice["message"]["tool_calls"].as_array().unwrap() {
            assert!(ids.insert(call["id"].as_str().unwrap().to_string()), "call ids repeat across choices: {v}");
        }
        assert_eq!((choice["index"].clone(), choice["finish_reason"].clone()), (json!(i), json!("tool_calls")), "{v}");
        let names: Vec<&str> = choice["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["get_weather", "get_time"], "{v}");
    }
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = chunks(&server.stream("/v1/chat/completions", &streamed).await);
    let mut names: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut finishes: BTreeMap<u64, String> = BTreeMap::new();
    let mut streamed_ids = std::collections::BTreeSet::new();
    for c in &chunks {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap();
        for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            if let Some(id) = call["id"].as_str() {
                assert!(streamed_ids.insert(id.to_string()), "call ids repeat across streamed choices");
            }
            if let Some(name) = call["function"]["name"].as_str() {
                names.entry(i).or_default().push(name.to_string());
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finishes.insert(i, reason.to_string());
        }
    }
    let expected: Vec<String> = vec!["get_weather".into(), "get_time".into()];
    assert_eq!(names, BTreeMap::from([(0, expected.clone()), (1, expected)]));
    assert_eq!(finishes, BTreeMap::from([(0, "tool_calls".to_string()), (1, "tool_calls".to_string())]));
    assert_eq!(streamed_ids.len(), 4, "two calls in each of two choices");
}

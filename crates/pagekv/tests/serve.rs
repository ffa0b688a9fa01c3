//! `pagekv serve` end to end: the real binary on 127.0.0.1 over the default model, driven by
//! an HTTP client. Chat and completions, streaming and not, stop strings, length limits, the
//! API key, bad input against the real engine, disconnects returning blocks to the pool, pool
//! exhaustion with preemption, session-bank reuse across chat turns, greedy outputs identical
//! alone and batched, and SIGTERM.
//!
//! Every test starts its own server (about 0.3 s) with the pool it needs; the harness runs
//! them one at a time. Skipped visibly without the model, failed under PAGEKV_REQUIRE_MODEL=1.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};
use support::{read_until, reply_text, streamed_finish, streamed_text, streamed_usage, ServerProcess};

/// Context window and pool of the servers that need nothing special.
const DEFAULT_ARGS: &[&str] = &["--context-window", "1024", "--num-blocks", "256"];
/// How long freed blocks may take to show in `/metrics` (the engine frees them within a step).
const RETURN_LIMIT: Duration = Duration::from_secs(5);

fn completion(model: &str, prompt: &str, max_tokens: usize) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

fn chat(model: &str, messages: Value, max_tokens: usize) -> Value {
    json!({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
}

/// `body` with `"stream": true` and usage in the last chunk.
fn streaming(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

fn usage_of(v: &Value) -> (u64, u64, u64) {
    let u = &v["usage"];
    let n = |k: &str| u[k].as_u64().unwrap_or_else(|| panic!("usage.{k} missing: {v}"));
    let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| panic!("no cached: {v}"));
    assert_eq!(n("total_tokens"), n("prompt_tokens") + n("completion_tokens"), "{v}");
    (n("prompt_tokens"), n("completion_tokens"), cached)
}

#[tokio::test]
async fn chat_and_completions_streaming_and_not_give_the_same_greedy_text() {
    let Some(s) = ServerProcess::start("chat_and_completions", DEFAULT_ARGS) else { return };
    assert_eq!(s.get("/health").await.status, 200);
    let models = s.get("/v1/models").await.ok();
    assert_eq!(models["data"][0]["id"], s.model.as_str(), "{models}");

    let messages = json!([{"role": "user", "content": "Name three colors."}]);
    let whole = s.post("/v1/chat/completions", &chat(&s.model, messages.clone(), 24)).await.ok();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let text = reply_text(&whole);
    assert!(!text.is_empty(), "{whole}");
    let (prompt_tokens, completion_tokens, _) = usage_of(&whole);
    assert!(prompt_tokens > 5 && (1..=24).contains(&completion_tokens), "{whole}");
    let finish = whole["choices"][0]["finish_reason"].as_str().unwrap().to_string();
    assert!(finish == "stop" || finish == "length", "{whole}");

    let events = s.stream("/v1/chat/completions", &streaming(chat(&s.model, messages.clone(), 24))).await;
    assert!(events.iter().all(|e| e["object"] == "chat.completion.chunk"), "{events:?}");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant", "{events:?}");
    assert_eq!(streamed_text(&events), text);
    assert_eq!(streamed_finish(&events), finish);
    let usage = streamed_usage(&events);
    assert_eq!(
        (usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()),
        (Some(prompt_tokens), Some(completion_tokens))
    );

    // The Anthropic API over the same engine and template answers the same.
    let m = s
        .post("/v1/messages", &json!({"model": s.model, "messages": messages, "max_tokens": 24, "temperature": 0}))
        .await
        .ok();
    assert_eq!(m["content"][0]["text"].as_str(), Some(text.as_str()), "{m}");

    let body = completion(&s.model, "The capital of France is", 16);
    let whole = s.post("/v1/completions", &body).await.ok();
    assert_eq!(whole["object"], "text_completion");
    let text = reply_text(&whole);
    assert!(text.contains("Paris"), "{whole}");
    let events = s.stream("/v1/completions", &streaming(body)).await;
    assert_eq!(streamed_text(&events), text);
    assert_eq!(streamed_finish(&events), whole["choices"][0]["finish_reason"].as_str().unwrap());
    assert_eq!(streamed_usage(&events)["completion_tokens"], whole["usage"]["completion_tokens"]);

    // A stream without include_usage ends with [DONE] and carries no usage object.
    let mut plain = completion(&s.model, "The capital of France is", 4);
    plain["stream"] = json!(true);
    let events = s.stream("/v1/completions", &plain).await;
    assert!(events.iter().all(|e| e["usage"].is_null()), "{events:?}");
    assert_eq!(streamed_text(&events), text.chars().take(streamed_text(&events).chars().count()).collect::<String>());
}

/// A stop string taken from the middle of the greedy output cuts the output right before it.
#[tokio::test]
async fn stop_strings_end_the_output_before_the_match() {
    let Some(s) = ServerProcess::start("stop_strings", DEFAULT_ARGS) else { return };
    let prompt = "Once upon a time, in a small village,";
    let full = reply_text(&s.post("/v1/completions", &completion(&s.model, prompt, 32)).await.ok());
    let (stop, cut) = pick_stop(&full);

    let mut body = completion(&s.model, prompt, 32);
    body["stop"] = json!(["\u{1F600}never", stop]);
    let r = s.post("/v1/completions", &body).await.ok();
    assert_eq!(reply_text(&r), cut, "stop {stop:?} in {full:?}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let events = s.stream("/v1/completions", &streaming(body)).await;
    assert_eq!(streamed_text(&events), cut);
    assert_eq!(streamed_finish(&events), "stop");

    // A stop string that never occurs changes nothing.
    let mut body = completion(&s.model, prompt, 32);
    body["stop"] = json!("zqzqzq");
    assert_eq!(reply_text(&s.post("/v1/completions", &body).await.ok()), full);

    // Chat, with the stop string as a list.
    let messages = json!([{"role": "user", "content": "Tell me about the moon in two sentences."}]);
    let full = reply_text(&s.post("/v1/chat/completions", &chat(&s.model, messages.clone(), 40)).await.ok());
    let (stop, cut) = pick_stop(&full);
    let mut body = chat(&s.model, messages.clone(), 40);
    body["stop"] = json!([stop]);
    let r = s.post("/v1/chat/completions", &body).await.ok();
    assert_eq!(reply_text(&r), cut, "stop {stop:?} in {full:?}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let events = s.stream("/v1/chat/completions", &streaming(body)).await;
    assert_eq!(streamed_text(&events), cut);

    // The Anthropic API names the stop sequence that matched; without a match it names none.
    let mut body = json!({"model": s.model, "messages": messages, "max_tokens": 40, "temperature": 0,
        "stop_sequences": ["zqzqzq", stop]});
    let m = s.post("/v1/messages", &body).await.ok();
    assert_eq!(m["content"][0]["text"].as_str(), Some(cut.as_str()), "{m}");
    assert_eq!((m["stop_reason"].as_str(), m["stop_sequence"].as_str()), (Some("stop_sequence"), Some(stop.as_str())));
    body["stop_sequences"] = json!(["zqzqzq"]);
    let m = s.post("/v1/messages", &body).await.ok();
    assert!(matches!(m["stop_reason"].as_str(), Some("max_tokens" | "end_turn")), "{m}");
    assert!(m["stop_sequence"].is_null(), "{m}");
}

/// A 4-character stop string from the middle of `full` and the text before its first
/// occurrence (never empty).
fn pick_stop(full: &str) -> (String, String) {
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    assert!(chars.len() >= 12, "output too short to cut: {full:?}");
    for i in (chars.len() / 3)..chars.len() - 4 {
        let start = chars[i].0;
        let end = chars[i + 4].0;
        let stop = &full[start..end];
        let first = full.find(stop).expect("found");
        if first > 0 && !stop.trim().is_empty() {
            return (stop.to_string(), full[..first].to_string());
        }
    }
    panic!("no stop string to pick in {full:?}");
}

#[tokio::test]
async fn length_limits_are_exact() {
    let Some(s) = ServerProcess::start("length_limits", &["--context-window", "128", "--num-blocks", "64"]) else {
        return;
    };
    // A prompt that never runs out of things to say.
    let counting = "1, 2, 3, 4, 5, 6, 7, 8,";
    for n in [1, 5] {
        let r = s.post("/v1/completions", &completion(&s.model, counting, n)).await.ok();
        assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
        assert_eq!(usage_of(&r).1, n as u64, "{r}");
    }
    let events = s.stream("/v1/completions", &streaming(completion(&s.model, counting, 7))).await;
    assert_eq!(streamed_finish(&events), "length");
    assert_eq!(streamed_usage(&events)["completion_tokens"], 7);

    let messages = json!([{"role": "user", "content": "Count from one to one hundred."}]);
    let mut body = chat(&s.model, messages.clone(), 999);
    body.as_object_mut().unwrap().remove("max_tokens");
    body["max_completion_tokens"] = json!(3);
    let r = s.post("/v1/chat/completions", &body).await.ok();
    assert_eq!((r["choices"][0]["finish_reason"].as_str(), usage_of(&r).1), (Some("length"), 3), "{r}");

    // /v1/completions without max_tokens: OpenAI's default of 16.
    let r = s.post("/v1/completions", &json!({"model": s.model, "prompt": counting, "temperature": 0})).await.ok();
    assert_eq!(usage_of(&r).1, 16, "{r}");

    // Prompt + max_tokens filling the window exactly is accepted and stops at the window.
    let prompt_tokens = usage_of(&r).0 as usize;
    let r = s.post("/v1/completions", &completion(&s.model, counting, 128 - prompt_tokens)).await.ok();
    let (p, c, _) = usage_of(&r);
    assert!(p + c <= 128, "{r}");
    // Chat without a limit: as many as fit.
    let r = s.post("/v1/chat/completions", &json!({"model": s.model, "messages": messages, "temperature": 0})).await;
    let (p, c, _) = usage_of(&r.ok());
    assert!(p + c <= 128);
}

#[tokio::test]
async fn api_key_guards_every_v1_route() {
    let key = "sk-test-5b0b7e";
    let Some(s) = ServerProcess::start("api_key", &["--context-window", "256", "--num-blocks", "32", "--api-key", key])
    else {
        return;
    };
    let bearer = format!("Bearer {key}");
    let auth = [("authorization", bearer.as_str())];
    let wrong = [("authorization", "Bearer sk-wrong")];
    let e = s.get("/v1/models").await.error(401);
    assert_eq!(e["code"], "invalid_api_key", "{e}");
    s.get_with("/v1/models", &wrong).await.error(401);
    s.get_with("/v1/models", &[("authorization", key)]).await.error(401);
    assert_eq!(s.get_with("/v1/models", &auth).await.ok()["data"][0]["id"], s.model.as_str());

    let body = completion(&s.model, "Hello", 2).to_string();
    s.post_raw("/v1/completions", &[], body.clone()).await.error(401);
    s.post_raw("/v1/completions", &wrong, body.clone()).await.error(401);
    let chat_body = chat(&s.model, json!([{"role": "user", "content": "hi"}]), 2).to_string();
    s.post_raw("/v1/chat/completions", &[], chat_body.clone()).await.error(401);
    // The Anthropic route answers in Anthropic's error shape.
    let r = s.post_raw("/v1/messages", &[], chat_body.clone()).await;
    assert_eq!((r.status, r.json()["error"]["type"].as_str()), (401, Some("authentication_error")), "{}", r.text());
    assert_eq!(usage_of(&s.post_raw("/v1/completions", &auth, body).await.ok()).1, 2);
    assert_eq!(s.post_raw("/v1/chat/completions", &auth, chat_body).await.status, 200);
    // Health and metrics are not behind the key; refused requests never reached the engine.
    assert_eq!(s.get("/health").await.status, 200);
    let m = s.metrics().await;
    assert_eq!(m.get("pagekv_generations_finished_total{reason=\"length\"}"), 2.0, "{}", m.summary());
}

/// Every bad input the issue lists gets the OpenAI error shape and the right status, against
/// the real engine and tokenizer; the server keeps serving after all of them.
#[tokio::test]
async fn bad_input_is_refused_with_openai_errors_and_the_server_keeps_serving() {
    // Window 128 tokens; the pool holds 6 blocks of 16 = 96 tokens: a prompt of 110 tokens fits
    // the window but can never fit the pool.
    let args = ["--context-window", "128", "--num-blocks", "6", "--max-body-bytes", "4096"];
    let Some(s) = ServerProcess::start("bad_input", &args) else { return };
    let model = s.model.clone();
    let ids = |n: usize| json!(vec![1000; n]);

    let e = s.post("/v1/completions", &json!({"model": model, "prompt": ids(200), "max_tokens": 4})).await.error(400);
    assert_eq!((e["code"].as_str(), e["param"].as_str()), (Some("context_length_exceeded"), Some("prompt")), "{e}");
    let long_text = "the sea and the sky ".repeat(60);
    let e = s.post("/v1/completions", &completion(&model, &long_text, 4)).await.error(400);
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    let e = s
        .post("/v1/chat/completions", &chat(&model, json!([{"role": "user", "content": long_text}]), 4))
        .await
        .error(400);
    assert_eq!((e["code"].as_str(), e["param"].as_str()), (Some("context_length_exceeded"), Some("messages")), "{e}");
    // Prompt + max_tokens over the window.
    let e = s.post("/v1/completions", &json!({"model": model, "prompt": ids(50), "max_tokens": 79})).await.error(400);
    assert_eq!((e["code"].as_str(), e["param"].as_str()), (Some("context_length_exceeded"), Some("max_tokens")), "{e}");
    // A prompt the whole pool cannot hold: refused up front, not queued forever.
    let e = s.post("/v1/completions", &json!({"model": model, "prompt": ids(110), "max_tokens": 4})).await.error(400);
    assert!(e["message"].as_str().unwrap().contains("pool"), "{e}");
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    // Huge, overflowing, zero and negative max_tokens.
    for n in [json!(1_000_000_000_000u64), json!(1e30), json!(u64::MAX), json!(0), json!(-5)] {
        let e = s.post("/v1/completions", &json!({"model": model, "prompt": "hi", "max_tokens": n})).await.error(400);
        assert_eq!(e["param"], "max_tokens", "{n}: {e}");
    }
    let e = s
        .post(
            "/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": "hi"}],
                                               "max_completion_tokens": 1_000_000}),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "max_completion_tokens", "{e}");
    // Malformed JSON, not an object, empty body, invalid UTF-8.
    for body in [&b"{\"model\": "[..], b"[1, 2]", b"", b"{\"prompt\": \"\xff\xfe\"}"] {
        let e = s.post_raw("/v1/completions", &[], body.to_vec()).await.error(400);
        assert!(e["code"] == "invalid_json" || e["code"] == "invalid_utf8", "{e}");
    }
    // Wrong types.
    for body in [
        json!({"model": model, "messages": "hi"}),
        json!({"model": model, "messages": [{"role": "user", "content": 5}]}),
        json!({"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}),
        json!({"model": model, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
        json!({"model": model, "messages": [{"role": "user", "content": "x"}], "stop": 7}),
        json!({"model": model, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
    ] {
        s.post("/v1/chat/completions", &body).await.error(400);
    }
    // Unknown model, empty messages, unsupported role, n > 16, out-of-range sampling.
    let e = s.post("/v1/chat/completions", &chat("gpt-9", json!([{"role": "user", "content": "x"}]), 4)).await;
    assert_eq!(e.error(404)["code"], "model_not_found");
    s.post("/v1/chat/completions", &chat(&model, json!([]), 4)).await.error(400);
    s.post("/v1/chat/completions", &chat(&model, json!([{"role": "wizard", "content": "x"}]), 4)).await.error(400);
    let mut body = chat(&model, json!([{"role": "user", "content": "x"}]), 4);
    body["n"] = json!(17);
    assert_eq!(s.post("/v1/chat/completions", &body).await.error(400)["param"], "n");
    body["n"] = json!(1);
    body["temperature"] = json!(7.5);
    s.post("/v1/chat/completions", &body).await.error(400);
    // Token ids outside the vocabulary.
    let e = s.post("/v1/completions", &json!({"model": model, "prompt": [1, 99_999_999], "max_tokens": 2})).await;
    e.error(400);
    // A body over --max-body-bytes.
    let big = json!({"model": model, "prompt": "x".repeat(10_000), "max_tokens": 2}).to_string();
    let r = s.post_raw("/v1/completions", &[], big).await;
    assert_eq!(r.status, 413, "{}", r.text());

    // Still serving, with nothing left in the pool and no generation failed.
    assert_eq!(s.get("/health").await.status, 200);
    let r = s.post("/v1/completions", &completion(&model, "The capital of France is", 4)).await.ok();
    assert_eq!(usage_of(&r).1, 4);
    let m = s.wait_metrics(RETURN_LIMIT, "no blocks in use", |m| m.get("pagekv_kv_blocks_used") == 0.0).await;
    assert_eq!(m.get("pagekv_generations_finished_total{reason=\"error\"}"), 0.0, "{}", m.summary());
}

/// A client that goes away mid-stream (or while waiting for a whole answer) gets its blocks
/// returned to the pool: `/metrics` shows used blocks back at the baseline.
#[tokio::test]
async fn disconnect_returns_the_blocks_to_the_pool() {
    let Some(s) = ServerProcess::start("disconnect", DEFAULT_ARGS) else { return };
    let baseline = s.metrics().await.get("pagekv_kv_blocks_used");
    assert_eq!(baseline, 0.0);
    let counting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";
    let mut body = completion(&s.model, counting, 900);
    body["stream"] = json!(true);
    let mut socket = s.raw_post("/v1/completions", &body).await;
    // Three tokens on the wire.
    let mut seen = read_until(&mut socket, "\"text\"").await;
    while seen.matches("\"text\"").count() < 3 {
        seen.push_str(&read_until(&mut socket, "\"text\"").await);
    }
    let m = s.metrics().await;
    assert!(m.get("pagekv_kv_blocks_used") > baseline, "{}", m.summary());
    drop(socket);
    let m = s
        .wait_metrics(RETURN_LIMIT, "blocks back after a streaming disconnect", |m| {
            m.get("pagekv_kv_blocks_used") == baseline && m.get("pagekv_running_sequences") == 0.0
        })
        .await;
    assert_eq!(m.get("pagekv_generations_finished_total{reason=\"cancelled\"}"), 1.0, "{}", m.summary());

    // Non-streaming: the client leaves while the engine is generating.
    let socket = s.raw_post("/v1/completions", &completion(&s.model, counting, 900)).await;
    s.wait_metrics(Duration::from_secs(60), "the request is running", |m| m.get("pagekv_kv_blocks_used") > baseline)
        .await;
    drop(socket);
    let m = s
        .wait_metrics(RETURN_LIMIT, "blocks back after a non-streaming disconnect", |m| {
            m.get("pagekv_kv_blocks_used") == baseline && m.get("pagekv_running_sequences") == 0.0
        })
        .await;
    assert_eq!(m.get("pagekv_generations_finished_total{reason=\"cancelled\"}"), 2.0, "{}", m.summary());
    // And the pool still serves.
    let r = s.post("/v1/completions", &completion(&s.model, "The capital of France is", 4)).await.ok();
    assert_eq!(usage_of(&r).1, 4);
}

/// `--request-timeout`: a generation that runs past it is answered 504 `request_timeout` and
/// its blocks go back to the pool within a step; the server keeps serving.
#[tokio::test]
async fn request_timeout_cancels_and_returns_the_blocks() {
    let args = [DEFAULT_ARGS, &["--request-timeout", "1"]].concat();
    let Some(s) = ServerProcess::start("request_timeout", &args) else { return };
    let baseline = s.metrics().await.get("pagekv_kv_blocks_used");
    // Counting to 900 tokens takes several seconds at any speed seen so far.
    let body = completion(&s.model, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", 900);
    let e = s.post("/v1/completions", &body).await.error(504);
    assert_eq!(e["code"], "request_timeout", "{e}");
    let m = s
        .wait_metrics(RETURN_LIMIT, "blocks back after a timeout", |m| {
            m.get("pagekv_kv_blocks_used") == baseline && m.get("pagekv_running_sequences") == 0.0
        })
        .await;
    assert_eq!(m.get("pagekv_generations_finished_total{reason=\"timeout\"}"), 1.0, "{}", m.summary());
    let r = s.post("/v1/completions", &completion(&s.model, "The capital of France is", 4)).await.ok();
    assert_eq!(usage_of(&r).1, 4);
}

/// Runs `bodies` one after another, then all at once; returns both lists of (text, finish).
async fn alone_then_together(
    s: &ServerProcess,
    bodies: &[(&str, Value)],
) -> (Vec<(String, String)>, Vec<(String, String)>) {
    let mut alone = Vec::new();
    for (path, body) in bodies {
        let r = s.post(path, body).await.ok();
        alone.push((reply_text(&r), r["choices"][0]["finish_reason"].as_str().unwrap().to_string()));
    }
    let tasks: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(i, (path, body))| {
            // Half of them stream.
            let stream = i % 2 == 1;
            let body = if stream { streaming(body.clone()) } else { body.clone() };
            let (path, addr) = (path.to_string(), s.addr);
            tokio::spawn(async move {
                if stream {
                    let (status, mut reader) = support::open_stream_at(addr, &path, &body).await;
                    assert_eq!(status, 200);
                    let events = reader.read_to_done().await;
                    (streamed_text(&events), streamed_finish(&events))
                } else {
                    let r = support::send_json(addr, &path, &body).await.ok();
                    (reply_text(&r), r["choices"][0]["finish_reason"].as_str().unwrap().to_string())
                }
            })
        })
        .collect();
    // Watch the engine while they run: they must really run together.
    let mut most_running = 0.0f64;
    while !tasks.iter().all(|t| t.is_finished()) {
        most_running = most_running.max(s.metrics().await.get("pagekv_running_sequences"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut together = Vec::new();
    for t in tasks {
        together.push(t.await.expect("client task panicked"));
    }
    assert!(most_running > 1.0, "the requests never ran together (at most {most_running} running)");
    (alone, together)
}

/// A pool far too small for the concurrent requests: the scheduler preempts and recomputes,
/// and every request still completes with exactly the greedy output it has alone.
#[tokio::test]
async fn pool_exhaustion_preempts_and_every_request_matches_its_solo_output() {
    // 12 blocks of 16 tokens; each request needs about 5 (a short prompt and 64 tokens).
    let args = ["--context-window", "512", "--num-blocks", "12"];
    let Some(s) = ServerProcess::start("preemption", &args) else { return };
    let bodies: Vec<(&str, Value)> = (0..4)
        .map(|i| ("/v1/completions", completion(&s.model, &format!("Story {i}: Once upon a time, in a land of"), 64)))
        .collect();
    let (alone, together) = alone_then_together(&s, &bodies).await;
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "request {i} differs when run with the others");
    }
    let m = s
        .wait_metrics(RETURN_LIMIT, "pool drained", |m| {
            m.get("pagekv_kv_blocks_used") == 0.0 && m.get("pagekv_waiting_sequences") == 0.0
        })
        .await;
    assert!(m.get("pagekv_preemptions_total") > 0.0, "no preemption happened:\n{}", m.summary());
    assert_eq!(m.get("pagekv_generations_finished_total{reason=\"error\"}"), 0.0);
}

/// Greedy outputs do not depend on what else is in the batch: 16 requests of different
/// lengths, chat and completions, run alone and then all together (prefill chunks mixed with
/// decodes under a small token budget), give the same texts and finish reasons.
#[tokio::test]
async fn greedy_output_is_the_same_alone_and_batched_with_fifteen_others() {
    let args = ["--context-window", "1024", "--num-blocks", "512", "--max-batch-tokens", "64", "--no-session-bank"];
    let Some(s) = ServerProcess::start("batch_invariance", &args) else { return };
    let topics = ["the sea", "a lighthouse", "bread", "owls", "rain", "a violin", "Mars", "chess"];
    let mut bodies: Vec<(&str, Value)> = Vec::new();
    for (i, topic) in topics.iter().enumerate() {
        let padding = "Please answer carefully and briefly. ".repeat(i);
        let messages = json!([{"role": "user", "content": format!("{padding}Write one sentence about {topic}.")}]);
        bodies.push(("/v1/chat/completions", chat(&s.model, messages, 24)));
        let prompt = format!("{}A short note about {topic}:", "Notes, in order. ".repeat(2 * i));
        bodies.push(("/v1/completions", completion(&s.model, &prompt, 24)));
    }
    assert_eq!(bodies.len(), 16);
    let (alone, together) = alone_then_together(&s, &bodies).await;
    let distinct: HashSet<&String> = alone.iter().map(|(t, _)| t).collect();
    assert!(distinct.len() > 8, "the prompts should lead to different outputs: {alone:?}");
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "request {i} differs when batched with 15 others");
    }
}

/// The second turn of a chat finds the first turn (its prompt and the reply) in the session
/// bank: usage reports the cached tokens, the engine computes only the rest, and the answer is
/// the same as without the bank.
#[tokio::test]
async fn session_bank_reuses_the_previous_turn() {
    let turn1 = json!([
        {"role": "system", "content": "You are a concise assistant who answers in plain sentences."},
        {"role": "user", "content": "Write two sentences about the sea."}
    ]);
    let (turn2, first, second, hits) = {
        let Some(s) = ServerProcess::start("session_bank", DEFAULT_ARGS) else { return };
        let r1 = s.post("/v1/chat/completions", &chat(&s.model, turn1.clone(), 48)).await.ok();
        let (p1, c1, cached1) = usage_of(&r1);
        assert_eq!(cached1, 0, "nothing to reuse on the first turn: {r1}");
        let before = s.metrics().await;
        let mut turn2 = turn1.as_array().unwrap().clone();
        turn2.push(json!({"role": "assistant", "content": reply_text(&r1)}));
        turn2.push(json!({"role": "user", "content": "Now one sentence about mountains."}));
        let turn2 = Value::Array(turn2);
        let r2 = s.post("/v1/chat/completions", &chat(&s.model, turn2.clone(), 24)).await.ok();
        let (p2, _, cached2) = usage_of(&r2);
        let after = s.metrics().await;
        eprintln!("session bank: turn 1 {p1} prompt + {c1} generated; turn 2 {p2} prompt, {cached2} cached");
        // Reused: whole blocks, at least the first turn's prompt, at most the history before the
        // new message. Computed: the new message and the partial block before it.
        assert!(cached2 > 0 && cached2 % 16 == 0, "{r2}");
        // Turn 1 left its prompt and every generated token but the last (sampled, never fed
        // back) in the pool: all their full blocks are reused.
        let history = p1 + c1 - 1;
        assert!(cached2 >= history / 16 * 16, "turn 1 held {history} tokens, turn 2 reused {cached2}");
        assert!(cached2 <= history, "reused {cached2} > the {history} tokens of turn 1");
        let new_tokens = p2 - (p1 + c1);
        assert!(p2 - cached2 <= new_tokens + 2 * 16, "computed {} of {p2} prompt tokens", p2 - cached2);
        let hits = after.get("pagekv_session_bank_hits_total") - before.get("pagekv_session_bank_hits_total");
        assert!(hits >= 1.0, "no bank hit counted:\n{}", after.summary());
        let cached_metric =
            after.get("pagekv_prompt_cached_tokens_total") - before.get("pagekv_prompt_cached_tokens_total");
        assert_eq!(cached_metric, cached2 as f64);
        (turn2, reply_text(&r2), r2, hits)
    };
    let _ = (first, hits);
    // The same second turn computed from scratch answers the same.
    let Some(s) = ServerProcess::start("session_bank_off", &[DEFAULT_ARGS, &["--no-session-bank"]].concat()) else {
        return;
    };
    let r = s.post("/v1/chat/completions", &chat(&s.model, turn2, 24)).await.ok();
    assert_eq!(usage_of(&r).2, 0, "{r}");
    assert_eq!(reply_text(&r), reply_text(&second));
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_and_exits_zero() {
    let Some(mut s) = ServerProcess::start("sigterm", DEFAULT_ARGS) else { return };
    let body = streaming(completion(&s.model, "1, 2, 3, 4, 5, 6, 7, 8,", 24));
    let (status, mut reader) = s.open_stream("/v1/completions", &body).await;
    assert_eq!(status, 200);
    let first = reader.next_json().await.expect("a first chunk");
    s.terminate();
    let mut events = vec![first];
    events.extend(reader.read_to_done().await);
    assert_eq!(streamed_finish(&events), "length", "the in-flight request was not finished: {events:?}");
    assert_eq!(streamed_usage(&events)["completion_tokens"], 24);
    let status = s.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert!(s.stderr().contains("pagekv: stopped"), "{}", s.stderr());
    drop(s);

    // A request that outlasts the grace period is cut off, and the exit is still 0.
    let args = [DEFAULT_ARGS, &["--grace-period", "0.5"]].concat();
    let Some(mut s) = ServerProcess::start("sigterm_grace", &args) else { return };
    let body = streaming(completion(&s.model, "1, 2, 3, 4, 5, 6, 7, 8,", 900));
    let (status, mut reader) = s.open_stream("/v1/completions", &body).await;
    assert_eq!(status, 200);
    reader.next_json().await.expect("a first chunk");
    s.terminate();
    let status = s.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
}

/// `pagekv bench serve --json` runs end to end on a small scale: one JSON row per client
/// count, the batching ratio, and a session-bank row whose hit is faster than its miss.
#[test]
fn bench_serve_prints_one_json_row_per_measurement() {
    let Some(model) = pagekv_testkit::default_model("bench_serve") else { return };
    let _serial = support::serial();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pagekv"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PAGEKV_") {
            cmd.env_remove(&k);
        }
    }
    let args = ["--clients", "1,8", "--max-tokens", "4", "--prefix-tokens", "256", "--prefix-runs", "1"];
    let out = cmd
        .args(["bench", "serve", "--json", "--model"])
        .arg(&model)
        .args(args)
        .args(["--context-window", "512", "--num-blocks", "128"])
        .output()
        .expect("run pagekv bench serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let kinds: Vec<&str> = rows.iter().map(|r| r["row"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["clients", "clients", "batching", "session_bank"], "{rows:?}");
    for (r, clients) in rows.iter().zip([1u64, 8]) {
        assert_eq!(r["clients"], clients);
        let tokens = r["output_tokens"].as_u64().unwrap();
        assert!(tokens > 0 && tokens <= 4 * clients, "{r}");
        let u = r["pool_utilization"].as_f64().unwrap();
        assert!(u > 0.5 && u <= 1.0, "{r}");
        for k in ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"] {
            assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {r}");
        }
        assert!(r["ttft_p50_ms"].as_f64() <= r["ttft_p99_ms"].as_f64(), "{r}");
    }
    assert!(rows[2]["throughput_8_vs_1"].as_f64().is_some_and(|x| x > 0.0), "{:?}", rows[2]);
    let bank = &rows[3];
    assert_eq!(bank["cached_tokens"], 256, "{bank}");
    assert!(bank["ttft_hit_ms"].as_f64() < bank["ttft_miss_ms"].as_f64(), "{bank}");
}

/// `run` and `serve` generate through one loop (the engine): with the same numerics, the same
/// greedy completion, stop string included, comes out of both.
#[tokio::test]
async fn run_and_the_server_give_the_same_greedy_completion() {
    let Some(s) = ServerProcess::start("run_equals_serve", DEFAULT_ARGS) else { return };
    for (prompt, stop) in [("The capital of France is", None), ("def fibonacci(n):", Some("return"))] {
        let mut body = completion(&s.model, prompt, 40);
        let mut args = vec!["run", "--temperature", "0", "-n", "40", "--attn-numerics", "fast", "--model"];
        let model = pagekv_testkit::default_model("run_equals_serve").expect("the server found it");
        let model = model.to_string_lossy().into_owned();
        args.push(&model);
        if let Some(stop) = stop {
            body["stop"] = json!([stop]);
            args.extend(["--stop", stop]);
        }
        args.push(prompt);
        let served = reply_text(&s.post("/v1/completions", &body).await.ok());
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagekv"))
            .args(&args)
            .env_remove("PAGEKV_ATTN_NUMERICS")
            .output()
            .expect("run pagekv");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let ran = String::from_utf8(out.stdout).expect("UTF-8");
        // `run` ends its output with a newline.
        assert_eq!(ran.strip_suffix('\n'), Some(served.as_str()), "{prompt:?}");
        assert!(!served.is_empty(), "{prompt:?}");
    }
}

#[tokio::test]
async fn served_model_names_from_the_flag_or_the_variable() {
    let args = [DEFAULT_ARGS, &["--served-model-name", "gpt-4o-mini,local"]].concat();
    let Some(s) =
        ServerProcess::start_with_env("served_model_names", &args, &[("PAGEKV_SERVED_MODEL_NAME", "env-name")])
    else {
        return;
    };
    let models = s.get("/v1/models").await.ok();
    assert_eq!(models["data"][0]["id"], "gpt-4o-mini", "the flag wins over the variable: {models}");
    let v = s.post("/v1/completions", &completion("local", "Hello", 2)).await.ok();
    assert_eq!(v["model"], "local");
    for unknown in [s.model.as_str(), "env-name"] {
        let r = s.post("/v1/completions", &completion(unknown, "Hello", 2)).await;
        assert_eq!(r.status, 404, "{unknown}: {}", r.text());
    }
    drop(s);

    let Some(s) =
        ServerProcess::start_with_env("served_model_names", DEFAULT_ARGS, &[("PAGEKV_SERVED_MODEL_NAME", "*")])
    else {
        return;
    };
    assert_eq!(s.get("/v1/models").await.ok()["data"][0]["id"], s.model.as_str());
    let v = s.post("/v1/completions", &completion("claude-opus-4", "Hello", 2)).await.ok();
    assert_eq!(v["model"], "claude-opus-4");
}

/// The schema of the structured-output tests, checked by hand in [`check_city`].
fn city_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
            "capital": {"type": "boolean"},
            "continent": {"enum": ["Africa", "Americas", "Asia", "Europe", "Oceania"]},
        },
        "required": ["city", "population", "capital", "continent"],
        "additionalProperties": false,
    })
}

fn check_city(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    if o.len() != 4 {
        return Err(format!("{} keys", o.len()));
    }
    let city = o.get("city").and_then(Value::as_str).ok_or("city")?;
    if city.chars().count() > 20 {
        return Err("city too long".into());
    }
    let population = o.get("population").and_then(Value::as_i64).ok_or("population")?;
    if !(0..=100_000_000).contains(&population) {
        return Err("population out of range".into());
    }
    o.get("capital").and_then(Value::as_bool).ok_or("capital")?;
    let continent = o.get("continent").and_then(Value::as_str).ok_or("continent")?;
    if !["Africa", "Americas", "Asia", "Europe", "Oceania"].contains(&continent) {
        return Err("continent".into());
    }
    Ok(())
}

#[tokio::test]
async fn json_schema_outputs_parse_and_validate_at_temperature_one() {
    let Some(s) = ServerProcess::start("json_schema_outputs", DEFAULT_ARGS) else { return };
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "city", "schema": city_schema(), "strict": true}});
    let messages = json!([{"role": "user", "content": "Describe a city as JSON."}]);
    // Eight seeds at once (batched with each other, each with its own grammar state).
    let tasks: Vec<_> = (0..8u64)
        .map(|seed| {
            let body = json!({"model": s.model, "messages": messages, "max_tokens": 120, "temperature": 1.0,
                              "seed": seed, "response_format": format});
            let addr = s.addr;
            tokio::spawn(async move { (seed, support::send_json(addr, "/v1/chat/completions", &body).await.ok()) })
        })
        .collect();
    for t in tasks {
        let (seed, v) = t.await.expect("client task panicked");
        let text = reply_text(&v);
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "seed {seed}: {text}");
        let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        check_city(&parsed).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
    }

    // Streamed, and on /v1/completions, with json_object: an object.
    let body = json!({"model": s.model, "messages": messages, "max_tokens": 120, "temperature": 1.0, "seed": 3,
                      "response_format": {"type": "json_object"}});
    let events = s.stream("/v1/chat/completions", &streaming(body)).await;
    if streamed_finish(&events) == "stop" {
        let v: Value = serde_json::from_str(&streamed_text(&events)).expect("a JSON object");
        assert!(v.is_object(), "{v}");
    }
    let body = json!({"model": s.model, "prompt": "City data: ", "max_tokens": 120, "temperature": 0.7, "seed": 5,
                      "response_format": format});
    let v = s.post("/v1/completions", &body).await.ok();
    let text = v["choices"][0]["text"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        check_city(&serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))).unwrap();
    }

    // A cut-off object ends on length, and is a prefix of valid JSON text (it starts the object).
    let body = json!({"model": s.model, "messages": messages, "max_tokens": 5, "response_format": format});
    let v = s.post("/v1/chat/completions", &body).await.ok();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(reply_text(&v).starts_with("{\"city\": \""), "{v}");

    // A schema llguidance refuses: 400 naming the field and the problem; the server goes on.
    let bad =
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}, "strict": true}});
    let body = json!({"model": s.model, "messages": messages, "max_tokens": 5, "response_format": bad});
    let e = s.post("/v1/chat/completions", &body).await.error(400);
    assert_eq!(e["param"], "response_format.json_schema.schema", "{e}");
    assert!(e["message"].as_str().unwrap().contains("frobnicate"), "{e}");
    let m = s.metrics().await;
    assert_eq!(m.get("pagekv_kv_blocks_used"), 0.0, "{}", m.summary());
}

/// Qwen2.5-Coder-1.5B's file in the model registry's folder, or `None` after saying it is skipped.
fn qwen_model(test: &str) -> Option<std::path::PathBuf> {
    pagekv_testkit::dev::registry_model(test, "qwen2.5-coder-1.5b.gguf")
}

/// The real-model tool check: Qwen2.5-Coder's template (Hermes `<tool_call>` blocks) with a
/// weather function. Under `required` decoding is held to the call format, so the call always
/// parses, streamed or not; its result then goes back through the template for the next turn.
#[tokio::test]
async fn qwen_calls_the_weather_function_under_required() {
    let Some(path) = qwen_model("qwen_calls_the_weather_function_under_required") else { return };
    let s = ServerProcess::start_model(&path, &["--context-window", "2048", "--num-blocks", "256"], &[]);
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]);
    let messages = json!([{"role": "user", "content": "What is the weather like in Paris today?"}]);
    let body = json!({"model": s.model, "messages": messages, "tools": tools, "tool_choice": "required",
                      "temperature": 0, "max_tokens": 60});
    let v = s.post("/v1/chat/completions", &body).await.ok();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).expect("JSON arguments");
    let city = args["city"].as_str().expect("a city");
    assert!(city.contains("Paris"), "{args}");
    if let Some(unit) = args.get("unit") {
        assert!(unit == "celsius" || unit == "fahrenheit", "{args}");
    }

    // Streamed: the same call as incremental deltas.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = s.stream("/v1/chat/completions", &streamed).await;
    let name: String =
        events.iter().filter_map(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].as_str()).collect();
    let arguments: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(name, "get_weather");
    assert_eq!(serde_json::from_str::<Value>(&arguments).unwrap(), args, "greedy: the same arguments");
    assert_eq!(streamed_finish(&events), "tool_calls");

    // The result goes back; the next turn is a plain answer (no tool required).
    let id = call["id"].as_str().unwrap();
    let history = json!([
        messages[0],
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": id, "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"},
    ]);
    let body = json!({"model": s.model, "messages": history, "tools": tools, "temperature": 0, "max_tokens": 8});
    let v = s.post("/v1/chat/completions", &body).await.ok();
    let (prompt_tokens, _, cached) = usage_of(&v);
    assert!(prompt_tokens > 200 && cached > 0, "the history was rendered and its prefix reused: {v}");
}

/// `serve --speculative ngram`: requests that repeat their prompt are drafted and verified, the
/// greedy text is the server's text without drafting (a server started without it), and
/// `/metrics` counts the drafted and kept tokens and the tokens per step.
#[tokio::test]
async fn speculative_serving_keeps_the_text_and_counts_the_drafts() {
    let prompt = "Copy this list exactly: red, green, blue, yellow, purple, orange, pink, brown, grey, black, white. \
                  Copy this list exactly: red, green, blue, yellow, purple, orange, pink, brown, grey, black, white. \
                  Copy this list exactly: red, green,";
    let Some(plain) = ServerProcess::start("speculative-off", &["--context-window", "1024"]) else { return };
    let want = reply_text(&plain.post("/v1/completions", &completion(&plain.model, prompt, 48)).await.ok());
    drop(plain);
    let args = ["--context-window", "1024", "--speculative", "ngram", "--draft-tokens", "6"];
    let Some(s) = ServerProcess::start("speculative-ngram", &args) else { return };
    let got = reply_text(&s.post("/v1/completions", &completion(&s.model, prompt, 48)).await.ok());
    assert_eq!(got, want, "greedy text with drafts");
    let streamed = {
        let (status, mut reader) =
            support::open_stream_at(s.addr, "/v1/completions", &streaming(completion(&s.model, prompt, 48))).await;
        assert_eq!(status, 200);
        streamed_text(&reader.read_to_done().await)
    };
    assert_eq!(streamed, want, "streamed text with drafts");
    let m = s.metrics().await;
    let (drafted, kept) =
        (m.get("pagekv_speculative_draft_tokens_total"), m.get("pagekv_speculative_accepted_tokens_total"));
    assert!(kept > 0.0 && kept <= drafted, "drafted {drafted}, kept {kept}:\n{}", m.summary());
    assert!(m.get("pagekv_speculative_steps_total") > 0.0);
    assert!(m.get("pagekv_tokens_per_step") > 1.0, "more than one token per step:\n{}", m.summary());
    assert!(m.get("pagekv_generated_tokens_total") > m.get("pagekv_sequence_steps_total"));
}

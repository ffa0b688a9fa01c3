//! `pagekv serve` with `n` choices over the default model: the real binary on 127.0.0.1, its
//! prompt computed once and forked into the choices (`pagekv_sequence_forks_total`), and the
//! pool back to empty afterwards. Skipped visibly without the model, failed under
//! PAGEKV_REQUIRE_MODEL=1.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{reply_text, ServerProcess};

const DEFAULT_ARGS: &[&str] = &["--context-window", "1024", "--num-blocks", "256"];
/// How long freed blocks may take to show in `/metrics` (the engine frees them within a step).
const RETURN_LIMIT: Duration = Duration::from_secs(5);

/// A greedy completion of 12 tokens.
fn completion(model: &str, prompt: &str) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0})
}

/// `(prompt, completion)` tokens of a response's usage.
fn usage_of(v: &Value) -> (u64, u64) {
    let n = |k: &str| v["usage"][k].as_u64().unwrap_or_else(|| panic!("usage.{k} missing: {v}"));
    (n("prompt_tokens"), n("completion_tokens"))
}

/// `n = 4` over the real model: the prompt is computed once and forked, greedy choices are the
/// `n = 1` answer, usage counts the prompt once, and every block returns afterwards.
#[tokio::test]
async fn n_choices_share_the_prompt_and_return_their_blocks() {
    let Some(s) = ServerProcess::start("n_choices", DEFAULT_ARGS) else { return };
    let prompt = "The three primary colors are";
    let one = s.post("/v1/completions", &completion(&s.model, prompt)).await.ok();
    let mut body = completion(&s.model, prompt);
    body["n"] = json!(4);
    let four = s.post("/v1/completions", &body).await.ok();
    let texts: Vec<&str> = four["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, vec![reply_text(&one).as_str(); 4], "{four}");
    let (prompt_tokens, completion_tokens) = usage_of(&one);
    assert_eq!(usage_of(&four), (prompt_tokens, 4 * completion_tokens), "{four}");
    let m = s.wait_metrics(RETURN_LIMIT, "no blocks in use", |m| m.get("pagekv_kv_blocks_used") == 0.0).await;
    assert_eq!(m.get("pagekv_sequence_forks_total"), 3.0, "{}", m.summary());
    assert_eq!(m.get("pagekv_kv_blocks_shared"), 0.0, "{}", m.summary());
}

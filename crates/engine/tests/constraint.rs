//! Constrained decoding against real vocabularies: the tokenizer → token-trie bridge gives every
//! token the bytes it prints (byte-level BPE's byte map undone, specials marked), the mask of a
//! grammar allows exactly the tokens that can continue it, and masked sampling from random
//! logits always yields output of the grammar. Mask times per token are printed for the
//! default model's 49k vocabulary and, when cached, Qwen2.5's 151k.
//!
//! Needs the default model's file for its tokenizer (skipped with a message when absent).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagekv_engine::constraint::{trie_words, Constraint, Grammar, GrammarCompiler};
use pagekv_engine::{Sampler, SamplingParams};
use pagekv_model::gguf::GgufFile;
use pagekv_model::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn tokenizer_of(path: &Path) -> Arc<Tokenizer> {
    let file = GgufFile::open(path).expect("open the model file");
    Arc::new(Tokenizer::from_gguf(file.metadata()).expect("its tokenizer"))
}

fn default_tokenizer(test: &str) -> Option<Arc<Tokenizer>> {
    pagekv_testkit::default_model(test).map(|p| tokenizer_of(&p))
}

/// Qwen2.5-Coder-1.5B's file in the model registry's folder, or `None` after saying it is skipped.
fn qwen_model(test: &str) -> Option<std::path::PathBuf> {
    pagekv_testkit::dev::registry_model(test, "qwen2.5-coder-1.5b.gguf")
}

/// The allowed ids of a freshly computed mask (computed through `apply` on a zero row).
fn allowed(c: &mut Constraint, vocab: usize) -> Vec<u32> {
    let mut out = Vec::new();
    c.apply(&vec![0.0; vocab], &mut out).expect("a mask");
    (0..vocab as u32).filter(|&i| out[i as usize] == 0.0).collect()
}

#[test]
fn trie_words_are_the_bytes_each_token_prints() {
    let Some(tok) = default_tokenizer("trie_words_are_the_bytes_each_token_prints") else { return };
    let words = trie_words(&tok, tok.vocab_size() + 7);
    assert_eq!(words.len(), tok.vocab_size() + 7);
    assert!(words[tok.vocab_size()..].iter().all(Vec::is_empty), "padded ids print nothing");
    for id in 0..tok.vocab_size() as u32 {
        let w = &words[id as usize];
        if tok.is_special(id) {
            assert_eq!(w[0], 0xFF, "special token {id} carries the marker");
            assert_eq!(&w[1..], tok.token_text(id).unwrap().as_bytes());
        } else {
            assert_eq!(w.as_slice(), tok.piece(id, false).unwrap(), "token {id}");
        }
    }
    // Byte-level BPE: `Ġ` is a space, and a lone `Ã` is the raw lead byte 0xC3 of a UTF-8 pair.
    let space_brace = tok.token_id("Ġ{").expect("SmolLM2 has 'Ġ{'");
    assert_eq!(words[space_brace as usize], b" {");
    let lead = tok.token_id("Ã").expect("SmolLM2 has 'Ã'");
    assert_eq!(words[lead as usize], [0xC3]);
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(words[im_end as usize], b"\xFF<|im_end|>");
}

#[test]
fn a_regex_mask_allows_exactly_the_tokens_that_fit() {
    let Some(tok) = default_tokenizer("a_regex_mask_allows_exactly_the_tokens_that_fit") else { return };
    let vocab = tok.vocab_size();
    let compiler = GrammarCompiler::new(tok.clone(), vocab);
    let mut c = compiler.compile(&Grammar::Regex("[0-9]{2,3}".into())).unwrap();
    let words = trie_words(&tok, vocab);
    let fits = |w: &[u8], max: usize| !w.is_empty() && w.len() <= max && w.iter().all(u8::is_ascii_digit);
    let expected: Vec<u32> = (0..vocab as u32).filter(|&i| fits(&words[i as usize], 3)).collect();
    assert!(!expected.is_empty());
    assert_eq!(allowed(&mut c, vocab), expected, "first position: digit tokens of 1 to 3 digits");

    let one = tok.token_id("7").unwrap();
    c.commit(one).unwrap();
    let expected: Vec<u32> = (0..vocab as u32).filter(|&i| fits(&words[i as usize], 2)).collect();
    assert_eq!(allowed(&mut c, vocab), expected, "after one digit: at most two more");
    assert!(!c.allows(*tok.eot_ids().first().unwrap()), "two digits are required");
    c.commit(one).unwrap();
    let mut after_two = allowed(&mut c, vocab);
    after_two.retain(|id| !tok.is_eot(*id));
    let single: Vec<u32> = (0..vocab as u32).filter(|&i| fits(&words[i as usize], 1)).collect();
    assert_eq!(after_two, single, "a third digit or the end");
    assert!(tok.eot_ids().iter().all(|&e| c.allows(e)), "the end is allowed once the regex matches");
    c.commit(one).unwrap();
    assert!(c.is_finished(), "three digits: nothing more is possible");
    assert!(c.commit(one).is_err(), "a token past the end is refused");
}

#[test]
fn bad_grammars_are_refused_with_their_problem() {
    let Some(tok) = default_tokenizer("bad_grammars_are_refused_with_their_problem") else { return };
    let compiler = GrammarCompiler::new(tok.clone(), tok.vocab_size());
    for (g, needle) in [
        (Grammar::JsonSchema { schema: json!({"type": "frobnicate"}), strict: true }, "frobnicate"),
        (Grammar::JsonSchema { schema: json!({"$ref": "#/$defs/missing"}), strict: true }, "missing"),
        (Grammar::Regex("(unclosed".into()), ""),
        (Grammar::Lark("start: undefined_rule".into()), "undefined_rule"),
    ] {
        let e = compiler.compile(&g).expect_err(&format!("{g:?}")).to_string();
        assert!(e.starts_with("invalid grammar") && e.contains(needle), "{g:?}: {e}");
    }
    assert!(compiler.compile(&Grammar::JsonObject).is_ok(), "the compiler keeps working");
}

/// Samples a whole output under `grammar` from random logits (temperature 1, seeded), the way
/// the scheduler does: mask, sample from the masked row, commit. Returns the text, whether the
/// grammar finished or an end token was drawn, and the time per mask.
fn sample_random(
    tok: &Tokenizer,
    compiler: &GrammarCompiler,
    grammar: &Grammar,
    seed: u64,
    max: usize,
) -> (String, bool, Duration) {
    let vocab = tok.vocab_size();
    let mut c = compiler.compile(grammar).unwrap();
    let mut sampler = Sampler::new(SamplingParams { temperature: 1.0, seed, ..SamplingParams::default() }).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut ids, mut masked, mut logits) = (Vec::new(), Vec::new(), vec![0f32; vocab]);
    let mut mask_time = Duration::ZERO;
    for _ in 0..max {
        logits.iter_mut().for_each(|l| *l = rng.gen_range(-4.0..4.0));
        let t0 = Instant::now();
        c.compute_mask();
        mask_time += t0.elapsed();
        c.apply(&logits, &mut masked).unwrap();
        let t = sampler.sample(&masked, &ids);
        if tok.is_eot(t) {
            return (tok.decode(&ids, true).unwrap(), true, mask_time / (ids.len() as u32 + 1));
        }
        c.commit(t).unwrap();
        ids.push(t);
        if c.is_finished() {
            return (tok.decode(&ids, true).unwrap(), true, mask_time / ids.len() as u32);
        }
    }
    (tok.decode(&ids, true).unwrap(), false, mask_time / max as u32)
}

/// The schema of the sampled objects, checked by hand below.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
        "required": ["name", "age", "role"],
        "additionalProperties": false,
    })
}

fn check_person(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    for k in o.keys() {
        if !["name", "age", "role", "tags"].contains(&k.as_str()) {
            return Err(format!("extra key {k}"));
        }
    }
    let name = o.get("name").and_then(Value::as_str).ok_or("name")?;
    if name.chars().count() > 12 {
        return Err("name too long".into());
    }
    let age = o.get("age").and_then(Value::as_i64).ok_or("age")?;
    if !(0..=150).contains(&age) {
        return Err("age out of range".into());
    }
    let role = o.get("role").and_then(Value::as_str).ok_or("role")?;
    if !["admin", "user", "guest"].contains(&role) {
        return Err("role".into());
    }
    if let Some(tags) = o.get("tags") {
        let tags = tags.as_array().ok_or("tags")?;
        if tags.len() > 3 || !tags.iter().all(Value::is_boolean) {
            return Err("tags".into());
        }
    }
    Ok(())
}

#[test]
fn random_logits_under_a_schema_always_give_valid_json() {
    let Some(tok) = default_tokenizer("random_logits_under_a_schema_always_give_valid_json") else { return };
    let compiler = GrammarCompiler::new(tok.clone(), tok.vocab_size());
    let grammar = Grammar::JsonSchema { schema: person_schema(), strict: true };
    for seed in 0..20 {
        let (text, ended, _) = sample_random(&tok, &compiler, &grammar, seed, 400);
        assert!(ended, "seed {seed}: no end within 400 tokens: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        check_person(&v).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
    }
    // Any object: parses and is an object.
    for seed in 0..5 {
        let (text, ended, _) = sample_random(&tok, &compiler, &Grammar::JsonObject, seed, 300);
        if ended {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
            assert!(v.is_object(), "{text}");
        }
    }
}

/// Schema-held outputs on both vocabularies (SmolLM2's 49,152 tokens and Qwen's 151,936), with
/// the mean mask time per token printed for the record (`-- --nocapture`; a measurement, not a
/// bound: speed is for benchmarks, not tests).
#[test]
fn mask_time_per_token() {
    let mut vocabularies = Vec::new();
    if let Some(t) = default_tokenizer("mask_time_per_token") {
        vocabularies.push(("SmolLM2", t));
    }
    if let Some(p) = qwen_model("mask_time_per_token") {
        vocabularies.push(("Qwen2.5", tokenizer_of(&p)));
    }
    for (name, tok) in vocabularies {
        let t0 = Instant::now();
        let compiler = GrammarCompiler::new(tok.clone(), tok.vocab_size());
        compiler.compile(&Grammar::JsonObject).unwrap();
        let setup = t0.elapsed();
        let grammar = Grammar::JsonSchema { schema: person_schema(), strict: true };
        let mut total = Duration::ZERO;
        let runs = 5;
        for seed in 0..runs {
            let (text, ended, per_mask) = sample_random(&tok, &compiler, &grammar, seed, 400);
            assert!(ended, "{name} seed {seed}: no end within 400 tokens: {text}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} seed {seed}: {e}: {text}"));
            check_person(&v).unwrap_or_else(|e| panic!("{name} seed {seed}: {e}: {text}"));
            total += per_mask;
        }
        let per_token = total / runs as u32;
        eprintln!(
            "mask time per token, {name} ({} tokens): {:.1} µs (factory built in {:.0} ms)",
            tok.vocab_size(),
            per_token.as_secs_f64() * 1e6,
            setup.as_secs_f64() * 1e3
        );
    }
}

//! The tokenizer against llama.cpp on the default model (SmolLM2-135M-Instruct, byte-level
//! BPE, `smollm` pre-tokenizer): golden ids from ../shared/reference/smollm2/llamacpp.json.
//! Skipped, with a visible line, when the model file or the golden file is absent.

use pagekv_model::gguf::GgufFile;
use pagekv_model::tokenizer::{StreamDecoder, Tokenizer, TokenizerModel};
use serde_json::Value;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/smollm2/llamacpp.json");

/// The tokenizer and golden data, or `None` (after printing why) when either is missing.
fn setup(test: &str) -> Option<(Tokenizer, Value)> {
    let model = pagekv_testkit::default_model(test)?;
    let file = GgufFile::open(&model).expect("open model");
    let tok = Tokenizer::from_gguf(file.metadata()).expect("tokenizer from metadata");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(GOLDEN).expect("read golden")).unwrap();
    Some((tok, golden))
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn vocabulary_facts() {
    let Some((tok, _)) = setup("vocabulary_facts") else {
        return;
    };
    assert_eq!(tok.model(), TokenizerModel::Gpt2);
    assert_eq!(tok.pre_tokenizer(), Some("smollm"));
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(!tok.add_bos());
    assert_eq!(tok.token_text(1), Some("<|im_start|>"));
    // <|endoftext|> (0) and <|im_end|> (2, also EOS) end a turn.
    assert_eq!(tok.eot_ids(), &[0, 2]);
    assert!(tok.is_special(1) && !tok.is_special(17));
    assert!(tok.warnings().is_empty(), "{:?}", tok.warnings());
}

#[test]
fn tokenize_cases_match_llama_cpp() {
    let Some((tok, golden)) = setup("tokenize_cases_match_llama_cpp") else {
        return;
    };
    let cases = golden["tokenize"].as_array().unwrap();
    let mut passed = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, want, "text {text:?}");
        assert_eq!(tok.decode(&got, false).unwrap(), text, "round trip of {text:?}");
        passed += 1;
    }
    println!("tokenize: {passed}/{} cases identical to llama.cpp", cases.len());
}

#[test]
fn greedy_prompts_and_outputs_match_llama_cpp() {
    let Some((tok, golden)) = setup("greedy_prompts_and_outputs_match_llama_cpp") else {
        return;
    };
    for case in golden["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(tok.encode(prompt, true).unwrap(), ids_of(&case["prompt_ids"]));
        let out = ids_of(&case["greedy_ids"]);
        let text = tok.decode(&out, true).unwrap();
        assert_eq!(text, case["greedy_text"].as_str().unwrap(), "prompt {prompt:?}");
        let text16 = tok.decode(&out[..16], true).unwrap();
        assert_eq!(text16, case["greedy_text_16"].as_str().unwrap());
    }
}

#[test]
fn apache_license_ids_survive_decode_and_encode() {
    let Some((tok, golden)) = setup("apache_license_ids_survive_decode_and_encode") else {
        return;
    };
    for case in golden["teacher_forced"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        let text = tok.decode(&ids, false).unwrap();
        assert_eq!(tok.encode(&text, true).unwrap(), ids);
    }
}

#[test]
fn streaming_matches_decode_and_never_splits_a_character() {
    let Some((tok, golden)) = setup("streaming_matches_decode_and_never_splits_a_character") else {
        return;
    };
    for case in golden["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        let mut dec = StreamDecoder::new(false);
        let mut streamed = String::new();
        let mut held_back = 0;
        for &id in &ids {
            let chunk = dec.push(&tok, id).unwrap();
            assert!(!chunk.contains('\u{FFFD}'), "replacement char in {text:?}");
            if chunk.len() < tok.piece(id, false).unwrap().len() {
                held_back += 1;
            }
            streamed.push_str(&chunk);
        }
        assert_eq!(dec.finish(), "");
        assert_eq!(streamed, text);
        // Where a token carries only part of a character, the decoder must have held it back.
        let splits = ids.iter().any(|&id| std::str::from_utf8(tok.piece(id, false).unwrap()).is_err());
        if splits {
            assert!(held_back > 0, "no token was held back in {text:?}");
        }
    }
}

//! Unit tests with small vocabularies built here: SentencePiece merges and byte fallback,
//! byte-level BPE with pre-tokenizer selection, special tokens, streaming, bad metadata.

use super::bytelevel::byte_to_char;
use super::*;
use crate::gguf::{MetaArray, MetaValue, Metadata};

// ---------------------------------------------------------------- SentencePiece (llama)

/// `<unk> <s> </s>`, the 256 byte tokens, single characters, scored merges, a control and a
/// user-defined token.
fn spm_spec() -> VocabSpec {
    let mut tokens: Vec<(String, i32, f32)> =
        vec![("<unk>".into(), 2, 0.0), ("<s>".into(), 3, 0.0), ("</s>".into(), 3, 0.0)];
    for b in 0..=255u8 {
        tokens.push((format!("<0x{b:02X}>"), 6, 0.0));
    }
    for c in ["▁", "h", "e", "l", "o", "w", "r", "d", "a"] {
        tokens.push((c.into(), 1, -10.0));
    }
    for (t, s) in [
        ("▁h", -1.0),
        ("ll", -1.5),
        ("▁he", -2.0),
        ("llo", -2.5),
        ("▁hello", -3.0),
        ("▁w", -1.2),
        ("or", -1.3),
        ("ld", -1.4),
        ("▁wor", -2.2),
        ("▁world", -3.1),
        ("aa", -1.0),
    ] {
        tokens.push((t.into(), 1, s));
    }
    tokens.push(("<|im_start|>".into(), 3, 0.0));
    tokens.push(("<tool>".into(), 4, 0.0));
    let mut spec = VocabSpec::new(TokenizerModel::Llama, tokens.iter().map(|t| t.0.clone()).collect());
    spec.token_types = Some(tokens.iter().map(|t| t.1).collect());
    spec.scores = Some(tokens.iter().map(|t| t.2).collect());
    spec
}

fn ids(tok: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts.iter().map(|t| tok.token_id(t).unwrap_or_else(|| panic!("no token {t:?}"))).collect()
}

#[test]
fn spm_merges_by_score_with_space_prefix() {
    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(tok.add_bos() && tok.add_space_prefix());
    let got = tok.encode("hello world", true).unwrap();
    assert_eq!(got, ids(&tok, &["▁hello", "▁world"]));
    assert_eq!(tok.decode(&got, false).unwrap(), "hello world");
    assert_eq!(tok.encode_with_bos("hello", true).unwrap(), [vec![1], ids(&tok, &["▁hello"])].concat());
}

#[test]
fn spm_equal_scores_merge_leftmost_first() {
    let mut spec = spm_spec();
    spec.add_space_prefix = Some(false);
    let tok = Tokenizer::from_spec(spec).unwrap();
    // "aaa": the pairs (0,1) and (1,2) tie; llama.cpp merges the left one.
    assert_eq!(tok.encode("aaa", false).unwrap(), ids(&tok, &["aa", "a"]));
    assert_eq!(tok.encode("aaaa", false).unwrap(), ids(&tok, &["aa", "aa"]));
}

#[test]
fn spm_byte_fallback_and_round_trip() {
    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    // 'é' = C3 A9 is not in the vocabulary.
    let got = tok.encode("hé", false).unwrap();
    assert_eq!(got, ids(&tok, &["▁h", "<0xC3>", "<0xA9>"]));
    assert_eq!(tok.decode(&got, false).unwrap(), "hé");
    for text in ["hello  world", " leading", "wörld 😀!", "a\tb\nc"] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "ids {ids:?}");
    }
}

#[test]
fn spm_special_tokens_and_space_prefix_after_them() {
    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    let s = tok.token_id("<s>").unwrap();
    let im = tok.token_id("<|im_start|>").unwrap();
    let tool = tok.token_id("<tool>").unwrap();
    assert_eq!(
        tok.encode("<s>hello<|im_start|>world", true).unwrap(),
        [vec![s], ids(&tok, &["▁hello"]), vec![im], ids(&tok, &["▁world"])].concat()
    );
    // Without parsing, "<s>" is text: '<' 's' '>' are spelled with byte tokens.
    assert_eq!(
        tok.encode("<s>hello", false).unwrap(),
        ids(&tok, &["▁", "<0x3C>", "<0x73>", "<0x3E>", "h", "e", "llo"])
    );
    // User-defined tokens are matched either way.
    let got = tok.encode("a<tool>", false).unwrap();
    assert_eq!(got, [ids(&tok, &["▁", "a"]), vec![tool]].concat());
    assert!(tok.is_special(s) && !tok.is_special(tool));
    let with_special = [vec![s], ids(&tok, &["▁hello"])].concat();
    assert_eq!(tok.decode(&with_special, true).unwrap(), " hello");
    assert_eq!(tok.decode(&with_special, false).unwrap(), "<s> hello");
}

#[test]
fn spm_without_byte_tokens_uses_unk() {
    let spec = VocabSpec {
        token_types: Some(vec![2, 3, 3, 1, 1]),
        scores: Some(vec![0.0; 5]),
        ..VocabSpec::new(TokenizerModel::Llama, ["<unk>", "<s>", "</s>", "▁", "a"].map(String::from).to_vec())
    };
    let tok = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(tok.encode("aé", false).unwrap(), vec![3, 4, 0]);
    assert_eq!(tok.decode(&[3, 4, 0], false).unwrap(), "a<unk>");
    assert_eq!(tok.decode(&[3, 4, 0], true).unwrap(), "a");
}

// ---------------------------------------------------------------- byte-level BPE (gpt2)

/// Three control tokens, the 256 byte characters, merged tokens, and "xyz" reachable by
/// no merge.
fn bpe_spec(pre: &str) -> VocabSpec {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from).to_vec();
    let mut types = vec![3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(byte_to_char(b).to_string());
        types.push(1);
    }
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ 1"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    tokens.push("xyz".into());
    types.push(1);
    let mut spec = VocabSpec::new(TokenizerModel::Gpt2, tokens);
    spec.pre = Some(pre.to_owned());
    spec.token_types = Some(types);
    spec.merges = Some(merges.map(String::from).to_vec());
    spec.eos_id = Some(0);
    spec
}

fn bpe(pre: &str) -> Tokenizer {
    Tokenizer::from_spec(bpe_spec(pre)).unwrap()
}

#[test]
fn bpe_merges_inside_words() {
    let tok = bpe("gpt-2");
    assert_eq!(tok.encode("hello world", false).unwrap(), ids(&tok, &["hello", "Ġworld"]));
    assert_eq!(tok.decode(&ids(&tok, &["hello", "Ġworld"]), false).unwrap(), "hello world");
    assert!(!tok.add_bos());
}

#[test]
fn pre_tokenizer_choice_changes_ids() {
    // gpt-2 keeps " 123" as one word, so "Ġ 1" merges; smollm isolates every digit first.
    let gpt2 = bpe("gpt-2");
    assert_eq!(gpt2.encode("a 123", false).unwrap(), ids(&gpt2, &["a", "Ġ1", "2", "3"]));
    let smollm = bpe("smollm");
    assert_eq!(smollm.encode("a 123", false).unwrap(), ids(&smollm, &["a", "Ġ", "1", "2", "3"]));
    // llama-bpe takes a word that is itself a token without merging, and adds BOS.
    let llama3 = bpe("llama-bpe");
    assert_eq!(llama3.encode("xyz", false).unwrap(), ids(&llama3, &["xyz"]));
    assert_eq!(gpt2.encode("xyz", false).unwrap(), ids(&gpt2, &["x", "y", "z"]));
    assert!(llama3.add_bos());
}

#[test]
fn every_known_pre_tokenizer_builds_and_round_trips() {
    let text = "Hello, world! It's 2024:\n\t  café 😀 ١٢٣ 你好 <b>x</b>";
    for pre in PRE_TOKENIZERS {
        let tok = bpe(pre.names[0]);
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "pre {}", pre.names[0]);
    }
}

#[test]
fn bpe_special_tokens_and_eot() {
    let tok = bpe("smollm");
    let got = tok.encode("<|im_start|>hello<|im_end|>", true).unwrap();
    assert_eq!(got, [vec![1], ids(&tok, &["hello"]), vec![2]].concat());
    assert_eq!(tok.decode(&got, false).unwrap(), "<|im_start|>hello<|im_end|>");
    assert_eq!(tok.decode(&got, true).unwrap(), "hello");
    // Not parsed: the control text is ordinary bytes.
    let raw = tok.encode("<|im_end|>", false).unwrap();
    assert!(raw.len() > 1 && !raw.contains(&2));
    assert_eq!(tok.decode(&raw, true).unwrap(), "<|im_end|>");
    assert_eq!(tok.eot_ids(), &[0, 2]);
    assert!(tok.is_eot(2) && !tok.is_eot(1));
    assert_eq!(tok.bos_id(), None);
}

#[test]
fn unmarked_end_of_turn_token_becomes_control() {
    let mut spec = bpe_spec("smollm");
    spec.token_types.as_mut().unwrap()[2] = 1; // <|im_end|> typed normal
    let tok = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(tok.token_type(2), Some(TokenType::Control));
    assert_eq!(tok.warnings().len(), 1);
}

// ---------------------------------------------------------------- streaming

#[test]
fn stream_holds_back_partial_characters() {
    let tok = bpe("smollm");
    let byte_id = |b: u8| tok.token_id(&byte_to_char(b).to_string()).unwrap();
    let mut dec = StreamDecoder::new(true);
    let mut outs = Vec::new();
    for b in "a😀".bytes() {
        outs.push(dec.push(&tok, byte_id(b)).unwrap());
    }
    assert_eq!(outs, ["a", "", "", "", "😀"]);
    assert_eq!(dec.pending_len(), 0);
    // A special token in the middle of the stream.
    assert_eq!(dec.push(&tok, 2).unwrap(), "");
    let mut dec_all = StreamDecoder::new(false);
    assert_eq!(dec_all.push(&tok, 2).unwrap(), "<|im_end|>");
}

#[test]
fn stream_replaces_bytes_that_cannot_complete() {
    let tok = bpe("smollm");
    let byte_id = |b: u8| tok.token_id(&byte_to_char(b).to_string()).unwrap();
    let mut dec = StreamDecoder::new(true);
    assert_eq!(dec.push(&tok, byte_id(0xFF)).unwrap(), "\u{FFFD}");
    assert_eq!(dec.push(&tok, byte_id(0xF0)).unwrap(), "");
    assert_eq!(dec.push(&tok, byte_id(b'a')).unwrap(), "\u{FFFD}a");
    assert_eq!(dec.push(&tok, byte_id(0xE2)).unwrap(), "");
    assert_eq!(dec.push(&tok, byte_id(0x82)).unwrap(), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
    assert_eq!(dec.pending_len(), 0);
}

#[test]
fn stream_equals_decode_on_random_ids() {
    use rand::{Rng, SeedableRng};
    let tok = bpe("smollm");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..200 {
        let n = rng.gen_range(0..24);
        let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..tok.vocab_size() as u32)).collect();
        let mut dec = StreamDecoder::new(false);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&dec.push(&tok, id).unwrap());
            assert!(dec.pending_len() < 4);
        }
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, tok.decode(&ids, false).unwrap(), "ids {ids:?}");
    }
}

// ---------------------------------------------------------------- bad metadata

#[test]
fn bad_specs_are_typed_errors() {
    let err = |spec: VocabSpec| Tokenizer::from_spec(spec).unwrap_err();

    let mut s = bpe_spec("smollm");
    s.merges = None;
    assert!(matches!(err(s), TokenizerError::MissingMerges));

    let mut s = bpe_spec("smollm");
    s.token_types.as_mut().unwrap().pop();
    assert!(matches!(err(s), TokenizerError::LengthMismatch { key: "tokenizer.ggml.token_type", .. }));

    let mut s = bpe_spec("smollm");
    s.token_types.as_mut().unwrap()[5] = 9;
    assert!(matches!(err(s), TokenizerError::BadTokenType { id: 5, value: 9 }));

    let mut s = bpe_spec("smollm");
    s.bos_id = Some(1_000_000);
    assert!(matches!(err(s), TokenizerError::SpecialIdOutOfRange { id: 1_000_000, .. }));

    let mut s = bpe_spec("smollm");
    s.merges.as_mut().unwrap().push("nospace".into());
    assert!(matches!(err(s), TokenizerError::BadMerge { .. }));

    let mut s = bpe_spec("smollm");
    s.pre = Some("made-up".into());
    match err(s) {
        TokenizerError::UnknownPreTokenizer { name, known } => {
            assert_eq!(name, "made-up");
            assert!(known.contains("smollm") && known.contains("qwen2"));
        }
        other => panic!("unexpected {other:?}"),
    }

    let mut s = spm_spec();
    s.scores.as_mut().unwrap().push(0.0);
    assert!(matches!(err(s), TokenizerError::LengthMismatch { .. }));

    let mut s = spm_spec();
    s.tokens[3] = "<0xZZ>".into();
    assert!(matches!(err(s), TokenizerError::BadByteToken { id: 3, .. }));

    assert!(matches!(err(VocabSpec::new(TokenizerModel::Gpt2, vec![])), TokenizerError::EmptyVocabulary));

    let tok = bpe("smollm");
    assert!(matches!(tok.decode(&[tok.vocab_size() as u32], false), Err(TokenizerError::IdOutOfRange { .. })));
    let mut dec = StreamDecoder::new(true);
    assert!(dec.push(&tok, u32::MAX).is_err());
}

#[test]
fn merges_outside_the_vocabulary_are_dropped_with_a_warning() {
    let mut s = bpe_spec("smollm");
    s.merges.as_mut().unwrap().push("q q".into()); // "qq" is not a token
    s.merges.as_mut().unwrap().push("h e".into()); // repeated pair
    let tok = Tokenizer::from_spec(s).unwrap();
    assert_eq!(tok.warnings().len(), 1);
    assert!(tok.warnings()[0].starts_with("2 merge rules"));
}

// ---------------------------------------------------------------- from_gguf

fn meta_from(spec: &VocabSpec) -> Metadata {
    let mut m = Metadata::new();
    let mut put = |k: &str, v: MetaValue| assert!(m.insert(format!("tokenizer.ggml.{k}"), v));
    put("model", MetaValue::String(spec.model.name().into()));
    put("tokens", MetaValue::Array(MetaArray::String(spec.tokens.clone())));
    if let Some(t) = &spec.token_types {
        put("token_type", MetaValue::Array(MetaArray::I32(t.clone())));
    }
    if let Some(s) = &spec.scores {
        put("scores", MetaValue::Array(MetaArray::F32(s.clone())));
    }
    if let Some(mg) = &spec.merges {
        put("merges", MetaValue::Array(MetaArray::String(mg.clone())));
    }
    if let Some(p) = &spec.pre {
        put("pre", MetaValue::String(p.clone()));
    }
    m
}

#[test]
fn from_gguf_reads_the_same_vocabulary() {
    let spec = bpe_spec("smollm");
    let mut meta = meta_from(&spec);
    meta.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2));
    meta.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::I32(-1));
    meta.insert("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(true));
    let tok = Tokenizer::from_gguf(&meta).unwrap();
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.bos_id(), None); // -1 means none
    assert!(tok.add_bos());
    assert_eq!(tok.pre_tokenizer(), Some("smollm"));
    assert_eq!(tok.encode("hello world", false).unwrap(), ids(&tok, &["hello", "Ġworld"]));

    let spm = Tokenizer::from_gguf(&meta_from(&spm_spec())).unwrap();
    assert_eq!(spm.encode("hello", false).unwrap(), ids(&spm, &["▁hello"]));
}

#[test]
fn from_gguf_errors_name_the_key() {
    let mut meta = meta_from(&bpe_spec("smollm"));
    meta.insert("tokenizer.ggml.padding_token_id".into(), MetaValue::String("x".into()));
    let e = Tokenizer::from_gguf(&meta).unwrap_err();
    assert!(matches!(e, TokenizerError::Metadata(_)));
    assert!(e.to_string().contains("padding_token_id"), "{e}");

    let mut meta = Metadata::new();
    meta.insert("tokenizer.ggml.model".into(), MetaValue::String("bert".into()));
    assert!(matches!(
        Tokenizer::from_gguf(&meta),
        Err(TokenizerError::UnsupportedModel(m)) if m == "bert"
    ));
    let mut meta = Metadata::new();
    meta.insert("tokenizer.ggml.model".into(), MetaValue::String("gpt2".into()));
    let e = Tokenizer::from_gguf(&meta).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.tokens"), "{e}");
}

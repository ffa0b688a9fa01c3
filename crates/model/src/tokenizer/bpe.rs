//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) encoding, built on the `tokenizers` crate.
//!
//! Pipeline for one run of plain text (special tokens are cut out before this, in
//! `special.rs`): the pre-tokenizer's regexes cut the text into words (`pretokenize.rs`),
//! `ByteLevel` maps each word's bytes to stand-in characters (`bytelevel.rs`), and the BPE
//! model applies merges by rank inside each word. Merge ranks are the order of
//! `tokenizer.ggml.merges`.
//!
//! Decoding does not go through `tokenizers`: `Tokenizer` keeps one byte string per token.

use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::pretokenize::PreTokenizerSpec;
use super::TokenizerError;

/// A byte-level BPE encoder for text without special tokens.
pub(super) struct BpeEncoder {
    inner: tokenizers::Tokenizer,
}

/// Merge rules as given, split into pairs, with the ones the BPE model cannot use removed.
pub(super) struct ParsedMerges {
    pub pairs: Merges, // [n_merges] (left, right) in rank order
    /// Rules dropped because a part or the merged text is not in the vocabulary, or because
    /// the same pair appeared earlier (the first occurrence keeps its rank, as in llama.cpp).
    pub dropped: usize,
}

/// Splits `"left right"` rules. The separator is the first space after the first byte, as in
/// llama.cpp, so a left part may itself begin with a space in vocabularies that keep raw
/// spaces.
pub(super) fn parse_merges(rules: &[String], vocab: &Vocab) -> Result<ParsedMerges, TokenizerError> {
    let mut pairs = Vec::with_capacity(rules.len());
    let mut seen = std::collections::HashSet::with_capacity(rules.len());
    let mut dropped = 0;
    for (index, rule) in rules.iter().enumerate() {
        let split = rule.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
        let (left, right) = match split {
            Some(i) if i + 1 < rule.len() => (&rule[..i], &rule[i + 1..]),
            _ => return Err(TokenizerError::BadMerge { index, rule: rule.clone() }),
        };
        let merged = format!("{left}{right}");
        let usable = vocab.contains_key(left) && vocab.contains_key(right) && vocab.contains_key(&merged);
        if !usable || !seen.insert((left, right)) {
            dropped += 1;
            continue;
        }
        pairs.push((left.to_owned(), right.to_owned()));
    }
    Ok(ParsedMerges { pairs, dropped })
}

impl BpeEncoder {
    /// Builds the encoder. `tokens[id]` is the byte-level text of token `id`; when a text
    /// occurs twice the later id wins (as in llama.cpp's text → id map).
    pub(super) fn new(
        tokens: &[String],
        merge_rules: &[String],
        pre: &PreTokenizerSpec,
    ) -> Result<(BpeEncoder, usize), TokenizerError> {
        let vocab: Vocab = tokens.iter().enumerate().map(|(id, t)| (t.clone(), id as u32)).collect();
        let merges = parse_merges(merge_rules, &vocab)?;
        let model = BPE::builder()
            .vocab_and_merges(vocab, merges.pairs)
            .ignore_merges(pre.ignore_merges)
            .build()
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;

        let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
        for (index, re) in pre.regexes.iter().enumerate() {
            let split = Split::new(SplitPattern::Regex((*re).to_owned()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| TokenizerError::BadRegex { pre: pre.names[0].to_owned(), index, reason: e.to_string() })?;
            steps.push(split.into());
        }
        // Bytes → stand-in characters only; the splitting was done above.
        steps.push(ByteLevel::new(false, false, false).into());

        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(steps))));
        Ok((BpeEncoder { inner }, merges.dropped))
    }

    /// Appends the ids of `text` (no special-token parsing, no BOS) to `out`.
    pub(super) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        let encoding = self.inner.encode_fast(text, false).map_err(|e| TokenizerError::Backend(e.to_string()))?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }
}

//! The bridge from the model's [`Tokenizer`] to llguidance's token trie ([`TokTrie`]): the bytes
//! each token id stands for, and tokenization of forced text.
//!
//! A token's trie word is the bytes it prints: for byte-level BPE (`gpt2` vocabularies) the
//! GPT-2 byte map undone (`Ġ` → space, `Ã` alone → the raw byte 0xC3, so a multi-byte UTF-8
//! character split over two tokens is two words of raw bytes), for SentencePiece `▁` → space
//! and `<0xXX>` → that byte. Control and unknown tokens are llguidance's special words: the
//! marker byte 0xFF then their text (`\xFF<|im_end|>`), so no grammar over text can produce them
//! and only the end-of-sequence set is allowed, when the grammar accepts. Tokens that print
//! nothing (unused, undefined, byte tokens of a BPE vocabulary) and ids past the tokenizer's
//! vocabulary (a padded output layer) get an empty word: they are never allowed.

use std::sync::Arc;

use pagekv_model::tokenizer::{TokenType, Tokenizer, TokenizerModel};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::GrammarError;

/// The trie words of `tokenizer` for a model with `vocab_size` logits (≥ the tokenizer's).
pub fn trie_words(tokenizer: &Tokenizer, vocab_size: usize) -> Vec<Vec<u8>> {
    (0..vocab_size as u32)
        .map(|id| match tokenizer.token_type(id) {
            None | Some(TokenType::Unused | TokenType::Undefined) => Vec::new(),
            Some(TokenType::Control | TokenType::Unknown) => {
                let text = tokenizer.token_text(id).unwrap_or_default();
                let mut w = Vec::with_capacity(text.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(text.as_bytes());
                w
            }
            Some(_) => tokenizer.piece(id, false).map(<[u8]>::to_vec).unwrap_or_default(),
        })
        .collect()
}

/// llguidance's view of the tokenizer: the trie plus canonical tokenization of forced bytes.
struct TokenizerBridge {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenizerBridge {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Our tokenizer's own ids (the ids the model saw in training) when they print exactly `s`;
    /// otherwise (bytes that are not text, an unknown-token fallback, a SentencePiece space
    /// prefix) the trie's greedy split, which always does.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let own = std::str::from_utf8(s).ok().and_then(|text| self.tokenizer.encode(text, false).ok());
        match own {
            Some(ids) if self.prints(&ids) == s => ids,
            _ => self.trie.greedy_tokenize(s),
        }
    }

    /// Byte-level BPE splits text the same wherever it stands; SentencePiece's space prefix
    /// makes a piece's ids depend on what precedes it, so llguidance must not force them.
    fn tokenize_is_canonical(&self) -> bool {
        self.tokenizer.model() == TokenizerModel::Gpt2
    }
}

impl TokenizerBridge {
    /// The bytes `ids` stand for in the trie.
    fn prints(&self, ids: &[TokenId]) -> Vec<u8> {
        ids.iter().flat_map(|&id| self.trie.token(id).iter().copied()).collect()
    }
}

/// The [`TokEnv`] for `tokenizer` under a model with `vocab_size` logits. The end-of-sequence
/// set is every end-of-turn token of the tokenizer.
pub fn tok_env(tokenizer: Arc<Tokenizer>, vocab_size: usize) -> Result<TokEnv, GrammarError> {
    if vocab_size < tokenizer.vocab_size() {
        return Err(GrammarError::Vocabulary(format!(
            "the model has {vocab_size} logits but the tokenizer {} tokens",
            tokenizer.vocab_size()
        )));
    }
    let eos: Vec<TokenId> = tokenizer.eot_ids().to_vec();
    let Some(&first) = eos.first() else {
        return Err(GrammarError::Vocabulary("the tokenizer has no end-of-sequence token".into()));
    };
    let info = TokRxInfo {
        tok_bos: tokenizer.bos_id(),
        tok_pad: tokenizer.pad_id(),
        tok_unk: tokenizer.unk_id(),
        ..TokRxInfo::new(vocab_size as u32, first)
    };
    let words = trie_words(&tokenizer, vocab_size);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
    Ok(Arc::new(TokenizerBridge { trie, tokenizer }))
}

//! `TokenizerError`: everything that can be wrong with a vocabulary in GGUF metadata or with
//! a call to encode or decode.
//!
//! Each variant names the metadata key or token id at fault, so a message printed by the CLI
//! is enough to find the problem in the file.

use crate::gguf::GgufError;

/// An error from building a [`Tokenizer`](super::Tokenizer) or from using one.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata lookup failed (missing required key, wrong value type, out of range).
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] GgufError),
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error("unsupported tokenizer model '{0}' (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("unknown pre-tokenizer '{name}' (tokenizer.ggml.pre); known: {known}")]
    UnknownPreTokenizer { name: String, known: String },
    /// The vocabulary has no tokens.
    #[error("the vocabulary is empty (tokenizer.ggml.tokens)")]
    EmptyVocabulary,
    /// A per-token array (`token_type`, `scores`) does not have one entry per token.
    #[error("{key} has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch { key: &'static str, expected: usize, found: usize },
    /// A `tokenizer.ggml.token_type` value outside 0..=6.
    #[error("token {id}: unknown token type {value} (tokenizer.ggml.token_type; expected 0..=6)")]
    BadTokenType { id: u32, value: i32 },
    /// A byte-level BPE vocabulary without `tokenizer.ggml.merges`.
    #[error("tokenizer.ggml.merges is missing; a gpt2 (byte-level BPE) vocabulary needs it")]
    MissingMerges,
    /// A merge rule that is not two non-empty parts separated by a space.
    #[error("merge rule {index} '{rule}' is not of the form 'left right'")]
    BadMerge { index: usize, rule: String },
    /// A special token id (BOS, EOS, ...) at or past the vocabulary size.
    #[error("{key} = {id} is out of range for a vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange { key: &'static str, id: u32, vocab_size: usize },
    /// A pre-tokenizer regex that the regex engine rejects.
    #[error("pre-tokenizer '{pre}': regex {index} does not compile: {reason}")]
    BadRegex { pre: String, index: usize, reason: String },
    /// The `tokenizers` crate refused the BPE model it was given or failed to encode.
    #[error("BPE backend (tokenizers crate): {0}")]
    Backend(String),
    /// A byte-type token whose text is not `<0xXX>`.
    #[error("token {id} has type byte but its text '{text}' is not of the form <0xXX>")]
    BadByteToken { id: u32, text: String },
    /// A SentencePiece vocabulary lacks the `<0xXX>` byte token (and an unknown token) needed
    /// to spell a character that is not in the vocabulary.
    #[error("no byte token <0x{byte:02X}> and no unknown token to spell a character outside the vocabulary")]
    MissingByteToken { byte: u8 },
    /// `decode` was given an id that is not in the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    IdOutOfRange { id: u32, vocab_size: usize },
}

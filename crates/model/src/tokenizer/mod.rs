//! Text ↔ token ids for GGUF models: [`Tokenizer`] (encode, decode, special tokens) and
//! [`StreamDecoder`] (incremental decoding that never splits a UTF-8 character).
//!
//! Two families, chosen by `tokenizer.ggml.model`:
//! - `gpt2` — byte-level BPE (SmolLM, Llama 3, Qwen2, ...): a regex pre-tokenizer picked by
//!   `tokenizer.ggml.pre` (`pretokenize.rs`), merges from `tokenizer.ggml.merges`, run by the
//!   `tokenizers` crate (`bpe.rs`);
//! - `llama` — SentencePiece-style (Llama 2, Mistral, ...): score-ordered merges, `▁` for a
//!   space, `<0xXX>` byte fallback (`spm.rs`).
//!
//! Both behave like llama.cpp, the reference our golden tests come from: `encode` cuts
//! special tokens out first (`special.rs`), runs the subword model on the text between them,
//! and adds no BOS; `decode` concatenates each token's bytes (`bytelevel.rs` undoes the GPT-2
//! byte map) and is lossless — no `clean_up_tokenization_spaces`.
//!
//! File map: `vocab.rs` (metadata → `VocabSpec`), `error.rs`, `stream.rs`.

mod bpe;
mod bytelevel;
mod error;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod vocab;

use std::collections::HashMap;

pub use error::TokenizerError;
pub use pretokenize::{PreTokenizerSpec, PRE_TOKENIZERS};
pub use stream::StreamDecoder;
pub use vocab::{TokenType, TokenizerModel, VocabSpec};

use crate::gguf::Metadata;
use bpe::BpeEncoder;
use special::{Fragment, SpecialMatcher};
use spm::SpmEncoder;

/// Token texts that end a turn (llama.cpp's end-of-generation list). Such a token is
/// retyped to `Control` when the file forgot to mark it, as llama.cpp does.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
];

/// The SentencePiece word-boundary marker that stands for a space.
const SPM_SPACE: &str = "\u{2581}";

/// The subword model behind `encode`. (One per tokenizer: the variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
enum Encoder {
    Bpe(BpeEncoder),
    Spm(SpmEncoder),
}

/// A vocabulary ready to encode and decode. Immutable after construction; share it by
/// reference or `Arc` (it is `Send + Sync`).
pub struct Tokenizer {
    model: TokenizerModel,
    pre: Option<&'static str>,        // canonical pre-tokenizer name (gpt2 only)
    tokens: Vec<String>,              // [vocab] token text as stored
    types: Vec<TokenType>,            // [vocab]
    pieces: Vec<Vec<u8>>,             // [vocab] bytes printed for the token (specials included)
    text_to_id: HashMap<String, u32>, // token text → id (later id wins on duplicates)
    special: SpecialMatcher,
    encoder: Encoder,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    eot_ids: Vec<u32>, // sorted, unique
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    warnings: Vec<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("vocab_size", &self.tokens.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("eot_ids", &self.eot_ids)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(VocabSpec::from_gguf(meta)?)
    }

    /// Builds a tokenizer from plain data, checking it: per-token arrays as long as the
    /// vocabulary, token types in range, special ids inside the vocabulary, merges present
    /// and well-formed for `gpt2`, a known pre-tokenizer.
    pub fn from_spec(spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocabulary);
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::LengthMismatch {
                key: "tokenizer.ggml.tokens",
                expected: u32::MAX as usize,
                found: n,
            });
        }
        let mut warnings = Vec::new();
        let mut types = token_types(&spec)?;
        let scores = match spec.scores {
            Some(s) if s.len() != n => {
                return Err(TokenizerError::LengthMismatch {
                    key: "tokenizer.ggml.scores",
                    expected: n,
                    found: s.len(),
                })
            }
            Some(s) => s,
            None => vec![0.0; n],
        };
        let text_to_id: HashMap<String, u32> =
            spec.tokens.iter().enumerate().map(|(id, t)| (t.clone(), id as u32)).collect();

        let is_llama = spec.model == TokenizerModel::Llama;
        let default_id = |id: u32| (is_llama && (id as usize) < n).then_some(id);
        let check = |key: &'static str, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(TokenizerError::SpecialIdOutOfRange { key, id, vocab_size: n }),
            other => Ok(other),
        };
        let bos_id = check("tokenizer.ggml.bos_token_id", spec.bos_id)?.or(default_id(1));
        let eos_id = check("tokenizer.ggml.eos_token_id", spec.eos_id)?.or(default_id(2));
        let unk_id = check("tokenizer.ggml.unknown_token_id", spec.unk_id)?.or(default_id(0));
        let pad_id = check("tokenizer.ggml.padding_token_id", spec.pad_id)?;
        let eot_id = check("tokenizer.ggml.eot_token_id", spec.eot_id)?;
        let eom_id = check("tokenizer.ggml.eom_token_id", spec.eom_id)?;

        // End-of-turn ids: the declared ones plus every token with an end-of-turn text.
        let mut eot_ids: Vec<u32> = [eos_id, eot_id, eom_id].into_iter().flatten().collect();
        for text in END_OF_TURN_TEXTS {
            if let Some(&id) = text_to_id.get(*text) {
                eot_ids.push(id);
                if types[id as usize] != TokenType::Control {
                    warnings.push(format!(
                        "token {id} '{text}' ends a turn but is not a control token; treating it as one"
                    ));
                    types[id as usize] = TokenType::Control;
                }
            }
        }
        eot_ids.sort_unstable();
        eot_ids.dedup();

        let (encoder, pre, add_bos_default) = match spec.model {
            TokenizerModel::Gpt2 => {
                let merges = spec.merges.as_deref().ok_or(TokenizerError::MissingMerges)?;
                let pre_name = match spec.pre.as_deref() {
                    Some(name) => name,
                    None => {
                        warnings.push("tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer".to_owned());
                        "default"
                    }
                };
                let pre = pretokenize::lookup(pre_name).ok_or_else(|| TokenizerError::UnknownPreTokenizer {
                    name: pre_name.to_owned(),
                    known: pretokenize::known_names(),
                })?;
                let (encoder, dropped) = BpeEncoder::new(&spec.tokens, merges, pre)?;
                if dropped > 0 {
                    warnings.push(format!(
                        "{dropped} merge rules name tokens outside the vocabulary or repeat a pair; ignored"
                    ));
                }
                (Encoder::Bpe(encoder), Some(pre.names[0]), pre.add_bos)
            }
            TokenizerModel::Llama => {
                let byte_ids = spm_byte_ids(&text_to_id);
                let encoder = SpmEncoder::new(&spec.tokens, scores, byte_ids, unk_id);
                (Encoder::Spm(encoder), None, true)
            }
        };

        let pieces = spec
            .tokens
            .iter()
            .zip(&types)
            .enumerate()
            .map(|(id, (text, &ty))| token_piece(spec.model, id as u32, text, ty))
            .collect::<Result<Vec<_>, _>>()?;
        let special = SpecialMatcher::new(&spec.tokens, &types);

        Ok(Tokenizer {
            model: spec.model,
            pre,
            tokens: spec.tokens,
            types,
            pieces,
            text_to_id,
            special,
            encoder,
            bos_id,
            eos_id,
            unk_id,
            pad_id,
            eot_ids,
            add_bos: spec.add_bos.unwrap_or(add_bos_default),
            add_eos: spec.add_eos.unwrap_or(false),
            add_space_prefix: spec.add_space_prefix.unwrap_or(is_llama),
            warnings,
        })
    }

    /// Token ids of `text`, without BOS/EOS. With `parse_special`, the texts of control
    /// tokens (`<|im_start|>`) become those tokens; without it they are tokenized as plain
    /// text. User-defined tokens are always matched whole.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let fragments = self.special.partition(text, parse_special);
        match &self.encoder {
            Encoder::Bpe(bpe) => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => bpe.encode(t, &mut out)?,
                    }
                }
            }
            Encoder::Spm(spm) => {
                // A space prefix goes before the first run of text and after each special
                // token, as in llama.cpp.
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(t) => {
                            let mut escaped = String::with_capacity(t.len() + 3);
                            if self.add_space_prefix && after_special {
                                escaped.push_str(SPM_SPACE);
                            }
                            escaped.push_str(&t.replace(' ', SPM_SPACE));
                            spm.encode(&escaped, &mut out)?;
                            after_special = false;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// `encode`, then BOS in front when the model asks for it (`add_bos()`) and EOS at the
    /// end when it asks for that (`add_eos()`): the ids a raw prompt is fed as.
    pub fn encode_with_bos(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos_id) {
            ids.push(bos);
        }
        ids.extend(self.encode(text, parse_special)?);
        if let (true, Some(eos)) = (self.add_eos, self.eos_id) {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// The text of `ids`. With `skip_special`, control and unknown tokens print nothing;
    /// otherwise their text is printed. Invalid UTF-8 (a byte sequence cut by the id list)
    /// becomes U+FFFD. For `llama` vocabularies with a space prefix, the one space that
    /// `encode` put in front of the first word is removed again, so
    /// `decode(encode(t)) == t`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.piece(id, skip_special)?;
            let strip = i == 0
                && self.add_space_prefix
                && self.model == TokenizerModel::Llama
                && self.types[id as usize] == TokenType::Normal;
            match piece.split_first() {
                Some((b' ', rest)) if strip => bytes.extend_from_slice(rest),
                _ => bytes.extend_from_slice(piece),
            }
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The bytes token `id` prints (empty for a skipped special token).
    pub fn piece(&self, id: u32, skip_special: bool) -> Result<&[u8], TokenizerError> {
        let i = id as usize;
        if i >= self.tokens.len() {
            return Err(TokenizerError::IdOutOfRange { id, vocab_size: self.tokens.len() });
        }
        if skip_special && self.is_special(id) {
            return Ok(&[]);
        }
        Ok(&self.pieces[i])
    }

    /// The stored text of token `id` (byte-level stand-ins or `▁` as in the vocabulary).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// True for control and unknown tokens: the ones `decode(.., skip_special = true)` drops
    /// and `encode(.., parse_special = false)` does not recognize. User-defined tokens are
    /// not special in this sense: they are printed like text.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(self.token_type(id), Some(TokenType::Control | TokenType::Unknown))
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// Every id that ends a turn, sorted: EOS, the declared EOT/EOM ids, and the tokens
    /// named `<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>`, ... when present.
    pub fn eot_ids(&self) -> &[u32] {
        &self.eot_ids
    }

    /// True when `id` is one of [`eot_ids`](Self::eot_ids).
    pub fn is_eot(&self, id: u32) -> bool {
        self.eot_ids.binary_search(&id).is_ok()
    }

    /// Whether a prompt should start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether a prompt should end with EOS (`tokenizer.ggml.add_eos_token`).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether text gets a leading space before SentencePiece encoding.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The tokenizer family.
    pub fn model(&self) -> TokenizerModel {
        self.model
    }

    /// The canonical name of the pre-tokenizer in use (`gpt2` vocabularies only).
    pub fn pre_tokenizer(&self) -> Option<&'static str> {
        self.pre
    }

    /// Things about the metadata that were accepted but are worth telling the user
    /// (missing `tokenizer.ggml.pre`, merges that were ignored, tokens retyped).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

/// Token types from the spec, checked; all `Normal` when absent.
fn token_types(spec: &VocabSpec) -> Result<Vec<TokenType>, TokenizerError> {
    let n = spec.tokens.len();
    match &spec.token_types {
        None => Ok(vec![TokenType::Normal; n]),
        Some(raw) if raw.len() != n => {
            Err(TokenizerError::LengthMismatch { key: "tokenizer.ggml.token_type", expected: n, found: raw.len() })
        }
        Some(raw) => raw
            .iter()
            .enumerate()
            .map(|(id, &value)| TokenType::from_i32(value).ok_or(TokenizerError::BadTokenType { id: id as u32, value }))
            .collect(),
    }
}

/// For each byte, the id of `<0xXX>`, or else of the one-byte text (as llama.cpp falls back).
fn spm_byte_ids(text_to_id: &HashMap<String, u32>) -> [Option<u32>; 256] {
    let mut ids = [None; 256];
    for (b, slot) in ids.iter_mut().enumerate() {
        *slot = text_to_id.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
            let c = char::from_u32(b as u32).filter(|c| c.is_ascii())?;
            text_to_id.get(c.to_string().as_str()).copied()
        });
    }
    ids
}

/// The bytes token `id` prints when printed at all (llama.cpp's `token_to_piece` with
/// specials shown).
fn token_piece(model: TokenizerModel, id: u32, text: &str, ty: TokenType) -> Result<Vec<u8>, TokenizerError> {
    Ok(match (ty, model) {
        (TokenType::Control | TokenType::Unknown | TokenType::UserDefined, _) => text.as_bytes().to_vec(),
        (TokenType::Normal, TokenizerModel::Gpt2) => bytelevel::decode_token_text(text),
        (TokenType::Normal, TokenizerModel::Llama) => text.replace(SPM_SPACE, " ").into_bytes(),
        (TokenType::Byte, TokenizerModel::Llama) => {
            vec![parse_byte_token(text).ok_or_else(|| TokenizerError::BadByteToken { id, text: text.to_owned() })?]
        }
        // Byte tokens mean nothing to byte-level BPE; undefined and unused print nothing.
        (TokenType::Byte, TokenizerModel::Gpt2) | (TokenType::Undefined | TokenType::Unused, _) => Vec::new(),
    })
}

/// `<0xXX>` → the byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests;

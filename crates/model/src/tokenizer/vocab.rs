//! What a vocabulary is made of, read from GGUF metadata: `VocabSpec` (plain data, also built
//! by hand in tests), `TokenType` and `TokenizerModel`.
//!
//! Keys read (all under `tokenizer.ggml.`): `model`, `pre`, `tokens`, `token_type`, `scores`,
//! `merges`, `bos_token_id`, `eos_token_id`, `unknown_token_id`, `padding_token_id`,
//! `eot_token_id`, `eom_token_id`, `add_bos_token`, `add_eos_token`, `add_space_prefix`.
//! Only `model` and `tokens` are always required, `merges` for `gpt2`. A special-token id
//! stored as a negative number means "none" (some converters write -1).
//! Validation (lengths, ranges, type values) happens in `Tokenizer::from_spec`, so a spec
//! built by hand is checked the same way as one read from a file.

use crate::gguf::{MetaValue, Metadata};

use super::TokenizerError;

/// The tokenizer family (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerModel {
    /// `gpt2`: byte-level BPE with merge rules and a regex pre-tokenizer.
    Gpt2,
    /// `llama`: SentencePiece-style, merges chosen by token score, `▁` for spaces, byte
    /// fallback tokens `<0xXX>`.
    Llama,
}

impl TokenizerModel {
    /// Parses a `tokenizer.ggml.model` value.
    pub fn from_name(name: &str) -> Result<TokenizerModel, TokenizerError> {
        match name {
            "gpt2" => Ok(TokenizerModel::Gpt2),
            "llama" => Ok(TokenizerModel::Llama),
            other => Err(TokenizerError::UnsupportedModel(other.to_owned())),
        }
    }

    /// The `tokenizer.ggml.model` value.
    pub fn name(self) -> &'static str {
        match self {
            TokenizerModel::Gpt2 => "gpt2",
            TokenizerModel::Llama => "llama",
        }
    }
}

/// The kind of one token (`tokenizer.ggml.token_type`, values 0..=6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: no type given; decodes to nothing.
    Undefined,
    /// 1: an ordinary subword.
    Normal,
    /// 2: the unknown token; a special token.
    Unknown,
    /// 3: a control token (`<s>`, `<|im_start|>`); a special token.
    Control,
    /// 4: a user-defined token: always matched whole in text, printed as written.
    UserDefined,
    /// 5: a reserved slot; decodes to nothing.
    Unused,
    /// 6: a byte token `<0xXX>` (SentencePiece byte fallback).
    Byte,
}

impl TokenType {
    /// The type for a stored value, or `None` outside 0..=6.
    pub fn from_i32(value: i32) -> Option<TokenType> {
        Some(match value {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// Everything needed to build a [`Tokenizer`](super::Tokenizer), as plain data.
///
/// Optional fields left `None`/empty take llama.cpp's defaults: token types all `Normal`,
/// scores all 0, `add_bos` true for `llama` and for the pre-tokenizers that ask for it
/// (llama3, tekken, chameleon), `add_space_prefix` true for `llama`, BOS/EOS/UNK 1/2/0 for
/// `llama` and none for `gpt2`.
#[derive(Debug, Clone)]
pub struct VocabSpec {
    pub model: TokenizerModel,
    /// `tokenizer.ggml.pre` (gpt2 only); `None` means `default`.
    pub pre: Option<String>,
    pub tokens: Vec<String>, // [vocab] token text (byte-level stand-ins for gpt2, ▁ for llama)
    pub token_types: Option<Vec<i32>>, // [vocab] raw TokenType values
    pub scores: Option<Vec<f32>>, // [vocab] SentencePiece scores
    pub merges: Option<Vec<String>>, // [n_merges] "left right", in rank order (gpt2)
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

impl VocabSpec {
    /// A spec with only the model and tokens set.
    pub fn new(model: TokenizerModel, tokens: Vec<String>) -> VocabSpec {
        VocabSpec {
            model,
            pre: None,
            tokens,
            token_types: None,
            scores: None,
            merges: None,
            bos_id: None,
            eos_id: None,
            unk_id: None,
            pad_id: None,
            eot_id: None,
            eom_id: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
        }
    }

    /// Reads the `tokenizer.ggml.*` keys. Fails on a missing required key or a value of the
    /// wrong type; content checks are left to `Tokenizer::from_spec`.
    pub fn from_gguf(meta: &Metadata) -> Result<VocabSpec, TokenizerError> {
        const P: &str = "tokenizer.ggml.";
        let key = |k: &str| format!("{P}{k}");
        let model = TokenizerModel::from_name(meta.get_str(&key("model"))?)?;
        let tokens = meta.get_str_array(&key("tokens"))?.to_vec();
        let mut spec = VocabSpec::new(model, tokens);
        spec.pre = optional(meta, &key("pre"), |k| meta.get_str(k).map(str::to_owned))?;
        spec.token_types = optional(meta, &key("token_type"), |k| meta.get_i32_array(k))?;
        spec.scores = optional(meta, &key("scores"), |k| meta.get_f32_array(k))?;
        spec.merges = optional(meta, &key("merges"), |k| meta.get_str_array(k).map(|m| m.to_vec()))?;
        spec.bos_id = token_id(meta, &key("bos_token_id"))?;
        spec.eos_id = token_id(meta, &key("eos_token_id"))?;
        spec.unk_id = token_id(meta, &key("unknown_token_id"))?;
        spec.pad_id = token_id(meta, &key("padding_token_id"))?;
        spec.eot_id = token_id(meta, &key("eot_token_id"))?;
        spec.eom_id = token_id(meta, &key("eom_token_id"))?;
        spec.add_bos = optional(meta, &key("add_bos_token"), |k| meta.get_bool(k))?;
        spec.add_eos = optional(meta, &key("add_eos_token"), |k| meta.get_bool(k))?;
        spec.add_space_prefix = optional(meta, &key("add_space_prefix"), |k| meta.get_bool(k))?;
        Ok(spec)
    }
}

/// `Some(get(key))` when the key is present, `None` when it is absent.
fn optional<T>(
    meta: &Metadata,
    key: &str,
    get: impl FnOnce(&str) -> Result<T, crate::gguf::GgufError>,
) -> Result<Option<T>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(get(key)?)),
    }
}

/// A token id key: absent or negative → `None`.
fn token_id(meta: &Metadata, key: &str) -> Result<Option<u32>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(MetaValue::I8(_) | MetaValue::I16(_) | MetaValue::I32(_) | MetaValue::I64(_))
            if meta.get_i64(key)? < 0 =>
        {
            Ok(None)
        }
        Some(_) => Ok(Some(meta.get_u32(key)?)),
    }
}

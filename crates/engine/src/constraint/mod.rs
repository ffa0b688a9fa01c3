//! Constrained decoding: a request's output is held to a [`Grammar`] (a JSON Schema, any JSON
//! object, a regular expression or a Lark grammar) by llguidance, the grammar engine of
//! llama.cpp, vLLM and SGLang.
//!
//! - [`GrammarCompiler`]: one per engine; builds llguidance's parser factory over the model's
//!   vocabulary (`vocab.rs`) on the first constrained request — unconstrained serving never
//!   pays for it — and compiles a request's grammar into a [`Constraint`] on the submitting
//!   thread, so a grammar llguidance refuses is an error of `submit` ([`GrammarError`]).
//! - [`Constraint`]: one per constrained sequence, owned by it (it moves with the sequence
//!   through preemption and recompute; the session bank only shares K/V). Each sampling step:
//!   [`Constraint::compute_mask`] (the scheduler runs it on a worker thread while the forward
//!   pass runs), [`Constraint::apply`] to the logit row before the sampler, then
//!   [`Constraint::commit`] of the chosen token.

mod vocab;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use pagekv_model::tokenizer::Tokenizer;
use serde_json::{json, Value};
use thiserror::Error;
use toktrie::SimpleVob;

pub use vocab::{tok_env, trie_words};

/// What a constrained output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON value valid under this JSON Schema. `strict`: a schema keyword llguidance does
    /// not support is an error; otherwise it is ignored (`lenient`).
    JsonSchema { schema: Value, strict: bool },
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's dialect; `%json {…}` embeds a
    /// JSON Schema).
    Lark(String),
}

/// Separators of constrained JSON: one space after `,` and `:`, no other whitespace, so a
/// sampled output cannot wander off into blank space (and reads like the JSON models learned).
fn json_layout(lenient: bool) -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": lenient})
}

impl Grammar {
    /// The llguidance form of this grammar.
    fn top_level(&self) -> TopLevelGrammar {
        let with_layout = |mut schema: Value, lenient: bool| {
            if let Value::Object(map) = &mut schema {
                map.entry("x-guidance").or_insert_with(|| json_layout(lenient));
            }
            TopLevelGrammar::from_json_schema(schema)
        };
        match self {
            Grammar::JsonSchema { schema, strict } => with_layout(schema.clone(), !strict),
            Grammar::JsonObject => with_layout(json!({"type": "object"}), false),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// A grammar that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum GrammarError {
    /// llguidance refused the grammar (the message names the problem).
    #[error("invalid grammar: {0}")]
    Invalid(String),
    /// The model's vocabulary cannot carry a grammar (no end-of-sequence token, …).
    #[error("constrained decoding is not available for this model: {0}")]
    Vocabulary(String),
    /// The grammar failed while decoding (a token it did not allow, a step over its limits).
    #[error("constrained decoding failed: {0}")]
    Decoding(String),
}

/// Compiles grammars over one model's vocabulary. Cheap to create; the parser factory (the
/// token trie and its lexer slices, tens of milliseconds to a second for a large vocabulary)
/// is built on first use and shared by every later request.
pub struct GrammarCompiler {
    tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
    factory: OnceLock<Result<Arc<ParserFactory>, GrammarError>>,
}

impl GrammarCompiler {
    /// A compiler for `tokenizer` under a model with `vocab_size` logits.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize) -> GrammarCompiler {
        GrammarCompiler { tokenizer, vocab_size, factory: OnceLock::new() }
    }

    fn factory(&self) -> Result<&Arc<ParserFactory>, GrammarError> {
        self.factory
            .get_or_init(|| {
                let env = tok_env(self.tokenizer.clone(), self.vocab_size)?;
                let mut factory =
                    ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
                // Errors come back as values; nothing is printed on the server's stderr.
                factory.quiet();
                Ok(Arc::new(factory))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A fresh constraint for one sequence: the grammar compiled and at its start.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let factory = self.factory()?;
        let parser = factory.create_parser(grammar.top_level());
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(Constraint { matcher, mask: None, mask_time: Duration::ZERO, masks: 0 })
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    /// `[vocab bits]` the tokens allowed next, from the last `compute_mask`; `Err` when it failed.
    mask: Option<Result<SimpleVob, GrammarError>>,
    /// Total time spent in `compute_mask` and how many masks were computed.
    mask_time: Duration,
    masks: u64,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).field("masks", &self.masks).finish()
    }
}

impl Constraint {
    /// Computes the set of tokens allowed next (only the end-of-sequence tokens once the
    /// grammar is complete). The slow part of a step (tens of microseconds to milliseconds):
    /// the scheduler runs it beside the forward pass.
    pub fn compute_mask(&mut self) {
        let start = Instant::now();
        let mask = match self.matcher.compute_mask_or_eos() {
            Ok(m) if m.is_zero() => Err(GrammarError::Decoding("the grammar allows no token here".into())),
            Ok(m) => Ok(m),
            Err(e) => Err(GrammarError::Decoding(e.to_string())),
        };
        self.mask_time += start.elapsed();
        self.masks += 1;
        self.mask = Some(mask);
    }

    /// `out` ← `logits` with every token the mask forbids at −∞. Computes the mask first if
    /// the scheduler did not. Errors when the grammar cannot continue.
    pub fn apply(&mut self, logits: &[f32], out: &mut Vec<f32>) -> Result<(), GrammarError> {
        if self.mask.is_none() {
            self.compute_mask();
        }
        let mask = match self.mask.as_ref() {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(e.clone()),
            None => unreachable!("computed above"),
        };
        out.clear();
        out.resize(logits.len(), f32::NEG_INFINITY);
        mask.iter_set_entries(|i| {
            if let Some(&l) = logits.get(i) {
                out[i] = l;
            }
        });
        Ok(())
    }

    /// Whether the last computed mask allows `token` (false before any mask).
    pub fn allows(&self, token: u32) -> bool {
        matches!(&self.mask, Some(Ok(m)) if m.is_allowed(token))
    }

    /// How many of `tokens`, in order from the current state, the grammar accepts (checked
    /// without advancing it; 0 on a grammar error). Drafts are cut to this before they are fed.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        if tokens.is_empty() {
            return 0;
        }
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    /// Advances the grammar by the chosen token; the next step needs a new mask.
    pub fn commit(&mut self, token: u32) -> Result<(), GrammarError> {
        self.mask = None;
        self.matcher.consume_token(token).map_err(|e| GrammarError::Decoding(e.to_string()))
    }

    /// The grammar is complete and allows nothing more (not even more text): the output is done.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far is a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Time spent computing masks, and how many (since the last [`Constraint::take_mask_stats`]).
    pub fn mask_stats(&self) -> (Duration, u64) {
        (self.mask_time, self.masks)
    }

    /// Time spent computing masks and how many, since the last call (the scheduler adds them
    /// to the engine's counters after every step).
    pub fn take_mask_stats(&mut self) -> (Duration, u64) {
        let taken = (self.mask_time, self.masks);
        (self.mask_time, self.masks) = (Duration::ZERO, 0);
        taken
    }

    /// An independent copy of this grammar state (one per continuation of an `n > 1`
    /// request): the same position in the grammar, its own future, no mask yet.
    pub fn fork(&self) -> Constraint {
        Constraint { matcher: self.matcher.clone(), mask: None, mask_time: Duration::ZERO, masks: 0 }
    }
}

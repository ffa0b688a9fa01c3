//! `Generator`: one sequence over its own pool, stepped by the caller — the runner behind
//! `pagekv eval` (teacher-forced scoring) and `bench decode` (timing). It samples nothing;
//! generation goes through the engine. It keeps the tokens whose K/V are cached, so a new
//! prompt that extends them (the next chat turn) computes only the new tokens: the cache is
//! trimmed back to the common prefix and only the rest is prefilled.
//!
//! It runs over any [`Forward`] backend: the CPU [`Model`] (the default) with host pages, or a
//! GPU model with device pages (`pagekv_model::cuda::CudaModel`).

use kvcache::{CacheConfig, CacheError, KvPool, SequenceCache, SequencePolicy};
use pagekv_model::{Batch, Forward, Logits, Model, ModelError};

/// One sequence, its pool and the tokens it holds.
pub struct Generator<M: Forward = Model> {
    model: M,
    pool: KvPool<M::Pages>,
    seq: SequenceCache,
    /// `[offset]` token ids whose K/V the cache holds.
    tokens: Vec<u32>,
    batch: Batch,
    /// Tokens per prefill step (bounds the scratch buffers).
    chunk: usize,
    policy: SequencePolicy,
    /// `[logit rows]` greedy ids of the last [`Generator::step_greedy`].
    ids: Vec<u32>,
}

/// What a prefill did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefill {
    /// Prompt tokens found in the cache and not recomputed.
    pub reused: usize,
    /// Prompt tokens computed.
    pub computed: usize,
}

impl<M: Forward> Generator<M> {
    /// A generator over a pool built from `cache` (geometry taken from the model).
    pub fn new(model: M, mut cache: CacheConfig) -> Result<Generator<M>, ModelError> {
        let c = model.config();
        cache.num_layers = c.num_layers;
        cache.num_kv_heads = c.num_kv_heads;
        cache.head_dim = c.head_dim;
        if cache.context_window.is_none() {
            cache.context_window = Some(c.context_length);
        }
        if cache.sliding_window.is_none() {
            cache.sliding_window = c.sliding_window;
        }
        cache.hybrid &= model.reads_layer_groups();
        cache.set_layer_windows(&c.layer_windows)?;
        let policy = SequencePolicy::from_config(&cache);
        let reserve = if cache.dynamic_growth { cache.block_size } else { cache.whole_pool_tokens() };
        let mut pool = model.new_pool(cache)?;
        let seq = SequenceCache::new(&mut pool, policy, reserve)?;
        Ok(Generator {
            model,
            pool,
            seq,
            tokens: Vec::new(),
            batch: Batch::default(),
            chunk: 512,
            policy,
            ids: Vec::new(),
        })
    }

    /// Gives the model back (the pool and the sequence are dropped).
    pub fn into_model(self) -> M {
        self.model
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn pool(&self) -> &KvPool<M::Pages> {
        &self.pool
    }

    pub fn sequence(&self) -> &SequenceCache {
        &self.seq
    }

    /// Token ids the cache holds.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Sets the prefill chunk size (tokens per forward step).
    pub fn set_chunk(&mut self, chunk: usize) {
        self.chunk = chunk.max(1);
    }

    /// Drops the cached tokens: the sequence starts over with the same reservation.
    pub fn reset(&mut self) -> Result<(), CacheError> {
        let reserve = self.seq.reserved_blocks() * self.seq.block_size();
        let empty = SequenceCache::new(&mut self.pool, self.policy, 0)?;
        std::mem::replace(&mut self.seq, empty).release(&mut self.pool);
        self.seq = SequenceCache::new(&mut self.pool, self.policy, reserve)?;
        self.tokens.clear();
        Ok(())
    }

    /// Makes the cache hold `prompt` and returns the logits of its last token. The longest
    /// common prefix with what is cached is kept (at least one token is always computed,
    /// since its logits are needed).
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<(Prefill, &[f32]), ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Batch("empty prompt".into()));
        }
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let keep = common.min(prompt.len() - 1);
        if !self.seq.can_cut_to(keep) {
            self.reset()?;
        } else {
            self.seq.trim(&mut self.pool, self.seq.offset() - keep)?;
            self.tokens.truncate(keep);
        }
        let reused = self.tokens.len();
        let rest = &prompt[reused..];
        let chunks = rest.len().div_ceil(self.chunk);
        for (i, chunk) in rest.chunks(self.chunk).enumerate() {
            let logits = if i + 1 == chunks { Logits::Last } else { Logits::None };
            self.run(chunk, logits)?;
        }
        let v = self.model.config().vocab_size;
        let logits = self.model_logits(v);
        Ok((Prefill { reused, computed: rest.len() }, logits))
    }

    /// Feeds `tokens` (teacher forcing) and returns the logits of every one of them,
    /// `[tokens.len(), vocab]`.
    pub fn score(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        self.run(tokens, Logits::All)?;
        Ok(self.model_logits(tokens.len() * self.model.config().vocab_size))
    }

    /// Appends one generated token and returns the logits that follow it.
    pub fn step(&mut self, token: u32) -> Result<&[f32], ModelError> {
        self.run(&[token], Logits::Last)?;
        Ok(self.model_logits(self.model.config().vocab_size))
    }

    /// Appends one generated token and returns the greedy choice that follows it (the
    /// backend's argmax: on a GPU only the id leaves the device, not the logits).
    pub fn step_greedy(&mut self, token: u32) -> Result<u32, ModelError> {
        self.append(&[token], Logits::Last, true)?;
        Ok(self.ids[0])
    }

    fn model_logits(&self, n: usize) -> &[f32] {
        &self.model.last_logits()[..n]
    }

    fn run(&mut self, tokens: &[u32], logits: Logits) -> Result<(), ModelError> {
        self.append(tokens, logits, false)
    }

    fn append(&mut self, tokens: &[u32], logits: Logits, greedy: bool) -> Result<(), ModelError> {
        self.seq.begin_append(&mut self.pool, tokens.len())?;
        self.batch.clear();
        self.batch.sliding_window = self.seq.attention_window(None);
        self.batch.push_groups(
            tokens,
            self.seq.offset() + tokens.len(),
            self.seq.pending_slots(),
            self.seq.block_tables(),
            logits,
        );
        let result = if greedy {
            self.model.forward_greedy(&self.batch, &mut self.pool, &mut self.ids)
        } else {
            self.model.forward(&self.batch, &mut self.pool).map(|_| ())
        };
        match result {
            Ok(()) => {
                self.seq.commit_append(&mut self.pool);
                self.tokens.extend_from_slice(tokens);
                Ok(())
            }
            Err(e) => {
                self.seq.cancel_append();
                Err(e)
            }
        }
    }
}

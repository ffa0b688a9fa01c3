//! `Batch`: the plain arrays one forward step consumes (DESIGN.md, "Data flow"). The engine
//! fills it from its sequences' block tables; the model never sees a `SequenceCache`.
//!
//! A hybrid cache ([`kvcache::LayerGroups`]) has one block table per layer group: every
//! sequence carries one table per group and every token one slot per group; a layer reads
//! and writes through its group's. A one-group cache has one of each.

use kvcache::{LayerGroups, PageGeometry, NULL_BLOCK};

use crate::error::ModelError;
use crate::llama::ModelConfig;

/// What a sequence wants back from the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// No logits (a prefill chunk that is not the prompt's last).
    None,
    /// Logits of the last token only (decode, end of prompt).
    Last,
    /// Logits of every token (teacher-forced evaluation, speculative verify).
    All,
}

/// One sequence's part of a batch.
#[derive(Clone, Debug)]
pub struct BatchSeq {
    /// Index of its first token in the batch's token arrays.
    pub token_start: usize,
    /// New tokens this step (1 for decode).
    pub num_tokens: usize,
    /// Tokens in the cache after this step's are written (positions `0..context_len`).
    pub context_len: usize,
    /// `[groups][logical blocks]` physical block ids, covering `context_len` positions.
    pub block_tables: Vec<Vec<u32>>,
    pub logits: Logits,
    /// Whether the step hands out the last hidden state of every one of its tokens
    /// (`Forward::last_hidden`; for a drafter that reads the model's hidden states).
    pub hidden: bool,
}

/// Token ids, positions and slots of every new token, sequence after sequence.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// `[num_tokens]`
    pub tokens: Vec<u32>,
    /// `[num_tokens]` position of each token in its sequence.
    pub positions: Vec<u32>,
    /// `[groups][num_tokens]` cache slot each token's K/V is written to, per layer group.
    pub slots: Vec<Vec<u32>>,
    /// `[num_seqs]`
    pub seqs: Vec<BatchSeq>,
    /// Attention window for every sequence of the step (the model's, capped by the cache's).
    pub sliding_window: Option<usize>,
}

impl Batch {
    /// Checks the batch against the model, the pool's geometry and its layer groups before
    /// anything is written (every backend's kernels index with these values unchecked):
    /// lengths agree, token ids are in the vocabulary, slots and block ids in the pool,
    /// sequences cover the tokens in order, positions run up to each context length, and each
    /// slot is the one its group's block table names.
    pub fn validate(&self, c: &ModelConfig, g: &PageGeometry, groups: &LayerGroups) -> Result<(), ModelError> {
        self.validate_layers(c.num_layers, c, g, groups)
    }

    /// [`Self::validate`] for a pool of `num_layers` layers of `c`'s geometry (a
    /// next-token-prediction pool holds only its own layers).
    pub fn validate_layers(
        &self,
        num_layers: usize,
        c: &ModelConfig,
        g: &PageGeometry,
        groups: &LayerGroups,
    ) -> Result<(), ModelError> {
        if (groups.num_layers(), g.num_layers, g.num_kv_heads, g.head_dim)
            != (num_layers, groups.planes(), c.num_kv_heads, c.head_dim)
        {
            return Err(ModelError::Batch(format!(
                "cache geometry (layers {} in groups of {}, kv heads {}, head dim {}) does not match the model ({}, {}, {})",
                groups.num_layers(),
                g.num_layers,
                g.num_kv_heads,
                g.head_dim,
                num_layers,
                c.num_kv_heads,
                c.head_dim
            )));
        }
        let n = self.num_tokens();
        let ng = groups.num_groups();
        if self.positions.len() != n || self.slots.len() != ng || self.slots.iter().any(|s| s.len() != n) {
            return Err(ModelError::Batch(format!(
                "tokens, positions and slots differ in length (or the slots are not of {ng} groups)"
            )));
        }
        if let Some(&id) = self.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange { id, vocab: c.vocab_size });
        }
        if let Some(&slot) = self.slots.iter().flatten().find(|&&s| s as usize >= g.slots()) {
            return Err(ModelError::Batch(format!("slot {slot} outside the pool of {} slots", g.slots())));
        }
        let mut next = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.token_start != next || s.num_tokens == 0 || s.context_len < s.num_tokens {
                return Err(ModelError::Batch(format!("sequence {i}: bad token range or context length")));
            }
            if s.block_tables.len() != ng {
                return Err(ModelError::Batch(format!(
                    "sequence {i}: {} block tables for {ng} groups",
                    s.block_tables.len()
                )));
            }
            // Reclaimed blocks (before a sliding window) are NULL_BLOCK; kernels never read them.
            let outside = s.block_tables.iter().flatten().find(|&&b| b != NULL_BLOCK && b as usize >= g.num_blocks);
            if let Some(&b) = outside {
                return Err(ModelError::Batch(format!("sequence {i}: block {b} outside the pool of {}", g.num_blocks)));
            }
            next += s.num_tokens;
            let first = s.context_len - s.num_tokens;
            for t in 0..s.num_tokens {
                let tok = s.token_start + t;
                if self.positions[tok] as usize != first + t {
                    return Err(ModelError::Batch(format!("sequence {i}: position of token {t} is not {}", first + t)));
                }
                for (table, slots) in s.block_tables.iter().zip(&self.slots) {
                    let b = table.get((first + t) / g.block_size).copied();
                    let want = b.map(|b| b * g.block_size as u32 + ((first + t) % g.block_size) as u32);
                    if want != Some(slots[tok]) {
                        return Err(ModelError::Batch(format!(
                            "sequence {i}: slot of token {t} disagrees with its block table"
                        )));
                    }
                }
            }
        }
        if next != n {
            return Err(ModelError::Batch("sequences do not cover the batch's tokens".into()));
        }
        Ok(())
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.slots.iter_mut().for_each(Vec::clear);
        self.seqs.clear();
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Layer groups of the batch's tables (set by the first push after a clear).
    pub fn num_groups(&self) -> usize {
        self.slots.len()
    }

    /// Appends a sequence's new tokens to a one-group batch; `slots` are where their K/V go
    /// (from `SequenceCache::pending_slots`), `block_table` its table after the append.
    pub fn push(&mut self, tokens: &[u32], context_len: usize, slots: &[u32], block_table: &[u32], logits: Logits) {
        self.push_groups(tokens, context_len, slots, std::iter::once(block_table), logits);
    }

    /// Appends a sequence's new tokens: `slots` is `[groups][T]` (group after group, as
    /// `SequenceCache::pending_slots` gives them) and `tables` one block table per group
    /// (`SequenceCache::block_tables`).
    pub fn push_groups<'a>(
        &mut self,
        tokens: &[u32],
        context_len: usize,
        slots: &[u32],
        tables: impl IntoIterator<Item = &'a [u32]>,
        logits: Logits,
    ) {
        let start = self.tokens.len();
        let first_pos = context_len - tokens.len();
        self.tokens.extend_from_slice(tokens);
        self.positions.extend((0..tokens.len()).map(|i| (first_pos + i) as u32));
        let block_tables: Vec<Vec<u32>> = tables.into_iter().map(<[u32]>::to_vec).collect();
        let ng = block_tables.len();
        if self.seqs.is_empty() {
            self.slots.resize_with(ng, Vec::new);
            self.slots.truncate(ng);
        }
        // A sequence with another group count fails `validate` (its slots are uneven).
        for (g, group_slots) in self.slots.iter_mut().enumerate() {
            let r = (g * tokens.len()).min(slots.len())..((g + 1) * tokens.len()).min(slots.len());
            group_slots.extend_from_slice(&slots[r]);
        }
        self.seqs.push(BatchSeq {
            token_start: start,
            num_tokens: tokens.len(),
            context_len,
            block_tables,
            logits,
            hidden: false,
        });
    }

    /// Asks for the last hidden state of every token of the sequence pushed last
    /// ([`BatchSeq::hidden`]).
    pub fn keep_hidden(&mut self) {
        if let Some(s) = self.seqs.last_mut() {
            s.hidden = true;
        }
    }

    /// Rows of hidden states the step hands out, in order.
    pub fn num_hidden_rows(&self) -> usize {
        self.seqs.iter().filter(|s| s.hidden).map(|s| s.num_tokens).sum()
    }

    /// Rows of the logits the step returns, in order.
    pub fn num_logit_rows(&self) -> usize {
        self.seqs
            .iter()
            .map(|s| match s.logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => s.num_tokens,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::{Architecture, RopeStyle};
    use kvcache::KvFormat;

    fn config() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            arch_name: "llama".into(),
            name: "test".into(),
            num_layers: 2,
            mtp_layers: 0,
            hidden: 64,
            ffn: 128,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            vocab_size: 100,
            context_length: 256,
            rms_eps: 1e-5,
            rope_base: 10000.0,
            rope_dims: 16,
            rope_style: RopeStyle::Norm,
            rope_linear_scale: 1.0,
            sliding_window: None,
            layer_windows: vec![None; 2],
            rope_base_local: 10000.0,
            embed_scale: 1.0,
            attn_scale: 0.25,
            scale_queries: false,
            activation: crate::llama::Activation::Silu,
        }
    }

    fn geometry() -> PageGeometry {
        PageGeometry {
            num_layers: 2,
            num_blocks: 8,
            block_size: 4,
            num_kv_heads: 2,
            head_dim: 16,
            format: KvFormat::F16,
            rotation_seed: 0,
        }
    }

    /// Two sequences: a 3-token prefill into block 5 and a decode at position 5 (blocks 2, 7).
    fn good() -> Batch {
        let mut b = Batch::default();
        b.push(&[1, 2, 3], 3, &[20, 21, 22], &[5], Logits::All);
        b.push(&[4], 6, &[29], &[2, 7], Logits::Last);
        b
    }

    #[test]
    fn validate_accepts_a_consistent_batch_and_names_each_inconsistency() {
        let (c, g) = (config(), geometry());
        let one = LayerGroups::single(2);
        good().validate(&c, &g, &one).unwrap();
        let bad = |f: &dyn Fn(&mut Batch)| {
            let mut b = good();
            f(&mut b);
            b.validate(&c, &g, &one).unwrap_err().to_string()
        };
        assert!(bad(&|b| b.tokens[1] = 100).contains("100"));
        assert!(bad(&|b| b.slots[0][0] = 32).contains("slot 32"));
        assert!(bad(&|b| b.slots[0][1] = 23).contains("disagrees with its block table"));
        assert!(bad(&|b| b.positions[3] = 4).contains("position of token 0"));
        assert!(bad(&|b| b.seqs[1].block_tables[0][0] = 8).contains("block 8 outside the pool"));
        assert!(bad(&|b| b.seqs[1].token_start = 2).contains("bad token range"));
        assert!(bad(&|b| {
            b.slots[0].pop();
        })
        .contains("differ in length"));
        // A reclaimed (windowed-out) block is not a bad block.
        let mut b = good();
        b.seqs[1].block_tables[0][0] = NULL_BLOCK;
        b.validate(&c, &g, &one).unwrap();
        let mut other = geometry();
        other.head_dim = 32;
        assert!(good().validate(&c, &other, &one).unwrap_err().to_string().contains("does not match the model"));
    }

    #[test]
    fn two_groups_carry_a_table_and_a_slot_each() {
        let (c, mut g) = (config(), geometry());
        g.num_layers = 1;
        let groups = LayerGroups::from_groups(
            2,
            vec![(kvcache::GroupKind::Full, vec![0]), (kvcache::GroupKind::Sliding { window: 4 }, vec![1])],
        )
        .unwrap();
        let mut b = Batch::default();
        // Positions 4 and 5 of group 0 in block 2, of group 1 in block 6 (block 0 reclaimed),
        // but group 1's slots name block 5.
        b.push_groups(&[1, 2], 6, &[8, 9, 20, 21], [&[3, 2][..], &[NULL_BLOCK, 6][..]], Logits::Last);
        assert_eq!(b.num_groups(), 2);
        assert!(b.validate(&c, &g, &groups).unwrap_err().to_string().contains("disagrees"));
        let mut b = Batch::default();
        b.push_groups(&[1, 2], 6, &[12, 13, 24, 25], [&[3, 3][..], &[NULL_BLOCK, 6][..]], Logits::Last);
        b.validate(&c, &g, &groups).unwrap();
        assert_eq!(b.slots, vec![vec![12, 13], vec![24, 25]]);
        // One group's tables against two groups: refused.
        assert!(good().validate(&c, &g, &groups).unwrap_err().to_string().contains("groups"));
    }
}

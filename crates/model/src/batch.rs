//! `Batch`: the plain arrays one forward step consumes (DESIGN.md, "Data flow"). The engine
//! fills it from its sequences' block tables; the model never sees a `SequenceCache`.

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
    /// `[logical blocks]` physical block ids, covering `context_len` positions.
    pub block_table: Vec<u32>,
    pub logits: Logits,
}

/// Token ids, positions and slots of every new token, sequence after sequence.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// `[num_tokens]`
    pub tokens: Vec<u32>,
    /// `[num_tokens]` position of each token in its sequence.
    pub positions: Vec<u32>,
    /// `[num_tokens]` cache slot each token's K/V is written to.
    pub slots: Vec<u32>,
    /// `[num_seqs]`
    pub seqs: Vec<BatchSeq>,
    /// Attention window for every sequence of the step (the model's, capped by the cache's).
    pub sliding_window: Option<usize>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.slots.clear();
        self.seqs.clear();
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Appends a sequence's new tokens; `slots` are where their K/V go (from
    /// `SequenceCache::pending_slots`), `block_table` its table after the append.
    pub fn push(&mut self, tokens: &[u32], context_len: usize, slots: &[u32], block_table: &[u32], logits: Logits) {
        let start = self.tokens.len();
        let first_pos = context_len - tokens.len();
        self.tokens.extend_from_slice(tokens);
        self.positions.extend((0..tokens.len()).map(|i| (first_pos + i) as u32));
        self.slots.extend_from_slice(slots);
        self.seqs.push(BatchSeq {
            token_start: start,
            num_tokens: tokens.len(),
            context_len,
            block_table: block_table.to_vec(),
            logits,
        });
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

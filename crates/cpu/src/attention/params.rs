//! The arguments of one attention call.

/// One attention call over a batch of sequences.
#[derive(Clone, Copy, Debug)]
pub struct AttentionParams<'a> {
    /// `[num_seqs, q_len, num_heads, head_dim]`
    pub queries: &'a [f32],
    pub num_seqs: usize,
    /// Query tokens per sequence (1 for decode).
    pub q_len: usize,
    /// Query heads; a multiple of the layer's `num_kv_heads` (grouped-query attention).
    pub num_heads: usize,
    /// `[num_seqs]` block tables (logical block → physical block id; `NULL_BLOCK` for blocks a
    /// sliding window reclaimed, which must lie wholly before every query's window).
    pub block_tables: &'a [&'a [u32]],
    /// `[num_seqs]` keys in the cache per sequence, including the `q_len` new ones.
    pub context_lens: &'a [usize],
    /// Multiplies `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Query at position `p` sees keys `(p - W, p]`.
    pub sliding_window: Option<usize>,
    /// Query `i` sees keys up to its own position (`context_len - q_len + i`).
    pub causal: bool,
}

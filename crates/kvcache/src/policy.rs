//! The growth and window policy of a sequence, as its cache and each group's table apply it.

/// Growth and window policy of one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequencePolicy {
    /// Take more blocks when an append does not fit the reservation.
    pub dynamic_growth: bool,
    /// Without a sliding window: the most positions the sequence may hold.
    pub context_window: Option<usize>,
    /// Attention sees at most the last W tokens; blocks no future window reaches are freed.
    pub sliding_window: Option<usize>,
    /// Print the block table on growth, trim and fork.
    pub debug_blocks: bool,
    /// Tokens the sequence may be trimmed back right after an append (a speculative step trims
    /// its rejected draft tokens): windowed groups free only what no query at `offset −
    /// trim_margin` or later reaches, so such a trim leaves every window whole. A sliding group
    /// then holds at most `⌈W / block_size⌉ + ⌈trim_margin / block_size⌉ + 1` blocks. 0: blocks
    /// go as soon as the newest query cannot reach them.
    pub trim_margin: usize,
}

impl SequencePolicy {
    pub fn from_config(c: &crate::CacheConfig) -> SequencePolicy {
        SequencePolicy {
            dynamic_growth: c.dynamic_growth,
            context_window: c.context_window,
            sliding_window: c.sliding_window,
            debug_blocks: c.debug_blocks,
            trim_margin: 0,
        }
    }
}

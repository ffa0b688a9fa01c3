//! Continuations of one request (`n > 1`, [`crate::EngineHandle::submit_n`]): the first
//! sequence computes the prompt with the others waiting in its `siblings`; when the prompt is
//! computed, [`Scheduler::fork_siblings`] forks its cache into each of them. A fork shares every
//! block by reference and takes none (a running sequence holds exactly the blocks its tokens
//! need); the partly filled last block is copied by whichever continuation writes it first
//! (`SequenceCache::begin_append`'s copy-on-write, which the scheduler's block planning counts:
//! [`cache_blocks_needed`]). From then on each continuation is a sequence like any other:
//! its own sampler, grammar, stops, preemption, drafts and bank entry.

use std::ops::Range;

use kvcache::{KvPool, PageStore, SequenceCache};
use pagekv_model::Forward;

use super::Scheduler;
use crate::request::EngineError;
use crate::sequence::Sequence;

impl<M: Forward> Scheduler<M> {
    /// Gives running sequence `i`'s waiting siblings a fork of its cache (its prompt is
    /// computed) and its tokens, and appends them to `running`; returns their indices. The
    /// prompt's blocks stay indexed in the bank under `i`; each continuation registers only the
    /// blocks it fills itself. Siblings whose clients already left are dropped.
    pub(super) fn fork_siblings(&mut self, i: usize) -> Range<usize> {
        let siblings = std::mem::take(&mut self.running[i].siblings);
        let start = self.running.len();
        for mut child in siblings {
            if child.out.is_cancelled() {
                self.counters.cancelled += 1;
                continue;
            }
            let parent = &self.running[i];
            let cache = parent.cache.as_ref().expect("running sequences hold a cache");
            debug_assert_eq!(cache.offset(), parent.tokens.len(), "forks follow the computed prompt");
            let fork = cache.fork(&mut self.pool);
            debug_assert!(fork.as_ref().is_ok_and(|f| f.block_table() == cache.block_table()), "a fork takes no block");
            let fork = match fork {
                Ok(f) => f,
                Err(e) => {
                    self.fail(child, EngineError::Forward(format!("cannot fork the prompt's cache: {e}")));
                    continue;
                }
            };
            let parent = &self.running[i];
            child.tokens.clone_from(&parent.tokens);
            child.hashes.clone_from(&parent.hashes);
            child.registered = parent.registered;
            child.cached_tokens = parent.cached_tokens;
            child.cache = Some(fork);
            self.counters.forks += 1;
            self.running.push(child);
        }
        start..self.running.len()
    }
}

/// New blocks a cache needs to take `t` more tokens, over every layer group: blocks past its
/// tables, and shared blocks the append copies first (a fork's partly filled last block).
pub(super) fn cache_blocks_needed<S: PageStore>(cache: &SequenceCache, t: usize, pool: &KvPool<S>) -> usize {
    cache.blocks_needed(t) + cache.copy_on_write_blocks(pool, t)
}

/// Tokens a cache with `pending` tokens to feed can take with `spare` more blocks: what its
/// tables fit once the shared blocks it writes first are copied.
pub(super) fn cache_fit_tokens<S: PageStore>(
    cache: &SequenceCache,
    pending: usize,
    spare: usize,
    pool: &KvPool<S>,
) -> usize {
    let copies = cache.copy_on_write_blocks(pool, 1);
    if spare < copies {
        return 0;
    }
    cache.tokens_fitting(spare - copies).min(pending)
}

/// Running sequences plus the continuations they still carry (what `Done`/`Error` events and
/// the submitted/cancelled counters count).
pub(super) fn requests_in<'a>(seqs: impl IntoIterator<Item = &'a Sequence>) -> usize {
    seqs.into_iter().map(|s| 1 + s.siblings.len()).sum()
}

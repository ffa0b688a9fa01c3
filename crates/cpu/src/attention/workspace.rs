//! The attention workspace: buffers reused across calls so the decode step allocates nothing
//! once they have grown to the batch's size.
//!
//! - one [`ThreadScratch`] per pool thread (query rows, online-softmax state, tile buffers),
//!   reached by the pool's thread index: a thread runs one task at a time, so no two tasks
//!   touch the same scratch at once;
//! - the partitioned path's partial states, one region per (sequence, partition, kv head),
//!   written only by the task that owns it and read by the merge after the pool returned.

use std::cell::UnsafeCell;

use super::group::HeadStates;
#[cfg(target_arch = "x86_64")]
use super::tile::TileScratch;

/// Buffers of one pool thread, for tasks of up to `heads` kv heads × `rows` query rows of `d`
/// values.
#[derive(Default)]
pub(crate) struct ThreadScratch {
    /// `[heads, rows, d]` scaled, rotated queries.
    pub q: Vec<f32>,
    /// `[heads, rows * (d + 2)]` row states (see [`HeadStates`]).
    pub state: Vec<f32>,
    /// Tile buffers, lengths `TileScratch::LENS` (x86-64 only).
    pub tile: [Vec<f32>; 4],
}

fn ensure(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl ThreadScratch {
    fn ensure(&mut self, heads: usize, rows: usize, d: usize) {
        ensure(&mut self.q, heads * rows * d);
        ensure(&mut self.state, heads * HeadStates::region(rows, d));
        #[cfg(target_arch = "x86_64")]
        for (buf, len) in self.tile.iter_mut().zip(TileScratch::LENS) {
            ensure(buf, len);
        }
    }

    /// Query rows, row states and tile buffers for `heads` kv heads × `rows` rows of `d`
    /// values.
    #[cfg(target_arch = "x86_64")]
    pub fn split(&mut self, heads: usize, rows: usize, d: usize) -> (&mut [f32], HeadStates<'_>, TileScratch<'_>) {
        let [sc, kscale, vscale, w] = &mut self.tile;
        (
            &mut self.q[..heads * rows * d],
            HeadStates { buf: &mut self.state[..heads * HeadStates::region(rows, d)], rows, d },
            TileScratch { sc, kscale, vscale, w },
        )
    }
}

struct Slot(UnsafeCell<ThreadScratch>);

// SAFETY: a slot is only reached through `Workspace::thread`, whose contract gives each
// concurrently running task a distinct thread index.
unsafe impl Sync for Slot {}

/// A raw output/partials pointer shared by the tasks of one call (each writes its own rows).
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(*mut f32);

// SAFETY: tasks write disjoint regions through it (documented at each use).
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    pub fn new(p: *mut f32) -> SyncPtr {
        SyncPtr(p)
    }

    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// Buffers reused across attention calls.
#[derive(Default)]
pub(crate) struct Workspace {
    threads: Vec<Slot>,
    /// `[partitions, kv_heads, rows * (d + 2)]` partial states of the partitioned path
    /// (see [`HeadStates`]), partitions of all sequences in order.
    pub partials: Vec<f32>,
    /// `[num_seqs + 1]` first partition of each sequence (the last entry: their total).
    pub seq_first_part: Vec<usize>,
}

impl Workspace {
    /// Grows every thread's scratch to `heads` kv heads × `rows` rows of `d` values.
    pub fn prepare(&mut self, n_threads: usize, heads: usize, rows: usize, d: usize) {
        while self.threads.len() < n_threads {
            self.threads.push(Slot(UnsafeCell::new(ThreadScratch::default())));
        }
        for slot in &mut self.threads {
            slot.0.get_mut().ensure(heads, rows, d);
        }
    }

    /// The scratch of pool thread `thread`.
    ///
    /// # Safety
    /// No other live reference to this thread's scratch may exist: call it once per task with
    /// the pool's thread index, and let the reference die with the task.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn thread(&self, thread: usize) -> &mut ThreadScratch {
        // SAFETY: per the contract, this is the only reference to the slot.
        unsafe { &mut *self.threads[thread].0.get() }
    }
}

//! The attention workspace: buffers reused across calls so the decode step allocates nothing
//! once they have grown to the batch's size.
//!
//! - one [`ThreadScratch`] per pool thread (query rows, online-softmax state, tile buffers),
//!   reached by the pool's thread index: a thread runs one task at a time, so no two tasks
//!   touch the same scratch at once;
//! - the partitioned path's partial states, one region per (sequence, kv head, partition)
//!   task, written only by that task and read by the merge after the pool returned.

use std::cell::UnsafeCell;

use super::group::RowState;
#[cfg(target_arch = "x86_64")]
use super::tile::TileScratch;

/// Buffers of one pool thread. Shapes for `rows` query rows of `d` values.
#[derive(Default)]
pub(crate) struct ThreadScratch {
    /// `[rows, d]` scaled, rotated queries.
    pub q: Vec<f32>,
    /// `[rows]`
    pub m: Vec<f32>,
    /// `[rows]`
    pub l: Vec<f32>,
    /// `[rows, d]`
    pub acc: Vec<f32>,
    /// Tile buffers, lengths `TileScratch::LENS` (x86-64 only).
    pub tile: [Vec<f32>; 4],
}

fn ensure(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl ThreadScratch {
    fn ensure(&mut self, rows: usize, d: usize) {
        ensure(&mut self.q, rows * d);
        ensure(&mut self.m, rows);
        ensure(&mut self.l, rows);
        ensure(&mut self.acc, rows * d);
        #[cfg(target_arch = "x86_64")]
        for (buf, len) in self.tile.iter_mut().zip(TileScratch::LENS) {
            ensure(buf, len);
        }
    }

    /// Query rows, row state and tile buffers for `rows` rows of `d` values.
    #[cfg(target_arch = "x86_64")]
    pub fn split(&mut self, rows: usize, d: usize) -> (&mut [f32], RowState<'_>, TileScratch<'_>) {
        let [sc, kscale, vscale, w] = &mut self.tile;
        (
            &mut self.q[..rows * d],
            RowState { m: &mut self.m[..rows], l: &mut self.l[..rows], acc: &mut self.acc[..rows * d] },
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
    /// `[tasks, rows * (d + 2)]` partial states of the partitioned path (m, l, acc per task).
    pub partials: Vec<f32>,
    /// `[num_seqs + 1]` first task of each sequence in the partitioned path.
    pub seq_tasks: Vec<usize>,
    /// `[num_seqs]` partitions per kv head of each sequence.
    pub seq_parts: Vec<usize>,
}

impl Workspace {
    /// Grows every thread's scratch to `rows` rows of `d` values.
    pub fn prepare(&mut self, n_threads: usize, rows: usize, d: usize) {
        while self.threads.len() < n_threads {
            self.threads.push(Slot(UnsafeCell::new(ThreadScratch::default())));
        }
        for slot in &mut self.threads {
            slot.0.get_mut().ensure(rows, d);
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

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
use super::queries::int8_lane_floats;
#[cfg(target_arch = "x86_64")]
use super::tile::TileScratch;

/// One cache line of f32.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A growable f32 buffer aligned to cache lines: the kernels' 256-bit loads and stores of
/// queries, accumulators and scores never straddle two lines (with a 16-byte aligned `Vec`,
/// half of them would, depending on where the allocator put it).
#[derive(Default)]
pub(crate) struct AlignedF32 {
    lines: Vec<Line>,
}

impl AlignedF32 {
    /// Grows to at least `n` floats (zeroed when new).
    pub fn ensure(&mut self, n: usize) {
        let lines = n.div_ceil(16);
        if self.lines.len() < lines {
            self.lines.resize(lines, Line([0.0; 16]));
        }
    }

    pub fn len(&self) -> usize {
        self.lines.len() * 16
    }

    pub fn as_mut_ptr(&mut self) -> *mut f32 {
        self.lines.as_mut_ptr().cast()
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: `Line` is 16 f32 with no padding; the lines are initialized.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }
}

/// Buffers of one pool thread, for tasks of up to `heads` kv heads × `rows` query rows of `d`
/// values.
#[derive(Default)]
pub(crate) struct ThreadScratch {
    /// `[heads, rows, d]` scaled, rotated queries.
    pub q: AlignedF32,
    /// `[heads, rows, int8_lane_floats(d)]` their int8 lanes for the integer K·Q kernel.
    pub lanes: AlignedF32,
    /// `[heads, HeadStates::region(rows, d)]` row states.
    pub state: AlignedF32,
    /// The same, for one partition's partial states (the primitive path folds them into
    /// `state`).
    pub partial: AlignedF32,
    /// Tile buffers, lengths `TileScratch::LENS` (x86-64 only).
    pub tile: [AlignedF32; 5],
}

impl ThreadScratch {
    fn ensure(&mut self, heads: usize, rows: usize, d: usize) {
        self.q.ensure(heads * rows * d);
        self.lanes.ensure(heads * rows * int8_lane_floats(d));
        self.state.ensure(heads * HeadStates::region(rows, d));
        self.partial.ensure(heads * HeadStates::region(rows, d));
        #[cfg(target_arch = "x86_64")]
        for (buf, len) in self.tile.iter_mut().zip(TileScratch::LENS) {
            buf.ensure(len);
        }
    }

    /// Query rows, their int8 lanes, row states, partial row states and tile buffers for
    /// `heads` kv heads × `rows` rows of `d` values.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::type_complexity)]
    pub fn split(
        &mut self,
        heads: usize,
        rows: usize,
        d: usize,
    ) -> (&mut [f32], &mut [f32], HeadStates<'_>, HeadStates<'_>, TileScratch<'_>) {
        let [sc, p, kscale, vscale, w] = self.tile.each_mut().map(AlignedF32::as_mut_slice);
        let n = heads * HeadStates::region(rows, d);
        (
            &mut self.q.as_mut_slice()[..heads * rows * d],
            &mut self.lanes.as_mut_slice()[..heads * rows * int8_lane_floats(d)],
            HeadStates { buf: &mut self.state.as_mut_slice()[..n], rows, d },
            HeadStates { buf: &mut self.partial.as_mut_slice()[..n], rows, d },
            TileScratch { sc, p, kscale, vscale, w },
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
    /// `[partitions, kv_heads, HeadStates::region(rows, d)]` partial states of the
    /// partitioned path, partitions of all sequences in order.
    pub partials: AlignedF32,
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

//! Captured forward steps: [`Graphs`] records a step's launches (about 8 per layer) as a CUDA
//! graph the second time its shape ([`GraphKey`]) is seen and replays it with one launch from
//! then on; the device tuning's `graphs` switch (`PAGEKV_DEV_CUDA_GRAPH=0`) turns this off.

use std::collections::{HashMap, HashSet};

use pagekv_cuda::{CudaDevice, DecodeRoute, DeviceGraph};

use super::buffers::dev;
use super::step::{DecodeRows, Step};
use crate::error::ModelError;

/// Most captured step graphs kept (a decode run needs one per 256 tokens of context).
const MAX_GRAPHS: usize = 64;

/// What a captured step depends on besides the contents of the device buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GraphKey {
    n: usize,
    n_logits: usize,
    mb: usize,
    max_ctx: usize,
    route: DecodeRoute,
    route_local: DecodeRoute,
    window: Option<usize>,
    q_round: u32,
    /// Prefill tiles (grid size of the prefill kernel) and which rows the decode kernel serves.
    prefill_tiles: usize,
    decode_rows: DecodeRows,
    /// The pool's pages (`DevicePages::id`: a later pool may reuse a dropped one's addresses).
    pages: u64,
}

impl GraphKey {
    /// The key of step `st` over the pages with id `pages`.
    pub(crate) fn new(st: &Step, pages: u64) -> GraphKey {
        GraphKey {
            n: st.n,
            n_logits: st.n_logits,
            mb: st.mb,
            max_ctx: st.max_ctx,
            route: st.route,
            route_local: st.route_local,
            window: st.window,
            q_round: st.rope.q_round,
            prefill_tiles: st.prefill_tiles,
            decode_rows: st.decode_rows,
            pages,
        }
    }
}

/// The captured steps of one model.
pub(crate) struct Graphs {
    enabled: bool,
    /// (scratch, attention) buffer generations the graphs were captured with.
    generation: (u64, u64),
    /// Shapes run once (captured the second time).
    seen: HashSet<GraphKey>,
    captured: HashMap<GraphKey, DeviceGraph>,
}

impl Graphs {
    pub(crate) fn new(enabled: bool) -> Graphs {
        Graphs { enabled, generation: (0, 0), seen: Default::default(), captured: Default::default() }
    }

    /// Drops every graph (the buffers they captured were reallocated).
    fn clear(&mut self, generation: (u64, u64)) {
        self.seen.clear();
        self.captured.clear();
        self.generation = generation;
    }

    /// Runs the step `key` describes on `device`: replays its graph; or, the second time the
    /// shape is seen, captures `enqueue` as one (the first run sized every buffer, so nothing
    /// is allocated while capturing) and launches it; else runs `enqueue` directly — graphs off,
    /// the cache full, or a capture that failed (which turns graphs off, with one warning).
    /// `generation`: the (scratch, attention) buffer generations; a change drops every graph.
    pub(crate) fn run(
        &mut self,
        device: &CudaDevice,
        key: GraphKey,
        generation: (u64, u64),
        mut enqueue: impl FnMut() -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        if !self.enabled {
            return enqueue();
        }
        if self.generation != generation {
            self.clear(generation);
        }
        if let Some(g) = self.captured.get(&key) {
            return g.launch().map_err(dev);
        }
        if !self.seen.insert(key) && self.captured.len() < MAX_GRAPHS {
            match device.capture_graph(&mut enqueue) {
                Ok(Ok(g)) => {
                    g.launch().map_err(dev)?;
                    self.captured.insert(key, g);
                    return Ok(());
                }
                Ok(Err(e)) => return Err(e),
                Err(e) => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| eprintln!("pagekv: CUDA graph capture failed, running without graphs: {e}"));
                    self.enabled = false;
                }
            }
        }
        enqueue()
    }
}

//! The GPU model's working buffers: [`DeviceScratch`] on the device (allocated up front, grown
//! only when a larger batch arrives) and [`HostScratch`], the host-side staging of a step's
//! small arrays.

use pagekv_cuda::{CudaDevice, DType, DeviceMatrix, DeviceVec};

use super::buffers::{dev, zeros};
use crate::error::ModelError;
use crate::llama::ModelConfig;

/// Working buffers on the device, sized for `cap` tokens, `cap_logits` logit rows,
/// `cap_blocks` block-table entries per token and `cap_groups` layer groups of the pool (each
/// group has its own slots and block tables: `kvcache::LayerGroups`).
#[derive(Default)]
pub(crate) struct DeviceScratch {
    cap: usize,
    cap_logits: usize,
    cap_blocks: usize,
    cap_groups: usize,
    pub(crate) bufs: Option<Bufs>,
    /// Counts reallocations (captured graphs hold the buffers' addresses).
    generation: u64,
}

/// The device buffers of [`DeviceScratch`]; shapes in the comments.
pub(crate) struct Bufs {
    pub(crate) tokens: DeviceVec<u32>,      // [cap]
    pub(crate) positions: DeviceVec<u32>,   // [cap]
    pub(crate) slots: Vec<DeviceVec<u32>>,  // [cap_groups][cap] each token's slot, per layer group
    pub(crate) ctx: DeviceVec<u32>,         // [cap] context length seen by each token's query (position + 1)
    pub(crate) ctx_dec: DeviceVec<u32>,     // [cap] as ctx, 0 for tokens the prefill kernel serves (mixed steps)
    pub(crate) tiles: DeviceVec<u32>,       // [cap, 2] prefill tiles: (first token, tokens)
    pub(crate) tables: Vec<DeviceVec<u32>>, // [cap_groups][cap, cap_blocks] each token's block table, per group
    pub(crate) x: DeviceVec<f32>,           // [cap, hidden] residual stream
    pub(crate) xn: DeviceMatrix,            // [cap, hidden] normed input of a block (product type)
    pub(crate) qkv: DeviceVec<f32>,         // [cap, q_dim + 2·kv_dim]
    pub(crate) q: DeviceVec<f32>,           // [cap, q_dim]
    pub(crate) k: DeviceVec<f32>,           // [cap, kv_dim]
    pub(crate) v: DeviceVec<f32>,           // [cap, kv_dim]
    pub(crate) attn: DeviceVec<f32>,        // [cap, q_dim]
    pub(crate) attn_t: DeviceMatrix,        // [cap, q_dim] attention output (product type)
    pub(crate) proj: DeviceVec<f32>,        // [cap, hidden] a block's output before its post-norm (Gemma 3)
    pub(crate) gate_up: DeviceVec<f32>,     // [cap, 2·ffn]
    pub(crate) act: DeviceMatrix,           // [cap, ffn] silu(gate)·up or gelu(gate)·up (product type)
    pub(crate) rows: DeviceVec<u32>,        // [cap_logits] token index of each logit row
    pub(crate) normed_rows: DeviceMatrix,   // [cap_logits, hidden]
    pub(crate) logits: DeviceVec<f32>,      // [cap_logits, vocab]
    pub(crate) ids: DeviceVec<u32>,         // [cap_logits] argmax of each logit row
}

impl DeviceScratch {
    /// The buffers, reallocated (all of them, larger) when a step needs more `tokens`,
    /// `logit_rows`, block-table entries per token (`blocks`) or layer `groups` than they hold;
    /// with the table width they hold and their generation.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ensure(
        &mut self,
        device: &CudaDevice,
        c: &ModelConfig,
        dtype: DType,
        tokens: usize,
        logit_rows: usize,
        blocks: usize,
        groups: usize,
    ) -> Result<(&mut Bufs, usize, u64), ModelError> {
        let grow = tokens > self.cap || logit_rows > self.cap_logits || blocks > self.cap_blocks;
        if self.bufs.is_none() || grow || groups > self.cap_groups {
            // Free the old buffers first: a large model leaves little room for two sets.
            self.bufs = None;
            let cap = tokens.max(self.cap).next_power_of_two();
            let cap_logits = logit_rows.max(self.cap_logits).max(1).next_power_of_two();
            let cap_blocks = blocks.max(self.cap_blocks).max(1).next_power_of_two();
            let cap_groups = groups.max(self.cap_groups).max(1);
            let (h, qd, kvd, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
            let m = |rows, cols| DeviceMatrix::zeros(device, rows, cols, dtype).map_err(dev);
            self.bufs = Some(Bufs {
                tokens: zeros(device, cap)?,
                positions: zeros(device, cap)?,
                slots: (0..cap_groups).map(|_| zeros(device, cap)).collect::<Result<_, _>>()?,
                ctx: zeros(device, cap)?,
                ctx_dec: zeros(device, cap)?,
                tiles: zeros(device, 2 * cap)?,
                tables: (0..cap_groups).map(|_| zeros(device, cap * cap_blocks)).collect::<Result<_, _>>()?,
                x: zeros(device, cap * h)?,
                xn: m(cap, h)?,
                qkv: zeros(device, cap * (qd + 2 * kvd))?,
                q: zeros(device, cap * qd)?,
                k: zeros(device, cap * kvd)?,
                v: zeros(device, cap * kvd)?,
                attn: zeros(device, cap * qd)?,
                attn_t: m(cap, qd)?,
                proj: zeros(device, cap * h)?,
                gate_up: zeros(device, cap * 2 * f)?,
                act: m(cap, f)?,
                rows: zeros(device, cap_logits)?,
                normed_rows: m(cap_logits, h)?,
                logits: zeros(device, cap_logits * c.vocab_size)?,
                ids: zeros(device, cap_logits)?,
            });
            (self.cap, self.cap_logits, self.cap_blocks, self.cap_groups) = (cap, cap_logits, cap_blocks, cap_groups);
            self.generation += 1;
        }
        Ok((self.bufs.as_mut().expect("allocated above"), self.cap_blocks, self.generation))
    }
}

/// Host-side staging of one step's small arrays.
#[derive(Default)]
pub(crate) struct HostScratch {
    pub(crate) ctx: Vec<u32>,     // [n]
    pub(crate) ctx_dec: Vec<u32>, // [n] ctx, 0 for prefill-kernel rows
    pub(crate) tiles: Vec<u32>,   // [tiles, 2]
    pub(crate) tables: Vec<u32>,  // [groups, n, blocks]
    pub(crate) rows: Vec<u32>,    // [logit rows]
    pub(crate) logits: Vec<f32>,  // [logit rows, vocab]
}

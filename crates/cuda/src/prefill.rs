//! Causal prefill attention over the paged cache on the GPU: [`PrefillAttention::forward`].
//!
//! Many query tokens per sequence (a prompt chunk): queries `[num_tokens, num_heads, head_dim]`
//! f32, each token's context length (`position + 1`) and its sequence's block table, cut by the
//! host into *tiles* of at most [`prefill_tokens_per_cta`] consecutive tokens of one sequence
//! ([`prefill_tiles`]). The kernel (`kernels/prefill_tc.cu`, `pk_prefill_tc`) gives each (kv head,
//! tile) one CTA that reads the sequence's keys and values once per tile — not once per token as
//! the decode kernel does — on the tensor cores, with an online softmax (FlashAttention-2 style).
//! Output `[num_tokens, num_heads, head_dim]` f32, the same function as the decode kernel run
//! with one row per token: token `t` sees keys `[lo_t, C_t)`, `lo_t = C_t − W` with a sliding
//! window `W`, else 0.
//!
//! Served: f16 and bf16 pages, head_dim 32, 64, 128, 256, up to 16 query heads per kv head
//! ([`prefill_supported`]). Other formats stay on the decode kernel (one row per token); the
//! caller counts that as a fallback.
//!
//! Routing rule ([`CudaTuning::prefill_min_tokens`](crate::CudaTuning::prefill_min_tokens),
//! applied by the model step): a sequence whose step brings at least that many new tokens
//! (default 96, `PAGEKV_DEV_CUDA_PREFILL_MIN`) goes through this kernel; shorter ones (decode,
//! speculative verification, short chunks) stay on the decode kernel.
//! `PAGEKV_DEV_CUDA_PREFILL=0` turns the kernel off. The default comes from the H200
//! (`gpu_prefill prefill_kernel_timing`, Llama-3-8B
//! attention shape, bf16): one CTA per (tile, kv head) walks the whole prefix, so the kernel's
//! time is flat up to 128 tokens (79 µs at context 1024, 271 µs at 4096) while the decode rows
//! grow with the chunk (1024: 71 µs at 64 tokens, 127 at 128; 4096: 210 at 64, 405 at 128) —
//! the crossover lies between 64 and 128 tokens at both contexts; 96 is interpolated.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::attention::kv_group;
use crate::device::CudaDevice;
use crate::pages::{dptr, DevicePages};
use crate::shapes::{prefill_smem_bytes, prefill_supported, prefill_tokens_per_cta};
use crate::spec::ModuleSpec;
use crate::CudaError;

/// Appends the tiles of one sequence's chunk — tokens `[first, first + len)` of the batch — to
/// `tiles` (`[num_tiles, 2]`: first token, tokens), at most `per_cta` tokens each.
pub fn prefill_tiles(first: usize, len: usize, per_cta: usize, tiles: &mut Vec<u32>) {
    debug_assert!(per_cta >= 1);
    let mut t = first;
    while t < first + len {
        let n = per_cta.min(first + len - t);
        tiles.push(t as u32);
        tiles.push(n as u32);
        t += n;
    }
}

/// One prefill call. Device arrays; shapes in comments.
#[derive(Clone, Copy)]
pub struct PrefillBatch<'a> {
    /// `[num_tokens, num_heads, head_dim]`
    pub queries: &'a CudaSlice<f32>,
    pub num_tokens: usize,
    /// A multiple of the pages' `num_kv_heads`.
    pub num_heads: usize,
    /// `[num_tokens, max_blocks_per_seq]` each token's sequence's block table; entries before
    /// the window of a tile's first token may be anything (they are not read).
    pub block_tables: &'a CudaSlice<u32>,
    pub max_blocks_per_seq: usize,
    /// `[num_tokens]` keys visible to each token (its position + 1), increasing along a tile.
    pub context_lens: &'a CudaSlice<u32>,
    /// `[num_tiles, 2]` (first token, tokens ≤ [`prefill_tokens_per_cta`]) from [`prefill_tiles`];
    /// the tokens of a tile belong to one sequence. Tokens in no tile are not written.
    pub tiles: &'a CudaSlice<u32>,
    pub num_tiles: usize,
    /// Multiplies `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    pub sliding_window: Option<usize>,
}

/// The prefill attention launcher.
pub struct PrefillAttention {
    device: Arc<CudaDevice>,
}

impl PrefillAttention {
    pub fn new(device: Arc<CudaDevice>) -> PrefillAttention {
        PrefillAttention { device }
    }

    /// Whether the kernel serves pages of this geometry with `num_heads` query heads.
    pub fn serves(&self, pages: &DevicePages, num_heads: usize) -> bool {
        use kvcache::PageStore;
        let g = pages.geometry();
        let hkv = g.num_kv_heads.max(1);
        num_heads.is_multiple_of(hkv)
            && prefill_supported(g.format, g.head_dim, num_heads / hkv)
            && prefill_smem_bytes(g.format, g.head_dim) <= self.device.smem_optin()
    }

    /// Query tokens per tile for this many query heads per kv head.
    pub fn tokens_per_tile(group: usize) -> usize {
        prefill_tokens_per_cta(group)
    }

    /// `out [num_tokens, num_heads, head_dim]` ← causal attention of every tiled token over
    /// `layer`. The caller guarantees valid block ids for every visible position and context
    /// lengths within `max_blocks_per_seq × block_size`.
    pub fn forward(
        &mut self,
        pages: &DevicePages,
        layer: usize,
        b: &PrefillBatch,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        use kvcache::PageStore;
        let g = pages.geometry().clone();
        let bad = |m: String| Err(CudaError::Invalid(m));
        let group = kv_group(&g, layer, b.num_heads)?;
        if !self.serves(pages, b.num_heads) {
            return Err(CudaError::Unsupported(format!(
                "prefill kernel: {} pages, head_dim {}, {group} query heads per kv head",
                g.format, g.head_dim
            )));
        }
        let n = b.num_tokens * b.num_heads * g.head_dim;
        if b.queries.len() < n || out.len() < n {
            return bad(format!(
                "{} tokens × {} heads × {}: queries {}, out {}",
                b.num_tokens,
                b.num_heads,
                g.head_dim,
                b.queries.len(),
                out.len()
            ));
        }
        if b.context_lens.len() < b.num_tokens
            || b.block_tables.len() < b.num_tokens * b.max_blocks_per_seq
            || b.tiles.len() < 2 * b.num_tiles
        {
            return bad("context_lens, block_tables or tiles shorter than the batch".into());
        }
        if b.num_tiles == 0 {
            return Ok(());
        }
        if b.num_tiles > 65535 {
            return Err(CudaError::Unsupported(format!("{} prefill tiles in one call (at most 65535)", b.num_tiles)));
        }
        let d = g.head_dim;
        let module = self.device.module(&ModuleSpec::Kv { format: g.format, head_dim: d, group })?;
        let f = module.function("pk_prefill_tc")?;
        let dev = self.device.clone();
        let p = pages.layer_ptrs(layer)?;
        let out_p = dptr(out, &dev);
        let q_p = dptr(b.queries, &dev);
        let tables = dptr(b.block_tables, &dev);
        let ctx = dptr(b.context_lens, &dev);
        let tiles = dptr(b.tiles, &dev);
        let max_blocks = b.max_blocks_per_seq as u32;
        let scale_log2 = b.scale * std::f32::consts::LOG2_E;
        let window = b.sliding_window.unwrap_or(0) as u32;
        let log2_bs = g.block_size.trailing_zeros();
        let num_kv_heads = g.num_kv_heads as u32;
        let cfg = LaunchConfig {
            grid_dim: (num_kv_heads, b.num_tiles as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: prefill_smem_bytes(g.format, d) as u32,
        };
        let stream = dev.stream();
        let mut l = stream.launch_builder(&f);
        l.arg(&out_p).arg(&q_p).arg(&p.k_codes).arg(&p.v_codes);
        l.arg(&tables).arg(&max_blocks).arg(&ctx).arg(&tiles);
        l.arg(&scale_log2).arg(&window).arg(&log2_bs).arg(&num_kv_heads);
        // SAFETY: argument list matches pk_prefill_tc; buffer sizes were checked above; the caller
        // guarantees the tiles, context lengths and block ids (see the doc).
        unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel(pk_prefill_tc)", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_each_chunk_once_within_one_sequence() {
        let mut t = Vec::new();
        prefill_tiles(0, 37, 16, &mut t);
        prefill_tiles(40, 16, 16, &mut t);
        prefill_tiles(56, 1, 16, &mut t);
        assert_eq!(t, vec![0, 16, 16, 16, 32, 5, 40, 16, 56, 1]);
        assert_eq!(prefill_tokens_per_cta(4), 16);
        assert_eq!(prefill_tokens_per_cta(3), 21);
        assert_eq!(prefill_tokens_per_cta(16), 4);
    }

    #[test]
    fn prefill_serves_float_pages_only() {
        use kvcache::KvFormat;
        assert!(prefill_supported(KvFormat::Bf16, 128, 4));
        assert!(prefill_supported(KvFormat::F16, 64, 3));
        assert!(!prefill_supported(KvFormat::Q8, 128, 4));
        assert!(!prefill_supported(KvFormat::Bf16, 80, 4));
        assert!(!prefill_supported(KvFormat::Bf16, 128, 17));
        // H200 opt-in limit 227 KiB: every served head_dim fits.
        assert!(prefill_smem_bytes(KvFormat::Bf16, 256) <= 227 * 1024);
    }
}

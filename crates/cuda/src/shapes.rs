//! The kernel-shape policy: which kernels serve a format, head_dim and group, the tensor-core
//! decode kernel's shape and variants under a [`TcTuning`] (warps, stages, heads per CTA, two
//! tiles per step, V in registers, L2 policy), and the host mirrors of each kernel's shared
//! memory layout (a kernel traps if it gets less than its layout needs). The module compiler
//! (`spec.rs`) turns these choices into `-D` options; the launchers size their launches with
//! the same functions and the same tuning, so the two agree.

use kvcache::{Codec, KvFormat};

use crate::tuning::TcTuning;
use crate::CudaError;

/// Checks that the kernels serve `format` at `head_dim`.
pub fn check_supported(format: KvFormat, head_dim: usize) -> Result<(), CudaError> {
    format.validate(head_dim).map_err(|e| CudaError::Invalid(e.to_string()))?;
    let quantized = !matches!(format, KvFormat::F32 | KvFormat::F16 | KvFormat::Bf16);
    if quantized && !head_dim.is_multiple_of(32) {
        return Err(CudaError::Unsupported(format!(
            "{format} with head_dim {head_dim}: the GPU kernels need a multiple of 32 for quantized formats"
        )));
    }
    if head_dim > 1024 {
        return Err(CudaError::Unsupported(format!("head_dim {head_dim} > 1024")));
    }
    Ok(())
}

/// Whether the tensor-core decode kernel for `format` is compiled with the eager prologue
/// (`PK_TC_EAGER`). `auto`: q4 pages only. Measured on the H200 (`pagekv bench attention --device cuda`, 2026-12-01):
/// for bf16 the eager prologue itself is slower at 1 × 4096 (1092 → 1018 GB/s); q4 is
/// 2–13 % faster with it compiled in at every shape (16 × 4096 59.0 → 51.5 µs, 64 × 16384 488
/// → 477) — at shapes where no warp takes the eager branch, so that is ptxas scheduling the
/// loop differently (same 128 registers), while q8 is up to 12 % slower with it.
pub fn tc_eager(t: &TcTuning, format: KvFormat) -> bool {
    match t.eager {
        "1" => true,
        "0" => false,
        _ => matches!(format, KvFormat::Q4 { .. }),
    }
}

/// Whether quantized pages at `head_dim` take two tiles per step (`PK_TC_PAIR`), where the group
/// allows it and before the stage count is known: `auto` q4 at head_dim 64 or 128; `1` every
/// quantized format.
fn tc_pair_wanted(t: &TcTuning, format: KvFormat, head_dim: usize) -> bool {
    tc_quantized(format)
        && match t.pair {
            "1" => true,
            "0" => false,
            _ => matches!(format, KvFormat::Q4 { .. }) && head_dim <= 128,
        }
}

/// Whether the decode module for `format` at `head_dim` with `group` query heads per kv head is
/// compiled with `PK_TC_PAIR`: the loop of `pk_decode_tc` attends two 16-token tiles per step —
/// their QK chains side by side, one softmax reduction and one rescale per 32 tokens. Groups of
/// at most 4 (the kernel's rule too, `tc::TS`: at group 8 the loop needs 255 registers instead of
/// 128), and 4 stages, which [`tc_shape_for`] gives such modules by default (`pagekv bench attention
/// --device cuda --formats q4`: q4 1.7–2.8 % faster).
pub fn tc_pair(t: &TcTuning, format: KvFormat, head_dim: usize, group: usize) -> bool {
    tc_pair_wanted(t, format, head_dim) && group <= 4 && tc_shape_for(t, format, head_dim, group).1 >= 4
}

/// Whether the decode module for `format` at `head_dim` with `group` query heads per kv head
/// holds `pk_decode_tc_vreg` (`PK_TC_VREG`): `pk_decode_tc` with the V rows landed in registers —
/// the stages hold K only (half the shared memory, so two CTAs of 8 warps fit an SM) and the
/// query fragments move to shared memory, the kernel held to 128 registers. Float pages with
/// head_dim 64 or 128, 2 stages (the kernel's condition, `tc::VREG`) and at most 4 query heads per
/// kv head ([`tc_vreg_fits`]); not with `PAGEKV_DEV_CUDA_TC_VREG=0`.
pub fn tc_vreg(t: &TcTuning, format: KvFormat, head_dim: usize, group: usize) -> bool {
    tc_vreg_fits(t, format, head_dim, group) && t.vreg != "0"
}

/// The shapes `pk_decode_tc_vreg` serves: larger groups and head_dim 256 spill at 128 registers
/// (hundreds of bytes of stack, `cuobjdump -res-usage`).
pub fn tc_vreg_fits(t: &TcTuning, format: KvFormat, head_dim: usize, group: usize) -> bool {
    !tc_quantized(format)
        && matches!(head_dim, 64 | 128)
        && group <= 4
        && tc_shape_for(t, format, head_dim, group).1 == 2
}

/// Whether a call of the tensor-core kernel over a grid of `ctas` CTAs on `sm_count` SMs takes
/// `pk_decode_tc_vreg` ([`tc_vreg`] for its shape): `auto` where the grid has more CTAs than the
/// device has SMs — the stage kernel fits one CTA of 8 warps per SM (139 KB of stages), this one
/// two, and the 16 warps per SM are what V in registers needs to hide its loads. Measured on the
/// H200 (`pagekv bench attention --device cuda`, bf16, 32 × 8 heads, d128, GB/s): 64 × 4096 (512 CTAs) 3964 →
/// 4017, 64 × 16384 4142 → 4220, 32 × 8192 (256) 3984 → 4032, 128 × 1024 3532 → 3656; but
/// 16 × 4096 (128 CTAs) 3642 → 3428 and 1 × 4096, 1 × 32768 (128) 6 % slower with it.
/// `PAGEKV_DEV_CUDA_TC_VREG=1`: every call it can serve.
pub fn tc_vreg_call(
    t: &TcTuning,
    format: KvFormat,
    head_dim: usize,
    group: usize,
    ctas: usize,
    sm_count: usize,
) -> bool {
    tc_vreg(t, format, head_dim, group) && (t.vreg == "1" || ctas > sm_count.max(1))
}

/// Whether the tensor-core decode kernel for `format` puts an L2 evict-first policy on its page
/// copies (`PK_TC_EF`: `createpolicy.fractional.L2::evict_first` and the `cp.async …
/// .L2::cache_hint` forms; each page is read once per call). `auto` (the default) takes
/// evict-first for f16/bf16 and q8 pages, measured on the H200 (`pagekv bench attention --device cuda`, 2026-12-01: bf16
/// 1 × 32768 +1.3–2 %, 16 × 4096 +0.3–1.2 %, q8 +1–2.5 %, the large bf16 batches unchanged;
/// q4 64 × 16384 2.4 % slower, so q4 keeps the normal policy).
pub fn tc_evict_first(t: &TcTuning, format: KvFormat) -> bool {
    match t.l2 {
        "evict-first" => true,
        "normal" => false,
        _ => matches!(format, KvFormat::F16 | KvFormat::Bf16 | KvFormat::Q8),
    }
}

/// Shared memory one block may use on sm_90 (the kernels are compiled per architecture; the
/// device's own limit is checked again at launch).
const TC_SMEM_LIMIT: usize = 227 * 1024;

/// Whether the tensor-core decode kernel serves this format, head_dim and group — the host
/// mirror of the condition in `kernels/decode_tc.cuh`: f16/bf16 pages with head_dim 32, 64, 128
/// or 256, q8/q4 (rotated or not) with head_dim 64, 128 or 256; at most 16 query heads per kv head.
pub fn tc_supported(format: KvFormat, head_dim: usize, group: usize) -> bool {
    let float = matches!(format, KvFormat::F16 | KvFormat::Bf16) && [32, 64, 128, 256].contains(&head_dim);
    let quant = matches!(format, KvFormat::Q8 | KvFormat::Q4 { .. }) && [64, 128, 256].contains(&head_dim);
    (float || quant) && (1..=16).contains(&group)
}

/// Whether the tensor-core prefill kernel (`kernels/prefill_tc.cu`, `pk_prefill_tc`) serves this
/// format, head_dim and group — the host mirror of its condition: f16/bf16 pages, head_dim 32,
/// 64, 128 or 256, at most 16 query heads per kv head.
pub fn prefill_supported(format: KvFormat, head_dim: usize, group: usize) -> bool {
    matches!(format, KvFormat::F16 | KvFormat::Bf16)
        && [32, 64, 128, 256].contains(&head_dim)
        && (1..=16).contains(&group)
}

/// Query tokens one CTA of `pk_prefill_tc` takes (`pf::TQ`): 64 query rows ÷ the group.
pub fn prefill_tokens_per_cta(group: usize) -> usize {
    (64 / group.max(1)).max(1)
}

/// Bytes of dynamic shared memory `pk_prefill_tc` needs — the host mirror of `pf::SMEM_BYTES`
/// (2 stages × (32 K + 32 V rows), then the query parts: 3 for bf16, 2 for f16, × 64 rows; rows
/// of `2·head_dim + 16` bytes). The kernel traps if it gets less.
pub fn prefill_smem_bytes(format: KvFormat, head_dim: usize) -> usize {
    let row = 2 * head_dim + 16;
    let parts = if format == KvFormat::Bf16 { 3 } else { 2 };
    2 * 2 * 32 * row + parts * 64 * row
}

/// Stage bytes of one warp of the tensor-core kernel (`tc::STAGE`): 16 K + 16 V rows of
/// `2·head_dim + 16` bytes for float pages; quantized pages: code rows 16 bytes longer than the
/// codes, then the K and V scales.
fn tc_stage_bytes(format: KvFormat, head_dim: usize) -> usize {
    match format {
        KvFormat::Q8 | KvFormat::Q4 { .. } => {
            let c = format.key_codec();
            32 * (c.code_bytes(head_dim) + 16 + 2 * c.scales(head_dim))
        }
        _ => 32 * (2 * head_dim + 16),
    }
}

fn tc_quantized(format: KvFormat) -> bool {
    matches!(format, KvFormat::Q8 | KvFormat::Q4 { .. })
}

/// (warps, stages) of the tensor-core kernel for `format` at `head_dim`, at the most stages any
/// group takes (groups that allow two tiles per step, [`tc_pair`]); the warps of every module of
/// the format and head_dim. [`tc_shape_for`] gives a module's stages.
pub fn tc_shape(t: &TcTuning, format: KvFormat, head_dim: usize) -> (usize, usize) {
    tc_shape_with(t, format, head_dim, tc_pair_wanted(t, format, head_dim))
}

/// (warps, stages) of the decode module for `format` at `head_dim` with `group` query heads per
/// kv head: [`tc_shape`]'s warps, and 4 stages only where the group takes two tiles per step.
pub fn tc_shape_for(t: &TcTuning, format: KvFormat, head_dim: usize, group: usize) -> (usize, usize) {
    let (warps, _) = tc_shape(t, format, head_dim);
    let (_, stages) = tc_shape_with(t, format, head_dim, tc_pair_wanted(t, format, head_dim) && group <= 4);
    (warps, stages)
}

/// (warps, stages): the tuning (quantized pages have their own stage count; `pair`: two tiles
/// per step); then fewer stages (down to 2), then fewer warps, where the stages, or the warps'
/// merge scratch at the widest group (16), would not fit in shared memory.
fn tc_shape_with(t: &TcTuning, format: KvFormat, head_dim: usize, pair: bool) -> (usize, usize) {
    let stage = tc_stage_bytes(format, head_dim);
    let mut warps = if tc_quantized(format) { t.quant_warps } else { t.warps };
    // Quantized pages: stages measured on the H200 (`pagekv bench attention --device cuda`: at 64 × 16384
    // q8 3258 GB/s with 2 stages, 3024 with 3; q4 2404 with 3, 2338 with 4, 2359 with 2).
    // Two tiles per step ([`tc_pair`]) keep a step's tiles in flight: 4 stages.
    let mut stages = match (tc_quantized(format), t.quant_stages) {
        (true, 0) if pair => 4,
        (true, 0) if matches!(format, KvFormat::Q4 { .. }) => 3,
        (true, 0) => 2,
        (true, q) => q,
        (false, _) => t.stages,
    };
    let bytes = |w: usize, s: usize| w * s * stage;
    while bytes(warps, stages) > TC_SMEM_LIMIT && stages > 2 {
        stages -= 1;
    }
    while (bytes(warps, stages) > TC_SMEM_LIMIT || tc_merge_bytes(warps, head_dim, 16) > TC_SMEM_LIMIT) && warps > 1 {
        warps /= 2;
    }
    (warps, stages)
}

/// `__launch_bounds__` minimum CTAs per SM of the tensor-core kernel for quantized pages (0:
/// none given — ptxas then keeps the shape, q8/q4 at head_dim 128 with 4 query heads
/// per kv head, at 128 registers without spills, and larger shapes spill-free at up to 255);
/// a tuning knob only (`PAGEKV_DEV_CUDA_TC_MINB`).
pub fn tc_min_blocks(t: &TcTuning, format: KvFormat) -> usize {
    if tc_quantized(format) {
        t.quant_min_blocks
    } else {
        0
    }
}

/// The measured rule for the most kv heads per CTA (`PAGEKV_DEV_CUDA_TC_HPC=0`, the default): 2 for
/// quantized pages once a batch of `num_seqs` fills the `sm_count` SMs with them (`num_seqs ×
/// num_kv_heads / 2 ≥ sm_count`), else 1. Two adjacent heads make each token's codes one run of
/// twice the bytes, and with 8 warps each head keeps 4 (H200, `pagekv bench attention --device cuda`, 2026-12-02, 3
/// processes: 8 warps, 64 × 16384 q8 625 → 600 µs and q4 489 → 474 µs with two heads, against
/// 623 / 520 with one; 16 × 4096 and smaller batches are faster with one head per CTA, q8 64.1
/// → 54.0 µs). f16/bf16 gain nothing (2026-12-01).
pub fn measured_heads_per_cta(format: KvFormat, num_kv_heads: usize, num_seqs: usize, sm_count: usize) -> usize {
    if tc_quantized(format) && num_seqs * num_kv_heads / 2 >= sm_count.max(1) {
        2
    } else {
        1
    }
}

/// kv heads per CTA for a call over `num_seqs` sequences of a layer of `num_kv_heads` on
/// `sm_count` SMs: the largest power of two that divides both `num_kv_heads` and the warp count,
/// at most the tuning's maximum (0: [`measured_heads_per_cta`]).
pub fn tc_heads_per_cta(
    t: &TcTuning,
    format: KvFormat,
    head_dim: usize,
    num_kv_heads: usize,
    num_seqs: usize,
    sm_count: usize,
) -> usize {
    let (warps, _) = tc_shape(t, format, head_dim);
    let max = match t.max_heads_per_cta {
        0 => measured_heads_per_cta(format, num_kv_heads, num_seqs, sm_count),
        m => m,
    };
    let mut hpc = max.min(warps);
    while hpc > 1 && (!num_kv_heads.is_multiple_of(hpc) || !warps.is_multiple_of(hpc)) {
        hpc /= 2;
    }
    hpc
}

/// Bytes of dynamic shared memory `pk_decode_tc` (and `pk_decode_tc_base`) needs with `group`
/// query heads per kv head (`tc::TC_SMEM_BYTES`): the warps' stages, or the scratch of the warps'
/// final merge (`tc::MERGE_FLOATS`) where that is larger.
pub(crate) fn decode_tc_smem_bytes_for(t: &TcTuning, format: KvFormat, head_dim: usize, group: usize) -> usize {
    let (warps, stages) = tc_shape_for(t, format, head_dim, group);
    (warps * stages * tc_stage_bytes(format, head_dim)).max(tc_merge_bytes(warps, head_dim, group))
}

/// Bytes of dynamic shared memory `pk_decode_tc_vreg` needs (`tc::VREG_SMEM_BYTES`): per warp its
/// stages of 16 K rows and its query fragments (`BQ_WORDS` u32: the part sets of each head n-tile
/// — packed columns for groups of at most 4 — × k-steps × 32 lanes × 2), or the merge scratch
/// where that is larger.
pub(crate) fn tc_vreg_smem_bytes(t: &TcTuning, format: KvFormat, head_dim: usize, group: usize) -> usize {
    let (warps, stages) = tc_shape_for(t, format, head_dim, group);
    let parts = if matches!(format, KvFormat::Bf16) { 3 } else { 2 };
    let sets = if group <= 4 {
        let per_tile = 8 / if group <= 2 { 2 } else { 4 };
        usize::div_ceil(parts, per_tile)
    } else {
        group.div_ceil(8) * parts
    };
    let bq_words = sets * (head_dim / 16) * 64;
    (warps * (stages * tc_stage_bytes(format, head_dim) / 2 + 4 * bq_words)).max(tc_merge_bytes(warps, head_dim, group))
}

/// Bytes of the warps' merge scratch of `pk_decode_tc` (`4 · tc::MERGE_FLOATS`): per warp, the
/// (m, l, o) of the group padded to 8 heads, and the merged outputs.
fn tc_merge_bytes(warps: usize, head_dim: usize, group: usize) -> usize {
    let hp = group.div_ceil(8) * 8;
    4 * (warps * hp * (head_dim + 2) + warps * group * head_dim)
}

/// Bytes of dynamic shared memory the stream-K kernel `pk_decode_tc_sk` needs for a call over
/// `num_seqs` sequences — the host mirror of its layout (`sk::FIXED_BYTES` + the per-sequence
/// tables): the warps' stages, the merge scratch `[warps][group][head_dim + 2]` floats, 64
/// control words, then a tiles prefix `[num_seqs + 1]` and the context lengths `[num_seqs]` (u32).
/// The kernel traps if it gets less.
pub(crate) fn decode_tc_sk_smem_bytes(
    t: &TcTuning,
    format: KvFormat,
    head_dim: usize,
    group: usize,
    num_seqs: usize,
) -> usize {
    let (warps, stages) = tc_shape_for(t, format, head_dim, group);
    warps * stages * tc_stage_bytes(format, head_dim)
        + 4 * warps * group * (head_dim + 2)
        + 4 * 64
        + 4 * (2 * num_seqs + 1)
}

/// The most `pk_decode_tc` needs for any group it serves (≤ 16): the bound the module's
/// maximum dynamic shared memory is set to — the most stages ([`tc_shape`]) or the widest merge.
pub(crate) fn decode_tc_smem_bytes(t: &TcTuning, format: KvFormat, head_dim: usize) -> usize {
    let (warps, stages) = tc_shape(t, format, head_dim);
    (warps * stages * tc_stage_bytes(format, head_dim)).max(decode_tc_smem_bytes_for(t, format, head_dim, 16))
}

/// Bytes of dynamic shared memory `pk_decode` needs — the host mirror of `SMEM_BYTES` in
/// `kernels/decode.cu` (the kernel traps if it gets less).
pub(crate) fn decode_smem_bytes(format: KvFormat, head_dim: usize, group: usize) -> usize {
    const TT: usize = 32;
    const STAGES: usize = 3;
    let side = |c: Codec| {
        let cb = c.code_bytes(head_dim);
        let ns = c.scales(head_dim);
        let ub = cb / (head_dim / 8);
        let row = cb + 2 * ns;
        let stride = if (4 * ub).is_multiple_of(16) && 4 * ub < 128 {
            row.div_ceil(128) * 128 + 4 * ub
        } else if 4 * ub >= 128 {
            row.div_ceil(128) * 128 + 16
        } else {
            row.div_ceil(16) * 16
        };
        let levels = match c {
            Codec::LloydMax { bits } | Codec::LloydMaxSub { bits } => 1usize << bits,
            _ => 0,
        };
        (stride, levels)
    };
    let (ks, kl) = side(format.key_codec());
    let (vs, vl) = side(format.value_codec());
    let floats = group * head_dim + group * TT + 3 * group + kl + vl;
    STAGES * TT * (ks + vs) + 4 * floats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_smem_matches_the_kernel_layout_for_bf16() {
        // bf16, D = 128: rows of 256 B padded to 320; 3 stages of 32 tokens × (K + V).
        assert_eq!(decode_smem_bytes(KvFormat::Bf16, 128, 4), 3 * 32 * 640 + 4 * (512 + 128 + 12));
    }

    #[test]
    fn decode_smem_matches_the_kernel_layout_for_sub_scaled_turbo_values() {
        // turbo K8/V3, D = 64: K rows 64 + 2·2 B (unit 8 B) padded to 128 + 32; V rows 24 codes
        // + 2·3 slots (D, two of multipliers; unit 3 B) padded to 32; levels 256 + 8.
        let f = KvFormat::Turbo { k_bits: 8, v_bits: 3 };
        assert_eq!(f.value_codec(), Codec::LloydMaxSub { bits: 3 });
        assert_eq!(decode_smem_bytes(f, 64, 4), 3 * 32 * (160 + 32) + 4 * (256 + 128 + 12 + 256 + 8));
        // D = 128: K rows 128 + 2·4 B (unit 8 B) padded to 256 + 32; V rows 48 + 2·5 = 58 B to 64.
        assert_eq!(decode_smem_bytes(f, 128, 1), 3 * 32 * (288 + 64) + 4 * (128 + 32 + 3 + 256 + 8));
    }

    #[test]
    fn measured_heads_per_cta_pairs_quantized_heads_only_when_the_batch_fills_the_machine() {
        // H200 (132 SMs), 8 kv heads: 64 sequences give 256 CTAs of two heads; 16 would give 64.
        for f in [KvFormat::Q8, KvFormat::Q4 { rotate: false }, KvFormat::Q4 { rotate: true }] {
            assert_eq!(measured_heads_per_cta(f, 8, 64, 132), 2, "{f:?}");
            assert_eq!(measured_heads_per_cta(f, 8, 33, 132), 2, "{f:?}");
            assert_eq!(measured_heads_per_cta(f, 8, 32, 132), 1, "{f:?}");
            assert_eq!(measured_heads_per_cta(f, 8, 16, 132), 1, "{f:?}");
        }
        for f in [KvFormat::Bf16, KvFormat::F16] {
            assert_eq!(measured_heads_per_cta(f, 8, 64, 132), 1, "{f:?}");
        }
    }

    #[test]
    fn default_shapes_keep_stages_and_the_widest_merge_in_shared_memory() {
        let t = &TcTuning::DEFAULT;
        assert_eq!(tc_shape(t, KvFormat::Bf16, 128), (8, 2));
        assert_eq!(tc_shape(t, KvFormat::Q8, 128), (8, 2));
        // q4 at head_dim ≤ 128 takes two tiles per step, with 4 stages (8 × 4 × 2.75 KB: two
        // CTAs per SM, as its 128 registers allow); head_dim 256 keeps one tile and 3 stages.
        assert_eq!(tc_shape(t, KvFormat::Q4 { rotate: false }, 128), (8, 4));
        assert!(2 * (decode_tc_smem_bytes_for(t, KvFormat::Q4 { rotate: false }, 128, 4) + 1024) <= 228 * 1024);
        assert!(tc_pair(t, KvFormat::Q4 { rotate: false }, 128, 4) && tc_pair(t, KvFormat::Q4 { rotate: true }, 64, 1));
        assert!(!tc_pair(t, KvFormat::Q4 { rotate: false }, 256, 4) && !tc_pair(t, KvFormat::Q8, 128, 4));
        assert!(!tc_pair(t, KvFormat::Bf16, 128, 4));
        // Wider groups keep one tile per step, and q4's 3 stages; the module bound covers both.
        assert!(!tc_pair(t, KvFormat::Q4 { rotate: false }, 128, 8));
        assert_eq!(tc_shape_for(t, KvFormat::Q4 { rotate: false }, 128, 8), (8, 3));
        assert_eq!(tc_shape_for(t, KvFormat::Q4 { rotate: false }, 128, 4), (8, 4));
        for g in [1, 4, 8, 16] {
            let need = decode_tc_smem_bytes_for(t, KvFormat::Q4 { rotate: false }, 128, g);
            assert!(need <= decode_tc_smem_bytes(t, KvFormat::Q4 { rotate: false }, 128), "g{g}");
        }
        // head_dim 256: bf16 stages (8 × 2 × 16.5 KB) and the quantized merge scratch at 16
        // query heads (8 warps: 257 KB) would not fit; 4 warps do.
        assert_eq!(tc_shape(t, KvFormat::Bf16, 256), (4, 2));
        assert_eq!(tc_shape(t, KvFormat::Q8, 256), (4, 2));
        assert_eq!(tc_shape(t, KvFormat::Q4 { rotate: true }, 256), (4, 3));
        for f in [KvFormat::Bf16, KvFormat::F16, KvFormat::Q8, KvFormat::Q4 { rotate: false }] {
            for d in [64, 128, 256] {
                assert!(decode_tc_smem_bytes(t, f, d) <= TC_SMEM_LIMIT, "{f:?} d{d}");
            }
        }
        // V in registers (float pages with 2 stages, groups <= 4): K-only stages and the query
        // fragments — bf16 d128 g4: 8 × (2 × 16 × 272 + 2 part sets × 8 k-steps × 256) bytes,
        // small enough for two CTAs of 8 warps per SM (228 KB, 1 KB reserved per CTA).
        assert!(tc_vreg(t, KvFormat::Bf16, 128, 4) && tc_vreg(t, KvFormat::F16, 64, 1));
        assert!(!tc_vreg(t, KvFormat::Q8, 128, 4) && !tc_vreg(t, KvFormat::Bf16, 32, 4));
        assert!(!tc_vreg(t, KvFormat::Bf16, 256, 4) && !tc_vreg(t, KvFormat::Bf16, 128, 8));
        assert_eq!(tc_vreg_smem_bytes(t, KvFormat::Bf16, 128, 4), 8 * (2 * 16 * 272 + 2 * 8 * 256));
        assert!(2 * (tc_vreg_smem_bytes(t, KvFormat::Bf16, 128, 4) + 1024) <= 228 * 1024);
        assert_eq!(decode_tc_smem_bytes_for(t, KvFormat::Bf16, 128, 4), 8 * 2 * 32 * 272);
        // The layout at group 8 (unpacked: 1 n-tile × 2 f16 parts) keeps the merge's bound.
        assert_eq!(
            tc_vreg_smem_bytes(t, KvFormat::F16, 128, 8),
            (8 * (2 * 16 * 272 + 2 * 8 * 256)).max(tc_merge_bytes(8, 128, 8))
        );
        // The route: grids of more CTAs than 132 SMs (32 × 8 CTAs), not those of one round.
        assert!(tc_vreg_call(t, KvFormat::Bf16, 128, 4, 256, 132));
        assert!(!tc_vreg_call(t, KvFormat::Bf16, 128, 4, 128, 132));
        assert!(!tc_vreg_call(t, KvFormat::Bf16, 128, 4, 132, 132));
        assert!(!tc_vreg_call(t, KvFormat::Q8, 128, 4, 512, 132));
        // Large q8 batches pair heads, small ones do not (8 kv heads, 132 SMs).
        assert_eq!(tc_heads_per_cta(t, KvFormat::Q8, 128, 8, 64, 132), 2);
        assert_eq!(tc_heads_per_cta(t, KvFormat::Q8, 128, 8, 16, 132), 1);
        assert_eq!(tc_heads_per_cta(t, KvFormat::Bf16, 128, 8, 64, 132), 1);
    }

    #[test]
    fn unsupported_geometries_are_typed_errors() {
        assert!(matches!(check_supported(KvFormat::Q8, 80), Err(CudaError::Unsupported(_))));
        assert!(check_supported(KvFormat::F16, 80).is_ok());
        assert!(matches!(check_supported(KvFormat::Q8, 12), Err(CudaError::Invalid(_))));
    }
}

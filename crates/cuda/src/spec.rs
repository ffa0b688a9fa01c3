//! [`ModuleSpec`]: which kernels a module holds, the CUDA C++ text it is compiled from (the
//! files of `kernels/`, embedded with `include_str!` and joined in a fixed order: NVRTC sees one
//! translation unit, no `#include`) and the `-D` options that specialize it per KV format,
//! head_dim and group size — so every loop over a head vector unrolls — and per the
//! tensor-core kernel's shape under a [`TcTuning`] (`shapes.rs`).

use kvcache::{Codec, KvFormat};

use crate::shapes::{tc_eager, tc_evict_first, tc_min_blocks, tc_pair, tc_shape, tc_shape_for, tc_vreg};
use crate::tuning::{CudaTuning, TcTuning};

const COMMON: &str = include_str!("../kernels/common.cuh");
const ROPE: &str = include_str!("../kernels/rope.cuh");
const CACHE_WRITE: &str = include_str!("../kernels/cache_write.cu");
const DECODE: &str = include_str!("../kernels/decode.cu");
const DECODE_TC: &str = include_str!("../kernels/decode_tc.cuh");
const DECODE_TC_PARTITIONED: &str = include_str!("../kernels/decode_tc_partitioned.cu");
const DECODE_TC_STREAM_K: &str = include_str!("../kernels/decode_tc_stream_k.cu");
const PREFILL_TC: &str = include_str!("../kernels/prefill_tc.cu");
const BENCH: &str = include_str!("../kernels/bench.cu");
const MODEL: &str = include_str!("../kernels/model.cu");
const TOPK: &str = include_str!("../kernels/topk.cu");
const QMATRIX: &str = include_str!("../kernels/qmatrix.cu");
const QMMA: &str = include_str!("../kernels/qmma.cu");

/// Which kernels a module holds and how they are specialized.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ModuleSpec {
    /// Cache write (+ decode attention and merge when `group > 0`) for one format and head_dim.
    Kv { format: KvFormat, head_dim: usize, group: usize },
    /// Benchmark helpers (random fill, read bandwidth).
    Bench,
    /// The model kernels (embedding, RMSNorm, QKV + RoPE, SiLU·mul, GELU·mul, post-norms, argmax,
    /// conversions).
    Model,
    /// The top-k selection of logit rows (`TopK`).
    TopK,
    /// Products with GGUF-quantized weights (`QuantOps`).
    Quant,
}

/// (codec id, bits) as the kernels' `CODEC_*` constants.
fn codec_id(c: Codec) -> (u32, u32) {
    match c {
        Codec::F32 => (0, 32),
        Codec::F16 => (1, 16),
        Codec::Bf16 => (2, 16),
        Codec::Q8 => (3, 8),
        Codec::Q4 => (4, 4),
        Codec::LloydMax { bits } => (5, bits as u32),
        Codec::LloydMaxSub { bits } => (6, bits as u32),
    }
}

impl ModuleSpec {
    /// The module's source: `common.cuh` and the kernel files, in the order they depend on each
    /// other (the tensor-core decode header before its grids, and before the prefill kernel,
    /// which uses its helpers).
    pub fn source(&self) -> String {
        match self {
            ModuleSpec::Kv { .. } => {
                [COMMON, ROPE, CACHE_WRITE, DECODE, DECODE_TC, DECODE_TC_PARTITIONED, DECODE_TC_STREAM_K, PREFILL_TC]
                    .join("\n")
            }
            ModuleSpec::Bench => [COMMON, BENCH].join("\n"),
            ModuleSpec::Model => [COMMON, ROPE, MODEL].join("\n"),
            ModuleSpec::TopK => [COMMON, TOPK].join("\n"),
            ModuleSpec::Quant => [COMMON, QMATRIX, QMMA].join("\n"),
        }
    }

    fn defines(&self, t: &TcTuning) -> Vec<String> {
        let (format, d, g) = match *self {
            ModuleSpec::Kv { format, head_dim, group } => (format, head_dim, group),
            ModuleSpec::Bench | ModuleSpec::Model | ModuleSpec::TopK | ModuleSpec::Quant => (KvFormat::F32, 128, 0),
        };
        let (kc, kb) = codec_id(format.key_codec());
        let (vc, vb) = codec_id(format.value_codec());
        let rot_block = 1usize << d.trailing_zeros();
        vec![
            format!("-DPK_KC={kc}"),
            format!("-DPK_KBITS={kb}"),
            format!("-DPK_VC={vc}"),
            format!("-DPK_VBITS={vb}"),
            format!("-DPK_D={d}"),
            format!("-DPK_G={g}"),
            format!("-DPK_ROT_BLOCK={rot_block}"),
            format!("-DPK_TC_WARPS={}", tc_shape(t, format, d).0),
            format!("-DPK_TC_STAGES={}", tc_shape_for(t, format, d, g).1),
            format!("-DPK_TC_MINB={}", tc_min_blocks(t, format)),
            format!("-DPK_TC_EAGER={}", tc_eager(t, format) as u32),
            format!("-DPK_TC_EF={}", tc_evict_first(t, format) as u32),
            format!("-DPK_TC_VREG={}", tc_vreg(t, format, d, g) as u32),
            format!("-DPK_TC_PAIR={}", tc_pair(t, format, d, g) as u32),
        ]
    }

    /// NVRTC's options for `arch` (compute capability): the architecture, the language
    /// standard and the module's defines.
    pub fn options(&self, arch: (u32, u32), t: &CudaTuning) -> Vec<String> {
        let mut o = vec![format!("--gpu-architecture=sm_{}{}", arch.0, arch.1), "-std=c++17".to_string()];
        o.extend(self.defines(&t.tc));
        if let ModuleSpec::Quant = self {
            // The K-quant decode product's L2 prefetch depth and register preload (qmatrix.cu).
            o.push(format!("-DQK_PREFETCH={}", t.qgemv_prefetch));
            o.push(format!("-DQK_REGLOAD={}", t.qgemv_preload as u32));
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_ids_match_the_kernels_constants() {
        assert_eq!(codec_id(Codec::Bf16), (2, 16));
        assert_eq!(codec_id(Codec::LloydMaxSub { bits: 2 }), (6, 2));
    }

    #[test]
    fn the_quant_module_is_specialized_by_the_product_tuning() {
        let t = CudaTuning { qgemv_prefetch: 3, qgemv_preload: true, ..CudaTuning::default() };
        let o = ModuleSpec::Quant.options((9, 0), &t);
        assert!(o.contains(&"-DQK_PREFETCH=3".to_string()) && o.contains(&"-DQK_REGLOAD=1".to_string()));
        assert!(!ModuleSpec::Model.options((9, 0), &t).iter().any(|d| d.starts_with("-DQK_")));
    }

    #[test]
    fn kv_modules_hold_the_tensor_core_header_before_its_grids() {
        let src = ModuleSpec::Kv { format: KvFormat::Bf16, head_dim: 128, group: 4 }.source();
        let at = |needle: &str| src.find(needle).unwrap_or_else(|| panic!("{needle} missing"));
        assert!(at("#define PK_HAS_TC 1") < at("PK_DECODE_TC_KERNEL(pk_decode_tc,"));
        assert!(at("#define PK_QUERY_FRAGMENTS") < at("decode_tc_body<PK_G <= 4"));
        assert!(at("pk_decode_tc_sk(") < at("#define PK_HAS_PREFILL_TC 1"));
        assert_eq!(src.matches("#define PK_QUERY_FRAGMENTS").count(), 1);
    }
}

//! The synthetic models (`synthetic:NAME`): a real model's shape with random weights generated
//! on the device, for throughput measurements only.

use std::sync::Arc;

use pagekv_cuda::{CudaDevice, DType, ModelOps};

use super::buffers::dev;
use super::model::CudaModel;
use super::weights::DeviceWeights;
use crate::error::ModelError;
use crate::llama::{ModelConfig, RopeStyle};

/// Shapes of the synthetic models (`synthetic:NAME`): random weights of a real model's shape,
/// for throughput measurements only.
pub fn synthetic_config(name: &str) -> Option<ModelConfig> {
    let base = |name: &str, layers, hidden, ffn, heads, kv_heads, head_dim, vocab, rope_base| ModelConfig {
        architecture: crate::llama::Architecture::Llama,
        arch_name: "llama".into(),
        name: format!("synthetic:{name} (random weights, not a real model)"),
        num_layers: layers,
        mtp_layers: 0,
        hidden,
        ffn,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        vocab_size: vocab,
        context_length: 8192,
        rms_eps: 1e-5,
        rope_base,
        rope_dims: head_dim,
        rope_style: RopeStyle::Norm,
        rope_linear_scale: 1.0,
        sliding_window: None,
        layer_windows: vec![None; layers],
        rope_base_local: rope_base,
        embed_scale: 1.0,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        scale_queries: false,
        activation: crate::llama::Activation::Silu,
    };
    match name.strip_suffix("-q4km").unwrap_or(name) {
        // Meta-Llama-3-8B: 32 layers, 4096 wide, 14336 ffn, 32 q / 8 kv heads of 128, 128256 tokens.
        "llama3-8b" => Some(base(name, 32, 4096, 14336, 32, 8, 128, 128256, 500000.0)),
        // SmolLM2-135M: 30 layers, 576 wide, 1536 ffn, 9 q / 3 kv heads of 64, 49152 tokens.
        "smollm2" => Some(base(name, 30, 576, 1536, 9, 3, 64, 49152, 100000.0)),
        _ => None,
    }
}

/// The synthetic model names [`synthetic_config`] knows: bf16 (or f32) weights, or with
/// `-q4km` random blocks in the types of llama.cpp's Q4_K_M preset, kept quantized.
pub const SYNTHETIC_MODELS: [&str; 4] = ["llama3-8b", "llama3-8b-q4km", "smollm2", "smollm2-q4km"];

impl CudaModel {
    /// Random weights of the synthetic model `name` (see [`synthetic_config`]), generated on
    /// the device. For throughput measurements only: not a model.
    pub fn synthetic(name: &str, device: Arc<CudaDevice>, dtype: DType, seed: u32) -> Result<CudaModel, ModelError> {
        let config = synthetic_config(name).ok_or_else(|| {
            ModelError::Invalid(format!(
                "unknown synthetic model {name:?}: accepted values are {}",
                SYNTHETIC_MODELS.map(|m| format!("synthetic:{m}")).join(", ")
            ))
        })?;
        let ops = ModelOps::new(device.clone()).map_err(dev)?;
        // SmolLM2 ties its output to the embedding; Llama 3 8B does not.
        let tied = name.starts_with("smollm2");
        let q4km = name.ends_with("-q4km");
        let weights = DeviceWeights::synthetic(&device, &ops, &config, dtype, tied, q4km, seed)?;
        CudaModel::assemble(config, device, ops, weights, Some(name.to_string()))
    }
}

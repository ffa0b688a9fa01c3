//! Hyper-parameters of a llama-family model, read from GGUF metadata (`{arch}.*` keys).

use crate::error::ModelError;
use crate::gguf::Metadata;

/// How RoPE pairs dimensions: `Norm` rotates adjacent pairs `(2i, 2i+1)` (llama, mistral as
/// converted to GGUF); `Neox` rotates `(i, i + d/2)` (qwen2, qwen3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    Norm,
    Neox,
}

/// The architectures this runtime implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    /// Gemma 3: scaled embeddings, q/k norms, norms after attention and MLP, GeGLU, and
    /// sliding-window layers with their own RoPE base.
    Gemma3,
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (llama, qwen).
    Silu,
    /// `gelu(gate) · up` with GELU's tanh approximation (gemma).
    GeluTanh,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    /// The `general.architecture` string as found (`llama`, `mistral`, `qwen2`, `qwen3`).
    pub arch_name: String,
    pub name: String,
    /// Layers of the main forward: `{arch}.block_count` less the next-token-prediction layers.
    pub num_layers: usize,
    /// Next-token-prediction (MTP) layers after the main ones (`{arch}.nextn_predict_layers`,
    /// 0 when absent): blocks `blk.{num_layers}..blk.{num_layers + mtp_layers - 1}`, which carry
    /// `nextn.*` tensors beside a block's own. The main forward never runs them; they draft
    /// (`llama::mtp`).
    pub mtp_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Dimensions of each head that RoPE rotates (≤ head_dim).
    pub rope_dims: usize,
    pub rope_style: RopeStyle,
    /// Linear position scaling (`rope.scaling.factor` with type linear), 1.0 if none.
    pub rope_linear_scale: f32,
    /// A sliding window over the whole sequence (every layer), which the cache applies and
    /// reclaims blocks behind (Mistral-style). `None` for models whose windows are per layer.
    pub sliding_window: Option<usize>,
    /// Per-layer sliding windows (Gemma 3: five local layers of every six): `Some(w)` where layer
    /// `i` attends only to the last `w` positions. Attention applies them by masking; a hybrid
    /// cache (`kvcache::CacheConfig::set_layer_windows`) also gives them block tables that free
    /// the blocks their window left.
    pub layer_windows: Vec<Option<usize>>,
    /// RoPE base of the layers with a window in `layer_windows` (`rope.freq_base_swa`).
    pub rope_base_local: f32,
    /// Factor applied to the token embeddings (Gemma: √hidden), 1 otherwise.
    pub embed_scale: f32,
    /// Scale of the query·key products.
    pub attn_scale: f32,
    /// Whether the scale multiplies the queries (in f32, before attention rounds them) rather
    /// than the scores: llama.cpp's Gemma 3 graph scales Q and attends with scale 1. The two
    /// are equal in exact arithmetic but not after the ggml numerics round queries to f16
    /// (a query component scaled into f16's subnormal range keeps fewer bits).
    pub scale_queries: bool,
    pub activation: Activation,
}

impl ModelConfig {
    pub fn from_metadata(meta: &Metadata) -> Result<ModelConfig, ModelError> {
        let arch_name = meta.architecture()?.to_string();
        let architecture = match arch_name.as_str() {
            "llama" | "mistral" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "gemma3" => Architecture::Gemma3,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let u = |k: &str| -> Result<usize, ModelError> { Ok(meta.get_u32(&key(k))? as usize) };
        let block_count = u("block_count")?;
        let mtp_layers = match meta.get(&key("nextn_predict_layers")) {
            Some(_) => u("nextn_predict_layers")?,
            None => 0,
        };
        if mtp_layers >= block_count && mtp_layers > 0 {
            return Err(ModelError::NextnLayers { arch: arch_name, nextn: mtp_layers, block_count });
        }
        let num_layers = block_count - mtp_layers;
        let hidden = u("embedding_length")?;
        let num_heads = u("attention.head_count")?;
        let num_kv_heads =
            if meta.get(&key("attention.head_count_kv")).is_some() { u("attention.head_count_kv")? } else { num_heads };
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(ModelError::Invalid(format!("{num_heads} heads is not a multiple of {num_kv_heads} kv heads")));
        }
        let head_dim = if meta.get(&key("attention.key_length")).is_some() {
            u("attention.key_length")?
        } else {
            hidden / num_heads
        };
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > 1024 {
            return Err(ModelError::Invalid(format!("head dimension {head_dim} is not supported")));
        }
        let rope_dims =
            if meta.get(&key("rope.dimension_count")).is_some() { u("rope.dimension_count")? } else { head_dim };
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(ModelError::Invalid(format!("rope dimension count {rope_dims} vs head dim {head_dim}")));
        }
        let vocab_size = match meta.get(&key("vocab_size")) {
            Some(_) => u("vocab_size")?,
            None => meta.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let opt_f32 = |k: &str, d: f32| -> Result<f32, ModelError> {
            Ok(if meta.get(&key(k)).is_some() { meta.get_f32(&key(k))? } else { d })
        };
        let rope_linear_scale = match meta.get(&key("rope.scaling.type")) {
            Some(_) if meta.get_str(&key("rope.scaling.type"))? == "linear" => opt_f32("rope.scaling.factor", 1.0)?,
            _ => 1.0,
        };
        let window = match meta.get(&key("attention.sliding_window")) {
            Some(_) => Some(u("attention.sliding_window")?).filter(|&w| w > 0),
            None => None,
        };
        let gemma3 = architecture == Architecture::Gemma3;
        // Gemma 3: layer i is local unless i % pattern == pattern - 1 (llama.cpp's default
        // pattern 6, or the file's `attention.sliding_window_pattern`).
        let (sliding_window, layer_windows) = match (gemma3, window) {
            (true, Some(w)) => {
                let pattern = match meta.get(&key("attention.sliding_window_pattern")) {
                    Some(_) => u("attention.sliding_window_pattern")?,
                    None => 6,
                };
                let local = |i: usize| pattern == 0 || i % pattern < pattern - 1;
                (None, (0..num_layers).map(|i| local(i).then_some(w)).collect())
            }
            _ => (window, vec![None; num_layers]),
        };
        // llama.cpp: 1/√head_dim, but 1/√(hidden/heads) for Gemma 3 27B (62 layers).
        let attn_scale = if gemma3 && num_layers == 62 {
            1.0 / ((hidden / num_heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let config = ModelConfig {
            architecture,
            name: meta.get_str("general.name").unwrap_or(&arch_name).to_string(),
            num_layers,
            mtp_layers,
            hidden,
            ffn: u("feed_forward_length")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            context_length: u("context_length")?,
            rms_eps: opt_f32("attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_base: opt_f32("rope.freq_base", 10000.0)?,
            rope_dims,
            rope_style: match architecture {
                Architecture::Llama => RopeStyle::Norm,
                Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Gemma3 => RopeStyle::Neox,
            },
            rope_linear_scale,
            sliding_window,
            layer_windows,
            rope_base_local: opt_f32("rope.freq_base_swa", 10000.0)?,
            embed_scale: if gemma3 { (hidden as f32).sqrt() } else { 1.0 },
            attn_scale,
            scale_queries: gemma3,
            activation: if gemma3 { Activation::GeluTanh } else { Activation::Silu },
            arch_name,
        };
        if config.num_layers == 0 || config.hidden == 0 || config.ffn == 0 || config.vocab_size == 0 {
            return Err(ModelError::Invalid("zero-sized model dimension".into()));
        }
        Ok(config)
    }

    /// Queries per kv head (grouped-query attention ratio).
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Width of the query projection.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the key and value projections.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

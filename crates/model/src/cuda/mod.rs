//! [`CudaModel`]: the llama-family forward pass on one GPU (feature `cuda`), over device pages
//! (`KvPool<DevicePages>`: the bookkeeping stays in kvcache, the pages live on the device).
//!
//! One path, as on the CPU: embed → per layer (RMSNorm, fused QKV product, bias + q/k norms +
//! RoPE in one kernel, cache write, paged attention, output product accumulated into the
//! residual, RMSNorm, fused gate|up product, SiLU·mul, down product accumulated into the
//! residual) → final RMSNorm of the rows whose logits are wanted → output product. Products go
//! through cuBLAS with f32 accumulation; weights are bf16 (default) or f32 ([`DType`]). Steps of
//! at most [`pagekv_cuda::GEMV_MAX_N`] tokens with bf16 weights (decode) multiply every matrix
//! (`PAGEKV_DEV_CUDA_GEMV_MAX_BYTES` caps it) with the fused matrix-vector kernel instead, which
//! streams each weight matrix once with the op before the product (RMSNorm, SiLU·mul, the
//! conversion of the attention output) in its prologue.
//!
//! Attention: a sequence that brings at least [`pagekv_cuda::prefill_min_tokens`] new tokens
//! (96 by default, `PAGEKV_DEV_CUDA_PREFILL_MIN`; `PAGEKV_DEV_CUDA_PREFILL=0` turns it off) goes through
//! the tiled causal prefill kernel ([`PrefillAttention`]: one CTA per tile of query tokens and
//! kv head reads the prefix once per tile, tensor cores) where the pages' format allows it (f16,
//! bf16); every other token (decode, short chunks, other formats — counted as a fallback) is one
//! query row of the paged decode kernel with its own context length (`position + 1`) and its
//! sequence's block table. In a step with both, the decode kernel runs first with the prefill
//! rows' context lengths set to 0 (those rows are skipped), then the prefill kernel writes its rows.
//!
//! Reduced sampling inputs: [`Forward::forward_greedy`] (`pk_argmax`) and
//! [`Forward::forward_top_k`] ([`TopK`], each row's `k` best entries) run after the step and copy
//! only their `[rows]` / `[rows, k]` results to the host; the step's logits stay on the device
//! until [`Forward::fetch_logits`] asks for them.
//!
//! Buffers are allocated up front ([`DeviceScratch`]) and grow only when a larger batch arrives.
//!
//! A step's launches are captured as a CUDA graph the second time its shape (tokens, logit
//! rows, table width, context rounded up to 256, attention route, pages) is seen, and replayed
//! from then on (`PAGEKV_DEV_CUDA_GRAPH=0` turns this off). While a step runs, the device's stream
//! must be this model's thread's alone: work another thread queued on it during a capture
//! would be recorded into the graph. Give each concurrently used model its own
//! [`CudaDevice`] (each has its own stream).

mod weights;

use std::sync::Arc;

use kvcache::{AttentionRoute, CacheConfig, KvFormat, KvPool};
use pagekv_cuda::{
    CudaDevice, CudaError, DType, DecodeAttention, DecodeBatch, DecodeRoute, DeviceMatrix, DevicePages, DeviceVec,
    ModelOps, PrefillAttention, PrefillBatch, Prologue, QkvRope, RopeParams, TopK,
};

use crate::backend::Forward;
use crate::batch::{Batch, Logits};
use crate::error::ModelError;
use crate::llama::{Model, ModelConfig, RopeStyle};
use weights::DeviceWeights;

pub(crate) fn dev(e: CudaError) -> ModelError {
    ModelError::Device(e.to_string())
}

fn drv<E: std::fmt::Debug>(op: &'static str) -> impl Fn(E) -> ModelError {
    move |e| ModelError::Device(format!("CUDA driver error in {op}: {e:?}"))
}

/// `values` copied into a new device buffer.
pub(crate) fn upload_f32(device: &CudaDevice, values: &[f32]) -> Result<DeviceVec<f32>, ModelError> {
    device.stream().clone_htod(values).map_err(drv("cuMemcpyHtoD"))
}

fn zeros<T: pagekv_cuda::DeviceRepr + pagekv_cuda::ValidAsZeroBits>(
    device: &CudaDevice,
    n: usize,
) -> Result<DeviceVec<T>, ModelError> {
    device.stream().alloc_zeros::<T>(n.max(1)).map_err(drv("cuMemAlloc"))
}

/// Shapes of the synthetic models (`synthetic:NAME`): random weights of a real model's shape,
/// for throughput measurements only.
pub fn synthetic_config(name: &str) -> Option<ModelConfig> {
    let base = |name: &str, layers, hidden, ffn, heads, kv_heads, head_dim, vocab, rope_base| ModelConfig {
        architecture: crate::llama::Architecture::Llama,
        arch_name: "llama".into(),
        name: format!("synthetic:{name} (random weights, not a real model)"),
        num_layers: layers,
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
        activation: crate::llama::Activation::Silu,
    };
    match name {
        // Meta-Llama-3-8B: 32 layers, 4096 wide, 14336 ffn, 32 q / 8 kv heads of 128, 128256 tokens.
        "llama3-8b" => Some(base(name, 32, 4096, 14336, 32, 8, 128, 128256, 500000.0)),
        // SmolLM2-135M: 30 layers, 576 wide, 1536 ffn, 9 q / 3 kv heads of 64, 49152 tokens.
        "smollm2" => Some(base(name, 30, 576, 1536, 9, 3, 64, 49152, 100000.0)),
        _ => None,
    }
}

/// The synthetic model names [`synthetic_config`] knows.
pub const SYNTHETIC_MODELS: [&str; 2] = ["llama3-8b", "smollm2"];

/// Working buffers on the device, sized for `cap` tokens, `cap_logits` logit rows and
/// `cap_blocks` block-table entries per token.
#[derive(Default)]
struct DeviceScratch {
    cap: usize,
    cap_logits: usize,
    cap_blocks: usize,
    bufs: Option<Bufs>,
    /// Counts reallocations (captured graphs hold the buffers' addresses).
    generation: u64,
}

struct Bufs {
    tokens: DeviceVec<u32>,    // [cap]
    positions: DeviceVec<u32>, // [cap]
    slots: DeviceVec<u32>,     // [cap]
    ctx: DeviceVec<u32>,       // [cap] context length seen by each token's query (position + 1)
    ctx_dec: DeviceVec<u32>,   // [cap] as ctx, 0 for tokens the prefill kernel serves (mixed steps)
    tiles: DeviceVec<u32>,     // [cap, 2] prefill tiles: (first token, tokens)
    tables: DeviceVec<u32>,    // [cap, cap_blocks] each token's sequence's block table
    x: DeviceVec<f32>,         // [cap, hidden] residual stream
    xn: DeviceMatrix,          // [cap, hidden] normed input of a block (product type)
    qkv: DeviceVec<f32>,       // [cap, q_dim + 2·kv_dim]
    q: DeviceVec<f32>,         // [cap, q_dim]
    k: DeviceVec<f32>,         // [cap, kv_dim]
    v: DeviceVec<f32>,         // [cap, kv_dim]
    attn: DeviceVec<f32>,      // [cap, q_dim]
    attn_t: DeviceMatrix,      // [cap, q_dim] attention output (product type)
    gate_up: DeviceVec<f32>,   // [cap, 2·ffn]
    act: DeviceMatrix,         // [cap, ffn] silu(gate)·up (product type)
    rows: DeviceVec<u32>,      // [cap_logits] token index of each logit row
    normed_rows: DeviceMatrix, // [cap_logits, hidden]
    logits: DeviceVec<f32>,    // [cap_logits, vocab]
    ids: DeviceVec<u32>,       // [cap_logits] argmax of each logit row
}

impl DeviceScratch {
    fn ensure(
        &mut self,
        device: &CudaDevice,
        c: &ModelConfig,
        dtype: DType,
        tokens: usize,
        logit_rows: usize,
        blocks: usize,
    ) -> Result<(&mut Bufs, usize, u64), ModelError> {
        if self.bufs.is_none() || tokens > self.cap || logit_rows > self.cap_logits || blocks > self.cap_blocks {
            // Free the old buffers first: a large model leaves little room for two sets.
            self.bufs = None;
            let cap = tokens.max(self.cap).next_power_of_two();
            let cap_logits = logit_rows.max(self.cap_logits).max(1).next_power_of_two();
            let cap_blocks = blocks.max(self.cap_blocks).max(1).next_power_of_two();
            let (h, qd, kvd, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
            let m = |rows, cols| DeviceMatrix::zeros(device, rows, cols, dtype).map_err(dev);
            self.bufs = Some(Bufs {
                tokens: zeros(device, cap)?,
                positions: zeros(device, cap)?,
                slots: zeros(device, cap)?,
                ctx: zeros(device, cap)?,
                ctx_dec: zeros(device, cap)?,
                tiles: zeros(device, 2 * cap)?,
                tables: zeros(device, cap * cap_blocks)?,
                x: zeros(device, cap * h)?,
                xn: m(cap, h)?,
                qkv: zeros(device, cap * (qd + 2 * kvd))?,
                q: zeros(device, cap * qd)?,
                k: zeros(device, cap * kvd)?,
                v: zeros(device, cap * kvd)?,
                attn: zeros(device, cap * qd)?,
                attn_t: m(cap, qd)?,
                gate_up: zeros(device, cap * 2 * f)?,
                act: m(cap, f)?,
                rows: zeros(device, cap_logits)?,
                normed_rows: m(cap_logits, h)?,
                logits: zeros(device, cap_logits * c.vocab_size)?,
                ids: zeros(device, cap_logits)?,
            });
            (self.cap, self.cap_logits, self.cap_blocks) = (cap, cap_logits, cap_blocks);
            self.generation += 1;
        }
        Ok((self.bufs.as_mut().expect("allocated above"), self.cap_blocks, self.generation))
    }
}

/// Most captured step graphs kept (a decode run needs one per 256 tokens of context).
const MAX_GRAPHS: usize = 64;

/// What a captured step depends on besides the contents of the device buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct GraphKey {
    n: usize,
    n_logits: usize,
    mb: usize,
    max_ctx: usize,
    route: DecodeRoute,
    window: Option<usize>,
    q_round: u32,
    /// Prefill tiles (grid size of the prefill kernel) and which rows the decode kernel serves.
    prefill_tiles: usize,
    decode_rows: DecodeRows,
    /// The pool's pages ([`DevicePages::id`]: a later pool may reuse a dropped one's addresses).
    pages: u64,
}

/// Captured forward steps (CUDA graphs): the step's ~8 launches per layer replayed with one
/// launch. `PAGEKV_DEV_CUDA_GRAPH=0` turns them off.
struct Graphs {
    enabled: bool,
    /// (scratch, attention) buffer generations the graphs were captured with.
    generation: (u64, u64),
    /// Shapes run once (captured the second time).
    seen: std::collections::HashSet<GraphKey>,
    captured: std::collections::HashMap<GraphKey, pagekv_cuda::DeviceGraph>,
}

impl Graphs {
    fn new(enabled: bool) -> Graphs {
        Graphs { enabled, generation: (0, 0), seen: Default::default(), captured: Default::default() }
    }

    /// Drops every graph (the buffers they captured were reallocated).
    fn clear(&mut self, generation: (u64, u64)) {
        self.seen.clear();
        self.captured.clear();
        self.generation = generation;
    }
}

/// Which rows of a step the decode kernel serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum DecodeRows {
    /// Every row (no prefill tiles).
    All,
    /// The rows the prefill kernel does not serve (`ctx_dec`: 0 for the others).
    Rest,
    /// None: the prefill kernel serves every row.
    None,
}

/// Host-side staging of one step's small arrays.
#[derive(Default)]
struct HostScratch {
    ctx: Vec<u32>,     // [n]
    ctx_dec: Vec<u32>, // [n] ctx, 0 for prefill-kernel rows
    tiles: Vec<u32>,   // [tiles, 2]
    tables: Vec<u32>,  // [n, blocks]
    rows: Vec<u32>,    // [logit rows]
    logits: Vec<f32>,  // [logit rows, vocab]
    top: Vec<u32>,     // [2, logit rows, k] forward_top_k's ids, then its values' bits
}

/// The device top-k of [`Forward::forward_top_k`]: the kernels and their output, outside the
/// captured step graphs (launched after the step, like the argmax).
struct DeviceTopK {
    kernels: TopK,
    out: Option<DeviceVec<u32>>, // [2, rows, k] ids, then the values' bits (grown on demand)
}

/// A llama-family model on one GPU.
pub struct CudaModel {
    pub config: ModelConfig,
    device: Arc<CudaDevice>,
    ops: ModelOps,
    attention: DecodeAttention,
    prefill: PrefillAttention,
    weights: DeviceWeights,
    rope: RopeParams,
    scratch: DeviceScratch,
    host: HostScratch,
    /// `Some(name)` for random weights (`synthetic:NAME`).
    synthetic: Option<String>,
    /// Decode steps multiply matrices of at most this many bytes with the fused matrix-vector
    /// kernel, larger ones through cuBLAS (no limit by default: [`pagekv_cuda::dev::gemv_max_bytes`]).
    /// `PAGEKV_DEV_CUDA_GEMV_MAX_BYTES` sets it; `PAGEKV_DEV_CUDA_GEMV=0` means 0 (cuBLAS only).
    gemv_max_bytes: usize,
    /// The step's cache write and tensor-core decode kernel are programmatic dependent launches
    /// ([`pagekv_cuda::dev::attention_pdl`], `PAGEKV_DEV_CUDA_ATTN_PDL`, default on).
    attention_pdl: bool,
    graphs: Graphs,
    top_k: DeviceTopK,
    /// Logit rows of the last step that are on the device only ([`Forward::forward_greedy`] and
    /// [`Forward::forward_top_k`] leave them there; [`Forward::fetch_logits`] copies them).
    device_logit_rows: Option<usize>,
}

impl CudaModel {
    /// Copies the last step's first `rows` logit rows from the device into `host.logits`
    /// (`[rows, vocab]`); returns their length.
    fn copy_logits_to_host(&mut self, rows: usize) -> Result<usize, ModelError> {
        let len = rows * self.config.vocab_size;
        self.host.logits.resize(len, 0.0);
        if len > 0 {
            let s = self.scratch.bufs.as_ref().expect("allocated by forward_device");
            self.device
                .stream()
                .memcpy_dtoh(&s.logits.slice(..len), &mut self.host.logits[..len])
                .map_err(drv("cuMemcpyDtoH"))?;
        }
        Ok(len)
    }

    /// The weights of a loaded (CPU) model, dequantized to `dtype` and uploaded to `device`.
    pub fn from_model(model: &Model, device: Arc<CudaDevice>, dtype: DType) -> Result<CudaModel, ModelError> {
        if model.config.architecture == crate::llama::Architecture::Gemma3 {
            return Err(ModelError::UnsupportedArchitecture(
                "gemma3 on --device cuda (it runs on the CPU; the GPU forward has no Gemma 3 steps yet)".into(),
            ));
        }
        let ops = ModelOps::new(device.clone()).map_err(dev)?;
        let weights = DeviceWeights::upload(&device, &model.weights, &model.config, dtype)?;
        CudaModel::assemble(model.config.clone(), device, ops, weights, None)
    }

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
        let tied = name == "smollm2";
        let weights = DeviceWeights::synthetic(&device, &ops, &config, dtype, tied, seed)?;
        CudaModel::assemble(config, device, ops, weights, Some(name.to_string()))
    }

    fn assemble(
        config: ModelConfig,
        device: Arc<CudaDevice>,
        ops: ModelOps,
        weights: DeviceWeights,
        synthetic: Option<String>,
    ) -> Result<CudaModel, ModelError> {
        let c = &config;
        if c.num_heads / c.num_kv_heads > pagekv_cuda::MAX_GROUP {
            return Err(ModelError::Device(format!(
                "{} query heads per kv head: the CUDA attention kernels serve at most {}",
                c.num_heads / c.num_kv_heads,
                pagekv_cuda::MAX_GROUP
            )));
        }
        let rope = RopeParams {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            rope_dims: c.rope_dims,
            neox: c.rope_style == RopeStyle::Neox,
            theta_scale: c.rope_base.powf(-2.0 / c.rope_dims as f32),
            freq_scale: 1.0 / c.rope_linear_scale,
            eps: c.rms_eps,
            q_round: 0,
        };
        let top_k = DeviceTopK { kernels: TopK::new(device.clone()).map_err(dev)?, out: None };
        device.synchronize().map_err(dev)?;
        let attention_pdl = pagekv_cuda::dev::attention_pdl().map_err(dev)?;
        let mut attention = DecodeAttention::new(device.clone());
        attention.set_programmatic(attention_pdl);
        Ok(CudaModel {
            attention,
            prefill: PrefillAttention::new(device.clone()),
            rope,
            scratch: DeviceScratch::default(),
            host: HostScratch::default(),
            config,
            device,
            ops,
            weights,
            synthetic,
            gemv_max_bytes: pagekv_cuda::dev::gemv_max_bytes().map_err(dev)?,
            attention_pdl,
            graphs: Graphs::new(pagekv_cuda::dev::graphs_enabled().map_err(dev)?),
            top_k,
            device_logit_rows: None,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.weights.dtype
    }

    /// `Some(name)` when the weights are random (`synthetic:NAME`), not a model.
    pub fn synthetic_name(&self) -> Option<&str> {
        self.synthetic.as_deref()
    }

    /// Device pages for `cache` (geometry from the model).
    pub fn new_device_pool(&self, cache: CacheConfig) -> Result<KvPool<DevicePages>, ModelError> {
        let mut pages = DevicePages::new(self.device.clone(), kvcache::geometry_of(&cache)).map_err(dev)?;
        // The step writes the cache from the QKV kernel's results, slots uploaded beforehand.
        pages.set_programmatic_writes(self.attention_pdl);
        Ok(KvPool::with_store(cache, pages)?)
    }

    /// Seconds to read every weight matrix once (the weight traffic of one decode step, nothing
    /// computed): the median of `runs`. Its inverse is the decode roofline in tokens/s.
    pub fn weight_read_seconds(&self, runs: usize) -> Result<f64, ModelError> {
        let mats = self.weights.streamed();
        let mut times = Vec::with_capacity(runs.max(1));
        for i in 0..runs.max(1) + 1 {
            self.device.synchronize().map_err(dev)?;
            let t = std::time::Instant::now();
            self.ops.read_all(&mats).map_err(dev)?;
            self.device.synchronize().map_err(dev)?;
            if i > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Runs one step on the device; the logits of the rows asked for stay on the device.
    /// Returns the number of logit rows.
    pub fn forward_device(&mut self, batch: &Batch, pool: &mut KvPool<DevicePages>) -> Result<usize, ModelError> {
        if batch.num_tokens() == 0 {
            return Err(ModelError::Batch("empty batch".into()));
        }
        // A page write or copy-on-write queued through `PageStore` (which cannot return errors)
        // failed since the last step: the pages are not what the block tables say.
        if let Some(e) = pool.pages_mut().take_error() {
            return Err(dev(e));
        }
        batch.validate(&self.config, pool.geometry())?;
        let c = &self.config;
        let n = batch.num_tokens();
        let n_logits = batch.num_logit_rows();
        let blocks = batch.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(1).max(1);
        let dtype = self.weights.dtype;
        let (s, mb, scratch_generation) = self.scratch.ensure(&self.device, c, dtype, n, n_logits, blocks)?;

        // The step's small arrays: per token its context (position + 1) and its sequence's
        // block table; the token index of each logit row.
        let host = &mut self.host;
        host.ctx.clear();
        host.ctx.extend(batch.positions.iter().map(|&p| p + 1));
        host.tables.clear();
        host.rows.clear();
        for seq in &batch.seqs {
            for _ in 0..seq.num_tokens {
                host.tables.extend_from_slice(&seq.block_table);
                host.tables.extend(std::iter::repeat_n(0, mb - seq.block_table.len()));
            }
            let last = seq.token_start + seq.num_tokens;
            match seq.logits {
                Logits::None => {}
                Logits::Last => host.rows.push((last - 1) as u32),
                Logits::All => host.rows.extend((seq.token_start..last).map(|i| i as u32)),
            }
        }
        let max_ctx = host.ctx.iter().copied().max().unwrap_or(1) as usize;
        // Prefill routing: sequences with at least `prefill_min_tokens` new tokens take the
        // tiled prefill kernel where it serves the pages; the others stay on the decode kernel.
        host.tiles.clear();
        let min_tokens = pagekv_cuda::prefill_min_tokens();
        let long = |sq: &crate::batch::BatchSeq| sq.num_tokens >= min_tokens.max(2);
        if batch.seqs.iter().any(long) {
            if self.prefill.serves(pool.pages(), c.num_heads) {
                let per = PrefillAttention::tokens_per_tile(c.num_heads / c.num_kv_heads);
                for sq in batch.seqs.iter().filter(|sq| long(sq)) {
                    pagekv_cuda::prefill_tiles(sq.token_start, sq.num_tokens, per, &mut host.tiles);
                }
            } else {
                for _ in 0..c.num_layers {
                    pool.counters().count_fallback(kvcache::FallbackReason::UnsupportedFormat);
                }
            }
        }
        let prefill_tiles = host.tiles.len() / 2;
        let decode_rows = if prefill_tiles == 0 {
            DecodeRows::All
        } else if batch.seqs.iter().all(long) {
            DecodeRows::None
        } else {
            host.ctx_dec.clear();
            for sq in &batch.seqs {
                let served = long(sq);
                host.ctx_dec.extend(host.ctx[sq.token_start..sq.token_start + sq.num_tokens].iter().map(|&c| {
                    if served {
                        0
                    } else {
                        c
                    }
                }));
            }
            DecodeRows::Rest
        };
        let stream = self.device.stream().clone();
        let up = drv("cuMemcpyHtoD");
        stream.memcpy_htod(&batch.tokens, &mut s.tokens.slice_mut(..n)).map_err(&up)?;
        stream.memcpy_htod(&batch.positions, &mut s.positions.slice_mut(..n)).map_err(&up)?;
        stream.memcpy_htod(&batch.slots, &mut s.slots.slice_mut(..n)).map_err(&up)?;
        stream.memcpy_htod(&host.ctx, &mut s.ctx.slice_mut(..n)).map_err(&up)?;
        stream.memcpy_htod(&host.tables, &mut s.tables.slice_mut(..n * mb)).map_err(&up)?;
        if n_logits > 0 {
            stream.memcpy_htod(&host.rows, &mut s.rows.slice_mut(..n_logits)).map_err(&up)?;
        }
        if prefill_tiles > 0 {
            stream.memcpy_htod(&host.tiles, &mut s.tiles.slice_mut(..2 * prefill_tiles)).map_err(&up)?;
        }
        if decode_rows == DecodeRows::Rest {
            stream.memcpy_htod(&host.ctx_dec, &mut s.ctx_dec.slice_mut(..n)).map_err(&up)?;
        }

        let ops = &self.ops;
        let mut rope = self.rope;
        rope.q_round = match pool.config().format {
            KvFormat::F16 => 1,
            KvFormat::Bf16 => 2,
            _ => 0,
        };
        // The partition grid is sized for the longest context rounded up to 256 tokens (rows
        // shorter than it skip the partitions past their end), so consecutive decode steps
        // share one launch shape — and one captured graph.
        let max_ctx = max_ctx.next_multiple_of(256).min(mb * pool.geometry().block_size).max(max_ctx);
        let route = self.attention.auto_route(pool.pages(), c.num_heads, n, max_ctx);
        for _ in 0..c.num_layers {
            if decode_rows == DecodeRows::None {
                break;
            }
            pool.counters().count_route(match route {
                DecodeRoute::Primitive => AttentionRoute::Primitive,
                DecodeRoute::Partitioned { .. } => AttentionRoute::Partitioned,
            });
        }
        let st = Step {
            n,
            n_logits,
            mb,
            max_ctx,
            route,
            window: batch.sliding_window,
            rope,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            gemv_max_bytes: self.gemv_max_bytes,
            prefill_tiles,
            decode_rows,
        };
        if !self.graphs.enabled {
            enqueue(ops, &self.weights, &mut self.attention, &mut self.prefill, s, pool, c, &st)?;
            return Ok(n_logits);
        }
        // Replay a captured step of the same shape, or capture one the second time a shape is
        // seen (the first run sizes every buffer, so nothing is allocated while capturing).
        let key = GraphKey {
            n,
            n_logits,
            mb,
            max_ctx,
            route,
            window: batch.sliding_window,
            q_round: st.rope.q_round,
            prefill_tiles,
            decode_rows,
            pages: pool.pages().id(),
        };
        let generation = (scratch_generation, self.attention.generation());
        if self.graphs.generation != generation {
            self.graphs.clear(generation);
        }
        if let Some(g) = self.graphs.captured.get(&key) {
            g.launch().map_err(dev)?;
            return Ok(n_logits);
        }
        if !self.graphs.seen.insert(key) && self.graphs.captured.len() < MAX_GRAPHS {
            let (w, attention, prefill) = (&self.weights, &mut self.attention, &mut self.prefill);
            let captured = self.device.capture_graph(|| enqueue(ops, w, attention, prefill, s, pool, c, &st));
            match captured {
                Ok(Ok(g)) => {
                    g.launch().map_err(dev)?;
                    self.graphs.captured.insert(key, g);
                    return Ok(n_logits);
                }
                Ok(Err(e)) => return Err(e),
                Err(e) => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| eprintln!("pagekv: CUDA graph capture failed, running without graphs: {e}"));
                    self.graphs.enabled = false;
                }
            }
        }
        enqueue(ops, &self.weights, &mut self.attention, &mut self.prefill, s, pool, c, &st)?;
        Ok(n_logits)
    }
}

/// One step's launch shape and settings (everything the queued work depends on beyond the
/// device buffers' contents).
struct Step {
    n: usize,
    n_logits: usize,
    mb: usize,
    max_ctx: usize,
    route: DecodeRoute,
    window: Option<usize>,
    rope: RopeParams,
    scale: f32,
    gemv_max_bytes: usize,
    prefill_tiles: usize,
    decode_rows: DecodeRows,
}

/// Queues a whole forward step on the device's stream: embed, every layer, the logits of the
/// rows asked for. The step's small arrays are already on the device (`s`).
#[allow(clippy::too_many_arguments)]
fn enqueue(
    ops: &ModelOps,
    w: &DeviceWeights,
    attention: &mut DecodeAttention,
    prefill: &mut PrefillAttention,
    s: &mut Bufs,
    pool: &mut KvPool<DevicePages>,
    c: &ModelConfig,
    st: &Step,
) -> Result<(), ModelError> {
    let (n, n_logits, qd, scale) = (st.n, st.n_logits, c.q_dim(), st.scale);
    ops.embed(&mut s.x, &w.token_embd, &s.tokens, n).map_err(dev)?;
    // Decode-sized steps multiply bf16 weights with the fused matrix-vector kernel (norm,
    // SiLU·mul or conversion in its prologue); other steps go through cuBLAS.
    let gemv = |m: &DeviceMatrix, rows: usize| m.bytes() <= st.gemv_max_bytes && ops.gemv_serves(m, rows);
    let eps = c.rms_eps;
    for (li, lw) in w.layers.iter().enumerate() {
        // Attention block.
        if gemv(&lw.wqkv, n) {
            let norm = Prologue::RmsNorm { w: &lw.attn_norm, eps };
            ops.gemv(&mut s.qkv, &s.x, &lw.wqkv, norm, None, n, false).map_err(dev)?;
        } else {
            ops.rms_norm(&mut s.xn, &s.x, &lw.attn_norm, None, n, eps).map_err(dev)?;
            ops.matmul(&mut s.qkv, &s.xn, &lw.wqkv, n, false).map_err(dev)?;
        }
        let a = QkvRope {
            qkv: &s.qkv,
            bias: lw.bqkv.as_ref(),
            q_norm: lw.q_norm.as_ref(),
            k_norm: lw.k_norm.as_ref(),
            factors: w.rope_factors.as_ref(),
            positions: &s.positions,
        };
        ops.qkv_rope(&mut s.q, &mut s.k, &mut s.v, &a, &st.rope, n).map_err(dev)?;
        pool.pages_mut().write_device(li, &s.slots, &s.k, &s.v, n).map_err(dev)?;
        if st.decode_rows != DecodeRows::None {
            let b = DecodeBatch {
                queries: &s.q,
                num_seqs: n,
                num_heads: c.num_heads,
                block_tables: &s.tables,
                max_blocks_per_seq: st.mb,
                context_lens: if st.decode_rows == DecodeRows::Rest { &s.ctx_dec } else { &s.ctx },
                max_context_len: st.max_ctx,
                scale,
                sliding_window: st.window,
            };
            attention.forward(pool.pages(), li, &b, st.route, &mut s.attn).map_err(dev)?;
        }
        if st.prefill_tiles > 0 {
            // After the decode kernel: its (skipped) rows of these tokens are overwritten here.
            let b = PrefillBatch {
                queries: &s.q,
                num_tokens: n,
                num_heads: c.num_heads,
                block_tables: &s.tables,
                max_blocks_per_seq: st.mb,
                context_lens: &s.ctx,
                tiles: &s.tiles,
                num_tiles: st.prefill_tiles,
                scale,
                sliding_window: st.window,
            };
            prefill.forward(pool.pages(), li, &b, &mut s.attn).map_err(dev)?;
        }
        if gemv(&lw.wo, n) {
            ops.gemv(&mut s.x, &s.attn, &lw.wo, Prologue::Convert, None, n, true).map_err(dev)?;
        } else {
            ops.convert(&mut s.attn_t, &s.attn, n * qd).map_err(dev)?;
            ops.matmul(&mut s.x, &s.attn_t, &lw.wo, n, true).map_err(dev)?;
        }

        // MLP block.
        if gemv(&lw.w_gate_up, n) {
            let norm = Prologue::RmsNorm { w: &lw.ffn_norm, eps };
            ops.gemv(&mut s.gate_up, &s.x, &lw.w_gate_up, norm, None, n, false).map_err(dev)?;
        } else {
            ops.rms_norm(&mut s.xn, &s.x, &lw.ffn_norm, None, n, eps).map_err(dev)?;
            ops.matmul(&mut s.gate_up, &s.xn, &lw.w_gate_up, n, false).map_err(dev)?;
        }
        if gemv(&lw.w_down, n) {
            ops.gemv(&mut s.x, &s.gate_up, &lw.w_down, Prologue::SiluMul, None, n, true).map_err(dev)?;
        } else {
            ops.silu_mul(&mut s.act, &s.gate_up, n).map_err(dev)?;
            ops.matmul(&mut s.x, &s.act, &lw.w_down, n, true).map_err(dev)?;
        }
    }
    if n_logits > 0 {
        if gemv(w.output(), n_logits) {
            let norm = Prologue::RmsNorm { w: &w.output_norm, eps };
            ops.gemv(&mut s.logits, &s.x, w.output(), norm, Some(&s.rows), n_logits, false).map_err(dev)?;
        } else {
            ops.rms_norm(&mut s.normed_rows, &s.x, &w.output_norm, Some(&s.rows), n_logits, eps).map_err(dev)?;
            ops.matmul(&mut s.logits, &s.normed_rows, w.output(), n_logits, false).map_err(dev)?;
        }
    }
    Ok(())
}

impl Forward for CudaModel {
    type Pages = DevicePages;

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_pool(&self, cache: CacheConfig) -> Result<KvPool<DevicePages>, ModelError> {
        self.new_device_pool(cache)
    }

    fn forward(&mut self, batch: &Batch, pool: &mut KvPool<DevicePages>) -> Result<&[f32], ModelError> {
        self.device_logit_rows = None;
        let rows = self.forward_device(batch, pool)?;
        let len = self.copy_logits_to_host(rows)?;
        Ok(&self.host.logits[..len])
    }

    fn last_logits(&self) -> &[f32] {
        &self.host.logits
    }

    fn forward_greedy(
        &mut self,
        batch: &Batch,
        pool: &mut KvPool<DevicePages>,
        ids: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        self.host.logits.clear();
        self.device_logit_rows = None;
        let rows = self.forward_device(batch, pool)?;
        self.device_logit_rows = Some(rows);
        ids.clear();
        ids.resize(rows, 0);
        if rows > 0 {
            let s = self.scratch.bufs.as_mut().expect("allocated by forward_device");
            self.ops.argmax(&mut s.ids, &s.logits, rows, self.config.vocab_size).map_err(dev)?;
            self.device.stream().memcpy_dtoh(&s.ids.slice(..rows), &mut ids[..]).map_err(drv("cuMemcpyDtoH"))?;
        }
        // The logits of this step stay on the device.
        Ok(())
    }

    /// The step, then each logit row's `k` best entries selected on the device
    /// ([`pagekv_cuda::TopK`], `backend::top_k`'s rule): only `[rows, k]` ids and values are
    /// copied to the host; the logits stay on the device until [`Forward::fetch_logits`].
    fn forward_top_k(
        &mut self,
        batch: &Batch,
        pool: &mut KvPool<DevicePages>,
        k: usize,
        ids: &mut Vec<u32>,
        values: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        self.host.logits.clear();
        self.device_logit_rows = None;
        let rows = self.forward_device(batch, pool)?;
        self.device_logit_rows = Some(rows);
        ids.clear();
        values.clear();
        let n = rows * k;
        if n == 0 {
            return Ok(());
        }
        let vocab = self.config.vocab_size;
        if self.top_k.kernels.plan(rows, vocab, k).is_err() {
            // Sizes the kernel does not serve (k past TOP_K_MAX, vocabularies past its merge):
            // the host rule over the full rows.
            let logits = self.fetch_logits()?;
            for row in logits.chunks_exact(vocab) {
                crate::backend::top_k(row, k, ids, values);
            }
            return Ok(());
        }
        let t = &mut self.top_k;
        if t.out.as_ref().is_none_or(|o| o.len() < 2 * n) {
            t.out = None;
            t.out = Some(zeros(&self.device, (2 * n).next_power_of_two())?);
        }
        let out = t.out.as_mut().expect("allocated above");
        let s = self.scratch.bufs.as_ref().expect("allocated by forward_device");
        t.kernels.run_packed(out, &s.logits, rows, vocab, k, None).map_err(dev)?;
        let top = &mut self.host.top;
        top.resize(2 * n, 0);
        self.device.stream().memcpy_dtoh(&out.slice(..2 * n), &mut top[..]).map_err(drv("cuMemcpyDtoH"))?;
        ids.extend_from_slice(&top[..n]);
        values.extend(top[n..].iter().map(|&b| f32::from_bits(b)));
        debug_assert!(ids.len() == n && values.len() == n);
        Ok(())
    }

    /// The last step's logit rows on the host: copied from the device after
    /// [`Forward::forward_greedy`] or [`Forward::forward_top_k`] (once), else those
    /// [`Forward::forward`] returned.
    fn fetch_logits(&mut self) -> Result<&[f32], ModelError> {
        if let Some(rows) = self.device_logit_rows {
            self.copy_logits_to_host(rows)?;
            self.device_logit_rows = None;
        }
        Ok(&self.host.logits)
    }

    fn weight_bytes_per_token(&self) -> usize {
        self.weights.decode_bytes()
    }

    fn device_label(&self) -> String {
        let d = &self.device;
        let mut s = format!("cuda:{} {}, {} weights", d.ordinal(), d.name(), self.weights.dtype.name());
        if let Some(name) = &self.synthetic {
            s.push_str(&format!(", synthetic:{name} (random weights, not a real model)"));
        }
        s
    }
}

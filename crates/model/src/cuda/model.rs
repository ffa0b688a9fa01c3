//! [`CudaModel`]: the GPU model — its weights, kernels, buffers and captured graphs on one
//! device — and its [`Forward`] implementation. A step ([`CudaModel::forward_device`]) stages
//! the batch's small arrays (context lengths, block tables, logit rows, prefill tiles), uploads
//! them, fixes the launch shape ([`Step`]) and runs it through the graph cache ([`Graphs`]).

use std::sync::Arc;

use kvcache::{AttentionRoute, CacheConfig, KvFormat, KvPool};
use pagekv_cuda::{
    CudaDevice, DType, DecodeAttention, DecodeRoute, DevicePages, ModelOps, PrefillAttention, RopeParams,
};

use super::buffers::{dev, drv};
use super::graphs::{GraphKey, Graphs};
use super::scratch::{DeviceScratch, HostScratch};
use super::step::{enqueue, DecodeRows, Step};
use super::top_k::DeviceTopK;
use super::weights::{DeviceWeights, GpuWeights, Weight};
use crate::backend::Forward;
use crate::batch::{Batch, Logits};
use crate::error::ModelError;
use crate::llama::{Model, ModelConfig, RopeStyle};

/// A llama-family model on one GPU.
pub struct CudaModel {
    pub config: ModelConfig,
    device: Arc<CudaDevice>,
    ops: ModelOps,
    attention: DecodeAttention,
    prefill: PrefillAttention,
    weights: DeviceWeights,
    /// RoPE of the layers without a window of their own and of those with one.
    rope: RopeParams,
    rope_local: RopeParams,
    scratch: DeviceScratch,
    host: HostScratch,
    /// `Some(name)` for random weights (`synthetic:NAME`).
    synthetic: Option<String>,
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

    /// The weights of a loaded (CPU) model uploaded to `device`: kept in their GGUF types
    /// ([`GpuWeights::Gguf`]) or dequantized to a dense type (a [`DType`] converts).
    pub fn from_model(
        model: &Model,
        device: Arc<CudaDevice>,
        format: impl Into<GpuWeights>,
    ) -> Result<CudaModel, ModelError> {
        let ops = ModelOps::new(device.clone()).map_err(dev)?;
        let weights = DeviceWeights::upload(&device, &model.weights, &model.config, format.into())?;
        CudaModel::assemble(model.config.clone(), device, ops, weights, None)
    }

    /// The model around its weights on `device`, with the device's tuning (`CudaTuning`:
    /// graphs, the fused products' size cap, programmatic launches of the attention).
    pub(super) fn assemble(
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
        if c.layer_windows.len() != c.num_layers {
            return Err(ModelError::Invalid(format!(
                "{} layer windows for {} layers",
                c.layer_windows.len(),
                c.num_layers
            )));
        }
        // The RoPE of the layers without a window of their own, and of those with one (Gemma 3's
        // local layers: `rope_base_local`), with the angles' ratio computed as the CPU's `Rope`.
        let rope_with_base = |base: f32| RopeParams {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            rope_dims: c.rope_dims,
            neox: c.rope_style == RopeStyle::Neox,
            theta_scale: base.powf(-2.0 / c.rope_dims as f32),
            freq_scale: 1.0 / c.rope_linear_scale,
            eps: c.rms_eps,
            q_round: 0,
            q_scale: if c.scale_queries { c.attn_scale } else { 1.0 },
        };
        let (rope, rope_local) = (rope_with_base(c.rope_base), rope_with_base(c.rope_base_local));
        let top_k = DeviceTopK::new(device.clone())?;
        device.synchronize().map_err(dev)?;
        let tuning = device.tuning();
        let mut attention = DecodeAttention::new(device.clone());
        // The step's cache write and tensor-core decode kernel are programmatic dependent
        // launches (`CudaTuning::attention_pdl`).
        attention.set_programmatic(tuning.attention_pdl);
        let graphs = Graphs::new(tuning.graphs);
        Ok(CudaModel {
            attention,
            prefill: PrefillAttention::new(device.clone()),
            rope,
            rope_local,
            scratch: DeviceScratch::default(),
            host: HostScratch::default(),
            config,
            device,
            ops,
            weights,
            synthetic,
            graphs,
            top_k,
            device_logit_rows: None,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The products' dense input type (the weights' type unless they are quantized).
    pub fn dtype(&self) -> DType {
        self.weights.dtype
    }

    /// `gguf` when matrices are kept quantized, else the dense type's name.
    pub fn weights_name(&self) -> &'static str {
        if self.weights.quantized() {
            "gguf"
        } else {
            self.weights.dtype.name()
        }
    }

    /// `Some(name)` when the weights are random (`synthetic:NAME`), not a model.
    pub fn synthetic_name(&self) -> Option<&str> {
        self.synthetic.as_deref()
    }

    /// Device pages for `cache` (geometry from the model).
    pub fn new_device_pool(&self, cache: CacheConfig) -> Result<KvPool<DevicePages>, ModelError> {
        let mut pages = DevicePages::new(self.device.clone(), kvcache::geometry_of(&cache)).map_err(dev)?;
        // The step writes the cache from the QKV kernel's results, slots uploaded beforehand.
        pages.set_programmatic_writes(self.device.tuning().attention_pdl);
        Ok(KvPool::with_store(cache, pages)?)
    }

    /// Seconds to read every weight matrix once (the weight traffic of one decode step, nothing
    /// computed): the median of `runs`. Its inverse is the decode roofline in tokens/s.
    pub fn weight_read_seconds(&self, runs: usize) -> Result<f64, ModelError> {
        let (mut dense, mut quant) = (Vec::new(), Vec::new());
        for w in self.weights.streamed() {
            match w {
                Weight::Dense(m) => dense.push(m),
                Weight::Quant(parts) => quant.extend(parts),
            }
        }
        let mut times = Vec::with_capacity(runs.max(1));
        for i in 0..runs.max(1) + 1 {
            self.device.synchronize().map_err(dev)?;
            let t = std::time::Instant::now();
            self.ops.read_all(&dense, &quant).map_err(dev)?;
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
        batch.validate(&self.config, pool.geometry(), pool.groups())?;
        let c = &self.config;
        let n = batch.num_tokens();
        let n_logits = batch.num_logit_rows();
        // Layer groups (`kvcache::LayerGroups`): each has its own slots and block tables.
        let ng = pool.groups().num_groups();
        let longest = |sq: &crate::batch::BatchSeq| sq.block_tables.iter().map(Vec::len).max().unwrap_or(0);
        let blocks = batch.seqs.iter().map(longest).max().unwrap_or(1).max(1);
        let dtype = self.weights.dtype;
        let (s, mb, scratch_generation) = self.scratch.ensure(&self.device, c, dtype, n, n_logits, blocks, ng)?;

        // The step's small arrays: per token its context (position + 1) and, per group, its
        // sequence's block table (a sliding group's reclaimed entries stay NULL_BLOCK: they lie
        // before the window, where the kernels do not read); the token index of each logit row.
        let host = &mut self.host;
        host.ctx.clear();
        host.ctx.extend(batch.positions.iter().map(|&p| p + 1));
        host.tables.clear();
        host.rows.clear();
        for g in 0..ng {
            for seq in &batch.seqs {
                let table = &seq.block_tables[g];
                for _ in 0..seq.num_tokens {
                    host.tables.extend_from_slice(table);
                    host.tables.extend(std::iter::repeat_n(0, mb - table.len()));
                }
            }
        }
        for seq in &batch.seqs {
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
        // Batch-invariant: every row on the decode kernel (the prefill kernel's tiles sum a row
        // differently from a decode step's).
        let min_tokens = match self.device.tuning().batch_invariant {
            true => usize::MAX,
            false => self.device.tuning().prefill_min_tokens,
        };
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
        stream.memcpy_htod(&host.ctx, &mut s.ctx.slice_mut(..n)).map_err(&up)?;
        for g in 0..ng {
            stream.memcpy_htod(&batch.slots[g], &mut s.slots[g].slice_mut(..n)).map_err(&up)?;
            let tables = &host.tables[g * n * mb..(g + 1) * n * mb];
            stream.memcpy_htod(tables, &mut s.tables[g].slice_mut(..n * mb)).map_err(&up)?;
        }
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
        // The K·Q product sees q at the cache's precision, as on the CPU.
        let q_round = match pool.config().format {
            KvFormat::F16 => 1,
            KvFormat::Bf16 => 2,
            _ => 0,
        };
        let (mut rope, mut rope_local) = (self.rope, self.rope_local);
        (rope.q_round, rope_local.q_round) = (q_round, q_round);
        // The partition grid is sized for the longest context rounded up to 256 tokens (rows
        // shorter than it skip the partitions past their end), so consecutive decode steps
        // share one launch shape — and one captured graph. Layers with a window of their own see
        // at most the widest such window: their route is chosen for that span.
        let max_ctx = max_ctx.next_multiple_of(256).min(mb * pool.geometry().block_size).max(max_ctx);
        let route = self.attention.auto_route(pool.pages(), c.num_heads, n, max_ctx);
        let route_local = match c.layer_windows.iter().flatten().max() {
            Some(&w) => self.attention.auto_route(pool.pages(), c.num_heads, n, w.min(max_ctx).max(1)),
            None => route,
        };
        if decode_rows != DecodeRows::None {
            for w in &c.layer_windows {
                pool.counters().count_route(match if w.is_some() { route_local } else { route } {
                    DecodeRoute::Primitive => AttentionRoute::Primitive,
                    DecodeRoute::Partitioned { .. } => AttentionRoute::Partitioned,
                });
            }
        }
        let st = Step {
            n,
            n_logits,
            mb,
            max_ctx,
            route,
            route_local,
            window: batch.sliding_window,
            rope,
            rope_local,
            scale: if c.scale_queries { 1.0 } else { c.attn_scale },
            gemv_max_bytes: self.device.tuning().gemv_max_bytes,
            invariant: self.device.tuning().batch_invariant,
            prefill_tiles,
            decode_rows,
            qkv_write: self.device.tuning().qkv_write,
        };
        let key = GraphKey::new(&st, pool.pages().id());
        let generation = (scratch_generation, self.attention.generation());
        let (w, attention, prefill) = (&self.weights, &mut self.attention, &mut self.prefill);
        self.graphs.run(&self.device, key, generation, || enqueue(ops, w, attention, prefill, s, pool, c, &st))?;
        Ok(n_logits)
    }
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
        if !self.top_k.serves(rows, vocab, k) {
            // Sizes the kernel does not serve (k past TOP_K_MAX, vocabularies past its merge):
            // the host rule over the full rows.
            let logits = self.fetch_logits()?;
            for row in logits.chunks_exact(vocab) {
                crate::backend::top_k(row, k, ids, values);
            }
            return Ok(());
        }
        let s = self.scratch.bufs.as_ref().expect("allocated by forward_device");
        self.top_k.select(&s.logits, rows, vocab, k, ids, values)?;
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
        let mut s = format!("cuda:{} {}, {} weights", d.ordinal(), d.name(), self.weights_name());
        if let Some(name) = &self.synthetic {
            s.push_str(&format!(", synthetic:{name} (random weights, not a real model)"));
        }
        s
    }
}

//! The model's tensors as typed references into the mapped GGUF file: a [`Tensor`] names where
//! its bytes lie and [`Weights::view`] borrows them for a kernel.
//!
//! The matrices a decode step streams are read once, at load, from the file into memory backed
//! by transparent huge pages ([`Resident`]): the page cache behind the mapping uses 4 KiB pages,
//! and a step that reads ~100 MB through them pays a TLB miss every 4 KiB. A background thread
//! reads them with `pread` while the model already runs from the mapping, and each tensor's
//! mapped pages are dropped once its copy is in place, so the model costs its bytes once.
//! The copy is skipped
//! when it would take more than a quarter of the available memory, or when the caller's
//! [`LoadOptions::copy_weights`] is off (`PAGEKV_COPY_WEIGHTS=0`); the kernels then read the
//! mapping.
//!
//! Where the CPU has the AVX-512 Q4_K kernels, the copy of a Q4_K matrix is stored with its rows
//! interleaved in groups of 16 ([`RowLayout::Q4kX16`]), which those kernels read without
//! transposing rows in registers (decode about twice as fast per byte in cache). Products give
//! the same bits in either layout. [`Weights::view`] hands the kernels whichever layout is
//! current; [`Weights::bytes`] and [`Weights::file_view`] always give the file's rows (the
//! GPU upload and dequantizing read those). The tied token embedding stays in rows, since a
//! lookup reads single rows of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use pagekv_cpu::quant::hugepage::HugePageBuf;
use pagekv_cpu::quant::interleave::{interleavable, interleave};
use pagekv_cpu::quant::{Isa, RowLayout, WeightType, WeightView};

use super::config::{Architecture, ModelConfig};
use crate::error::ModelError;
use crate::gguf::GgufFile;

/// How the weights are loaded; the caller decides (the binary from `PAGEKV_COPY_WEIGHTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Copy the streamed matrices into huge pages at load (faster decode, slower load).
    pub copy_weights: bool,
    /// In that copy, interleave Q4_K matrices' rows in groups of 16 where the CPU has the
    /// kernels for it (AVX-512 VNNI); the same results, faster products.
    pub interleave_q4k: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { copy_weights: true, interleave_q4k: true }
    }
}

/// The environment variable [`LoadOptions::from_lookup`] reads for `copy_weights`.
pub const COPY_WEIGHTS_ENV: &str = "PAGEKV_COPY_WEIGHTS";
/// The developer switch [`LoadOptions::from_lookup`] reads for `interleave_q4k`.
pub const INTERLEAVE_Q4K_ENV: &str = "PAGEKV_DEV_INTERLEAVE_Q4K";

impl LoadOptions {
    /// The options named by `PAGEKV_COPY_WEIGHTS` and `PAGEKV_DEV_INTERLEAVE_Q4K` (booleans:
    /// 1/0/true/false/on/off/yes/no) in `lookup`, the defaults where unset. Pure: the caller
    /// supplies the variables.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<LoadOptions, kvcache::ConfigError> {
        let mut o = LoadOptions::default();
        if let Some(v) = lookup(COPY_WEIGHTS_ENV) {
            o.copy_weights = kvcache::config::parse_bool(&v, COPY_WEIGHTS_ENV)?;
        }
        if let Some(v) = lookup(INTERLEAVE_Q4K_ENV) {
            o.interleave_q4k = kvcache::config::parse_bool(&v, INTERLEAVE_Q4K_ENV)?;
        }
        Ok(o)
    }
}

/// A matrix `[rows, cols]` (GGUF dims `[cols, rows]`) or a vector (`rows = 1`).
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub ty: WeightType,
    pub rows: usize,
    pub cols: usize,
    /// Index into the file's tensor table.
    index: usize,
    len: usize,
}

/// Per-layer tensors. Shapes: `[rows, cols]` as multiplied (`out = W · x`).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Tensor,      // [1, hidden] f32
    pub wq: Tensor,             // [q_dim, hidden]
    pub wk: Tensor,             // [kv_dim, hidden]
    pub wv: Tensor,             // [kv_dim, hidden]
    pub wo: Tensor,             // [hidden, q_dim]
    pub bq: Option<Tensor>,     // [1, q_dim] (qwen2)
    pub bk: Option<Tensor>,     // [1, kv_dim]
    pub bv: Option<Tensor>,     // [1, kv_dim]
    pub q_norm: Option<Tensor>, // [1, head_dim] (qwen3)
    pub k_norm: Option<Tensor>, // [1, head_dim]
    /// Gemma 3: RMSNorm of the attention output before the residual add.
    pub post_attn_norm: Option<Tensor>, // [1, hidden]
    pub ffn_norm: Tensor,       // [1, hidden]
    /// Gemma 3: RMSNorm of the MLP output before the residual add.
    pub post_ffn_norm: Option<Tensor>, // [1, hidden]
    pub w_gate: Tensor,         // [ffn, hidden]
    pub w_up: Tensor,           // [ffn, hidden]
    pub w_down: Tensor,         // [hidden, ffn]
}

pub struct Weights {
    file: Arc<GgufFile>,
    /// Copies of the matrices in huge pages, if made (filled in the background, see
    /// [`Resident`]).
    resident: Option<Arc<Resident>>,
    pub token_embd: Tensor,  // [vocab, hidden]
    pub output_norm: Tensor, // [1, hidden]
    /// `[vocab, hidden]`; the token embedding when the model ties them.
    pub output: Tensor,
    pub tied_embeddings: bool,
    /// `[1, rope_dims / 2]` frequency divisors (Llama 3.1 `rope_freqs.weight`), if present.
    pub rope_freqs: Option<Tensor>,
    pub layers: Vec<LayerWeights>,
    /// `[ModelConfig::mtp_layers]` the next-token-prediction layers (read from the mapping,
    /// never copied: only the drafter reads them).
    pub mtp: Vec<MtpLayerWeights>,
}

/// One next-token-prediction (MTP, DeepSeek-V3's "nextn") layer: a transformer block of the
/// main architecture and the tensors that feed it and read it out. For position `t` it takes the
/// main model's last hidden state `h_t` and the next token's embedding `e_{t+1}`:
/// `x = eh_proj · [enorm(e_{t+1}), hnorm(h_t)]`, the block, then `shared_head_norm` and the head
/// give the logits of token `t + 2`.
#[derive(Clone, Debug)]
pub struct MtpLayerWeights {
    pub block: LayerWeights,
    pub eh_proj: Tensor,          // [hidden, 2 * hidden]: the embedding half first
    pub enorm: Tensor,            // [1, hidden] f32
    pub hnorm: Tensor,            // [1, hidden] f32
    pub shared_head_norm: Tensor, // [1, hidden] f32
    /// `[vocab, hidden]`, else the model's output matrix.
    pub head: Option<Tensor>,
    /// `[vocab, hidden]`, else the model's token embedding.
    pub embed: Option<Tensor>,
}

impl Weights {
    /// Loads with the default [`LoadOptions`].
    pub fn load(file: Arc<GgufFile>, c: &ModelConfig) -> Result<Weights, ModelError> {
        Weights::load_with(file, c, LoadOptions::default())
    }

    /// Loads the tensors `c` names from `file`, as `options` say.
    pub fn load_with(file: Arc<GgufFile>, c: &ModelConfig, options: LoadOptions) -> Result<Weights, ModelError> {
        let get = |name: &str, rows: usize, cols: usize| tensor(&file, name, rows, cols);
        let opt = |name: &str, rows: usize, cols: usize| -> Result<Option<Tensor>, ModelError> {
            if file.tensor(name).is_some() {
                Ok(Some(tensor(&file, name, rows, cols)?))
            } else {
                Ok(None)
            }
        };
        let h = c.hidden;
        let token_embd = get("token_embd.weight", c.vocab_size, h)?;
        let output = opt("output.weight", c.vocab_size, h)?;
        let tied_embeddings = output.is_none();
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            layers.push(layer(&file, c, i)?);
        }
        // The next-token-prediction layers follow the main ones.
        let mut mtp = Vec::with_capacity(c.mtp_layers);
        for i in c.num_layers..c.num_layers + c.mtp_layers {
            let n = |s: &str| format!("blk.{i}.nextn.{s}");
            mtp.push(MtpLayerWeights {
                block: layer(&file, c, i)?,
                eh_proj: get(&n("eh_proj.weight"), h, 2 * h)?,
                enorm: get(&n("enorm.weight"), 1, h)?,
                hnorm: get(&n("hnorm.weight"), 1, h)?,
                shared_head_norm: get(&n("shared_head_norm.weight"), 1, h)?,
                head: opt(&n("shared_head_head.weight"), c.vocab_size, h)?,
                embed: opt(&n("embed_tokens.weight"), c.vocab_size, h)?,
            });
        }
        let mtp_norms = mtp.iter().flat_map(|m| {
            [Some(&m.block.attn_norm), Some(&m.block.ffn_norm), m.block.post_attn_norm.as_ref()]
                .into_iter()
                .chain([m.block.post_ffn_norm.as_ref(), Some(&m.enorm), Some(&m.hnorm), Some(&m.shared_head_norm)])
                .flatten()
        });
        let norms = layers.iter().flat_map(|l| {
            [Some(&l.attn_norm), Some(&l.ffn_norm), l.post_attn_norm.as_ref(), l.post_ffn_norm.as_ref()]
                .into_iter()
                .flatten()
        });
        for (t, what) in norms.chain(mtp_norms).map(|t| (t, "norm")) {
            if t.ty != WeightType::F32 {
                return Err(ModelError::Tensor {
                    name: t.name.clone(),
                    reason: format!("{what} weights must be F32, found {:?}", t.ty),
                });
            }
        }
        let mut weights = Weights {
            output_norm: get("output_norm.weight", 1, h)?,
            output: output.unwrap_or_else(|| token_embd.clone()),
            rope_freqs: opt("rope_freqs.weight", 1, c.rope_dims / 2)?,
            token_embd,
            tied_embeddings,
            layers,
            mtp,
            file,
            resident: None,
        };
        if options.copy_weights {
            // The layout is fixed for the process: the kernels it needs are those of the best
            // instruction set, which every product of the model uses.
            let interleave = options.interleave_q4k && Isa::best() == Isa::Avx512Vnni;
            weights.resident = Resident::start(&weights, interleave);
        }
        Ok(weights)
    }

    /// The matrices in the order a forward pass reads them (each tensor once).
    fn streamed(&self) -> Vec<&Tensor> {
        let mut v: Vec<&Tensor> = Vec::new();
        for l in &self.layers {
            v.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        v.push(&self.output);
        v
    }

    /// Whether the streamed matrices are (or are being) copied into huge pages.
    pub fn is_resident(&self) -> bool {
        self.resident.is_some()
    }

    /// Blocks until the background copy into huge pages (if any) is complete, so a benchmark
    /// measures the steady state. The model is correct before it too.
    pub fn wait_until_resident(&self) {
        if let Some(r) = &self.resident {
            r.wait();
        }
    }

    /// `t` as a kernel operand: its copy once complete (interleaved or not), else the mapping.
    pub fn view(&self, t: &Tensor) -> WeightView<'_> {
        let (data, layout) = match self.resident.as_ref().and_then(|r| r.get(t.index, t.len)) {
            Some(copy) => copy,
            None => (self.mapped(t), RowLayout::Rows),
        };
        WeightView { ty: t.ty, rows: t.rows, cols: t.cols, data, layout }
    }

    /// `t`'s bytes as the file lays them out (row after row), whatever layout the kernels read.
    pub fn bytes(&self, t: &Tensor) -> &[u8] {
        match self.resident.as_ref().and_then(|r| r.get(t.index, t.len)) {
            Some((copy, RowLayout::Rows)) => copy,
            _ => self.mapped(t),
        }
    }

    /// [`Weights::bytes`] as a view of plain rows (for reading single rows).
    pub fn file_view(&self, t: &Tensor) -> WeightView<'_> {
        WeightView { ty: t.ty, rows: t.rows, cols: t.cols, data: self.bytes(t), layout: RowLayout::Rows }
    }

    fn mapped(&self, t: &Tensor) -> &[u8] {
        self.file.tensor_data(&self.file.tensors()[t.index])
    }

    /// An F32 vector tensor's values.
    pub fn f32s(&self, t: &Tensor) -> &[f32] {
        debug_assert_eq!(t.ty, WeightType::F32);
        bytemuck::cast_slice(self.bytes(t))
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The file the weights are read from, shared (another view of the same model, such as a
    /// drafter over its next-token-prediction layers, maps no second copy).
    pub fn shared_file(&self) -> Arc<GgufFile> {
        self.file.clone()
    }

    /// Replaces every matrix by its f32 dequantization (the embedding included), so matrix
    /// products run on f32 activations without the 8-bit activation quantization the
    /// quantized kernels use. The values are exactly the model's weights; only the arithmetic
    /// gets more precise (and 4–8× more bytes per token). `pagekv eval --exact-weights` uses it
    /// to measure a KV format's error apart from the model's own rounding noise.
    pub fn dequantize_to_f32(&mut self) -> Result<(), ModelError> {
        let mut offsets = vec![None; self.file.tensors().len()];
        let mut len = 0usize;
        let mut copies: Vec<Tensor> = Vec::new();
        for t in self.streamed().into_iter().chain([&self.token_embd]) {
            if offsets[t.index].is_none() {
                offsets[t.index] = Some(len);
                copies.push(t.clone());
                len = (len + t.rows * t.cols * 4).next_multiple_of(Resident::ALIGN);
            }
        }
        if available_memory().is_some_and(|avail| len > avail / 2) {
            return Err(ModelError::Invalid(format!(
                "dequantizing the weights to f32 needs {} MiB, more than half of the available memory",
                len >> 20
            )));
        }
        let mut buf = HugePageBuf::zeroed(len)
            .map_err(|e| ModelError::Invalid(format!("cannot allocate {} MiB for f32 weights: {e}", len >> 20)))?;
        let dst = buf.as_mut_slice();
        let mut row = Vec::new();
        for t in &copies {
            let off = offsets[t.index].expect("laid out above");
            let src = self.bytes(t);
            let row_bytes = t.len / t.rows;
            row.resize(t.cols, 0.0f32);
            // `[rows, cols]` f32, row after row.
            let out = &mut dst[off..off + t.rows * t.cols * 4];
            for (r, o) in out.chunks_exact_mut(t.cols * 4).enumerate() {
                pagekv_cpu::quant::reference::dequantize_row(t.ty, &src[r * row_bytes..(r + 1) * row_bytes], &mut row)
                    .map_err(|e| ModelError::Tensor { name: t.name.clone(), reason: e.to_string() })?;
                o.copy_from_slice(bytemuck::cast_slice(&row));
            }
        }
        let to_f32 = |t: &mut Tensor| {
            t.ty = WeightType::F32;
            t.len = t.rows * t.cols * 4;
        };
        for l in &mut self.layers {
            for t in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.w_gate, &mut l.w_up, &mut l.w_down] {
                to_f32(t);
            }
        }
        to_f32(&mut self.output);
        to_f32(&mut self.token_embd);
        let ready = offsets.iter().map(|o| AtomicBool::new(o.is_some())).collect();
        let layouts = vec![RowLayout::Rows; offsets.len()];
        self.resident =
            Some(Arc::new(Resident { buf, offsets, layouts, ready, done: (Mutex::new(true), Condvar::new()) }));
        Ok(())
    }

    /// Bytes a decode step reads from the weights (every matrix once, the embedding row aside).
    pub fn decode_bytes(&self) -> usize {
        let mut total = self.output.len;
        for l in &self.layers {
            total += [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down].iter().map(|t| t.len).sum::<usize>();
        }
        total
    }
}

/// The streamed matrices copied into one huge-page buffer, laid out in reading order.
///
/// Faulting in huge pages is slow on some hosts (seconds per GB under virtualization), so the
/// copy is made by a background thread while the model already runs from the mapping: each
/// tensor switches to its copy once it is complete (`ready`, release/acquire), and the
/// mapping's pages of that tensor are then dropped, so at any time each byte is held about
/// once. The data is the same either way, so results do not depend on when a tensor switches.
struct Resident {
    buf: HugePageBuf,
    /// Per tensor of the file (by index): where its copy starts in `buf`, if it has one.
    offsets: Vec<Option<usize>>,
    /// Per tensor of the file: how its copy's rows lie.
    layouts: Vec<RowLayout>,
    /// Per tensor of the file: whether its copy is complete and may be read.
    ready: Vec<AtomicBool>,
    /// Whether the whole copy has finished (with or without errors), and its signal.
    done: (Mutex<bool>, Condvar),
}

impl Resident {
    /// Alignment of each copied tensor (a cache line).
    const ALIGN: usize = 64;

    /// The copy of tensor `index` (`len` bytes) and its layout, once it is complete.
    fn get(&self, index: usize, len: usize) -> Option<(&[u8], RowLayout)> {
        let off = self.offsets[index]?;
        // Acquire: the filler's writes to these bytes happen before this read.
        self.ready[index].load(Ordering::Acquire).then(|| (&self.buf.as_slice()[off..off + len], self.layouts[index]))
    }

    fn wait(&self) {
        let (lock, signal) = &self.done;
        let mut done = lock.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = signal.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lays out the copy and starts the thread that fills it, with the Q4_K matrices
    /// interleaved if `interleave_q4k` (all but the token embedding, whose rows a lookup
    /// reads); `None` when it is too large for the available memory or the buffer cannot be
    /// allocated (the model then reads the mapping, as with `copy_weights` off).
    fn start(w: &Weights, interleave_q4k: bool) -> Option<Arc<Resident>> {
        let mut offsets = vec![None; w.file.tensors().len()];
        let mut layouts = vec![RowLayout::Rows; w.file.tensors().len()];
        let mut order = Vec::new();
        let mut len = 0;
        for t in w.streamed() {
            if offsets[t.index].is_none() {
                offsets[t.index] = Some(len);
                order.push(t.clone());
                len = (len + t.len).next_multiple_of(Self::ALIGN);
                if interleave_q4k && t.index != w.token_embd.index && interleavable(t.ty, t.rows, t.cols) {
                    layouts[t.index] = RowLayout::Q4kX16;
                }
            }
        }
        if len == 0 || available_memory().is_none_or(|avail| len > avail / 4) {
            return None;
        }
        let buf = HugePageBuf::zeroed(len).ok()?;
        let ready = offsets.iter().map(|_| AtomicBool::new(false)).collect();
        let resident = Arc::new(Resident { buf, offsets, layouts, ready, done: (Mutex::new(false), Condvar::new()) });
        let (r, file) = (resident.clone(), w.file.clone());
        let spawned = std::thread::Builder::new().name("pagekv-weights".into()).spawn(move || r.fill(&file, &order));
        if spawned.is_err() {
            return None;
        }
        Some(resident)
    }

    /// Copies the tensors in `order` from `file` (read with `pread`, never through the
    /// mapping), interleaving those laid out so, publishing each when complete. A tensor that
    /// cannot be read stays on the mapping (logged); the model is correct either way.
    fn fill(&self, file: &GgufFile, order: &[Tensor]) {
        for t in order {
            let index = t.index;
            let info = &file.tensors()[index];
            let off = self.offsets[index].expect("laid out in start");
            // SAFETY: tensor copies occupy disjoint ranges of the buffer, this thread alone
            // writes them, and nobody reads this range before `ready[index]` is set below.
            let dst = unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().add(off), info.n_bytes as usize) };
            let copied = file.read_tensor_data(info, 0, dst).map_err(|e| e.to_string()).and_then(|()| {
                if self.layouts[index] == RowLayout::Rows {
                    return Ok(());
                }
                interleave(dst, t.ty, t.rows, t.cols).map_err(|e| e.to_string())
            });
            match copied {
                Ok(()) => {
                    self.ready[index].store(true, Ordering::Release);
                    file.release_tensor_pages(info);
                }
                Err(e) => tracing::warn!(tensor = %info.name, "weights stay on the file mapping: {e}"),
            }
        }
        let (lock, signal) = &self.done;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        signal.notify_all();
    }
}

/// The block tensors of layer `i` (`blk.{i}.*`) as `c`'s architecture has them.
fn layer(file: &GgufFile, c: &ModelConfig, i: usize) -> Result<LayerWeights, ModelError> {
    let get = |name: &str, rows: usize, cols: usize| tensor(file, name, rows, cols);
    let opt = |name: &str, rows: usize, cols: usize| -> Result<Option<Tensor>, ModelError> {
        if file.tensor(name).is_some() {
            Ok(Some(tensor(file, name, rows, cols)?))
        } else {
            Ok(None)
        }
    };
    let (h, q, kv, f, d) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn, c.head_dim);
    let n = |s: &str| format!("blk.{i}.{s}");
    // Qwen 3 and Gemma 3 always normalize q and k per head; Gemma 3 also normalizes the
    // attention and MLP outputs.
    let qk_norms = matches!(c.architecture, Architecture::Qwen3 | Architecture::Gemma3);
    let gemma3 = c.architecture == Architecture::Gemma3;
    let post = |name: &str| -> Result<Option<Tensor>, ModelError> {
        if gemma3 {
            Ok(Some(get(&n(name), 1, h)?))
        } else {
            Ok(None)
        }
    };
    Ok(LayerWeights {
        attn_norm: get(&n("attn_norm.weight"), 1, h)?,
        wq: get(&n("attn_q.weight"), q, h)?,
        wk: get(&n("attn_k.weight"), kv, h)?,
        wv: get(&n("attn_v.weight"), kv, h)?,
        wo: get(&n("attn_output.weight"), h, q)?,
        bq: opt(&n("attn_q.bias"), 1, q)?,
        bk: opt(&n("attn_k.bias"), 1, kv)?,
        bv: opt(&n("attn_v.bias"), 1, kv)?,
        q_norm: if qk_norms {
            Some(get(&n("attn_q_norm.weight"), 1, d)?)
        } else {
            opt(&n("attn_q_norm.weight"), 1, d)?
        },
        k_norm: if qk_norms {
            Some(get(&n("attn_k_norm.weight"), 1, d)?)
        } else {
            opt(&n("attn_k_norm.weight"), 1, d)?
        },
        post_attn_norm: post("post_attention_norm.weight")?,
        ffn_norm: get(&n("ffn_norm.weight"), 1, h)?,
        post_ffn_norm: post("post_ffw_norm.weight")?,
        w_gate: get(&n("ffn_gate.weight"), f, h)?,
        w_up: get(&n("ffn_up.weight"), f, h)?,
        w_down: get(&n("ffn_down.weight"), h, f)?,
    })
}

/// `MemAvailable` of /proc/meminfo in bytes (Linux), `None` where unknown.
fn available_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn tensor(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Tensor, ModelError> {
    let index = file
        .tensors()
        .iter()
        .position(|t| t.name == name)
        .ok_or_else(|| ModelError::Tensor { name: name.into(), reason: "missing".into() })?;
    let info = &file.tensors()[index];
    let bad = |reason: String| ModelError::Tensor { name: name.into(), reason };
    let ty = WeightType::from_ggml_id(info.ggml_type.id()).map_err(|e| bad(e.to_string()))?;
    let dims: Vec<u64> = info.dims.iter().copied().filter(|&d| d != 1).collect();
    let want: Vec<u64> = [cols as u64, rows as u64].into_iter().filter(|&d| d != 1).collect();
    if dims != want {
        return Err(bad(format!("shape {:?}, expected [{cols}, {rows}]", info.dims)));
    }
    let row_bytes = ty.row_bytes(cols).map_err(|e| bad(e.to_string()))?;
    let len = row_bytes * rows;
    if len as u64 != info.n_bytes {
        return Err(bad(format!("{} bytes, expected {len}", info.n_bytes)));
    }
    if ty == WeightType::F32 && !(file.tensor_data(info).as_ptr() as usize).is_multiple_of(4) {
        return Err(bad("F32 data is not 4-byte aligned".into()));
    }
    Ok(Tensor { name: name.into(), ty, rows, cols, index, len })
}

#[cfg(test)]
mod load_options_tests {
    use super::LoadOptions;

    fn with(v: Option<&str>) -> impl Fn(&str) -> Option<String> + '_ {
        move |name| if name == "PAGEKV_COPY_WEIGHTS" { v.map(str::to_string) } else { None }
    }

    #[test]
    fn copy_weights_follows_the_boolean_grammar() {
        assert!(LoadOptions::from_lookup(with(None)).unwrap().copy_weights);
        for (text, want) in [("1", true), ("0", false), (" Off ", false), ("YES", true), ("no", false), ("true", true)]
        {
            assert_eq!(LoadOptions::from_lookup(with(Some(text))).unwrap().copy_weights, want, "{text:?}");
        }
        let msg = LoadOptions::from_lookup(with(Some("maybe"))).unwrap_err().to_string();
        for word in ["PAGEKV_COPY_WEIGHTS", "maybe", "true", "off", "yes"] {
            assert!(msg.contains(word), "{msg}");
        }
    }

    #[test]
    fn interleave_q4k_follows_its_switch() {
        let lookup = |v: &'static str| move |name: &str| (name == "PAGEKV_DEV_INTERLEAVE_Q4K").then(|| v.to_string());
        assert!(LoadOptions::from_lookup(|_| None).unwrap().interleave_q4k);
        assert!(!LoadOptions::from_lookup(lookup("off")).unwrap().interleave_q4k);
        assert!(LoadOptions::from_lookup(lookup("1")).unwrap().interleave_q4k);
        let msg = LoadOptions::from_lookup(lookup("sometimes")).unwrap_err().to_string();
        assert!(msg.contains("PAGEKV_DEV_INTERLEAVE_Q4K") && msg.contains("sometimes"), "{msg}");
    }
}

//! The decode-attention benchmark: [`bench_attention`] times both routes for every format on
//! scattered pages, plus roofline rows measured in the same run: a sequential read kernel and a
//! device-to-device copy over the bf16 byte count, and a paged read (`roofline-paged-h1`, the
//! exact rows a decode reads, in the same scattered order, nothing computed).
//!
//! Method: pages are filled on the device with valid random codes (never zeros); each
//! sequence's blocks are a random permutation of the pool; every timed run uses a different
//! copy of the KV (rotating over at least `min_footprint_bytes`, several times the L2) so small
//! cases are not measured from cache; runs are queued back to back with a CUDA event between
//! consecutive runs (attention + merge inside each interval) and the median of `runs` intervals
//! after `warmup` is reported. Effective bandwidth = KV bytes of one layer (codes + scales) ÷ time.
//! Before each row the device idles `cooldown_ms`, and each row records the SM clock averaged
//! over its timed runs (`sm_mhz`), so a row slowed by the power cap shows as such.
//!
//! Used by `pagekv bench attention --device cuda --json` and `examples/bench_attention.rs`:
//! `bench_attention(&CudaDevice::new(0, tuning)?, &BenchConfig::default())` → rows → [`Row::to_json`].

use std::sync::Arc;

use cudarc::driver::{result, sys::CUevent_flags, CudaSlice, LaunchConfig, PushKernelArg};
use kvcache::{KvFormat, PageGeometry, PageStore};

use crate::attention::{DecodeAttention, DecodeBatch, DecodeKernel, DecodeRoute};
use crate::device::CudaDevice;
use crate::pages::{dptr, DevicePages};
use crate::spec::ModuleSpec;
use crate::tuning::DecodeGrid;
use crate::CudaError;

/// One measured configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `primitive`, `partitioned` (`-simt` suffix: the SIMT kernel forced), `roofline-read`,
    /// `roofline-copy`, `roofline-paged-h1`, `roofline-paged-h8`.
    pub impl_name: String,
    /// KV format name (`-` for roofline rows).
    pub format: String,
    pub batch: usize,
    pub context: usize,
    /// Median kernel time, milliseconds (`us` in the JSON is the same in microseconds).
    pub ms: f64,
    /// KV bytes one call reads (codes + scales, one layer); for roofline rows the bytes of the
    /// bf16 KV of the same shape.
    pub kv_bytes: usize,
    /// GB/s: `kv_bytes / ms` (the copy row counts bytes read + written).
    pub gbps: f64,
    /// Partition size of the partitioned route (0 otherwise).
    pub partition_size: usize,
    /// SM 0's cycles per microsecond over the row's timed runs (its cycle counter against the
    /// global timer), a comparative clock: on the H200 it reads 5–10 % under the clock
    /// `nvidia-smi` reports even for unthrottled rows, and ~20 % lower still where the power cap
    /// lowered the clock while the row ran (0: not measured).
    pub sm_mhz: f64,
}

impl Row {
    /// One JSON object (no dependency on serde).
    pub fn to_json(&self) -> String {
        format!(
            concat!(
                "{{\"device\":\"cuda\",\"impl\":\"{}\",\"format\":\"{}\",\"batch\":{},\"context\":{},",
                "\"ms\":{:.6},\"us\":{:.2},\"kv_bytes\":{},\"gbps\":{:.1},\"partition_size\":{},\"sm_mhz\":{:.0}}}"
            ),
            self.impl_name,
            self.format,
            self.batch,
            self.context,
            self.ms,
            self.ms * 1e3,
            self.kv_bytes,
            self.gbps,
            self.partition_size,
            self.sm_mhz
        )
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// (batch, context) pairs.
    pub cases: Vec<(usize, usize)>,
    pub formats: Vec<KvFormat>,
    /// `primitive` and/or `partitioned`.
    pub routes: Vec<&'static str>,
    /// Partition sizes for the partitioned route; empty: the automatic size per case
    /// ([`DecodeAttention::auto_route`]).
    pub partition_sizes: Vec<usize>,
    /// Kernels to time; rows of [`DecodeKernel::Simt`] are named `<route>-simt` (the default
    /// rows, `Auto`, are plain `<route>`).
    pub kernels: Vec<DecodeKernel>,
    pub warmup: usize,
    pub runs: usize,
    /// Idle pause (ms) before each timed row, after its setup: a row then starts from a GPU whose
    /// power budget the rows and page fills before it have not used up (0: none). Default 100:
    /// on the H200 the software power cap lowered the SM clock during the quantized 64 × 16384
    /// rows without it (q4 448.9 and 516.4 µs in two processes, against 443–446 µs in each of
    /// four with 100 or 500 ms), as nvbench's throttle check pauses
    /// 50 ms to let the clock recover.
    pub cooldown_ms: u64,
    /// Scatter each sequence's blocks over the pool (a random permutation); `false` gives every
    /// sequence consecutive block ids (a contiguous cache, for comparison).
    pub scatter: bool,
    /// KV copies are rotated so each case touches at least this many bytes.
    pub min_footprint_bytes: usize,
    /// Round the queries to the pages' mma type (bf16 for bf16 pages, f16 for f16/q8/q4), as
    /// the GPU model passes them for f16/bf16 caches (`q_round`); `false`: full f32 queries.
    pub round_queries: bool,
    /// Launch the tensor-core decode kernel as a programmatic dependent launch, as the model
    /// step does ([`DecodeAttention::set_programmatic`]): each run's decode is launched against
    /// the previous run's last kernel (`pk_merge` ends its grid before a dependent starts, so the
    /// overlap is of launch latency only). Rows are named `<route>-pdl`.
    pub programmatic: bool,
}

impl Default for BenchConfig {
    fn default() -> BenchConfig {
        BenchConfig {
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            block_size: 16,
            cases: vec![(1, 4096), (1, 32768), (16, 4096), (64, 4096), (64, 16384)],
            formats: vec![
                KvFormat::Bf16,
                KvFormat::F16,
                KvFormat::F32,
                KvFormat::Q8,
                KvFormat::Q4 { rotate: false },
                KvFormat::Q4 { rotate: true },
                KvFormat::TURBO_DEFAULT,
            ],
            routes: vec!["primitive", "partitioned"],
            partition_sizes: Vec::new(),
            kernels: vec![DecodeKernel::Auto],
            scatter: true,
            warmup: 5,
            runs: 30,
            cooldown_ms: 100,
            min_footprint_bytes: 512 << 20,
            round_queries: true,
            programmatic: false,
        }
    }
}

/// A small deterministic generator (xorshift64*) for block permutations and queries.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A timed row's median and the SM clock over its runs.
#[derive(Clone, Copy, Debug)]
struct Timing {
    ms: f64,
    /// SM 0's cycles per µs from the first timed run to the last ([`sm0_timestamp`]; see
    /// [`Row::sm_mhz`]); 0 where a stamp found no block on SM 0.
    sm_mhz: f64,
}

/// Times `f` (which enqueues work on the device's stream) `warmup + runs` times with CUDA events;
/// `f` gets the run index. First the device idles `cooldown_ms` (after the caller's setup, so a
/// row does not inherit the power state of the rows and page fills before it). Returns the median
/// in milliseconds and the SM clock averaged over the timed runs, from SM 0's cycle counter
/// against the global timer (a comparative figure, [`Row::sm_mhz`]).
///
/// The runs are queued back to back with an event between consecutive runs and one
/// synchronization at the end, so the host runs ahead of the GPU and each interval is device
/// time (kernels plus the gaps between them), not host launch latency.
fn time_ms(
    dev: &CudaDevice,
    warmup: usize,
    runs: usize,
    cooldown_ms: u64,
    mut f: impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<Timing, CudaError> {
    let stream = dev.stream();
    let ev = |e| CudaError::driver("cuEventRecord", e);
    // [start ns, start cycles, end ns, end cycles]
    let stamps = stream.alloc_zeros::<u64>(4).map_err(|e| CudaError::driver("cuMemAlloc", e))?;
    let stamps_p = dptr(&stamps, dev);
    dev.synchronize()?;
    std::thread::sleep(std::time::Duration::from_millis(cooldown_ms));
    for i in 0..warmup {
        f(i)?;
    }
    sm0_timestamp(dev, stamps_p)?;
    let mut events = Vec::with_capacity(runs + 1);
    events.push(stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(ev)?);
    for i in 0..runs {
        f(warmup + i)?;
        events.push(stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(ev)?);
    }
    sm0_timestamp(dev, stamps_p + 16)?;
    dev.synchronize()?;
    let mut times = Vec::with_capacity(runs);
    for w in events.windows(2) {
        times.push(w[0].elapsed_ms(&w[1]).map_err(|e| CudaError::driver("cuEventElapsedTime", e))? as f64);
    }
    let s = stream.clone_dtoh(&stamps).map_err(|e| CudaError::driver("cuMemcpyDtoH", e))?;
    let sm_mhz =
        if s[0] == 0 || s[2] <= s[0] { 0.0 } else { s[3].wrapping_sub(s[1]) as f64 * 1e3 / (s[2] - s[0]) as f64 };
    Ok(Timing { ms: median(times), sm_mhz })
}

/// Enqueues `pk_sm0_timestamp` (one block per SM): [global ns, SM 0 cycles] at `out`.
fn sm0_timestamp(dev: &CudaDevice, out: u64) -> Result<(), CudaError> {
    let m = dev.module(&ModuleSpec::Bench)?;
    let f = m.function("pk_sm0_timestamp")?;
    let cfg = LaunchConfig { grid_dim: (dev.sm_count() as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    let mut l = dev.stream().launch_builder(&f);
    l.arg(&out);
    // SAFETY: out points at two u64 of a live allocation.
    unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel(pk_sm0_timestamp)", e))?;
    Ok(())
}

/// Fills `n` bytes at `ptr` with valid random values of `kind` (see `kernels/bench.cu`).
fn fill(dev: &CudaDevice, ptr: u64, n: usize, kind: u32, seed: u32) -> Result<(), CudaError> {
    let m = dev.module(&ModuleSpec::Bench)?;
    let f = m.function("pk_fill_random")?;
    let n64 = n as u64;
    let cfg =
        LaunchConfig { grid_dim: (dev.sm_count() as u32 * 16, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut l = dev.stream().launch_builder(&f);
    l.arg(&ptr).arg(&n64).arg(&kind).arg(&seed);
    // SAFETY: ptr is valid for n bytes.
    unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel(pk_fill_random)", e))?;
    Ok(())
}

fn code_kind(c: kvcache::Codec) -> u32 {
    match c {
        kvcache::Codec::F16 => 1,
        kvcache::Codec::Bf16 => 2,
        kvcache::Codec::F32 => 3,
        _ => 0,
    }
}

/// Runs the benchmark; prints nothing. Cases that do not fit in device memory are skipped.
pub fn bench_attention(dev: &Arc<CudaDevice>, cfg: &BenchConfig) -> Result<Vec<Row>, CudaError> {
    let mut rows = Vec::new();
    let stream = dev.stream().clone();
    let alloc = |e| CudaError::driver("cuMemAlloc", e);
    for &(batch, ctx) in &cfg.cases {
        let bf16_bytes = batch * ctx * KvFormat::Bf16.bytes_per_token(cfg.num_kv_heads, cfg.head_dim);
        rows.extend(roofline(dev, cfg, batch, ctx, bf16_bytes)?);
        for &format in &cfg.formats {
            let per_token = format.bytes_per_token(cfg.num_kv_heads, cfg.head_dim);
            let kv_bytes = batch * ctx * per_token;
            let copies = cfg.min_footprint_bytes.div_ceil(kv_bytes).clamp(1, 64);
            let bps = ctx.div_ceil(cfg.block_size);
            let num_blocks = copies * batch * bps;
            let (free, _) = dev.memory()?;
            if num_blocks * cfg.block_size * per_token + (256 << 20) > free {
                eprintln!(
                    "bench: skipping {format} {batch}x{ctx}: {} bytes do not fit",
                    num_blocks * cfg.block_size * per_token
                );
                continue;
            }
            let geometry = PageGeometry {
                num_layers: 1,
                num_blocks,
                block_size: cfg.block_size,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
                format,
                rotation_seed: kvcache::format::DEFAULT_ROTATION_SEED,
            };
            let pages = DevicePages::new(dev.clone(), geometry)?;
            {
                let p = pages.layer_ptrs(0)?;
                let g = pages.geometry();
                let heads = g.slots() * g.num_kv_heads;
                let (kc, vc) = (format.key_codec(), format.value_codec());
                fill(dev, p.k_codes, heads * kc.code_bytes(g.head_dim), code_kind(kc), 1)?;
                fill(dev, p.v_codes, heads * vc.code_bytes(g.head_dim), code_kind(vc), 2)?;
                fill(dev, p.k_scales, heads * kc.scales(g.head_dim) * 2, 4, 3)?;
                fill(dev, p.v_scales, heads * vc.scales(g.head_dim) * 2, 4, 4)?;
            }
            // Scattered pages: a random permutation of the pool, dealt out to sequences.
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (batch * 131 + ctx) as u64);
            let mut perm: Vec<u32> = (0..num_blocks as u32).collect();
            if cfg.scatter {
                for i in (1..perm.len()).rev() {
                    perm.swap(i, (rng.next() % (i as u64 + 1)) as usize);
                }
            }
            let tables: Vec<CudaSlice<u32>> =
                perm.chunks(batch * bps).map(|c| stream.clone_htod(c).map_err(alloc)).collect::<Result<_, _>>()?;
            let lens = stream.clone_htod(&vec![ctx as u32; batch]).map_err(alloc)?;
            let round = |x: f32| -> f32 {
                match format {
                    _ if !cfg.round_queries => x,
                    KvFormat::Bf16 => half::bf16::from_f32(x).to_f32(),
                    KvFormat::F16 | KvFormat::Q8 | KvFormat::Q4 { .. } => half::f16::from_f32(x).to_f32(),
                    _ => x,
                }
            };
            // [batch, num_heads, head_dim]
            let q: Vec<f32> = (0..batch * cfg.num_heads * cfg.head_dim).map(|_| round(rng.f32())).collect();
            let queries = stream.clone_htod(&q).map_err(alloc)?;
            let mut out = stream.alloc_zeros::<f32>(q.len()).map_err(alloc)?;
            let mut attn = DecodeAttention::new(dev.clone());
            attn.set_programmatic(cfg.programmatic);
            let mut runs: Vec<(&str, DecodeRoute, usize)> = Vec::new();
            for &route_name in &cfg.routes {
                match route_name {
                    "primitive" => runs.push(("primitive", DecodeRoute::Primitive, 0)),
                    "partitioned" if cfg.partition_sizes.is_empty() => {
                        // The automatic partition size of the kernel that serves the format
                        // (with one partition the route is the primitive one; time it anyway).
                        let ps = match attn.auto_route(&pages, cfg.num_heads, batch, ctx) {
                            DecodeRoute::Partitioned { partition_size } => partition_size,
                            DecodeRoute::Primitive => ctx,
                        };
                        runs.push(("partitioned", DecodeRoute::Partitioned { partition_size: ps }, ps));
                    }
                    "partitioned" => {
                        for &ps in &cfg.partition_sizes {
                            runs.push(("partitioned", DecodeRoute::Partitioned { partition_size: ps }, ps));
                        }
                    }
                    // The stream-K grid (its route argument is not used), where it serves the
                    // format: a rotated one (q8, q4r) would fall back to the primitive route.
                    "stream-k" => {
                        attn.set_grid(DecodeGrid::StreamK);
                        if attn.takes_stream_k(&pages, cfg.num_heads, batch, ctx) {
                            runs.push(("stream-k", DecodeRoute::Primitive, 0));
                        }
                    }
                    other => {
                        return Err(CudaError::Invalid(format!(
                            "bench route {other:?} (primitive, partitioned, stream-k)"
                        )))
                    }
                }
            }
            let runs: Vec<(String, DecodeKernel, DecodeRoute, usize)> = cfg
                .kernels
                .iter()
                .flat_map(|&k| {
                    runs.iter().map(move |&(name, route, ps)| {
                        let name = if k == DecodeKernel::Simt { format!("{name}-simt") } else { name.to_string() };
                        let name = if cfg.programmatic { format!("{name}-pdl") } else { name };
                        (name, k, route, ps)
                    })
                })
                .collect();
            for (route_name, kernel, route, ps) in runs {
                attn.set_kernel(kernel);
                // Rows name their grid explicitly, whatever PAGEKV_DEV_CUDA_TC_GRID says.
                attn.set_grid(if route_name.starts_with("stream-k") {
                    DecodeGrid::StreamK
                } else {
                    DecodeGrid::Partitioned
                });
                let t = time_ms(dev, cfg.warmup, cfg.runs, cfg.cooldown_ms, |i| {
                    let b = DecodeBatch {
                        queries: &queries,
                        num_seqs: batch,
                        num_heads: cfg.num_heads,
                        block_tables: &tables[i % copies],
                        max_blocks_per_seq: bps,
                        context_lens: &lens,
                        max_context_len: ctx,
                        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
                        sliding_window: None,
                    };
                    attn.forward(&pages, 0, &b, route, &mut out)
                })?;
                rows.push(Row {
                    impl_name: route_name,
                    format: format.name(),
                    batch,
                    context: ctx,
                    ms: t.ms,
                    kv_bytes,
                    gbps: kv_bytes as f64 / t.ms / 1e6,
                    partition_size: ps,
                    sm_mhz: t.sm_mhz,
                });
            }
            if format == KvFormat::Bf16 {
                rows.extend(paged_roofline(dev, cfg, &pages, &tables, bps, batch, ctx, kv_bytes)?);
            }
            let o = stream.clone_dtoh(&out).map_err(|e| CudaError::driver("cuMemcpyDtoH", e))?;
            if o.iter().any(|x| !x.is_finite()) {
                return Err(CudaError::Invalid(format!("benchmark output of {format} {batch}x{ctx} is not finite")));
            }
        }
    }
    Ok(rows)
}

/// Read and copy bandwidth over `bytes`-sized buffers, rotated like the attention runs.
fn roofline(
    dev: &Arc<CudaDevice>,
    cfg: &BenchConfig,
    batch: usize,
    ctx: usize,
    bytes: usize,
) -> Result<Vec<Row>, CudaError> {
    let stream = dev.stream().clone();
    let bytes = bytes / 16 * 16;
    let copies = cfg.min_footprint_bytes.div_ceil(bytes).clamp(1, 64);
    let buf = stream.alloc_zeros::<u8>(bytes * (copies + 1)).map_err(|e| CudaError::driver("cuMemAlloc", e))?;
    let base = dptr(&buf, dev);
    fill(dev, base, bytes * (copies + 1), 0, 9)?;
    let sink = stream.alloc_zeros::<u32>(dev.sm_count() * 8).map_err(|e| CudaError::driver("cuMemAlloc", e))?;
    let sink_p = dptr(&sink, dev);
    let m = dev.module(&ModuleSpec::Bench)?;
    let f = m.function("pk_read_bw")?;
    let n16 = (bytes / 16) as u64;
    let read = time_ms(dev, cfg.warmup, cfg.runs, cfg.cooldown_ms, |i| {
        let src = base + ((i % copies) * bytes) as u64;
        let lc =
            LaunchConfig { grid_dim: (dev.sm_count() as u32 * 8, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut l = stream.launch_builder(&f);
        l.arg(&src).arg(&n16).arg(&sink_p);
        // SAFETY: src is valid for n16 × 16 bytes; sink for grid blocks.
        unsafe { l.launch(lc) }.map_err(|e| CudaError::driver("cuLaunchKernel(pk_read_bw)", e))?;
        Ok(())
    })?;
    // Copy: copy i reads buffer i % copies and writes the spare one at the end.
    dev.bind()?;
    let copy = time_ms(dev, cfg.warmup, cfg.runs, cfg.cooldown_ms, |i| {
        let src = base + ((i % copies) * bytes) as u64;
        let dst = base + (copies * bytes) as u64;
        // SAFETY: both ranges lie in `buf` and do not overlap.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(|e| CudaError::driver("cuMemcpyDtoDAsync", e))
    })?;
    let row = |name: &str, t: Timing, moved: usize| Row {
        impl_name: name.into(),
        format: "-".into(),
        batch,
        context: ctx,
        ms: t.ms,
        kv_bytes: bytes,
        gbps: moved as f64 / t.ms / 1e6,
        partition_size: 0,
        sm_mhz: t.sm_mhz,
    };
    Ok(vec![row("roofline-read", read, bytes), row("roofline-copy", copy, 2 * bytes)])
}

/// Paged-read roofline rows over the bf16 pages of a case (`kernels/bench.cu`,
/// `pk_paged_read`): the bytes a decode reads, in its order, with nothing computed —
/// `roofline-paged-h1` one kv head per CTA, `roofline-paged-h8` eight adjacent kv heads per CTA
/// (whole token rows), partitions of 1024 tokens, 256 threads.
#[allow(clippy::too_many_arguments)]
fn paged_roofline(
    dev: &Arc<CudaDevice>,
    cfg: &BenchConfig,
    pages: &DevicePages,
    tables: &[CudaSlice<u32>],
    bps: usize,
    batch: usize,
    ctx: usize,
    kv_bytes: usize,
) -> Result<Vec<Row>, CudaError> {
    let stream = dev.stream().clone();
    let p = pages.layer_ptrs(0)?;
    let m = dev.module(&ModuleSpec::Bench)?;
    let f = m.function("pk_paged_read")?;
    let sink = stream.alloc_zeros::<u32>(cfg.num_kv_heads).map_err(|e| CudaError::driver("cuMemAlloc", e))?;
    let sink_p = dptr(&sink, dev);
    let copies = tables.len();
    let ps = 1024usize;
    let mut rows = Vec::new();
    for (name, hpc, warps) in [("roofline-paged-h1", 1usize, 8usize), ("roofline-paged-h8", 8, 8)] {
        if !cfg.num_kv_heads.is_multiple_of(hpc) {
            continue;
        }
        let table_ptrs: Vec<u64> = tables.iter().map(|t| dptr(t, dev)).collect();
        let (mb, ctx_u, log2_bs, hk) =
            (bps as u32, ctx as u32, cfg.block_size.trailing_zeros(), cfg.num_kv_heads as u32);
        let (row_bytes, ps_u) = (2 * cfg.head_dim as u32, ps as u32);
        let t = time_ms(dev, cfg.warmup, cfg.runs, cfg.cooldown_ms, |i| {
            let lc = LaunchConfig {
                grid_dim: ((cfg.num_kv_heads / hpc) as u32, batch as u32, ctx.div_ceil(ps) as u32),
                block_dim: (32 * warps as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut l = stream.launch_builder(&f);
            l.arg(&p.k_codes).arg(&p.v_codes).arg(&table_ptrs[i % copies]).arg(&mb).arg(&ctx_u).arg(&log2_bs);
            l.arg(&hk).arg(&row_bytes).arg(&ps_u).arg(&sink_p);
            // SAFETY: tables hold valid block ids for every position < ctx; pages hold them.
            unsafe { l.launch(lc) }.map_err(|e| CudaError::driver("cuLaunchKernel(pk_paged_read)", e))?;
            Ok(())
        })?;
        rows.push(Row {
            impl_name: name.into(),
            format: "bf16".into(),
            batch,
            context: ctx,
            ms: t.ms,
            kv_bytes,
            gbps: kv_bytes as f64 / t.ms / 1e6,
            partition_size: ps,
            sm_mhz: t.sm_mhz,
        });
    }
    Ok(rows)
}

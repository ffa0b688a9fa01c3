//! The attention benchmark behind `pagekv bench attention`: decode (q_len 1) over scattered
//! pages, every path × format × (batch, context) shape, median of several runs, plus one
//! `roofline` row per shape: a plain multi-threaded streaming read over a buffer as large as
//! the f16 cache of that shape, measured in the same run. When f16 is measured, a `paged-read`
//! row follows it: the same threads summing the f16 cache's own scattered blocks (whole
//! blocks, every kv head, in block-table order, no attention), the bound the page layout itself
//! puts on any kernel.
//!
//! `gbps` is KV bytes actually read (codes and scales of every visible token, K and V, one
//! layer) ÷ median time.

use std::time::Instant;

use kvcache::{CacheCounters, HostPages, KvFormat, PageGeometry, PageStore};

use super::config::{
    AttentionConfig, AttnImpl, AttnNumerics, IsaChoice, RouterConfig, DEFAULT_PARTITION_SIZE,
    DEFAULT_PARTITION_THRESHOLD,
};
use super::dispatch::Attention;
use super::error::AttentionError;
use super::params::AttentionParams;
use super::pool::PoolHandle;

/// What to measure. [`BenchConfig::default`] is the matrix.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// `(batch, context)` pairs.
    pub shapes: Vec<(usize, usize)>,
    pub formats: Vec<KvFormat>,
    pub impls: Vec<AttnImpl>,
    /// Timed runs per row (after one warm-up); the median is reported.
    pub runs: usize,
    pub partition_size: usize,
    pub partition_threshold: usize,
    /// Instruction set of the fast kernels.
    pub isa: IsaChoice,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            block_size: 16,
            shapes: vec![(1, 512), (1, 4096), (1, 32768), (16, 4096), (64, 4096)],
            formats: vec![
                KvFormat::F32,
                KvFormat::F16,
                KvFormat::Bf16,
                KvFormat::Q8,
                KvFormat::Q4 { rotate: false },
                KvFormat::Q4 { rotate: true },
                KvFormat::TURBO_DEFAULT,
            ],
            impls: vec![AttnImpl::Reference, AttnImpl::Primitive, AttnImpl::Partitioned, AttnImpl::Auto],
            runs: 7,
            partition_size: DEFAULT_PARTITION_SIZE,
            partition_threshold: DEFAULT_PARTITION_THRESHOLD,
            isa: IsaChoice::Auto,
        }
    }
}

/// One measured row.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// `reference`, `primitive`, `partitioned`, `auto`, `roofline` or `paged-read`.
    pub impl_: String,
    /// KV format name (`f16`, `q4r`, `turbo-k8v3`, …); the roofline row says `f16`.
    pub format: String,
    pub batch: usize,
    pub context: usize,
    /// Median milliseconds per call.
    pub ms: f64,
    /// KV bytes read per call.
    pub kv_bytes: u64,
    /// `kv_bytes / ms`, in GB/s (1e9 bytes).
    pub gbps: f64,
    /// Mean CPU time per call summed over the process's threads, in milliseconds (`NaN` where
    /// unavailable). Unlike `ms` it does not grow
    /// while other processes hold the cores, so it compares kernels on a loaded machine.
    pub cpu_ms: f64,
}

/// Runs the benchmark on `pool`. The reference path is slow: it is measured only for shapes
/// up to 4096 tokens in all (`batch × context`).
pub fn bench_attention(cfg: &BenchConfig, pool: impl Into<PoolHandle>) -> Result<Vec<BenchRow>, AttentionError> {
    let pool = pool.into();
    let mut rows = Vec::new();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for &(batch, context) in &cfg.shapes {
        let f16_bytes = (batch * context * KvFormat::F16.bytes_per_token(cfg.num_kv_heads, cfg.head_dim)) as u64;
        let (ms, cpu_ms) = median(cfg.runs, || streaming_read(&pool, f16_bytes as usize));
        rows.push(row("roofline", "f16", batch, context, ms, cpu_ms, f16_bytes));
        for &format in &cfg.formats {
            let mut case = Case::new(cfg, format, batch, context, &mut rng);
            let kv_bytes = (batch * context * format.bytes_per_token(cfg.num_kv_heads, cfg.head_dim)) as u64;
            if format == KvFormat::F16 {
                let (ms, cpu_ms) = median(cfg.runs, || paged_read(&pool, &case));
                rows.push(row("paged-read", "f16", batch, context, ms, cpu_ms, kv_bytes));
            }
            for &impl_ in &cfg.impls {
                if impl_ == AttnImpl::Reference && batch * context > 4096 {
                    continue;
                }
                // The fast kernels' paths: the numerics are not left to `auto`, which would
                // take the ggml kernel for f16.
                let config = AttentionConfig {
                    numerics: AttnNumerics::Fast,
                    impl_,
                    router: RouterConfig {
                        partition_size: cfg.partition_size,
                        partition_threshold: cfg.partition_threshold,
                    },
                    isa: cfg.isa,
                };
                let mut attn = Attention::new(config, pool.clone());
                case.run(&mut attn)?; // surfaces bad shapes before timing
                let (ms, cpu_ms) = median(cfg.runs, || {
                    let _ = case.run(&mut attn);
                });
                rows.push(row(impl_.name(), &format.name(), batch, context, ms, cpu_ms, kv_bytes));
            }
        }
    }
    Ok(rows)
}

fn row(impl_: &str, format: &str, batch: usize, context: usize, ms: f64, cpu_ms: f64, kv_bytes: u64) -> BenchRow {
    BenchRow {
        impl_: impl_.into(),
        format: format.into(),
        batch,
        context,
        ms,
        kv_bytes,
        gbps: kv_bytes as f64 / (ms * 1e6),
        cpu_ms,
    }
}

/// One warm-up, then the median of `runs` wall timings of `f` and the mean CPU time of the
/// process per run, both in milliseconds.
fn median(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let runs = runs.max(1);
    let cpu0 = process_cpu_ns();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let cpu = match (cpu0, process_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e6 / runs as f64,
        _ => f64::NAN,
    };
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], cpu)
}

/// CPU time consumed so far by all threads of the process, in nanoseconds
/// (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`, exact to the nanosecond on Linux).
fn process_cpu_ns() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            tv_sec: i64,
            tv_nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        }
        const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
        let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: libc's clock_gettime writes one timespec (two i64 on 64-bit Linux) to `ts`.
        let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Sums `bytes` bytes of a buffer on every pool thread (the bandwidth a kernel could reach).
fn streaming_read(pool: &PoolHandle, bytes: usize) {
    use std::sync::OnceLock;
    static BUF: OnceLock<std::sync::Mutex<Vec<u64>>> = OnceLock::new();
    let buf = BUF.get_or_init(Default::default);
    let mut buf = buf.lock().unwrap_or_else(|p| p.into_inner());
    let words = bytes / 8;
    if buf.len() < words {
        buf.resize(words, 1);
    }
    let data = &buf[..words];
    let chunk = 1 << 15; // 256 KiB per task
    let sink = std::sync::atomic::AtomicU64::new(0);
    pool.run(words.div_ceil(chunk), |task, _| {
        let part = &data[task * chunk..((task + 1) * chunk).min(words)];
        let mut acc = [0u64; 8];
        for c in part.chunks_exact(8) {
            for (a, x) in acc.iter_mut().zip(c) {
                *a = a.wrapping_add(*x);
            }
        }
        sink.fetch_add(acc.iter().fold(0, |s, a| s.wrapping_add(*a)), std::sync::atomic::Ordering::Relaxed);
    });
    std::hint::black_box(sink.into_inner());
}

/// Sums every block of every sequence of `case` (K and V planes, whole blocks) on the pool's
/// threads, tasks of 512 positions in block-table order, each block's lines prefetched into L2
/// while the previous block is read (which reads scattered blocks 25% faster than without).
fn paged_read(pool: &PoolHandle, case: &Case) {
    let layer = case.pages.layer(0);
    let bs = layer.block_size;
    let per_task = 512usize.div_ceil(bs);
    let block_bytes = bs * layer.num_kv_heads * layer.keys.code_bytes;
    let planes: [&[u64]; 2] = [bytemuck::cast_slice(layer.keys.codes), bytemuck::cast_slice(layer.values.codes)];
    let tasks: Vec<(usize, usize)> = case
        .tables
        .iter()
        .enumerate()
        .flat_map(|(seq, table)| (0..table.len().div_ceil(per_task)).map(move |j| (seq, j)))
        .collect();
    let sink = std::sync::atomic::AtomicU64::new(0);
    pool.run(tasks.len(), |task, _| {
        let (seq, j) = tasks[task];
        let table = &case.tables[seq];
        let mut acc = [0u64; 8];
        let blocks = &table[j * per_task..((j + 1) * per_task).min(table.len())];
        for (bi, &block) in blocks.iter().enumerate() {
            let next = blocks.get(bi + 1).copied().unwrap_or(block) as usize;
            for (pi, plane) in planes.iter().enumerate() {
                let words = block_bytes / 8;
                let nplane = planes[pi];
                for (ci, c) in plane[block as usize * words..(block as usize + 1) * words].chunks_exact(8).enumerate() {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: a prefetch is a hint and cannot fault.
                    unsafe {
                        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                        _mm_prefetch::<_MM_HINT_T1>(nplane.as_ptr().wrapping_add(next * words + ci * 8).cast());
                    }
                    for (a, x) in acc.iter_mut().zip(c) {
                        *a = a.wrapping_add(*x);
                    }
                }
            }
        }
        sink.fetch_add(acc.iter().fold(0, |s, a| s.wrapping_add(*a)), std::sync::atomic::Ordering::Relaxed);
    });
    std::hint::black_box(sink.into_inner());
}

/// Pages, block tables and queries of one (format, batch, context) shape.
struct Case {
    pages: HostPages,
    tables: Vec<Vec<u32>>,
    context_lens: Vec<usize>,
    queries: Vec<f32>,
    out: Vec<f32>,
    num_heads: usize,
    counters: CacheCounters,
}

impl Case {
    fn new(cfg: &BenchConfig, format: KvFormat, batch: usize, context: usize, rng: &mut XorShift) -> Case {
        let (hkv, d, bs) = (cfg.num_kv_heads, cfg.head_dim, cfg.block_size);
        let per_seq = context.div_ceil(bs);
        let num_blocks = batch * per_seq;
        let geometry = PageGeometry {
            num_layers: 1,
            num_blocks,
            block_size: bs,
            num_kv_heads: hkv,
            head_dim: d,
            format,
            rotation_seed: kvcache::format::DEFAULT_ROTATION_SEED,
        };
        let mut pages = HostPages::new(geometry);
        // Scatter: a random permutation of the block ids, dealt out to the sequences.
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let tables: Vec<Vec<u32>> = ids.chunks(per_seq).map(|c| c.to_vec()).collect();
        let mut k = vec![0f32; bs * hkv * d]; // [block_size, kv_heads, head_dim]
        let mut v = vec![0f32; bs * hkv * d];
        let mut slots = vec![0u32; bs];
        for &block in &ids {
            k.iter_mut().for_each(|x| *x = rng.normal());
            v.iter_mut().for_each(|x| *x = rng.normal());
            for (i, s) in slots.iter_mut().enumerate() {
                *s = block * bs as u32 + i as u32;
            }
            pages.write(0, &slots, &k, &v);
        }
        let n = batch * cfg.num_heads * d;
        Case {
            pages,
            tables,
            context_lens: vec![context; batch],
            queries: (0..n).map(|_| rng.normal()).collect(),
            out: vec![0.0; n],
            num_heads: cfg.num_heads,
            counters: CacheCounters::default(),
        }
    }

    fn run(&mut self, attn: &mut Attention) -> Result<(), AttentionError> {
        let tables: Vec<&[u32]> = self.tables.iter().map(|t| t.as_slice()).collect();
        let layer = self.pages.layer(0);
        let p = AttentionParams {
            queries: &self.queries,
            num_seqs: self.tables.len(),
            q_len: 1,
            num_heads: self.num_heads,
            block_tables: &tables,
            context_lens: &self.context_lens,
            scale: 1.0 / (layer.head_dim as f32).sqrt(),
            sliding_window: None,
            causal: true,
        };
        attn.forward(&layer, &p, &self.counters, &mut self.out).map(|_| ())
    }
}

/// A tiny deterministic generator (the library has no `rand` dependency).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Roughly N(0,1): sum of four uniforms, centred and scaled.
    fn normal(&mut self) -> f32 {
        let u: f32 = (0..4).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32).sum();
        (u - 2.0) * 1.732
    }
}

//! The matrix-vector work of one SmolLM2-135M decode step (30 layers of Q4_1 q/k/v/o/gate/up/
//! down and the tied 49152×576 Q8_0 output), with nothing else: tokens/s of the matmuls and
//! the pool alone, per instruction set and thread count, as medians of repeated runs. Also
//! the time of each matrix on its own, and the 64-row prefill products. Printed as
//! "median (best)": on a shared machine the best run is the one least disturbed.
//!
//! Run: `cargo bench -p pagekv-cpu --bench decode_matvec` (`BENCH_THREADS=1,2` picks the pool
//! sizes, `BENCH_WEIGHTS=q4_0|q8_0|f16|bf16` the layers' type (default q4_1), `BENCH_N` the
//! activation rows per step (default 1; the K-quants `q4_k|q5_k|q6_k` run a 512-wide model),
//! `BENCH_HUGE=1` puts the weights in huge pages, `BENCH_REPEATS` the number of timed runs, `BENCH_ISAS=avx2,avx512vnni,scalar` the
//! kernel families; default: all but scalar).

use pagekv_cpu::quant::hugepage::HugePageBuf;
use pagekv_cpu::quant::quantize::quantize_row;
use pagekv_cpu::quant::{matmul_with_isa, Isa, QuantScratch, WeightType, WeightView};
use pagekv_cpu::threadpool::ThreadPool;
use rand::{Rng, SeedableRng};
use std::time::Instant;

const HIDDEN: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;
const VOCAB: usize = 49152;
const LAYERS: usize = 30;

struct Matrix {
    ty: WeightType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    /// The same bytes in huge pages (`BENCH_HUGE=1`).
    huge: Option<HugePageBuf>,
}

impl Matrix {
    fn random(rng: &mut impl Rng, ty: WeightType, rows: usize, cols: usize) -> Matrix {
        let mut data = Vec::with_capacity(rows * ty.row_bytes(cols).unwrap());
        let mut row = vec![0.0f32; cols];
        if ty.block_elems() == 256 {
            // No reference quantizer for the K-quants: random codes with small f16 scales at
            // the header offsets (d, dmin for Q4_K/Q5_K; d at byte 208 for Q6_K).
            data.resize(rows * ty.row_bytes(cols).unwrap(), 0);
            rng.fill_bytes(&mut data);
            let scale = half::f16::from_f32(1e-3).to_le_bytes();
            for blk in data.chunks_exact_mut(ty.block_bytes()) {
                match ty {
                    WeightType::Q6K => blk[208..210].copy_from_slice(&scale),
                    _ => {
                        blk[0..2].copy_from_slice(&scale);
                        blk[2..4].copy_from_slice(&scale);
                    }
                }
            }
        }
        for _ in 0..rows * (ty.block_elems() != 256) as usize {
            row.iter_mut().for_each(|v| *v = rng.gen_range(-0.1..0.1));
            quantize_row(ty, &row, &mut data).unwrap();
        }
        let huge = std::env::var("BENCH_HUGE").is_ok_and(|v| v == "1").then(|| HugePageBuf::copy_of(&data).unwrap());
        Matrix { ty, rows, cols, data, huge }
    }

    fn view(&self) -> WeightView<'_> {
        let data = self.huge.as_ref().map_or(&self.data[..], |h| h.as_slice());
        WeightView::new(self.ty, self.rows, self.cols, data).unwrap()
    }
}

/// CPU time of the calling thread (Linux), which a preempted thread does not accumulate.
fn thread_cpu_secs() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid pointer to a timespec-shaped struct.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.sec as f64 + t.nsec as f64 * 1e-9
}

/// Seconds elapsed since `start` (wall clock) and since `cpu_start` (this thread's CPU).
fn elapsed(start: Instant, cpu_start: f64) -> (f64, f64) {
    (start.elapsed().as_secs_f64(), thread_cpu_secs() - cpu_start)
}

/// "median (best)" of timings where larger is better or smaller is better.
fn summary(mut v: Vec<f64>, larger_is_better: bool) -> String {
    v.sort_by(f64::total_cmp);
    let best = if larger_is_better { v[v.len() - 1] } else { v[0] };
    format!("{:>9.1} ({:.1})", v[v.len() / 2], best)
}

fn main() {
    let threads: Vec<usize> = std::env::var("BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .map(|s| s.trim().parse().expect("BENCH_THREADS"))
        .collect();
    let repeats: usize = std::env::var("BENCH_REPEATS").map(|s| s.parse().expect("BENCH_REPEATS")).unwrap_or(7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let q = match std::env::var("BENCH_WEIGHTS").as_deref() {
        Ok("q4_0") => WeightType::Q4_0,
        Ok("q8_0") => WeightType::Q8_0,
        Ok("f16") => WeightType::F16,
        Ok("bf16") => WeightType::BF16,
        Ok("q4_k") => WeightType::Q4K,
        Ok("q5_k") => WeightType::Q5K,
        Ok("q6_k") => WeightType::Q6K,
        _ => WeightType::Q4_1,
    };
    // The K-quants need rows of a multiple of 256 values: a 512-wide model of the same depth.
    let hidden = if q.block_elems() == 256 { 512 } else { HIDDEN };
    // Activation rows of the whole-token loop (several sequences decoding together).
    let n_acts: usize = std::env::var("BENCH_N").map(|s| s.parse().expect("BENCH_N")).unwrap_or(1);
    // Per layer: q, k, v, o, gate, up, down as (rows, cols).
    let shapes =
        [(hidden, hidden), (KV, hidden), (KV, hidden), (hidden, hidden), (FFN, hidden), (FFN, hidden), (hidden, FFN)];
    let layers: Vec<Vec<Matrix>> =
        (0..LAYERS).map(|_| shapes.iter().map(|&(r, c)| Matrix::random(&mut rng, q, r, c)).collect()).collect();
    let output = Matrix::random(&mut rng, WeightType::Q8_0, VOCAB, HIDDEN);
    let x: Vec<f32> = (0..64 * FFN).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut out = vec![0.0f32; 64 * VOCAB];
    let mut scratch = QuantScratch::new();
    let tokens = 32;
    println!(
        "decode matvec work of SmolLM2-135M, layers {q:?}, {n_acts} activation row(s) ({tokens} steps per run, median of {repeats} runs)"
    );
    for &nt in &threads {
        let pool = ThreadPool::new(nt);
        let isas: Vec<Isa> = match std::env::var("BENCH_ISAS") {
            Ok(list) => Isa::available()
                .into_iter()
                .filter(|i| list.to_lowercase().contains(&format!("{i:?}").to_lowercase()))
                .collect(),
            Err(_) => Isa::available().into_iter().filter(|&i| i != Isa::Scalar).collect(),
        };
        for isa in isas {
            let step = |out: &mut [f32], scratch: &mut QuantScratch| {
                for layer in &layers {
                    for m in layer {
                        let (xs, os) = (&x[..n_acts * m.cols], &mut out[..n_acts * m.rows]);
                        matmul_with_isa(isa, m.view(), xs, n_acts, os, scratch, &pool).unwrap();
                    }
                }
                let (xs, os) = (&x[..n_acts * HIDDEN], &mut out[..n_acts * VOCAB]);
                matmul_with_isa(isa, output.view(), xs, n_acts, os, scratch, &pool).unwrap();
            };
            step(&mut out, &mut scratch);
            let runs: Vec<(f64, f64)> = (0..repeats)
                .map(|_| {
                    let (t, c) = (Instant::now(), thread_cpu_secs());
                    for _ in 0..tokens {
                        step(&mut out, &mut scratch);
                    }
                    elapsed(t, c)
                })
                .collect();
            let wall = summary(runs.iter().map(|r| tokens as f64 / r.0).collect(), true);
            // With one thread, CPU time is the time left when preemption is taken out.
            let cpu = summary(runs.iter().map(|r| tokens as f64 / r.1).collect(), true);
            println!("  {nt} threads {isa:?}: {wall} steps/s wall, {cpu} steps/s of caller CPU time");
            let mut single = |m: &Matrix, n: usize, name: &str| {
                let iters = (20_000_000 / (m.rows * m.cols * n)).max(3);
                let runs: Vec<f64> = (0..repeats)
                    .map(|_| {
                        let t = Instant::now();
                        for _ in 0..iters {
                            let (xs, os) = (&x[..n * m.cols], &mut out[..n * m.rows]);
                            matmul_with_isa(isa, m.view(), xs, n, os, &mut scratch, &pool).unwrap();
                        }
                        t.elapsed().as_secs_f64() * 1e6 / iters as f64
                    })
                    .collect();
                println!("    {name:<24} {} µs", summary(runs, false));
            };
            for (m, name) in layers[0].iter().zip([
                "q hidden x hidden",
                "k 192 x hidden",
                "v",
                "o",
                "gate 1536 x hidden",
                "up",
                "down hidden x 1536",
            ]) {
                if name != "v" && name != "o" && name != "up" {
                    single(m, 1, name);
                }
            }
            single(&output, 1, "output 49152x576 Q8_0");
            single(&layers[0][4], 64, "gate n=64");
            single(&layers[0][6], 64, "down n=64");
        }
    }
}

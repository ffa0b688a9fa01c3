//! Weight bandwidth of one K-quant matrix product at a few activation rows: the matrix's bytes
//! over the time of one `matmul` (medians of 7 timed passes), with the weights in huge pages and
//! several copies cycled so they come from memory, beside a small matrix that stays in cache.
//! What chose the K-quant kernels' row counts, tile thresholds and prefetch distance.
//!
//! `cargo run --release -p pagekv-cpu --example kquant_matvec -- TYPE ROWSxCOLS N THREADS [ISA [ORDER [LAYOUT]]]`,
//! e.g. `-- q4_k 8960x1536 1,2,4,8 2`. TYPE: q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs or iq4_nl
//! (random codes, small scales); ISA: avx2, avx512 or, by default (or `best`), the best one; ORDER:
//! `llama` (llama.cpp's orders, the default) or `row` (row-invariant, what the engine runs);
//! LAYOUT: `rows` (the default) or `x16` (Q4_K rows interleaved in groups of 16, as the engine
//! copies them where the CPU has AVX-512 VNNI).

use pagekv_cpu::quant::hugepage::HugePageBuf;
use pagekv_cpu::quant::interleave::interleave;
use pagekv_cpu::quant::{
    matmul_fused_ordered, Isa, MatmulPart, QuantScratch, RowLayout, SumOrder, WeightType, WeightView,
};
use pagekv_cpu::threadpool::ThreadPool;
use rand::{RngCore, SeedableRng};
use std::time::Instant;

/// Copies cycled so that together they exceed the last-level cache.
const MEMORY_BYTES: usize = 192 << 20;

fn random_matrix(ty: WeightType, rows: usize, cols: usize, rng: &mut impl RngCore) -> Vec<u8> {
    let mut data = vec![0u8; rows * ty.row_bytes(cols).expect("whole blocks")];
    rng.fill_bytes(&mut data);
    let scale = half::f16::from_f32(1e-3).to_le_bytes();
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in ty.f16_scale_offsets() {
            blk[at..at + 2].copy_from_slice(&scale);
        }
    }
    data
}

/// GB/s of weights: median over 7 passes of `reps` products over every matrix in `mats`.
#[allow(clippy::too_many_arguments)]
fn bandwidth(
    isa: Isa,
    order: SumOrder,
    ty: WeightType,
    layout: RowLayout,
    mats: &[HugePageBuf],
    rows: usize,
    cols: usize,
    n: usize,
    reps: usize,
    pool: &ThreadPool,
) -> f64 {
    let x: Vec<f32> = (0..cols * n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
    let mut out = vec![0f32; rows * n];
    let mut scratch = QuantScratch::new();
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..reps {
            for m in mats {
                let w = WeightView::with_layout(ty, rows, cols, m.as_slice(), layout).expect("matrix shape");
                let mut parts = [MatmulPart { w, out: &mut out }];
                matmul_fused_ordered(isa, order, &mut parts, &x, n, &mut scratch, pool).expect("matmul");
            }
        }
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    (mats[0].len() * mats.len() * reps) as f64 / times[3] / 1e9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: kquant_matvec TYPE ROWSxCOLS N[,N..] THREADS [avx2|avx512|best [llama|row [rows|x16]]] (e.g. q4_k 8960x1536 1,2,4 2)";
    if !(4..=7).contains(&args.len()) {
        return Err(usage.into());
    }
    let isa = match args.get(4).map(String::as_str) {
        None | Some("best") => Isa::best(),
        Some("avx2") => Isa::Avx2,
        Some("avx512") => Isa::Avx512Vnni,
        Some(other) => return Err(format!("unknown ISA {other}; {usage}").into()),
    };
    if !isa.is_available() {
        return Err(format!("{isa:?} is not available on this CPU").into());
    }
    let order = match args.get(5).map(String::as_str) {
        None | Some("llama") => SumOrder::LlamaCpp,
        Some("row") => SumOrder::RowInvariant,
        Some(other) => return Err(format!("unknown order {other}; {usage}").into()),
    };
    let ty = match args[0].as_str() {
        "q2_k" => WeightType::Q2K,
        "q3_k" => WeightType::Q3K,
        "iq4_xs" => WeightType::IQ4XS,
        "iq4_nl" => WeightType::IQ4NL,
        "q4_k" => WeightType::Q4K,
        "q5_k" => WeightType::Q5K,
        "q6_k" => WeightType::Q6K,
        other => return Err(format!("unknown type {other}; {usage}").into()),
    };
    let layout = match args.get(6).map(String::as_str) {
        None | Some("rows") => RowLayout::Rows,
        Some("x16") => RowLayout::Q4kX16,
        Some(other) => return Err(format!("unknown layout {other}; {usage}").into()),
    };
    let (rows, cols) = args[1].split_once('x').ok_or(usage)?;
    let (rows, cols): (usize, usize) = (rows.parse()?, cols.parse()?);
    let ns: Vec<usize> = args[2].split(',').map(str::parse).collect::<Result<_, _>>()?;
    let pool = ThreadPool::try_new(args[3].parse()?)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut laid_out = |rows: usize| -> Result<HugePageBuf, Box<dyn std::error::Error>> {
        let mut m = random_matrix(ty, rows, cols, &mut rng);
        if layout == RowLayout::Q4kX16 {
            interleave(&mut m, ty, rows, cols)?;
        }
        Ok(HugePageBuf::copy_of(&m)?)
    };
    let copies = MEMORY_BYTES.div_ceil(rows * ty.row_bytes(cols)?).max(1);
    let memory: Vec<HugePageBuf> = (0..copies).map(|_| laid_out(rows)).collect::<Result<_, _>>()?;
    // About 1 MiB: both threads' share stays in their L2 (whole groups of 16 rows).
    let small_rows = ((1 << 20) / ty.row_bytes(cols)?).next_multiple_of(16);
    let cache = [laid_out(small_rows)?];
    println!(
        "{ty:?} {rows}x{cols}, {layout:?}, {isa:?}, {order:?}, {} threads: GB/s of weights per product",
        pool.n_threads()
    );
    for n in ns {
        let mem = bandwidth(isa, order, ty, layout, &memory, rows, cols, n, 2, &pool);
        let hot = bandwidth(isa, order, ty, layout, &cache, small_rows, cols, n, 200, &pool);
        println!("  n = {n:2}: from memory {mem:7.3}, in cache ({small_rows} rows) {hot:7.3}");
    }
    Ok(())
}

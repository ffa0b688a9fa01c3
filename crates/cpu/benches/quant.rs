//! Matvec / matmul throughput of the quantized kernels on the default model's shapes
//! (SmolLM2-135M: hidden 576, ffn 1536, vocab 49152), reported as GB/s of weight bytes read.
//!
//! Run: `CARGO_TARGET_DIR=target-quant cargo bench -p pagekv-cpu --bench quant`
//! (`PAGEKV_THREADS` sets the pool size; default: all cores).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pagekv_cpu::quant::quantize::quantize_row;
use pagekv_cpu::quant::{matmul, QuantScratch, WeightType, WeightView};
use pagekv_cpu::threadpool::ThreadPool;
use rand::{Rng, SeedableRng};

fn weights(ty: WeightType, m: usize, k: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut data = Vec::with_capacity(m * ty.row_bytes(k).unwrap());
    let mut row = vec![0.0f32; k];
    for _ in 0..m {
        row.iter_mut().for_each(|v| *v = rng.gen_range(-0.1..0.1));
        quantize_row(ty, &row, &mut data).unwrap();
    }
    data
}

fn bench(c: &mut Criterion) {
    let pool = ThreadPool::global().expect("thread pool");
    let mut scratch = QuantScratch::new();
    // (k, m): GGUF dims [k, m].
    let shapes = [(576, 1536), (1536, 576), (576, 49152)];
    for ty in [WeightType::Q4_1, WeightType::Q8_0] {
        let mut group = c.benchmark_group(format!("matvec_{:?}_{}t", ty, pool.n_threads()));
        for (k, m) in shapes {
            let data = weights(ty, m, k);
            let w = WeightView::new(ty, m, k, &data).unwrap();
            let x: Vec<f32> = (0..k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
            let mut out = vec![0.0f32; m];
            group.throughput(Throughput::Bytes(data.len() as u64));
            group.bench_function(BenchmarkId::from_parameter(format!("{k}x{m}")), |b| {
                b.iter(|| matmul(w, &x, 1, &mut out, &mut scratch, pool).unwrap())
            });
        }
        group.finish();
    }
    // Prefill: 64 activation rows against the ffn up projection.
    let (k, m, n) = (576, 1536, 64);
    let mut group = c.benchmark_group(format!("matmul_n{n}_{}t", pool.n_threads()));
    for ty in [WeightType::Q4_1, WeightType::Q8_0] {
        let data = weights(ty, m, k);
        let w = WeightView::new(ty, m, k, &data).unwrap();
        let x: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
        let mut out = vec![0.0f32; n * m];
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        group.bench_function(BenchmarkId::from_parameter(format!("{ty:?}_{k}x{m}")), |b| {
            b.iter(|| matmul(w, &x, n, &mut out, &mut scratch, pool).unwrap())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);

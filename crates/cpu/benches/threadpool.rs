//! Per-call overhead of `ThreadPool::run`: empty tasks, and one ~1 µs task per thread.
//!
//! Run: `CARGO_TARGET_DIR=target-quant cargo bench -p pagekv-cpu --bench threadpool`

use criterion::{criterion_group, criterion_main, Criterion};
use pagekv_cpu::threadpool::ThreadPool;
use std::hint::black_box;

fn spin_work(iters: u64) -> u64 {
    let mut acc = 1u64;
    for i in 0..iters {
        acc = black_box(acc.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    acc
}

fn bench(c: &mut Criterion) {
    for n_threads in [1, 2] {
        let pool = ThreadPool::new(n_threads);
        let mut group = c.benchmark_group(format!("threadpool_{n_threads}t"));
        group.bench_function("run_8_empty_tasks", |b| {
            b.iter(|| {
                pool.run(8, |t, _| {
                    black_box(t);
                })
            })
        });
        group.bench_function("serial_work_1us", |b| b.iter(|| black_box(spin_work(1000))));
        group.bench_function("run_1_task_of_1us_per_thread", |b| {
            b.iter(|| {
                pool.run(n_threads, |_, _| {
                    black_box(spin_work(1000));
                })
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

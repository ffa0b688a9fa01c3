//! Thread pool tests: every task index runs exactly once, with 1 and N threads and many calls;
//! nested calls run serially; a panicking task reaches the caller; the per-call overhead is
//! printed (`cargo test -p pagekv-cpu --release --test quant_threadpool -- --nocapture`).

use pagekv_cpu::threadpool::{parse_thread_count, ThreadPool, ThreadPoolError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

fn check_exactly_once(pool: &ThreadPool, n_tasks: usize) {
    let counts: Vec<AtomicUsize> = (0..n_tasks).map(|_| AtomicUsize::new(0)).collect();
    let bad_thread = AtomicUsize::new(0);
    pool.run(n_tasks, |task, thread| {
        counts[task].fetch_add(1, Ordering::Relaxed);
        if thread >= pool.n_threads() {
            bad_thread.fetch_add(1, Ordering::Relaxed);
        }
    });
    for (i, c) in counts.iter().enumerate() {
        assert_eq!(c.load(Ordering::Relaxed), 1, "task {i} of {n_tasks}");
    }
    assert_eq!(bad_thread.load(Ordering::Relaxed), 0);
}

#[test]
fn every_index_exactly_once_many_calls() {
    for n_threads in [1, 2, 3, 5] {
        let pool = ThreadPool::new(n_threads);
        assert_eq!(pool.n_threads(), n_threads);
        for call in 0..3000 {
            check_exactly_once(&pool, [0, 1, 2, 3, 7, 64, 1000][call % 7]);
        }
    }
}

#[test]
fn workers_take_part_and_results_are_complete() {
    let pool = ThreadPool::new(3);
    let used: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
    let sum = AtomicUsize::new(0);
    for _ in 0..200 {
        pool.run(256, |task, thread| {
            // Enough work per task for workers to wake up and join.
            let mut acc = task;
            for i in 0..2000 {
                acc = std::hint::black_box(acc.wrapping_mul(31).wrapping_add(i));
            }
            std::hint::black_box(acc);
            used[thread].fetch_add(1, Ordering::Relaxed);
            sum.fetch_add(task, Ordering::Relaxed);
        });
    }
    assert_eq!(sum.load(Ordering::Relaxed), 200 * (255 * 256 / 2));
    let total: usize = used.iter().map(|u| u.load(Ordering::Relaxed)).sum();
    assert_eq!(total, 200 * 256);
    assert!(used[1].load(Ordering::Relaxed) + used[2].load(Ordering::Relaxed) > 0, "no worker ran a task");
}

#[test]
fn nested_calls_run_serially() {
    let pool = ThreadPool::new(3);
    let counts: Vec<AtomicUsize> = (0..16 * 16).map(|_| AtomicUsize::new(0)).collect();
    pool.run(16, |outer, outer_thread| {
        pool.run(16, |inner, inner_thread| {
            assert_eq!(inner_thread, outer_thread, "nested run must stay on the same thread");
            counts[outer * 16 + inner].fetch_add(1, Ordering::Relaxed);
        });
    });
    assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
}

#[test]
fn concurrent_callers_share_one_pool() {
    let pool = ThreadPool::new(3);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for call in 0..500 {
                    check_exactly_once(&pool, 1 + call % 50);
                }
            });
        }
    });
}

#[test]
fn panic_in_task_reaches_caller_and_pool_survives() {
    let pool = ThreadPool::new(3);
    for trial in 0..20 {
        let bad = trial * 7 % 100;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(100, |task, _| {
                if task == bad {
                    panic!("task {task} failed");
                }
            })
        }));
        let payload = result.expect_err("panic must propagate");
        let msg = payload.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(msg, format!("task {bad} failed"));
        check_exactly_once(&pool, 100);
    }
}

#[test]
fn parked_workers_wake_up() {
    let pool = ThreadPool::new(2);
    for _ in 0..5 {
        std::thread::sleep(std::time::Duration::from_millis(3)); // longer than the spin phase
        check_exactly_once(&pool, 500);
    }
}

#[test]
fn thread_count_parsing() {
    assert_eq!(parse_thread_count("4"), Ok(4));
    assert_eq!(parse_thread_count(" 2 "), Ok(2));
    for bad in ["0", "-1", "two", "", "100000"] {
        assert!(matches!(parse_thread_count(bad), Err(ThreadPoolError::InvalidThreadCount { .. })), "{bad}");
    }
}

#[test]
fn per_call_overhead_is_printed() {
    for n_threads in [1, 2] {
        let pool = ThreadPool::new(n_threads);
        let sink = AtomicUsize::new(0);
        for _ in 0..1000 {
            pool.run(8, |t, _| {
                sink.fetch_add(t, Ordering::Relaxed);
            });
        }
        let calls = 20_000;
        let start = Instant::now();
        for _ in 0..calls {
            pool.run(8, |t, _| {
                sink.fetch_add(t, Ordering::Relaxed);
            });
        }
        let per_call = start.elapsed().as_secs_f64() / calls as f64;
        println!("thread pool: {n_threads} threads, 8 empty tasks: {:.2} us per run() call", per_call * 1e6);
        assert_eq!(sink.load(Ordering::Relaxed), (1000 + calls) * 28);

        // Tasks of ~2 us each, one per thread: the time above the ideal is the overhead that
        // a decode step pays when every thread takes part.
        let busy = |_: usize, _: usize| {
            let t = Instant::now();
            while t.elapsed().as_nanos() < 2000 {
                std::hint::spin_loop();
            }
        };
        let calls = 5_000;
        let start = Instant::now();
        for _ in 0..calls {
            pool.run(n_threads, busy);
        }
        let per_call = start.elapsed().as_secs_f64() / calls as f64;
        println!(
            "thread pool: {n_threads} threads, {n_threads} tasks of 2 us: {:.2} us per call (ideal 2.00)",
            per_call * 1e6
        );
    }
}

#[test]
fn the_caller_takes_its_own_range_in_order_then_steals() {
    // The caller (thread 0) owns the first tasks and takes them front to back; a worker that
    // stalls on its first task has the rest of its range stolen, so the call still finishes and
    // every index runs exactly once.
    let pool = ThreadPool::new(2);
    for _ in 0..5 {
        let order = std::sync::Mutex::new(Vec::new());
        let counts: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        let stalled = AtomicUsize::new(0);
        pool.run(64, |task, thread| {
            counts[task].fetch_add(1, Ordering::Relaxed);
            if thread == 0 {
                order.lock().unwrap().push(task);
            } else if stalled.fetch_add(1, Ordering::Relaxed) == 0 {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        let order = order.into_inner().unwrap();
        assert_eq!(order[..32], (0..32).collect::<Vec<_>>()[..], "own range first, in order");
        assert!(order.len() > 32, "the stalled worker's range was not stolen: {order:?}");
    }
}

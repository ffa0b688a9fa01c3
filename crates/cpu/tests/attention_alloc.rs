//! The decode step allocates nothing once the workspace has grown: every fast path × ISA and
//! the ggml route's SIMD kernel,
//! counted by a global allocator that tallies allocations made on any thread of the process
//! while a call runs (the pool's workers included).

mod attention_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use attention_common::{build, fast_config, ggml_config, isas, Case};
use kvcache::{CacheCounters, KvFormat};
use pagekv_cpu::attention::{Attention, AttnImpl, IsaChoice};
use pagekv_cpu::threadpool::ThreadPool;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(SeqCst) {
            ALLOCS.fetch_add(1, SeqCst);
        }
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(SeqCst) {
            ALLOCS.fetch_add(1, SeqCst);
        }
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn repeated_calls_allocate_nothing() {
    let pool = Arc::new(ThreadPool::new(2));
    for (format, q_len) in [(KvFormat::F16, 1), (KvFormat::Q4 { rotate: true }, 1), (KvFormat::TURBO_DEFAULT, 3)] {
        let case = Case {
            format,
            head_dim: 128,
            num_kv_heads: 2,
            group: 4,
            q_len,
            causal: true,
            contexts: Case::pair(1500, q_len),
            window: None,
            block_size: 16,
            partition_size: 256,
            seed: 77,
        };
        let built = build(&case);
        let tables = built.tables();
        let p = built.params(&case, &tables);
        let layer = built.pages.layer(0);
        let counters = CacheCounters::default();
        let mut out = vec![0f32; built.queries.len()];
        for isa in isas() {
            let mut configs: Vec<(String, _)> = [AttnImpl::Primitive, AttnImpl::Partitioned, AttnImpl::Auto]
                .map(|impl_| (format!("{impl_:?}"), fast_config(impl_, IsaChoice::Only(isa), 256)))
                .into();
            if format == KvFormat::F16 {
                configs.push(("ggml".into(), ggml_config(IsaChoice::Only(isa))));
            }
            for (name, config) in configs {
                let mut attn = Attention::new(config, pool.clone());
                attn.forward(&layer, &p, &counters, &mut out).unwrap(); // grows the workspace
                ALLOCS.store(0, SeqCst);
                COUNTING.store(true, SeqCst);
                for _ in 0..3 {
                    attn.forward(&layer, &p, &counters, &mut out).unwrap();
                }
                COUNTING.store(false, SeqCst);
                let n = ALLOCS.load(SeqCst);
                assert_eq!(n, 0, "{format:?} {name} {isa:?}: {n} allocations in 3 calls");
            }
        }
    }
}

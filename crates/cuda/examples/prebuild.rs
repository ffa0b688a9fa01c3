//! Compiles the kernel modules the tests and the benchmark use into the disk cache
//! (`$PAGEKV_HOME/kernels`), for an architecture given on the command line (default sm_90).
//! Needs libnvrtc, not a GPU:
//!
//! ```text
//! PAGEKV_HOME=dist/home cargo run -p pagekv-cuda --features cuda --example prebuild -- 90 [quick|writes]
//! ```
//!
//! `quick` compiles the first four modules only; `writes` only the cache-write modules
//! (`group` 0) of every format and head_dim, a fast compile check of `cache_write.cu`.

use kvcache::KvFormat;
use pagekv_cuda::compile::prebuild;
use pagekv_cuda::ModuleSpec;

/// Formats the tests cover (every codec and every turbo bit width on both sides).
pub const FORMATS: [KvFormat; 10] = [
    KvFormat::F32,
    KvFormat::F16,
    KvFormat::Bf16,
    KvFormat::Q8,
    KvFormat::Q4 { rotate: false },
    KvFormat::Q4 { rotate: true },
    KvFormat::Turbo { k_bits: 8, v_bits: 3 },
    KvFormat::Turbo { k_bits: 4, v_bits: 2 },
    KvFormat::Turbo { k_bits: 2, v_bits: 4 },
    KvFormat::Turbo { k_bits: 3, v_bits: 8 },
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arch_s = args.get(1).map(String::as_str).unwrap_or("90");
    let Ok(arch_n) = arch_s.parse::<u32>() else {
        eprintln!("usage: prebuild [ARCH like 90] [quick|writes]");
        std::process::exit(2);
    };
    let arch = (arch_n / 10, arch_n % 10);
    let quick = args.iter().any(|a| a == "quick");
    let writes = args.iter().any(|a| a == "writes");
    let mut specs = vec![ModuleSpec::Bench, ModuleSpec::Model, ModuleSpec::Quant];
    // Head dims and query heads per kv head of the tests: Llama-like, SmolLM2-like, and Gemma 3's
    // (head_dim 256, 4 query heads on 1 kv head).
    for format in FORMATS {
        for (d, groups) in [(128usize, &[0usize, 1, 4, 8][..]), (64, &[0, 3, 4][..]), (256, &[0, 4][..])] {
            for &group in groups {
                specs.push(ModuleSpec::Kv { format, head_dim: d, group });
            }
        }
    }
    if quick {
        specs.truncate(4);
    }
    if writes {
        specs.retain(|s| matches!(s, ModuleSpec::Kv { group: 0, .. }));
    }
    let tuning = match pagekv_cuda::dev::tuning_from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("prebuild: {e}");
            std::process::exit(2);
        }
    };
    let mut failed = 0;
    for spec in &specs {
        let t = std::time::Instant::now();
        match prebuild(spec, arch, &tuning) {
            Ok(n) => println!("{spec:?}: {n} bytes ({:.1} s)", t.elapsed().as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!("{spec:?}: FAILED: {e}");
            }
        }
    }
    println!("{} modules, {failed} failed, cache {:?}", specs.len(), tuning.kernel_cache);
    if failed > 0 {
        std::process::exit(1);
    }
}

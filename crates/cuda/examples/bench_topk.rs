//! Top-k kernel benchmark on one GPU ([`pagekv_cuda::TopK`]): for logit rows of SmolLM2's and
//! Llama 3's vocabularies, the device time of one top-k (CUDA events around `--runs`
//! back-to-back launches, the mean), beside `pk_argmax` on the same rows and the host time of
//! copying the result (`[2, rows, k]`) vs the full rows (`[rows, vocab]`) to the host (medians).
//! JSON lines on stdout, a table on stderr.
//!
//! ```text
//! cargo run --release -p pagekv-cuda --features cuda --example bench_topk -- \
//!     [--vocabs 49152,128256] [--rows 1,8,64,256] [--ks 1,8,65] [--chunks auto,1024,2048,4096]
//!     [--prefilter auto,on,off] [--runs 50] [--device 0]
//! bench_topk --prebuild 90     (compile the module into $PAGEKV_HOME/kernels; no GPU needed)
//! ```

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use pagekv_cuda::compile::prebuild;
use pagekv_cuda::dev::tuning_from_env;
use pagekv_cuda::ModuleSpec;
use pagekv_cuda::{CudaDevice, ModelOps, TopK, TopKPlan};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

struct Args {
    vocabs: Vec<usize>,
    rows: Vec<usize>,
    ks: Vec<usize>,
    /// 0: the automatic plan.
    chunks: Vec<usize>,
    /// `None`: the plan's choice.
    prefilter: Vec<Option<bool>>,
    runs: usize,
    device: usize,
}

fn list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| if s == "auto" { Ok(0) } else { s.parse().map_err(|_| format!("bad value {s:?}")) })
        .collect()
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        vocabs: vec![49152, 128256],
        rows: vec![1, 8, 64, 256],
        ks: vec![1, 8, 65],
        chunks: vec![0],
        prefilter: vec![None],
        runs: 50,
        device: 0,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--vocabs" => a.vocabs = list(v)?,
            "--rows" => a.rows = list(v)?,
            "--ks" => a.ks = list(v)?,
            "--chunks" => a.chunks = list(v)?,
            "--prefilter" => {
                a.prefilter = v
                    .split(',')
                    .map(|s| match s {
                        "auto" => Ok(None),
                        "on" => Ok(Some(true)),
                        "off" => Ok(Some(false)),
                        _ => Err(format!("bad --prefilter {s:?}: auto, on, off")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--runs" => a.runs = v.parse().map_err(|_| format!("bad --runs {v:?}"))?,
            "--device" => a.device = v.parse().map_err(|_| format!("bad --device {v:?}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--prebuild") {
        let arch: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(90);
        match tuning_from_env().and_then(|t| prebuild(&ModuleSpec::TopK, (arch / 10, arch % 10), &t)) {
            Ok(n) => println!("TopK module for sm_{arch}: {n} bytes"),
            Err(e) => {
                eprintln!("bench_topk: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let a = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_topk: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&a) {
        eprintln!("bench_topk: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let dev = CudaDevice::new(a.device, tuning_from_env()?)?;
    let ops = ModelOps::new(dev.clone())?;
    let mut topk = TopK::new(dev.clone())?;
    let s = dev.stream().clone();
    eprintln!("{dev:?}");
    eprintln!(
        "{:>7} {:>5} {:>4} {:>6} {:>4} {:>6} {:>10} {:>10} {:>12} {:>12}",
        "vocab", "rows", "k", "chunk", "pre", "ctas", "topk us", "argmax us", "copy k us", "copy rows us"
    );
    let mut rng = StdRng::seed_from_u64(7);
    let runs = a.runs.max(1);
    for &vocab in &a.vocabs {
        for &rows in &a.rows {
            let host: Vec<f32> = (0..rows * vocab).map(|_| 4.0 * rng.sample::<f32, _>(StandardNormal)).collect();
            let logits = s.clone_htod(&host)?;
            let mut ids = s.alloc_zeros::<u32>(rows.max(1))?;
            // argmax: mean device time of back-to-back launches.
            let time = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| -> Result<f64, Box<dyn std::error::Error>> {
                for _ in 0..3 {
                    f()?;
                }
                let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                for _ in 0..runs {
                    f()?;
                }
                let end = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                Ok(start.elapsed_ms(&end)? as f64 * 1e3 / runs as f64)
            };
            let argmax_us = time(&mut || Ok(ops.argmax(&mut ids, &logits, rows, vocab)?))?;
            let mut full = vec![0f32; rows * vocab];
            let copy_rows_us = median(
                (0..9)
                    .map(|_| {
                        let t = Instant::now();
                        s.memcpy_dtoh(&logits, &mut full[..]).expect("copy");
                        t.elapsed().as_secs_f64() * 1e6
                    })
                    .collect(),
            );
            for &k in &a.ks {
                let mut out = s.alloc_zeros::<u32>(2 * rows * k)?;
                let mut back = vec![0u32; 2 * rows * k];
                for &chunk in &a.chunks {
                    let chosen = if chunk == 0 {
                        topk.plan(rows, vocab, k)?
                    } else {
                        match TopKPlan::new(rows, vocab, k, dev.sm_count(), Some(chunk))? {
                            p if p.chunk == chunk => p,
                            _ => continue, // this chunk does not fit the merge at this k
                        }
                    };
                    for &pf in &a.prefilter {
                        let plan = TopKPlan { prefilter: pf.unwrap_or(chosen.prefilter), ..chosen };
                        let topk_us = time(&mut || {
                            topk.run_packed(&mut out, &logits, rows, vocab, k, Some(plan))?;
                            Ok(())
                        })?;
                        let copy_k_us = median(
                            (0..9)
                                .map(|_| {
                                    let t = Instant::now();
                                    s.memcpy_dtoh(&out, &mut back[..]).expect("copy");
                                    t.elapsed().as_secs_f64() * 1e6
                                })
                                .collect(),
                        );
                        let ctas = rows * plan.chunks;
                        let auto = chunk == 0 && pf.is_none();
                        let pre = if plan.prefilter { "on" } else { "off" };
                        eprintln!(
                            "{vocab:>7} {rows:>5} {k:>4} {:>6} {pre:>4} {ctas:>6} {topk_us:>10.1} {argmax_us:>10.1} {copy_k_us:>12.1} {copy_rows_us:>12.1}",
                            if auto { format!("{}*", plan.chunk) } else { plan.chunk.to_string() }
                        );
                        println!(
                            "{{\"vocab\":{vocab},\"rows\":{rows},\"k\":{k},\"chunk\":{},\"prefilter\":{},\"auto\":{auto},\
                             \"ctas\":{ctas},\"topk_us\":{topk_us:.2},\"argmax_us\":{argmax_us:.2},\
                             \"copy_k_us\":{copy_k_us:.2},\"copy_rows_us\":{copy_rows_us:.2}}}",
                            plan.chunk, plan.prefilter
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

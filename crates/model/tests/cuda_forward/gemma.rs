//! Gemma 3 on the GPU against the CPU forward (the CPU on the fast attention numerics, as in the
//! rest of this file; the CPU side's hybrid cache is checked against masking alone by
//! `pagekv-engine`'s `hybrid_cache` tests):
//! - the tiny random Gemma 3 of `tiny_gemma.rs` (6 layers, 4 with a 16-token window and their own
//!   RoPE base, head_dim 256, 4 query heads on 1 kv head, scaled embeddings, q/k norms, post-norms,
//!   GeGLU, tied output): a 160-token prompt prefilled in chunks of 7, 9, 40 and 104 tokens (the
//!   last through the tiled prefill kernel where the cache format allows it), a step of two
//!   sequences, then 100 decode steps — 263 positions, so every window slides and the sliding
//!   groups free blocks — on the hybrid cache (a block table per layer group) and on one group
//!   (windows by masking alone), f16 and q8 caches, f32 and bf16 weights; and with the
//!   GGUF types of Gemma 3 270M's Q4_K_M file kept quantized on the GPU.
//!
//! The real Gemma 3 270M is checked in `registry_models.rs`.
//!
//! Bounds. GELU: the CPU reads it from ggml's f16 table (llama.cpp's rounding), the GPU computes
//! it in f32; swapping the CPU's table for the f32 function moves the tiny model's logits by
//! 3.4e-4 of their largest magnitude with an f16 cache and 2.6e-3 with a q8 cache (the moved
//! keys flip some 8-bit codes; measured on the CPU, seed 48). With f32 weights the bounds are
//! 2e-3 and 8e-3 of that magnitude, and the greedy choices must be equal (the CPU's closest
//! top-2 gap along its greedy path is about 3.9 logits, against errors of 0.07 at most). bf16
//! weights round every weight and product input: 0.15 of the magnitude, choices not compared.
//! Quantized weights: the CPU quantizes activations to 8 bits per 32 or 256 values for every
//! product (as ggml), the GPU per 32 (or rounds them to bf16 for large steps), each about 0.05
//! of the magnitude from exact products (measured on the CPU: 0.04–0.07, mean 0.045): the max
//! difference within 0.2 of the magnitude and the mean within 0.1 of the logits' RMS — a wrong
//! window, RoPE base, scale or norm moves them by whole logits.

use kvcache::KvFormat;
use pagekv_cuda::DType;
use pagekv_model::cuda::{CudaModel, GpuWeights};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::gpu::{cpu_model, device, out};
use super::tiny_gemma::{gemma_cache, max_diff, run, tiny_gemma, VOCAB};

/// The tiny model's seed (the greedy margin above was measured with it).
const SEED: u64 = 48;
/// Prefill chunks of the 160-token prompt: two decode-sized, one past the quantized
/// matrix-vector products' 16 rows, one at least the prefill kernel's 96 tokens.
const CHUNKS: [usize; 4] = [7, 9, 40, 104];
const STEPS: usize = 100;

/// The prompt and the 102 tokens fed after it (random: the windows see varied keys).
fn inputs() -> (Vec<u32>, Vec<u32>) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let prompt = (0..CHUNKS.iter().sum::<usize>()).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let feed = (0..STEPS + 2).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    (prompt, feed)
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

#[test]
fn tiny_gemma3_matches_the_cpu_forward() {
    let Some(dev) = device("tiny_gemma3_matches_the_cpu_forward") else { return };
    let mut cpu = cpu_model(tiny_gemma(SEED, false));
    let c = cpu.config.clone();
    assert_eq!(c.layer_windows.iter().filter(|w| w.is_some()).count(), 4, "four local layers");
    let (prompt, feed) = inputs();
    for format in [KvFormat::F16, KvFormat::Q8] {
        let cache = gemma_cache(&c, format, true);
        assert_eq!(cache.groups.num_groups(), 3, "two sliding groups and a full one");
        let want = run(&mut cpu, &cache, &prompt, &CHUNKS, STEPS, Some(&feed));
        let want_greedy = run(&mut cpu, &cache, &prompt, &CHUNKS, STEPS, None);
        let margin = want_greedy.gaps.iter().copied().fold(f32::MAX, f32::min);
        for dtype in [DType::F32, DType::Bf16] {
            let mut gpu = CudaModel::from_model(&cpu, dev.clone(), dtype).unwrap();
            for hybrid in [true, false] {
                let gcache = gemma_cache(&c, format, hybrid);
                let got = run(&mut gpu, &gcache, &prompt, &CHUNKS, STEPS, Some(&feed));
                let (err, scale) = max_diff(&got.logits, &want.logits);
                let what = format!("{format} {dtype:?} {}", if hybrid { "hybrid" } else { "one group" });
                out(&format!("tiny gemma3 {what}: max |logit diff| {err:.2e} (max |logit| {scale:.2})"));
                let tol = match (dtype, format) {
                    (DType::F32, KvFormat::F16) => 2e-3,
                    (DType::F32, _) => 8e-3,
                    _ => 0.15,
                } * scale;
                assert!(err <= tol, "{what}: logits differ by {err} (bound {tol})");
                if dtype == DType::F32 {
                    // Greedy along the GPU's own choices (the device argmax after the prompt).
                    let got_greedy = run(&mut gpu, &gcache, &prompt, &CHUNKS, STEPS, None);
                    out(&format!("tiny gemma3 {what}: greedy; the CPU's smallest top-2 gap {margin:.3}"));
                    assert_eq!(got_greedy.choices, want_greedy.choices, "{what}: greedy tokens");
                }
            }
        }
    }
}

#[test]
fn tiny_gemma3_with_quantized_weights_matches_the_cpu_forward() {
    let Some(dev) = device("tiny_gemma3_with_quantized_weights_matches_the_cpu_forward") else { return };
    let mut cpu = cpu_model(tiny_gemma(SEED, true));
    let (prompt, feed) = inputs();
    let cache = gemma_cache(&cpu.config, KvFormat::F16, true);
    let want = run(&mut cpu, &cache, &prompt, &CHUNKS, STEPS, Some(&feed));
    let mut gpu = CudaModel::from_model(&cpu, dev.clone(), GpuWeights::Gguf).unwrap();
    assert_eq!(gpu.weights_name(), "gguf");
    let got = run(&mut gpu, &cache, &prompt, &CHUNKS, STEPS, Some(&feed));
    let (err, scale) = max_diff(&got.logits, &want.logits);
    let mean = got.logits.iter().zip(&want.logits).map(|(g, w)| (g - w).abs()).sum::<f32>() / want.logits.len() as f32;
    let spread = rms(&want.logits);
    let same = got.choices.iter().zip(&want.choices).filter(|(g, w)| g == w).count();
    out(&format!(
        "tiny gemma3, GGUF weights: max |logit diff| {err:.2e} (max |logit| {scale:.2}), mean {mean:.2e} \
         (logit RMS {spread:.2}); top-1 {same}/{}",
        want.choices.len()
    ));
    assert!(err <= 0.2 * scale, "logits differ by {err} (bound {})", 0.2 * scale);
    assert!(mean <= 0.1 * spread, "logits differ by {mean} on average (bound {})", 0.1 * spread);
}

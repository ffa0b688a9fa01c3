//! Registry models on the GPU against the CPU forward, on their golden prompts (each skipped
//! when its file is absent): for every prompt the GPU's greedy 16 tokens against the CPU's, and
//! teacher-forced top-1 along the CPU's continuation.
//!
//! The CPU quantizes activations to 8 bits per 32 or 256 values for every product and rounds as
//! llama.cpp does (for Gemma, GELU from ggml's f16 table); the GPU quantizes them per 32 in its
//! matrix-vector products, rounds them to bf16 in the prompts' large products and computes GELU
//! in f32. So logits differ by tenths, and a continuation must be the CPU's up to a near tie: at
//! the first difference the CPU's own logits put the GPU's token within `TIE` of its choice, and
//! so must every teacher-forced step that differs.
//! - SmolLM2 (the default model): f32, bf16 and GGUF weights, top-1 agreement at least 90 %.
//! - Gemma 3 270M (`gemma3-270m`): the hybrid cache the engine builds (six groups of three
//!   layers), two prompts past the 512-token window; GGUF, bf16 and f32 weights.
//! - Qwen2.5-Coder-1.5B (`qwen2.5-coder-1.5b`): one group, q/k biases, 6 query heads a kv head,
//!   Q4_K/Q6_K weights kept quantized.

use std::path::Path;
use std::sync::Arc;

use kvcache::{CacheConfig, KvFormat};
use pagekv_cuda::{CudaDevice, DType};
use pagekv_model::cuda::{CudaModel, GpuWeights};
use pagekv_model::gguf::GgufFile;

use super::gpu::{cpu_model, device, gap, greedy, out};

/// How far (in the CPU's logits) the GPU's token may trail the CPU's where they differ.
const TIE: f32 = 0.5;

/// A model's golden data (`crates/model/tests/data/NAME/llamacpp.json`): the build's source tree,
/// else the repository root as the current directory (a test binary carried to the GPU machine
/// runs from a copy of it).
fn golden(name: &str) -> serde_json::Value {
    let rel = format!("tests/data/{name}/llamacpp.json");
    let built = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(&rel);
    let path = if built.is_file() { built } else { std::path::PathBuf::from("crates/model").join(&rel) };
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A golden prompt's name (its start), ids, the CPU's greedy continuation and its logits at every
/// step.
type CpuCase = (String, Vec<u32>, Vec<u32>, Vec<Vec<f32>>);

/// One model's comparison (module docs).
struct Comparison<'a> {
    /// Names the golden data (`tests/data/NAME/llamacpp.json`) and the output lines.
    name: &'a str,
    /// Blocks of 16 tokens for every layer.
    num_blocks: usize,
    /// Layer groups of the cache the engine builds.
    groups: usize,
    weights: &'a [GpuWeights],
    /// The least teacher-forced top-1 agreement, `(num, den)` for num/den, if bounded.
    min_agreement: Option<(usize, usize)>,
}

/// The comparison described in the module docs of the model at `path`.
fn follows_the_cpu(dev: Arc<CudaDevice>, path: &Path, cmp: Comparison) {
    let Comparison { name, num_blocks, groups, weights, min_agreement } = cmp;
    let golden = golden(name);
    let mut cpu = cpu_model(Arc::new(GgufFile::open(path).unwrap()));
    let c = cpu.config.clone();
    let mut cache = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
    cache.format = KvFormat::F16;
    cache.num_blocks = num_blocks;
    cache.dynamic_growth = true;
    cache.set_layer_windows(&c.layer_windows).unwrap();
    assert_eq!(cache.groups.num_groups(), groups);
    // The CPU's continuation of each prompt and its logits at every step, once.
    let cases: Vec<CpuCase> = golden["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let prompt: Vec<u32> =
                case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            let name = case["prompt"].as_str().unwrap().chars().take(24).collect::<String>();
            let (want, cpu_logits) = greedy(&mut cpu, &cache, &prompt, None);
            (name, prompt, want, cpu_logits)
        })
        .collect();
    for &weights in weights {
        let mut gpu = CudaModel::from_model(&cpu, dev.clone(), weights).unwrap();
        let (mut same, mut agree, mut total) = (0, 0, 0);
        for (prompt_name, prompt, want, cpu_logits) in &cases {
            let (got, _) = greedy(&mut gpu, &cache, prompt, None);
            // Teacher-forced along the CPU's continuation: every step compared.
            let (forced, _) = greedy(&mut gpu, &cache, prompt, Some(want));
            for (step, (&g, &w)) in forced.iter().zip(want).enumerate() {
                total += 1;
                if g == w {
                    agree += 1;
                    continue;
                }
                let d = gap(&cpu_logits[step], w, g);
                out(&format!("{name} {weights:?} {prompt_name:?} step {step}: GPU {g}, CPU {w}, CPU logit gap {d:.3}"));
                assert!(
                    d <= TIE,
                    "{weights:?} {prompt_name:?} step {step}: GPU chose {g} where the CPU's {w} leads by {d}"
                );
            }
            if got == *want {
                same += 1;
                out(&format!("{name} {weights:?} {prompt_name:?}: same 16 tokens"));
            } else {
                let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
                let d = gap(&cpu_logits[first], want[first], got[first]);
                out(&format!(
                    "{name} {weights:?} {prompt_name:?}: first difference at token {first} (CPU logit gap there {d:.3})"
                ));
                assert!(
                    d <= TIE,
                    "{weights:?} {prompt_name:?}: continuation differs at token {first}, not a near tie ({d})"
                );
            }
        }
        out(&format!(
            "{name} GPU ({weights:?} weights) vs CPU: {same} of {} greedy continuations identical, \
             teacher-forced top-1 {agree}/{total}",
            cases.len()
        ));
        if let Some((num, den)) = min_agreement {
            assert!(agree * den >= total * num, "{weights:?}: top-1 agreement {agree}/{total}");
        }
    }
}

/// SmolLM2 (the default model): every weight kind, teacher-forced top-1 at least 90 %.
#[test]
fn smollm2_greedy_on_the_gpu_follows_the_cpu() {
    let test = "smollm2_greedy_on_the_gpu_follows_the_cpu";
    let Some(dev) = device(test) else { return };
    let Some(path) = pagekv_testkit::default_model(test) else { return };
    let weights = [GpuWeights::Dense(DType::F32), GpuWeights::Dense(DType::Bf16), GpuWeights::Gguf];
    let cmp =
        Comparison { name: "smollm2", num_blocks: 64, groups: 1, weights: &weights, min_agreement: Some((9, 10)) };
    follows_the_cpu(dev, &path, cmp);
}

/// Gemma 3 270M: the hybrid cache the engine builds (6 groups of 3 layers; 160 blocks of 18
/// layers, 2,560 tokens, as 960 blocks of 3). The golden file's closest llama.cpp top-2 gap is
/// 0.0027 (`digits`, step 14).
#[test]
fn gemma3_270m_greedy_on_the_gpu_follows_the_cpu() {
    let test = "gemma3_270m_greedy_on_the_gpu_follows_the_cpu";
    let Some(dev) = device(test) else { return };
    let Some(path) = pagekv_testkit::dev::registry_model(test, "gemma3-270m.gguf") else { return };
    let weights = [GpuWeights::Gguf, GpuWeights::Dense(DType::Bf16), GpuWeights::Dense(DType::F32)];
    let cmp = Comparison { name: "gemma3-270m", num_blocks: 160, groups: 6, weights: &weights, min_agreement: None };
    follows_the_cpu(dev, &path, cmp);
}

/// Qwen2.5-Coder-1.5B with its Q4_K/Q6_K weights kept quantized on the GPU (the default), and
/// dequantized to bf16.
#[test]
fn qwen_1_5b_greedy_on_the_gpu_follows_the_cpu() {
    let test = "qwen_1_5b_greedy_on_the_gpu_follows_the_cpu";
    let Some(dev) = device(test) else { return };
    let Some(path) = pagekv_testkit::dev::registry_model(test, "qwen2.5-coder-1.5b.gguf") else { return };
    let weights = [GpuWeights::Gguf, GpuWeights::Dense(DType::Bf16)];
    let cmp =
        Comparison { name: "qwen2.5-coder-1.5b", num_blocks: 64, groups: 1, weights: &weights, min_agreement: None };
    follows_the_cpu(dev, &path, cmp);
}

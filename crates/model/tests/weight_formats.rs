//! Every weight format through the loader: a tiny llama model whose matrices (and token
//! embedding) are random blocks of one type is written as a GGUF file, loaded and run; its
//! logits must match those of the same model with every matrix dequantized to F32 by the
//! scalar reference. The quantized model multiplies 8-bit activations (as llama.cpp does), so
//! the two agree to within that rounding, not bit for bit.

use std::sync::Arc;

use kvcache::{CacheConfig, KvPool, SequenceCache, SequencePolicy};
use pagekv_cpu::attention::AttentionConfig;
use pagekv_cpu::quant::{dequantize_row, WeightType};
use pagekv_model::gguf::{GgmlType, GgufFile, GgufWriter};
use pagekv_model::{Batch, Forward, Logits, Model};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const LAYERS: u32 = 2;
const HIDDEN: u64 = 256;
const HEADS: u32 = 4;
const KV_HEADS: u32 = 2;
const FFN: u64 = 512;
const VOCAB: u64 = 320;

/// Random blocks of `ty` for `rows × cols` whose f16 scales give values of about `scale`.
fn random_matrix(rng: &mut StdRng, ty: WeightType, rows: u64, cols: u64, scale: f32) -> Vec<u8> {
    if ty.f16_scale_offsets().is_empty() {
        // Float types: uniform values of about `scale`, encoded.
        let values: Vec<f32> = (0..rows * cols).map(|_| scale * rng.gen_range(-1.7f32..1.7)).collect();
        let mut data = Vec::new();
        pagekv_cpu::quant::quantize::quantize_row(ty, &values, &mut data).unwrap();
        return data;
    }
    let n_blocks = (rows * cols) as usize / ty.block_elems();
    let mut data = vec![0u8; n_blocks * ty.block_bytes()];
    rng.fill_bytes(&mut data);
    // Codes reach ~2^(bits-1) times the block scale (the K-quants also multiply a 4- or 6-bit
    // sub-scale), so this keeps values near `scale`.
    let d = match ty {
        WeightType::Q2K | WeightType::Q4K | WeightType::Q5K => scale / 64.0,
        WeightType::Q3K => scale / 512.0,
        WeightType::Q6K | WeightType::IQ4XS => scale / 2048.0,
        WeightType::IQ4NL | WeightType::Q8_0 => scale / 64.0,
        _ => scale / 8.0,
    };
    // The second field is a min (`m`, `dmin`), set to about the mean code times the scale so the
    // values centre near 0 (`m` is added, `dmin` subtracted).
    let min = match ty {
        WeightType::Q4_1 => -7.5 * d,
        WeightType::Q5_1 => -15.5 * d,
        WeightType::Q2K => 1.5 * d,
        WeightType::Q4K => 7.5 * d,
        _ => 15.5 * d,
    };
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        for (i, &at) in ty.f16_scale_offsets().iter().enumerate() {
            let v = if i == 0 { d } else { min } * rng.gen_range(0.8..1.2);
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    data
}

fn dequantize(ty: WeightType, cols: u64, data: &[u8]) -> Vec<f32> {
    let row_bytes = ty.row_bytes(cols as usize).unwrap();
    let mut out = vec![0.0; data.len() / row_bytes * cols as usize];
    for (row, o) in data.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols as usize)) {
        dequantize_row(ty, row, o).unwrap();
    }
    out
}

/// The tiny model twice: matrices of `ty`, and the same values as F32.
fn tiny_models(ty: WeightType, seed: u64) -> (Arc<GgufFile>, Arc<GgufFile>) {
    tiny_models_with(ty, seed, false)
}

/// [`tiny_models`], with the output matrix tied to the token embedding if `tied`.
fn tiny_models_with(ty: WeightType, seed: u64, tied: bool) -> (Arc<GgufFile>, Arc<GgufFile>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut wq, mut wf) = (GgufWriter::new(), GgufWriter::new());
    for w in [&mut wq, &mut wf] {
        w.set("general.architecture", "llama");
        w.set("general.name", "tiny");
        w.set("llama.block_count", LAYERS);
        w.set("llama.embedding_length", HIDDEN as u32);
        w.set("llama.feed_forward_length", FFN as u32);
        w.set("llama.attention.head_count", HEADS);
        w.set("llama.attention.head_count_kv", KV_HEADS);
        w.set("llama.context_length", 256u32);
        w.set("llama.vocab_size", VOCAB as u32);
        w.set("llama.attention.layer_norm_rms_epsilon", 1e-5f32);
        w.set("llama.rope.freq_base", 10000.0f32);
    }
    let ggml = GgmlType::from_id(ty.ggml_id()).unwrap();
    let head_dim = HIDDEN / HEADS as u64;
    let kv = KV_HEADS as u64 * head_dim;
    let mut matrix = |name: &str, cols: u64, rows: u64, scale: f32| {
        let data = random_matrix(&mut rng, ty, rows, cols, scale);
        wf.add_f32_tensor(name, &[cols, rows], &dequantize(ty, cols, &data)).unwrap();
        wq.add_tensor(name, &[cols, rows], ggml, data).unwrap();
    };
    let s = 1.0 / (HIDDEN as f32).sqrt();
    matrix("token_embd.weight", HIDDEN, VOCAB, 1.0);
    for i in 0..LAYERS {
        let n = |t: &str| format!("blk.{i}.{t}");
        matrix(&n("attn_q.weight"), HIDDEN, HIDDEN, s);
        matrix(&n("attn_k.weight"), HIDDEN, kv, s);
        matrix(&n("attn_v.weight"), HIDDEN, kv, s);
        matrix(&n("attn_output.weight"), HIDDEN, HIDDEN, s);
        matrix(&n("ffn_gate.weight"), HIDDEN, FFN, s);
        matrix(&n("ffn_up.weight"), HIDDEN, FFN, s);
        matrix(&n("ffn_down.weight"), FFN, HIDDEN, 1.0 / (FFN as f32).sqrt());
    }
    if !tied {
        matrix("output.weight", HIDDEN, VOCAB, 4.0 * s);
    }
    let ones = vec![1.0f32; HIDDEN as usize];
    for w in [&mut wq, &mut wf] {
        for i in 0..LAYERS {
            w.add_f32_tensor(&format!("blk.{i}.attn_norm.weight"), &[HIDDEN], &ones).unwrap();
            w.add_f32_tensor(&format!("blk.{i}.ffn_norm.weight"), &[HIDDEN], &ones).unwrap();
        }
        w.add_f32_tensor("output_norm.weight", &[HIDDEN], &ones).unwrap();
    }
    let file = |w: &GgufWriter| Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
    (file(&wq), file(&wf))
}

/// Every row of logits of one prefill of `prompt`.
fn prefill_logits(file: Arc<GgufFile>, prompt: &[u32]) -> Vec<f32> {
    prefill_logits_of(Model::from_file(file, AttentionConfig::default()).unwrap(), prompt)
}

fn prefill_logits_of(mut m: Model, prompt: &[u32]) -> Vec<f32> {
    let c = &m.config;
    let mut cache = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
    cache.num_blocks = 8;
    cache.block_size = 16;
    cache.dynamic_growth = true;
    let mut pool: KvPool = m.new_pool(cache.clone()).unwrap();
    let mut seq = SequenceCache::new(&mut pool, SequencePolicy::from_config(&cache), 0).unwrap();
    seq.begin_append(&mut pool, prompt.len()).unwrap();
    let mut batch = Batch::default();
    batch.push(prompt, seq.offset() + prompt.len(), seq.pending_slots(), seq.block_table(), Logits::All);
    let logits = m.forward(&batch, &mut pool).unwrap().to_vec();
    seq.commit_append(&mut pool);
    logits
}

#[test]
fn every_weight_format_loads_and_runs_like_its_dequantized_model() {
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % VOCAB as u32).collect();
    // Fixed seeds: a tiny random model can amplify the activations' int8 rounding past the
    // bound on an unlucky draw, so per-run seeds made this test flaky; the kernels themselves
    // are checked on fresh random blocks in pagekv-cpu's quant_kernels tests.
    for (i, ty) in WeightType::ALL.into_iter().enumerate() {
        let seed = 0x5eed_0000 + i as u64;
        let (quantized, float) = tiny_models(ty, seed);
        let got = prefill_logits(quantized, &prompt);
        let want = prefill_logits(float, &prompt);
        assert_eq!(got.len(), want.len());
        let v = VOCAB as usize;
        let mut worst = 1.0f64;
        for (pos, (g, w)) in got.chunks_exact(v).zip(want.chunks_exact(v)).enumerate() {
            assert!(g.iter().all(|x| x.is_finite()), "{ty:?} seed {seed}: non-finite logits");
            // Correlation of the centred rows (a shared offset cannot hide a difference).
            let centred = |x: &[f32]| {
                let mean = x.iter().map(|a| *a as f64).sum::<f64>() / x.len() as f64;
                x.iter().map(|a| *a as f64 - mean).collect::<Vec<f64>>()
            };
            let (g, w) = (centred(g), centred(w));
            let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
            let corr = g.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>() / (norm(&g) * norm(&w));
            // 8-bit activations through two layers: the logit rows stay almost parallel.
            assert!(corr > 0.99, "{ty:?} seed {seed} position {pos}: correlation {corr}");
            worst = worst.min(corr);
        }
        eprintln!("{:>6}: lowest correlation {worst:.6} over {} positions", ty.ggml_name(), prompt.len());
    }
}

#[test]
fn interleaved_q4_k_copy_gives_the_file_layouts_logits() {
    // The huge-page copy interleaves Q4_K matrices where the CPU has AVX-512 VNNI; the model's
    // logits must not change by a bit, the tied embedding (whose rows a lookup reads) must
    // stay in rows, and the file-layout accessors must still give the file's bytes.
    use pagekv_cpu::quant::{Isa, RowLayout};
    use pagekv_model::llama::weights::LoadOptions;
    let prompt: Vec<u32> = (0..23).map(|i| (i * 53 + 7) % VOCAB as u32).collect();
    for tied in [false, true] {
        let (file, _) = tiny_models_with(WeightType::Q4K, 0x1e4f + tied as u64, tied);
        let load = |copy_weights: bool, interleave_q4k: bool| {
            let options = LoadOptions { copy_weights, interleave_q4k };
            let m = Model::from_file_with(file.clone(), AttentionConfig::default(), options).unwrap();
            m.weights.wait_until_resident();
            m
        };
        let want = prefill_logits_of(load(false, false), &prompt);
        let plain_copy = load(true, false);
        let m = load(true, true);
        let w = &m.weights;
        let (wq, embd) = (&w.layers[0].wq, &w.token_embd);
        let interleaves = Isa::best() == Isa::Avx512Vnni;
        if interleaves {
            assert_eq!(w.view(wq).layout, RowLayout::Q4kX16, "tied {tied}");
            assert_eq!(w.view(&w.output).layout, if tied { RowLayout::Rows } else { RowLayout::Q4kX16 });
        } else {
            eprintln!("SKIPPED the interleaved layout: no AVX-512 VNNI here (the copy stays in rows)");
            assert_eq!(w.view(wq).layout, RowLayout::Rows);
        }
        assert_eq!(w.view(embd).layout, RowLayout::Rows, "tied {tied}");
        assert_eq!(w.bytes(wq), plain_copy.weights.bytes(wq), "bytes() gives the file's rows");
        assert_eq!(w.file_view(wq).row(5).unwrap(), plain_copy.weights.view(wq).row(5).unwrap());
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let got = prefill_logits_of(m, &prompt);
        assert_eq!(bits(&got), bits(&want), "tied {tied}");
        assert_eq!(bits(&prefill_logits_of(plain_copy, &prompt)), bits(&want), "tied {tied}");
    }
}

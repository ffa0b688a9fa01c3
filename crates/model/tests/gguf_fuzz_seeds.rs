//! Seed corpus for the `gguf_parse` fuzz target (fuzz/seeds/gguf_parse/), made by the
//! writer. Each seed must parse; the committed seeds must be exactly what `seeds()` makes.
//!
//! Regenerate after changing the writer or the seeds:
//! `PAGEKV_WRITE_FUZZ_SEEDS=1 cargo test -p pagekv-model --test gguf_fuzz_seeds`

use std::path::PathBuf;

use pagekv_model::gguf::{GgmlType, GgufFile, GgufWriter, MetaArray, MetaValue};

fn seed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/gguf_parse")
}

/// Deterministic filler bytes (no RNG dependency, so seeds are stable).
fn filler(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt)).collect()
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut scalars = GgufWriter::new();
    scalars
        .set("u8", 200u8)
        .set("i8", -5i8)
        .set("u16", 60000u16)
        .set("i16", -3000i16)
        .set("u32", 4_000_000_000u32)
        .set("i32", -70000i32)
        .set("f32", 0.125f32)
        .set("bool", true)
        .set("string", "héllo")
        .set("u64", 1u64 << 40)
        .set("i64", -(1i64 << 40))
        .set("f64", -2.5f64);

    let mut arrays = GgufWriter::new();
    arrays
        .set("a.u8", vec![1u8, 2, 3])
        .set("a.i8", vec![-1i8, 1])
        .set("a.u16", vec![1u16, 2])
        .set("a.i16", vec![-1i16])
        .set("a.u32", vec![7u32, 8])
        .set("a.i32", vec![-7i32, 8])
        .set("a.f32", vec![0.5f32, -0.5])
        .set("a.bool", vec![true, false])
        .set("a.string", vec!["x".to_string(), String::new()])
        .set("a.u64", vec![9u64])
        .set("a.i64", vec![-9i64])
        .set("a.f64", vec![0.25f64])
        .set(
            "a.nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::U8(vec![1]),
                MetaArray::Array(vec![MetaArray::String(vec!["deep".into()])]),
            ])),
        );

    let mut tensors = GgufWriter::new();
    tensors.set("general.architecture", "test");
    for (i, ty) in [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::BF16]
        .into_iter()
        .enumerate()
    {
        let dims = [ty.block_size() as u64, 2];
        let n = ty.bytes_for(dims[0] * dims[1]).unwrap() as usize;
        tensors.add_tensor(&format!("t.{}", ty.name()), &dims, ty, filler(n, i as u8)).unwrap();
    }

    let mut v2 = GgufWriter::new();
    v2.version(2).set("general.alignment", 16u32);
    v2.add_tensor("a", &[3], GgmlType::F32, filler(12, 1)).unwrap();
    v2.add_tensor("b", &[2, 2], GgmlType::F16, filler(8, 2)).unwrap();

    // A tiny llama: the keys and tensor names a loader looks for, 2 layers, dim 32.
    let mut llama = GgufWriter::new();
    let tokens: Vec<String> = ["<unk>", "<s>", "</s>", "a", "b", "ab"].map(String::from).to_vec();
    llama
        .set("general.architecture", "llama")
        .set("llama.block_count", 2u32)
        .set("llama.embedding_length", 32u32)
        .set("llama.feed_forward_length", 64u32)
        .set("llama.attention.head_count", 4u32)
        .set("llama.attention.head_count_kv", 2u32)
        .set("llama.context_length", 128u32)
        .set("llama.rope.freq_base", 10000.0f32)
        .set("llama.attention.layer_norm_rms_epsilon", 1e-5f32)
        .set("tokenizer.ggml.model", "gpt2")
        .set("tokenizer.ggml.tokens", tokens)
        .set("tokenizer.ggml.token_type", vec![2i32, 3, 3, 1, 1, 1])
        .set("tokenizer.ggml.merges", vec!["a b".to_string()])
        .set("tokenizer.ggml.bos_token_id", 1u32)
        .set("tokenizer.ggml.eos_token_id", 2u32);
    llama.add_tensor("token_embd.weight", &[32, 6], GgmlType::Q8_0, filler(6 * 34, 3)).unwrap();
    llama.add_tensor("output_norm.weight", &[32], GgmlType::F32, filler(128, 4)).unwrap();
    for layer in 0..2 {
        llama
            .add_tensor(&format!("blk.{layer}.attn_q.weight"), &[32, 32], GgmlType::Q4_1, filler(32 * 20, layer))
            .unwrap();
    }

    vec![
        ("scalars.gguf", scalars.to_bytes()),
        ("arrays.gguf", arrays.to_bytes()),
        ("tensors.gguf", tensors.to_bytes()),
        ("v2_align16.gguf", v2.to_bytes()),
        ("tiny_llama.gguf", llama.to_bytes()),
    ]
}

#[test]
fn seeds_parse_and_match_the_committed_corpus() {
    let seeds = seeds();
    let total: usize = seeds.iter().map(|(_, b)| b.len()).sum();
    assert!(total < 100 * 1024, "seed corpus is {total} bytes");
    for (name, bytes) in &seeds {
        GgufFile::from_bytes(bytes.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let dir = seed_dir();
    if std::env::var_os("PAGEKV_WRITE_FUZZ_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        eprintln!("wrote {} seeds ({total} bytes) to {}", seeds.len(), dir.display());
        return;
    }
    for (name, bytes) in &seeds {
        let committed = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}; regenerate with PAGEKV_WRITE_FUZZ_SEEDS=1 (see this file)"));
        assert!(&committed == bytes, "{name} is stale; regenerate with PAGEKV_WRITE_FUZZ_SEEDS=1 (see this file)");
    }
}

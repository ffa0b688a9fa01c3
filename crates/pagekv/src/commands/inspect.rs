//! `pagekv inspect FILE`: what a GGUF file holds — architecture, sizes, tensor types,
//! tokenizer, chat template — and what its KV cache costs per token in every format.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use kvcache::KvFormat;
use pagekv_model::gguf::GgufFile;
use pagekv_model::template::ChatTemplate;
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::ModelConfig;
use serde_json::json;

use crate::commands::all_formats;

pub fn run(path: &Path, json_out: bool) -> Result<()> {
    let file = GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let meta = file.metadata();
    let config = ModelConfig::from_metadata(meta).context("unsupported model")?;
    let mut types: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let e = types.entry(t.ggml_type.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let params: u64 = file.tensors().iter().map(|t| t.dims.iter().product::<u64>()).sum();
    let weight_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let tokenizer = Tokenizer::from_gguf(meta);
    let template = ChatTemplate::from_gguf(meta);
    let ctx = config.context_length;
    let kv: Vec<_> = all_formats()
        .into_iter()
        .filter(|f| f.validate(config.head_dim).is_ok())
        .map(|f: KvFormat| {
            let per_layer = f.bytes_per_token(config.num_kv_heads, config.head_dim);
            let per_token = per_layer * config.num_layers;
            (f.name(), per_token, per_token as u64 * ctx as u64)
        })
        .collect();

    if json_out {
        let out = json!({
            "file": path.display().to_string(),
            "gguf_version": file.version(),
            "architecture": config.arch_name,
            "name": config.name,
            "parameters": params,
            "weight_bytes": weight_bytes,
            "layers": config.num_layers,
            "hidden": config.hidden,
            "ffn": config.ffn,
            "heads": config.num_heads,
            "kv_heads": config.num_kv_heads,
            "head_dim": config.head_dim,
            "vocab": config.vocab_size,
            "context_length": ctx,
            "rope_base": config.rope_base,
            "tensor_types": types.iter().map(|(k, (n, b))| (k.clone(), json!({"tensors": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "tokenizer": match &tokenizer {
                Ok(t) => json!({"model": t.model().name(), "pre": t.pre_tokenizer(), "vocab": t.vocab_size(), "bos": t.bos_id(), "eos": t.eos_id(), "add_bos": t.add_bos()}),
                Err(e) => json!({"error": e.to_string()}),
            },
            "chat_template": match &template { Ok(t) => json!(t.source()), Err(e) => json!({"error": e.to_string()}) },
            "kv_bytes_per_token": kv.iter().map(|(n, t, c)| json!({"format": n, "bytes_per_token": t, "bytes_at_context": c})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    println!("file          {}", path.display());
    println!("gguf version  {}", file.version());
    println!("architecture  {} ({})", config.arch_name, if config.name.is_empty() { "unnamed" } else { &config.name });
    println!("parameters    {:.1} M, {} in weights", params as f64 / 1e6, bytes(weight_bytes));
    println!(
        "shape         {} layers, hidden {}, ffn {}, {} heads / {} kv heads × {}, vocab {}",
        config.num_layers,
        config.hidden,
        config.ffn,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.vocab_size
    );
    println!("context       {} tokens, rope base {}", ctx, config.rope_base);
    println!("tensor types");
    for (k, (n, b)) in &types {
        println!("  {k:<6} {n:>4} tensors  {}", bytes(*b));
    }
    match &tokenizer {
        Ok(t) => println!(
            "tokenizer     {} (pre {}), {} tokens, bos {:?}, eos {:?}, add_bos {}",
            t.model().name(),
            t.pre_tokenizer().unwrap_or("-"),
            t.vocab_size(),
            t.bos_id(),
            t.eos_id(),
            t.add_bos()
        ),
        Err(e) => println!("tokenizer     unusable: {e}"),
    }
    match &template {
        Ok(t) => println!("chat template {} bytes\n{}", t.source().len(), indent(t.source())),
        Err(e) => println!("chat template unusable: {e}"),
    }
    println!("KV cache at {ctx} tokens (all {} layers)", config.num_layers);
    for (name, per_token, at_ctx) in &kv {
        println!("  {name:<12} {per_token:>7} B/token  {}", bytes(*at_ctx));
    }
    Ok(())
}

fn bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1} KiB", b as f64 / 1024.0),
    }
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}

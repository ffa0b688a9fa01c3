//! `pagekv inspect NAME|FILE`: what a GGUF file holds — architecture, sizes, tensor types,
//! tokenizer, chat template — what its KV cache costs per token in every format, and what in it
//! the runtime cannot run (the architecture, each tensor type without a kernel). `--check`
//! turns the latter into a non-zero exit.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use kvcache::KvFormat;
use pagekv_model::gguf::{GgmlType, GgufFile};
use pagekv_model::template::ChatTemplate;
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::ModelConfig;
use serde_json::json;

use crate::commands::all_formats;

/// Whether the runtime has matrix kernels for tensors of type `t`: the loader's own test
/// (`WeightType::from_ggml_id`), so `inspect` and loading agree.
fn runnable(t: GgmlType) -> bool {
    pagekv_cpu::quant::WeightType::from_ggml_id(t.id()).is_ok()
}

/// Tensor count and bytes of one tensor type.
#[derive(Default)]
struct TypeUse {
    tensors: usize,
    bytes: u64,
}

pub fn run(spec: &str, json_out: bool, check: bool) -> Result<()> {
    let path = crate::registry::resolve(Some(spec))?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let meta = file.metadata();
    let arch = meta.architecture().unwrap_or("(none)").to_string();
    let mut types: BTreeMap<&'static str, (GgmlType, TypeUse)> = BTreeMap::new();
    for t in file.tensors() {
        let e = types.entry(t.ggml_type.name()).or_insert_with(|| (t.ggml_type, TypeUse::default()));
        e.1.tensors += 1;
        e.1.bytes += t.n_bytes;
    }
    let config = ModelConfig::from_metadata(meta);
    // Everything the runtime cannot run, one line each.
    let mut unsupported: Vec<String> = Vec::new();
    if let Err(e) = &config {
        unsupported.push(format!("architecture {arch:?}: {e}"));
    }
    for (name, (_, u)) in types.iter().filter(|(_, (t, _))| !runnable(*t)) {
        unsupported.push(format!("tensor type {name}: {} tensors, {} (no kernel)", u.tensors, bytes(u.bytes)));
    }
    let params: u64 = file.tensors().iter().map(|t| t.dims.iter().product::<u64>()).sum();
    let weight_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let tokenizer = Tokenizer::from_gguf(meta);
    let template = ChatTemplate::from_gguf(meta);
    let kv: Vec<_> = match &config {
        Ok(config) => all_formats()
            .into_iter()
            .filter(|f| f.validate(config.head_dim).is_ok())
            .map(|f: KvFormat| {
                let per_layer = f.bytes_per_token(config.num_kv_heads, config.head_dim);
                let per_token = per_layer * config.num_layers;
                (f.name(), per_token, per_token as u64 * config.context_length as u64)
            })
            .collect(),
        Err(_) => Vec::new(),
    };

    if json_out {
        let mut out = json!({
            "file": path.display().to_string(),
            "gguf_version": file.version(),
            "architecture": arch,
            "runnable": unsupported.is_empty(),
            "unsupported": unsupported,
            "parameters": params,
            "weight_bytes": weight_bytes,
            "tensor_types": types.iter().map(|(k, (t, u))| (k.to_string(), json!({"tensors": u.tensors, "bytes": u.bytes, "supported": runnable(*t)}))).collect::<serde_json::Map<_, _>>(),
            "tokenizer": match &tokenizer {
                Ok(t) => json!({"model": t.model().name(), "pre": t.pre_tokenizer(), "vocab": t.vocab_size(), "bos": t.bos_id(), "eos": t.eos_id(), "add_bos": t.add_bos()}),
                Err(e) => json!({"error": e.to_string()}),
            },
            "chat_template": match &template { Ok(t) => json!(t.source()), Err(e) => json!({"error": e.to_string()}) },
            "kv_bytes_per_token": kv.iter().map(|(n, t, c)| json!({"format": n, "bytes_per_token": t, "bytes_at_context": c})).collect::<Vec<_>>(),
        });
        if let (Ok(c), Some(obj)) = (&config, out.as_object_mut()) {
            let shape = json!({
                "name": c.name,
                "layers": c.num_layers,
                "mtp_layers": c.mtp_layers,
                "hidden": c.hidden,
                "ffn": c.ffn,
                "heads": c.num_heads,
                "kv_heads": c.num_kv_heads,
                "head_dim": c.head_dim,
                "vocab": c.vocab_size,
                "context_length": c.context_length,
                "rope_base": c.rope_base,
            });
            if let serde_json::Value::Object(shape) = shape {
                obj.extend(shape);
            }
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return finish(check, &unsupported);
    }

    println!("file          {}", path.display());
    println!("gguf version  {}", file.version());
    match &config {
        Ok(c) => println!("architecture  {} ({})", c.arch_name, if c.name.is_empty() { "unnamed" } else { &c.name }),
        Err(_) => println!("architecture  {arch} (not supported)"),
    }
    println!("parameters    {:.1} M, {} in weights", params as f64 / 1e6, bytes(weight_bytes));
    if let Ok(c) = &config {
        println!(
            "shape         {} layers, hidden {}, ffn {}, {} heads / {} kv heads × {}, vocab {}",
            c.num_layers, c.hidden, c.ffn, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size
        );
        println!("context       {} tokens, rope base {}", c.context_length, c.rope_base);
        if c.mtp_layers > 0 {
            println!(
                "mtp           {} next-token-prediction layer{} after the {} main ones (--speculative mtp)",
                c.mtp_layers,
                if c.mtp_layers == 1 { "" } else { "s" },
                c.num_layers
            );
        }
    }
    println!("tensor types");
    for (k, (t, u)) in &types {
        let mark = if runnable(*t) { "" } else { "  no kernel: cannot run" };
        println!("  {k:<7} {:>4} tensors  {}{mark}", u.tensors, bytes(u.bytes));
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
    if let Ok(c) = &config {
        println!("KV cache at {} tokens (all {} layers)", c.context_length, c.num_layers);
        for (name, per_token, at_ctx) in &kv {
            println!("  {name:<12} {per_token:>7} B/token  {}", bytes(*at_ctx));
        }
    }
    if unsupported.is_empty() {
        println!("runnable      yes");
    } else {
        println!("cannot run");
        for u in &unsupported {
            println!("  {u}");
        }
    }
    finish(check, &unsupported)
}

/// With `--check`, what the runtime cannot run becomes the command's error (a non-zero exit).
fn finish(check: bool, unsupported: &[String]) -> Result<()> {
    if check && !unsupported.is_empty() {
        bail!("the runtime cannot run this model: {}", unsupported.join("; "));
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

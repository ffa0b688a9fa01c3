//! Opening a model: the GGUF file, its tokenizer, chat template and weights, and the cache
//! configuration for it (flags and `PAGEKV_*` variables over the defaults).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kvcache::{CacheConfig, KvFormat};
use pagekv_cpu::attention::AttentionConfig;
use pagekv_model::gguf::GgufFile;
use pagekv_model::llama::weights::LoadOptions;
use pagekv_model::template::ChatTemplate;
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::Model;

use crate::device::Device;
use crate::registry;

/// A loaded model and everything needed to talk to it.
pub struct Loaded {
    pub path: PathBuf,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub model: Model,
}

/// Opens `model` (a known name or a file; none means the default model, fetched if needed) with
/// a spinner on a terminal. `template_override` replaces the file's chat template.
pub fn load(model: Option<&str>, template_override: Option<&Path>) -> Result<Loaded> {
    let path = registry::resolve(model)?;
    let spinner = progress(&format!("loading {}", path.display()));
    let file = Arc::new(GgufFile::open(&path).with_context(|| format!("cannot read model {}", path.display()))?);
    let tokenizer = Tokenizer::from_gguf(file.metadata()).context("cannot build the tokenizer")?;
    let template = match template_override {
        Some(t) => {
            let src =
                std::fs::read_to_string(t).with_context(|| format!("cannot read chat template {}", t.display()))?;
            let (bos, eos) = (tokenizer.bos_id(), tokenizer.eos_id());
            let text = |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or_default().to_string();
            ChatTemplate::new(&src).context("invalid chat template")?.with_special_tokens(text(bos), text(eos))
        }
        None => ChatTemplate::from_gguf(file.metadata()).context("invalid chat template in the model")?,
    };
    let attention = AttentionConfig::from_lookup(crate::config::env_lookup)?;
    let options = LoadOptions::from_lookup(crate::config::env_lookup)?;
    let model = Model::from_file_with(file.clone(), attention, options)
        .with_context(|| format!("cannot load model {}", path.display()))?;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    Ok(Loaded { path, tokenizer, template, model })
}

/// The cache configuration for `model`: defaults (f16 on CPU, dynamic growth on, the model's
/// context length as the window), then the `PAGEKV_*` variables (and so the flags).
pub fn cache_config(model: &Model) -> Result<CacheConfig> {
    let c = &model.config;
    let mut cfg = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
    cfg.format = KvFormat::F16;
    cfg.dynamic_growth = true;
    cfg.context_window = Some(c.context_length);
    cfg.sliding_window = c.sliding_window;
    let cfg = cfg.with_env_from(crate::config::env_lookup)?;
    cfg.format.validate(c.head_dim)?;
    Ok(cfg)
}

fn progress(msg: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let s = indicatif::ProgressBar::new_spinner();
    s.set_message(msg.to_string());
    s.enable_steady_tick(Duration::from_millis(100));
    Some(s)
}

/// `--speculative draft:MODEL`: loads the draft model (a known name or a file) and checks it
/// against the target's tokenizer — the same tokens under the same ids, or an error naming the
/// first difference. On `device` it is built on the engine's thread like the target.
pub fn draft_model(spec: &str, target: &Tokenizer, device: Device) -> Result<pagekv_engine::DraftModel> {
    let d = load(Some(spec), None).with_context(|| format!("draft model {spec}"))?;
    let (n, m) = (d.tokenizer.vocab_size(), target.vocab_size());
    if n != m {
        bail!("draft model {spec} has a vocabulary of {n} tokens but the model has {m}: they must share one");
    }
    if let Some(id) = (0..n as u32).find(|&i| d.tokenizer.token_text(i) != target.token_text(i)) {
        bail!(
            "draft model {spec}'s token {id} is {:?} but the model's is {:?}: they must share one vocabulary",
            d.tokenizer.token_text(id).unwrap_or_default(),
            target.token_text(id).unwrap_or_default()
        );
    }
    let name = d.path.file_stem().map_or_else(|| spec.to_string(), |s| s.to_string_lossy().into_owned());
    let model = d.model;
    Ok(match device {
        Device::Cpu => pagekv_engine::DraftModel::new(&name, move || Ok(model)),
        Device::Cuda(n) => {
            pagekv_engine::DraftModel::new(&name, crate::commands::cuda::gpu_model_builder(n, model, false)?)
        }
    })
}

/// `--speculative mtp`: the model's own next-token-prediction layers, run by a second view of
/// the same file (the MTP tensors are read from the mapping the model shares; nothing is
/// copied). One line of error for a model without them, and on a GPU, whose forward does not
/// hand out the hidden states they read.
pub fn mtp_model(model: &Model, device: Device) -> Result<pagekv_engine::MtpModel> {
    let c = &model.config;
    if c.mtp_layers == 0 {
        bail!(
            "{} has no next-token-prediction layers ({}.nextn_predict_layers is 0 or absent): --speculative mtp needs a model that ships them",
            c.name,
            c.arch_name
        );
    }
    if let Device::Cuda(_) = device {
        bail!("--speculative mtp runs on the CPU only (the CUDA forward does not hand out hidden states): use --device cpu, or ngram or draft:MODEL on the GPU");
    }
    let file = model.weights.shared_file();
    let attention = AttentionConfig::from_lookup(crate::config::env_lookup)?;
    let options = LoadOptions { copy_weights: false, ..LoadOptions::default() };
    Ok(pagekv_engine::MtpModel::new(&c.name, move || Model::from_file_with(file, attention, options)))
}

//! `pagekv run [PROMPT]`: one completion streamed to stdout (the prompt from the argument or
//! stdin); `--chat` wraps it as a single user message in the chat template. `--device cuda[:N]`
//! runs it on the GPU (feature `cuda`).

use std::io::{Read, Write};

use anyhow::{bail, Context, Result};
use clap::Args;
use pagekv_engine::Generator;
use pagekv_model::template::ChatMessage;

use super::generation::{generate, SamplingArgs};
use crate::load::{cache_config, load};
use crate::settings::{Device, ModelArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The prompt (read from stdin when absent).
    pub prompt: Option<String>,
    /// Apply the chat template to the prompt as one user message.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// Print timing figures to stderr at the end.
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(a: RunArgs) -> Result<()> {
    let device = Device::from_env()?;
    let prompt = match a.prompt {
        Some(p) => p,
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("cannot read the prompt from stdin")?;
            s
        }
    };
    if prompt.is_empty() {
        bail!("empty prompt: give one as an argument or on stdin");
    }
    let loaded = load(a.model.model.as_deref(), a.model.chat_template.as_deref())?;
    let tok = loaded.tokenizer;
    let text = if a.chat {
        let mut messages = Vec::new();
        if let Some(s) = &a.system {
            messages.push(ChatMessage::new("system", s.as_str()));
        }
        messages.push(ChatMessage::new("user", prompt.as_str()));
        loaded.template.render(&messages, true)?
    } else {
        prompt
    };
    // A chat render carries its own BOS text; a raw prompt gets BOS when the model asks for it.
    let ids = if a.chat { tok.encode(&text, true)? } else { tok.encode_with_bos(&text, true)? };
    if let Device::Cuda(n) = device {
        return super::cuda::run_model(n, loaded.model, &tok, &ids, &a.sampling, a.verbose);
    }
    let cache = cache_config(&loaded.model)?;
    let mut generator = Generator::new(loaded.model, cache)?;
    let mut out = std::io::stdout().lock();
    let stats = generate(&mut generator, &tok, &ids, &a.sampling, |s| {
        out.write_all(s.as_bytes())?;
        out.flush()?;
        Ok(())
    })?;
    writeln!(out)?;
    if a.verbose {
        eprintln!("pagekv: {}", stats.summary());
        eprintln!("pagekv: {}", super::cache_summary(generator.pool()));
    }
    Ok(())
}

/// Subcommands whose model runtime is the CPU's only (chat, eval, serve) refuse `--device cuda`
/// with a clear line.
pub fn require_cpu() -> Result<()> {
    match Device::from_env()? {
        Device::Cpu => Ok(()),
        Device::Cuda(_) => bail!("this subcommand runs models on the CPU only: use --device cpu (on CUDA: `pagekv run`, `pagekv bench decode`, `pagekv bench attention`)"),
    }
}

//! `pagekv run [PROMPT]`: one completion streamed to stdout (the prompt from the argument or
//! stdin); `--chat` wraps it as a single user message in the chat template. It runs through the
//! engine with one sequence ([`SingleUser`]); `--device cuda[:N]` runs the same engine over the
//! GPU model (feature `cuda`).

use std::io::{Read, Write};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use pagekv_model::template::ChatMessage;

use super::generation::{generate, SamplingArgs, SingleUser};
use crate::device::Device;
use crate::load::{cache_config, load};
use crate::settings::{ModelArgs, SpeculativeArgs};

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
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

pub fn run(a: RunArgs) -> Result<()> {
    let device = device()?;
    let prompt = match a.prompt.clone() {
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
    let cache = cache_config(&loaded.model)?;
    let speculative = a.speculative.config(device, &tok, &loaded.model)?;
    // The weights move to the GPU with `--device cuda`; the host copy is dropped once they are there.
    let user = SingleUser::start(loaded.model, Arc::new(tok), cache, device, speculative)?;
    let mut out = std::io::stdout().lock();
    let stats = generate(&user, ids, &a.sampling, |s| {
        out.write_all(s.as_bytes())?;
        out.flush()?;
        Ok(())
    })?;
    writeln!(out)?;
    if a.verbose {
        let label = user.device();
        if label != "cpu" {
            eprintln!("pagekv: {label}");
        }
        eprintln!("pagekv: {}", stats.summary());
        if let Some(d) = &stats.drafts {
            eprintln!("pagekv: {}", d.summary());
        }
        eprintln!("pagekv: {}", super::cache_summary(&user.metrics().cache));
    }
    Ok(())
}

/// Where a subcommand runs its model (`--device` / `PAGEKV_DEVICE`). A GPU is checked before
/// any model loads: a build without CUDA, no driver or no such device is one clear error.
pub fn device() -> Result<Device> {
    let device = Device::from_env()?;
    if let Device::Cuda(n) = device {
        super::cuda::check_device(n)?;
    }
    Ok(device)
}

//! `pagekv chat`: an interactive conversation in the terminal. The whole conversation is
//! re-rendered with the chat template each turn, and the generator keeps the cache of the
//! tokens it has seen, so a turn computes only what is new (the common prefix is reused).
//! Commands: `/reset`, `/stats`, `/quit`. `--device cuda[:N]` runs the same loop over the GPU
//! model (feature `cuda`; the KV cache is bf16 there unless `--kv-quant` says otherwise).

use std::io::{BufRead, Write};

use anyhow::Result;
use clap::Args;
use pagekv_engine::Generator;
use pagekv_model::template::{ChatMessage, ChatTemplate};
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::Forward;

use super::generation::{generate, SamplingArgs};
use crate::load::{cache_config, load};
use crate::settings::{Device, ModelArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// System message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let device = super::run::device()?;
    let loaded = load(a.model.model.as_deref(), a.model.chat_template.as_deref())?;
    let (tok, template) = (loaded.tokenizer, loaded.template);
    let cache = cache_config(&loaded.model)?;
    match device {
        Device::Cpu => converse(Generator::new(loaded.model, cache)?, &tok, &template, &a),
        Device::Cuda(n) => {
            let gpu = super::cuda::gpu_model(n, loaded.model, false)?;
            converse(Generator::new(gpu, super::cuda::gpu_cache(cache))?, &tok, &template, &a)
        }
    }
}

/// The conversation loop over one generator (CPU or GPU model).
fn converse<M: Forward>(
    mut generator: Generator<M>,
    tok: &Tokenizer,
    template: &ChatTemplate,
    a: &ChatArgs,
) -> Result<()> {
    let opening: Vec<ChatMessage> = a.system.iter().map(|s| ChatMessage::new("system", s.as_str())).collect();
    let mut messages = opening.clone();
    let mut last = None;
    eprintln!("pagekv chat — /reset starts over, /stats shows the cache, /quit or Ctrl-D leaves");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        match line.trim() {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                messages = opening.clone();
                generator.reset()?;
                eprintln!("(conversation reset)");
                continue;
            }
            "/stats" => {
                if let Some(s) = &last {
                    eprintln!("last turn: {}", super::generation::GenerationStats::summary(s));
                }
                eprintln!("{}", super::cache_summary(generator.pool()));
                eprintln!("{}", generator.sequence());
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line.as_str()));
        let ids = tok.encode(&template.render(&messages, true)?, true)?;
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        let stats = generate(&mut generator, tok, &ids, &a.sampling, |s| {
            reply.push_str(s);
            out.write_all(s.as_bytes())?;
            out.flush()?;
            Ok(())
        })?;
        writeln!(out)?;
        messages.push(ChatMessage::new("assistant", reply.as_str()));
        last = Some(stats);
    }
    Ok(())
}

//! `pagekv chat`: an interactive conversation in the terminal, through the engine with one
//! sequence at a time. The whole conversation is re-rendered with the chat template each turn;
//! the engine's session bank keeps the blocks of the turns before, so a turn computes only what
//! is new (whole blocks of the common prefix are reused). Commands: `/reset`, `/stats`, `/quit`.
//! `--device cuda[:N]` runs the same engine over the GPU model (feature `cuda`; the KV cache is
//! bf16 there unless `--kv-quant` says otherwise).

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use pagekv_model::template::{ChatMessage, ChatTemplate};
use pagekv_model::tokenizer::Tokenizer;

use super::generation::{generate, GenerationStats, SamplingArgs, SingleUser};
use crate::load::{cache_config, load};
use crate::settings::{ModelArgs, SpeculativeArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// System message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let device = super::run::device()?;
    let loaded = load(a.model.model.as_deref(), a.model.chat_template.as_deref())?;
    if loaded.template.origin() == pagekv_model::template::TemplateOrigin::Missing {
        anyhow::bail!("{}", pagekv_model::template::TemplateError::Missing);
    }
    let cache = cache_config(&loaded.model)?;
    let speculative = a.speculative.config(device, &loaded.tokenizer, &loaded.model)?;
    let tok = Arc::new(loaded.tokenizer);
    let user = SingleUser::start(loaded.model, tok.clone(), cache, device, speculative)?;
    converse(&user, &tok, &loaded.template, &a)
}

/// The conversation loop: each turn re-renders the whole conversation and submits it; the
/// engine's session bank holds the earlier turns' blocks, so only the new tokens are computed.
fn converse(user: &SingleUser, tok: &Tokenizer, template: &ChatTemplate, a: &ChatArgs) -> Result<()> {
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
                eprintln!("(conversation reset)");
                continue;
            }
            "/stats" => {
                if let Some(s) = &last {
                    eprintln!("last turn: {}", GenerationStats::summary(s));
                    if let Some(d) = &s.drafts {
                        eprintln!("last turn: {}", d.summary());
                    }
                }
                let m = user.metrics();
                eprintln!("{}", super::cache_summary(&m.cache));
                eprintln!(
                    "session bank: {} hits, {} misses, {} prompt tokens reused, {} blocks cached",
                    m.bank_hits, m.bank_misses, m.bank_hit_tokens, m.blocks_cached
                );
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line.as_str()));
        let ids = tok.encode(&template.render(&messages, true)?, true)?;
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        let stats = generate(user, ids, &a.sampling, |s| {
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

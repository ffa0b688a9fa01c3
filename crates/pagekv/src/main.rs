//! `pagekv` — run, chat with, serve, evaluate and benchmark GGUF models over a paged KV cache.
//!
//! Every cache and kernel setting is a flag and a `PAGEKV_*` variable (the flag wins); see
//! [`settings`]. Errors are one line on stderr and a non-zero exit code.

mod commands;
mod config;
mod device;
mod engine_backend;
mod load;
mod registry;
mod settings;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use device::Device;
use settings::RuntimeArgs;

#[derive(Parser, Debug)]
#[command(name = "pagekv", version, about = "LLM inference over a request-sized paged KV cache")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Complete a prompt (argument or stdin), streamed to stdout.
    Run(commands::run::RunArgs),
    /// Interactive multi-turn chat that keeps the conversation's cache between turns.
    Chat(commands::chat::ChatArgs),
    /// OpenAI-compatible HTTP server (and Anthropic Messages) with continuous batching.
    Serve(commands::serve::ServeArgs),
    /// Architecture, sizes, tensor types, tokenizer, template and KV bytes per token of a GGUF
    /// file (or a known model, fetched if needed), and what the runtime cannot run in it.
    Inspect {
        #[arg(value_name = "NAME|FILE")]
        model: String,
        #[arg(long)]
        json: bool,
        /// Exit non-zero when the runtime cannot run the model (architecture or tensor types).
        #[arg(long)]
        check: bool,
    },
    /// The known models: size, sha256 and whether each is in PAGEKV_HOME; `models fetch NAME`
    /// downloads one without running it.
    Models(commands::models::ModelsArgs),
    /// Perplexity and agreement with f16 KV for each KV format, teacher-forced over a text.
    Eval(commands::eval::EvalArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Bytes per token and append speed of every KV format.
    Cache {
        #[arg(long)]
        json: bool,
        /// Comma-separated formats (default: all).
        #[arg(long)]
        formats: Option<String>,
        #[arg(long, default_value_t = 7)]
        runs: usize,
        /// Geometry: layers appended per token.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
        layers: u64,
        /// Geometry: KV heads.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
        kv_heads: u64,
        /// Geometry: head dimension (a multiple of 32).
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(32..=1024))]
        head_dim: u64,
    },
    /// Decode attention over scattered pages: every path × format, with a streaming-read roofline.
    Attention {
        #[arg(long)]
        json: bool,
        /// Comma-separated formats (default: all).
        #[arg(long)]
        formats: Option<String>,
        /// Comma-separated BATCHxCONTEXT shapes (default: 1x512,1x4096,1x32768,16x4096,64x4096).
        #[arg(long)]
        shapes: Option<String>,
        /// Comma-separated paths (default: reference,primitive,partitioned,auto).
        #[arg(long)]
        impls: Option<String>,
        #[arg(long, default_value_t = 7)]
        runs: usize,
        /// CUDA only: launch the tensor-core decode as a programmatic dependent launch, as the
        /// model step launches it (rows named `<route>-pdl`).
        #[arg(long)]
        programmatic: bool,
        /// CUDA only: idle pause (ms) before each timed row, so no row inherits the power state
        /// of the rows before it (default 100; each row's JSON has `sm_mhz`, the SM clock over
        /// its runs).
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..=60_000))]
        cooldown_ms: Option<u64>,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
    /// Prompt-processing and decode tokens/s of a model at short and long context, per KV format.
    Decode(commands::decode::DecodeArgs),
    /// The server in-process under 1, 8 and 32 streaming clients on loopback: tokens/s, TTFT,
    /// inter-token latency, pool utilization; session-bank hit vs miss over a shared prefix.
    Serve(commands::bench_serve::BenchServeArgs),
    /// Multi-token decoding against plain decoding on a workload (edit or chat), in one run: the
    /// verification step's cost, tokens/s, acceptance; optionally llama.cpp's own lookup and
    /// draft speculation on the same prompts.
    Speculative(commands::bench_speculative::BenchSpeculativeArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match config::variable_error(&e, &Cli::command()) {
            Some(line) => {
                eprintln!("pagekv: error: {line}");
                return ExitCode::FAILURE;
            }
            None => e.exit(),
        },
    };
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pagekv: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(a) => {
            a.model.install()?;
            commands::run::run(a)
        }
        Command::Chat(a) => {
            a.model.install()?;
            commands::chat::run(a)
        }
        Command::Serve(a) => {
            a.model.install()?;
            commands::serve::run(a)
        }
        Command::Inspect { model, json, check } => commands::inspect::run(&model, json, check),
        Command::Models(a) => commands::models::run(a),
        Command::Eval(a) => {
            a.model.install()?;
            commands::eval::run(a)
        }
        Command::Bench(BenchCommand::Cache { json, formats, runs, layers, kv_heads, head_dim }) => {
            commands::bench::cache(
                json,
                formats.as_deref(),
                runs,
                (layers as usize, kv_heads as usize, head_dim as usize),
            )
        }
        Command::Bench(BenchCommand::Attention {
            json,
            formats,
            shapes,
            impls,
            runs,
            programmatic,
            cooldown_ms,
            runtime,
        }) => {
            runtime.install()?;
            let device = runtime.device.unwrap_or(Device::Cpu);
            let opts = commands::AttentionOpts {
                formats: formats.as_deref(),
                shapes: shapes.as_deref(),
                impls: impls.as_deref(),
                runs,
                programmatic,
                cooldown_ms,
            };
            commands::bench::attention(json, device, opts)
        }
        Command::Bench(BenchCommand::Decode(a)) => {
            a.model.install()?;
            match commands::run::device()? {
                Device::Cpu => commands::decode::run(a),
                Device::Cuda(n) => commands::bench_decode_cuda::run(n, a),
            }
        }
        Command::Bench(BenchCommand::Serve(a)) => {
            a.model.install()?;
            commands::bench_serve::run(a)
        }
        Command::Bench(BenchCommand::Speculative(a)) => {
            a.model.install()?;
            commands::bench_speculative::run(a)
        }
    }
}

/// The error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    e.chain().map(|c| c.to_string().replace('\n', " ")).collect::<Vec<_>>().join(": ")
}

//! The hybrid cache on real models (`kvcache::LayerGroups`, `docs/architecture.md`, "Hybrid
//! cache").
//!
//! Gemma 3 270M (registry model `gemma3-270m`; skipped when absent): 4,000 greedy tokens after
//! a short prompt, stepped in lockstep with a run whose per-layer windows are applied by masking
//! alone (`CacheConfig::hybrid = false`: one group, every block kept). After every step each
//! sliding group holds at most ⌈512/16⌉ + 1 = 33 blocks, the global group holds the ⌈len/16⌉
//! blocks of the tokens (and nothing before them is freed), and the two runs' tokens are equal.
//!
//! The engine (scheduler, session bank, preemption) over the tests' tiny model given a window of
//! 16 on its first layer: the same tokens as with masking alone, every block back at the end.
//!
//! SmolLM2 (one attention type): one group of every layer, planes = layers, the pool's blocks
//! unchanged — the cache without groups.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvcache::{CacheConfig, GroupKind, KvFormat, NULL_BLOCK};
use pagekv_cpu::attention::AttentionConfig;
use pagekv_engine::{DraftMode, Engine, Event, GenerationRequest, Generator, RequestStream, SpeculativeConfig};
use pagekv_model::gguf::GgufFile;
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::Model;

mod common;

const BLOCK: usize = 16;
const TOKENS: usize = 4000;

fn generator(path: &Path, hybrid: bool) -> (Generator, Tokenizer) {
    let file = Arc::new(GgufFile::open(path).unwrap());
    let tokenizer = Tokenizer::from_gguf(file.metadata()).unwrap();
    let model = Model::from_file(file, AttentionConfig::default()).unwrap();
    let c = &model.config;
    let mut cache = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
    cache.format = KvFormat::F16;
    cache.block_size = BLOCK;
    cache.dynamic_growth = true;
    cache.num_blocks = 512;
    cache.hybrid = hybrid;
    (Generator::new(model, cache).unwrap(), tokenizer)
}

fn argmax(row: &[f32]) -> u32 {
    pagekv_model::backend::argmax(row)
}

#[test]
fn gemma3_sliding_groups_free_their_blocks_and_keep_the_masked_tokens() {
    let test = "gemma3_sliding_groups_free_their_blocks_and_keep_the_masked_tokens";
    let Some(path) = pagekv_testkit::dev::registry_model(test, "gemma3-270m.gguf") else { return };
    let (mut hybrid, tokenizer) = generator(&path, true);
    let (mut masked, _) = generator(&path, false);
    let groups = hybrid.sequence().layer_groups().clone();
    assert_eq!((groups.num_groups(), groups.planes()), (6, 3), "one global and five local groups of 3 layers");
    assert!(masked.sequence().layer_groups().is_single());
    assert_eq!(hybrid.pool().blocks().num_blocks(), 6 * masked.pool().blocks().num_blocks(), "same bytes");

    let prompt = tokenizer
        .encode_with_bos("The history of the printing press begins in the fifteenth century, when", false)
        .unwrap();
    let a = argmax(hybrid.prefill(&prompt).unwrap().1);
    let b = argmax(masked.prefill(&prompt).unwrap().1);
    assert_eq!(a, b, "first token");
    let (mut a, mut b) = (a, b);
    let mut most = vec![0usize; groups.num_groups()];
    for step in 0..TOKENS {
        a = hybrid.step_greedy(a).unwrap();
        b = masked.step_greedy(b).unwrap();
        assert_eq!(a, b, "token {step} differs from the masking-only run");
        let s = hybrid.sequence();
        let len = s.offset();
        for (g, most) in most.iter_mut().enumerate() {
            let table = s.group_table(g);
            let held = table.iter().filter(|&&id| id != NULL_BLOCK).count();
            *most = (*most).max(held);
            match groups.kind(g) {
                GroupKind::Sliding { window } => {
                    assert_eq!(window, 512);
                    assert!(held <= 512usize.div_ceil(BLOCK) + 1, "step {step}: local group {g} holds {held}");
                }
                GroupKind::Full => {
                    // Every block of the tokens, none freed; growth's reserved tail after them.
                    let tokens = len.div_ceil(BLOCK);
                    assert!(table[..tokens].iter().all(|&id| id != NULL_BLOCK), "step {step}");
                    assert_eq!(held, table.len(), "step {step}: the global group freed a block");
                }
            }
        }
    }
    let len = hybrid.sequence().offset();
    assert_eq!(len, prompt.len() + TOKENS);
    for (g, &most) in most.iter().enumerate() {
        if groups.kind(g) != GroupKind::Full {
            assert_eq!(most, 33, "local group {g} reached the bound");
        }
    }
    // The masking-only run kept every block of every layer.
    let masked_held = masked.sequence().group_blocks().next().unwrap();
    assert!(masked_held >= len.div_ceil(BLOCK));
}

#[test]
fn models_with_one_attention_type_are_one_group() {
    let test = "models_with_one_attention_type_are_one_group";
    let Some(path) = pagekv_testkit::dev::default_model(test) else { return };
    let (g, _) = generator(&path, true);
    let layers = g.model().config.num_layers;
    let groups = g.sequence().layer_groups();
    assert!(groups.is_single());
    assert_eq!((groups.planes(), groups.num_layers()), (layers, layers));
    assert_eq!(g.pool().blocks().num_blocks(), 512, "the pool's blocks are not rescaled");
    assert_eq!(g.pool().geometry().num_layers, layers);
}

/// KV bytes resident after 8,192 tokens of context, with the sliding groups' reclaim and with
/// masking alone (printed; the lead's performance notes quote them). With reclaim: the global
/// group's 3 layers hold every position, each local group's 3 layers at most 33 blocks.
#[test]
fn gemma3_kv_bytes_resident_at_8192_tokens() {
    let test = "gemma3_kv_bytes_resident_at_8192_tokens";
    let Some(path) = pagekv_testkit::dev::registry_model(test, "gemma3-270m.gguf") else { return };
    let context = 8192;
    let mut resident = Vec::new();
    for hybrid in [true, false] {
        let (mut g, tokenizer) = generator(&path, hybrid);
        let text = "A paged cache keeps keys and values in fixed-size blocks. ";
        let ids = tokenizer.encode(text, false).unwrap();
        let prompt: Vec<u32> = ids.iter().copied().cycle().take(context).collect();
        g.prefill(&prompt).unwrap();
        let s = g.pool().stats();
        let bytes = s.code_bytes_used + s.scale_bytes_used;
        let (codes, scales) = g.pool().geometry().block_bytes_by_category();
        let per_block = codes + scales;
        // Blocks beyond the tokens (growth's reserved tail) are not resident KV.
        let tokens_blocks = g.sequence().blocks_holding_tokens();
        eprintln!(
            "gemma3-270m f16 KV at {context} tokens, hybrid {hybrid}: {:.1} MiB in the tokens' blocks ({} blocks of {} layers), {:.1} MiB held with growth's tail",
            (tokens_blocks * per_block) as f64 / (1 << 20) as f64,
            tokens_blocks,
            g.pool().geometry().num_layers,
            bytes as f64 / (1 << 20) as f64
        );
        resident.push(tokens_blocks * per_block);
    }
    // f16, 1 kv head of 256: 1 KiB per token per layer.
    let layer_block = BLOCK * 1024;
    assert_eq!(resident[1], 18 * context.div_ceil(BLOCK) * layer_block, "masking alone keeps every block");
    // A local group keeps the blocks a query at 8,192 reaches: 512 - ⌊(8193 - 512) / 16⌋ = 32.
    let local = context.div_ceil(BLOCK) - (context + 1 - 512) / BLOCK;
    assert_eq!(local, 32);
    assert_eq!(resident[0], 3 * (context.div_ceil(BLOCK) + 5 * local) * layer_block, "one global group, five windows");
}

fn tokens(mut s: RequestStream) -> (Vec<u32>, usize) {
    let mut out = Vec::new();
    loop {
        match s.recv_timeout(Duration::from_secs(120)).expect("an event within 2 minutes") {
            Event::Token { id, .. } => out.push(id),
            Event::Done { usage, .. } => return (out, usage.cached_tokens),
            Event::Error(e) => panic!("{e}"),
        }
    }
}

/// Runs requests one after another, then a second turn of each, then all at once, on a tiny
/// model whose layer 0 sees the last 16 tokens; returns every request's tokens and cached
/// prompt tokens, and the engine's final metrics.
fn run_windowed_engine(hybrid: bool) -> (Vec<(Vec<u32>, usize)>, pagekv_engine::EngineMetrics) {
    run_windowed_engine_with(hybrid, SpeculativeConfig::default())
}

/// [`run_windowed_engine`] with `speculative` drafting.
fn run_windowed_engine_with(
    hybrid: bool,
    speculative: SpeculativeConfig,
) -> (Vec<(Vec<u32>, usize)>, pagekv_engine::EngineMetrics) {
    let mut model = common::tiny_model(11, "tiny-windowed");
    model.config.layer_windows = vec![Some(16), None];
    let mut config = common::engine_config(40, true);
    config.cache.hybrid = hybrid;
    config.speculative = speculative;
    let engine = Engine::start(model, common::tokenizer(), config).unwrap();
    let h = engine.handle();
    let vocab = common::VOCAB as u32;
    let prompts: Vec<Vec<u32>> =
        (0..8u32).map(|i| (0..20 + 7 * i).map(|j| 3 + (j * 7 + i * 13) % (vocab - 3)).collect()).collect();
    let request = |prompt: Vec<u32>, n: usize| {
        let mut r = GenerationRequest::new(prompt, n);
        r.ignore_eos = true;
        r
    };
    let mut out = Vec::new();
    for p in &prompts {
        let first = tokens(h.submit(request(p.clone(), 20)).unwrap());
        // The next turn extends everything the first held: its prefix is whole in every group.
        let mut next = p.clone();
        next.extend(&first.0);
        next.extend([5, 6, 7]);
        out.push(first);
        out.push(tokens(h.submit(request(next, 10)).unwrap()));
    }
    let streams: Vec<RequestStream> = prompts.iter().map(|p| h.submit(request(p.clone(), 30)).unwrap()).collect();
    out.extend(streams.into_iter().map(tokens));
    let m = h.metrics();
    engine.shutdown(Duration::from_secs(5));
    (out, m)
}

#[test]
fn the_engine_over_sliding_groups_keeps_the_masked_tokens_and_frees_every_block() {
    let (hybrid, hm) = run_windowed_engine(true);
    let (masked, mm) = run_windowed_engine(false);
    let ids = |v: &[(Vec<u32>, usize)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&hybrid), ids(&masked), "tokens differ from the masking-only engine");
    assert_eq!(hm.group_blocks.len(), 2);
    assert_eq!(hm.group_blocks[0].0, GroupKind::Sliding { window: 16 });
    assert_eq!(mm.group_blocks.len(), 1);
    // Second turns reuse their first turn's blocks as much with sliding groups as without.
    for i in (1..16).step_by(2) {
        assert!(hybrid[i].1 > 0 && hybrid[i].1 == masked[i].1, "turn {i}: {} vs {} cached", hybrid[i].1, masked[i].1);
    }
    assert!(hm.bank_hits > 0 && mm.bank_hits > 0);
    assert_eq!((hm.blocks_used, mm.blocks_used), (0, 0), "every block went back to the pool or the bank");
}

/// Drafting over sliding groups: verification trims rejected draft tokens, so the groups keep
/// what a query `draft_tokens` back reaches (`SequencePolicy::trim_margin`). The tokens equal the
/// masking-only engine's without drafts, drafts are kept and rejected, every block comes back.
#[test]
fn the_engine_drafts_over_sliding_groups_and_keeps_the_masked_tokens() {
    let ngram = |k| SpeculativeConfig {
        mode: DraftMode::Ngram,
        draft_tokens: k,
        ngram_min: 1,
        ngram_max: 4,
        ..Default::default()
    };
    let (masked, _) = run_windowed_engine(false);
    let ids = |v: &[(Vec<u32>, usize)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    for k in [3, 8, 20] {
        let (drafted, m) = run_windowed_engine_with(true, ngram(k));
        assert_eq!(ids(&drafted), ids(&masked), "{k} draft tokens: tokens differ from the masking-only engine");
        assert!(m.draft_accepted_tokens > 0, "{k} draft tokens: some drafts kept: {m:?}");
        assert!(m.draft_accepted_tokens < m.draft_tokens, "{k} draft tokens: some drafts rejected: {m:?}");
        assert_eq!(m.blocks_used, 0, "{k} draft tokens: every block went back to the pool or the bank");
    }
}

//! Next-token-prediction (MTP) layers: the loader hook and the CPU forward of the MTP head.
//! - a tiny llama / qwen2 file with one `nextn` layer loads with 2 main layers and 1 MTP layer;
//!   `nextn_predict_layers` ≥ `block_count` and a missing nextn tensor are typed errors naming
//!   what is wrong;
//! - the main forward's hidden states and logits, and the MTP head's logits and outputs (catch-up
//!   in two chunks, then two chained draft steps) equal a naive f64 reference written from the
//!   formulas (`tiny_mtp/mod.rs`), within 1e-4 of the largest magnitude;
//! - asking for hidden states changes no logit (bit for bit) of a batch, on the tiny f32 model
//!   and on the quantized default model (skipped when absent).

mod tiny_mtp;

use kvcache::{CacheConfig, KvFormat, KvPool, SequenceCache, SequencePolicy};
use pagekv_cpu::attention::{AttentionConfig, AttnNumerics};
use pagekv_model::backend::argmax;
use pagekv_model::llama::MTP_POOL_LAYERS;
use pagekv_model::{Batch, Logits, Model, ModelError};
use tiny_mtp::{rel_diff, tiny_mtp, Kind, Reference, HEAD_DIM, HIDDEN, KV_HEADS, LAYERS, VOCAB};

fn load(arch: &str, seed: u64) -> (tiny_mtp::TinyMtp, Model) {
    let t = tiny_mtp(arch, seed, Kind::Random, 1, None);
    let mut m = Model::from_file(t.file.clone(), AttentionConfig::default()).unwrap();
    m.set_attn_numerics(AttnNumerics::Fast);
    (t, m)
}

#[test]
fn a_file_with_nextn_layers_loads_them_beside_the_main_ones() {
    for arch in ["llama", "qwen2"] {
        let (_, m) = load(arch, 1);
        assert_eq!((m.config.num_layers, m.config.mtp_layers), (LAYERS, 1), "{arch}");
        assert_eq!(m.weights.layers.len(), LAYERS);
        assert_eq!(m.weights.mtp.len(), 1);
        assert!(m.has_mtp());
        let mtp = &m.weights.mtp[0];
        assert_eq!(mtp.block.wq.name, "blk.2.attn_q.weight");
        assert_eq!((mtp.eh_proj.rows, mtp.eh_proj.cols), (HIDDEN, 2 * HIDDEN));
        assert!(mtp.head.is_none() && mtp.embed.is_none(), "the model's head and embedding serve");
        assert_eq!(mtp.block.bq.is_some(), arch == "qwen2", "{arch}: the block has the architecture's biases");
    }
    // Without the metadata the same blocks are all main layers (and the nextn tensors unread).
    let t = tiny_mtp("llama", 1, Kind::Random, 0, None);
    let m = Model::from_file(t.file, AttentionConfig::default()).unwrap();
    assert_eq!((m.config.num_layers, m.config.mtp_layers), (LAYERS + 1, 0));
    assert!(!m.has_mtp());
}

#[test]
fn nextn_layers_leaving_no_main_layer_are_refused_naming_both_counts() {
    for nextn in [3, 4] {
        let t = tiny_mtp("llama", 1, Kind::Random, nextn, None);
        let e = Model::from_file(t.file, AttentionConfig::default()).err().expect("refused");
        assert!(matches!(e, ModelError::NextnLayers { nextn: n, block_count: 3, .. } if n == nextn as usize), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("llama.nextn_predict_layers is {nextn}")), "{msg}");
        assert!(msg.contains("llama.block_count is 3"), "{msg}");
    }
}

#[test]
fn a_missing_nextn_tensor_is_refused_naming_it() {
    for name in ["blk.2.nextn.hnorm.weight", "blk.2.nextn.eh_proj.weight", "blk.2.attn_k.weight"] {
        let t = tiny_mtp("llama", 1, Kind::Random, 1, Some(name));
        let e = Model::from_file(t.file, AttentionConfig::default()).err().expect("refused");
        assert!(matches!(&e, ModelError::Tensor { name: n, .. } if n == name), "{e:?}");
        assert!(e.to_string().contains(name), "{e}");
    }
}

/// A pool of `layers` layers of the tiny geometry with f32 pages, and a sequence in it.
fn pool(layers: usize) -> (KvPool, SequenceCache) {
    let mut c = CacheConfig::new(layers, KV_HEADS, HEAD_DIM);
    c.format = KvFormat::F32;
    c.block_size = 8;
    c.num_blocks = 64;
    let mut pool = KvPool::new(c).unwrap();
    let policy = SequencePolicy {
        dynamic_growth: true,
        context_window: Some(256),
        sliding_window: None,
        debug_blocks: false,
        trim_margin: 0,
    };
    let seq = SequenceCache::new(&mut pool, policy, 0).unwrap();
    (pool, seq)
}

/// Appends `tokens` to `seq` in a one-sequence batch.
fn batch(seq: &mut SequenceCache, pool: &mut KvPool, tokens: &[u32], logits: Logits) -> Batch {
    seq.begin_append(pool, tokens.len()).unwrap();
    let mut b = Batch::default();
    b.push(tokens, seq.offset() + tokens.len(), seq.pending_slots(), seq.block_table(), logits);
    b
}

fn rows(v: &[Vec<f64>]) -> Vec<f64> {
    v.iter().flatten().copied().collect()
}

#[test]
fn the_mtp_head_matches_a_naive_reference_with_chained_drafts() {
    for arch in ["llama", "qwen2"] {
        let (t, mut m) = load(arch, 7);
        let r = Reference { m: &t };
        let h = HIDDEN;
        let prompt: Vec<u32> = vec![3, 41, 17, 88, 5, 60, 23, 9, 77];
        let n = prompt.len();
        // The main forward: every position's hidden state and logits.
        let (mut pool_main, mut seq_main) = pool(LAYERS);
        let mut b = batch(&mut seq_main, &mut pool_main, &prompt, Logits::All);
        b.keep_hidden();
        let logits = m.forward(&b, &mut pool_main).unwrap().to_vec();
        seq_main.commit_append(&mut pool_main);
        let hidden = m.last_hidden()[..n * h].to_vec();
        let (want_h, want_logits) = r.main(&prompt);
        let (dh, dl) = (rel_diff(&hidden, &rows(&want_h)), rel_diff(&logits, &rows(&want_logits)));
        assert!(dh < 1e-4 && dl < 1e-4, "{arch}: main hidden states off by {dh:.2e}, logits by {dl:.2e}");

        // The MTP head over entries 0..n-1 (hidden state t with token t + 1), in two chunks.
        let (mut pool_mtp, mut seq_mtp) = pool(MTP_POOL_LAYERS);
        let mut got_logits = Vec::new();
        let mut got_g = Vec::new();
        for (a, z) in [(0, 3), (3, n - 1)] {
            let b = batch(&mut seq_mtp, &mut pool_mtp, &prompt[a + 1..z + 1], Logits::All);
            got_logits.extend_from_slice(m.forward_mtp(&b, &mut pool_mtp, &hidden[a * h..z * h]).unwrap());
            got_g.extend_from_slice(&m.last_hidden()[..(z - a) * h]);
            seq_mtp.commit_append(&mut pool_mtp);
        }
        let (want_g, want_mtp) = r.mtp(&prompt[1..], &want_h[..n - 1]);
        let (dg, dl) = (rel_diff(&got_g, &rows(&want_g)), rel_diff(&got_logits, &rows(&want_mtp)));
        assert!(dg < 1e-4 && dl < 1e-4, "{arch}: MTP outputs off by {dg:.2e}, logits by {dl:.2e}");

        // Two chained draft steps: each drafted token with the MTP output before it.
        let mut next: Vec<u32> = prompt[1..].to_vec();
        let mut hs: Vec<Vec<f64>> = want_h[..n - 1].to_vec();
        let mut g = got_g[(n - 2) * h..].to_vec();
        let mut last = got_logits[(n - 2) * VOCAB..].to_vec();
        let mut want_g_last = want_g[n - 2].clone();
        for step in 0..2 {
            let d = argmax(&last);
            let b = batch(&mut seq_mtp, &mut pool_mtp, &[d], Logits::Last);
            last = m.forward_mtp(&b, &mut pool_mtp, &g).unwrap().to_vec();
            g = m.last_hidden()[..h].to_vec();
            seq_mtp.commit_append(&mut pool_mtp);
            next.push(d);
            hs.push(want_g_last);
            let (want_g, want_logits) = r.mtp(&next, &hs);
            let e = next.len() - 1;
            let (dg, dl) = (rel_diff(&g, &want_g[e]), rel_diff(&last, &want_logits[e]));
            assert!(dg < 1e-4 && dl < 1e-4, "{arch}: chained step {step} off by {dg:.2e} (output), {dl:.2e} (logits)");
            want_g_last = want_g[e].clone();
        }
    }
}

#[test]
fn asking_for_hidden_states_changes_no_logit() {
    let (_, mut m) = load("llama", 3);
    let prompts: [&[u32]; 3] = [&[5, 6, 7, 8, 9, 10, 11], &[40, 41, 42], &[90, 1, 2, 3, 4]];
    let run = |m: &mut Model, hidden: [bool; 3]| {
        let (mut p, _) = pool(LAYERS);
        let policy = SequencePolicy {
            dynamic_growth: true,
            context_window: Some(256),
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        };
        let mut b = Batch::default();
        let mut seqs = Vec::new();
        for (i, toks) in prompts.iter().enumerate() {
            let mut s = SequenceCache::new(&mut p, policy, 0).unwrap();
            s.begin_append(&mut p, toks.len()).unwrap();
            let logits = [Logits::Last, Logits::None, Logits::All][i];
            b.push(toks, toks.len(), s.pending_slots(), s.block_table(), logits);
            if hidden[i] {
                b.keep_hidden();
            }
            seqs.push(s);
        }
        let logits = m.forward(&b, &mut p).unwrap().to_vec();
        (logits, m.last_hidden()[..b.num_hidden_rows() * HIDDEN].to_vec())
    };
    let (plain, _) = run(&mut m, [false; 3]);
    let (with, hidden) = run(&mut m, [true, true, false]);
    assert_eq!(plain, with, "logits do not change when hidden states are kept");
    assert_eq!(hidden.len(), (7 + 3) * HIDDEN);
    // The second sequence asked for no logits: its hidden states are its own (not another's).
    let (_, alone) = run(&mut m, [false, true, false]);
    assert_eq!(alone, hidden[7 * HIDDEN..].to_vec());
}

#[test]
fn asking_for_hidden_states_changes_no_logit_of_the_quantized_default_model() {
    // The engine's path-invariant numerics over quantized weights: the extra rows that go through
    // the last block when a prompt chunk asks for its hidden states change no other row.
    let Some(path) = pagekv_testkit::dev::default_model("mtp hidden states") else { return };
    let mut m = Model::load(&path, AttentionConfig::default()).unwrap();
    pagekv_model::Forward::ensure_path_invariance(&mut m);
    let c = m.config.clone();
    let prompts: [Vec<u32>; 2] = [(0..40).map(|i| 100 + i * 37).collect(), (0..9).map(|i| 2000 + i * 11).collect()];
    let run = |m: &mut Model, hidden: bool| {
        let mut cc = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
        cc.num_blocks = 16;
        let mut p = KvPool::new(cc).unwrap();
        let policy = SequencePolicy {
            dynamic_growth: true,
            context_window: Some(256),
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        };
        let mut b = Batch::default();
        let mut seqs = Vec::new();
        for (i, toks) in prompts.iter().enumerate() {
            let mut s = SequenceCache::new(&mut p, policy, 0).unwrap();
            s.begin_append(&mut p, toks.len()).unwrap();
            b.push(toks, toks.len(), s.pending_slots(), s.block_table(), [Logits::Last, Logits::All][i]);
            if hidden && i == 0 {
                b.keep_hidden();
            }
            seqs.push(s);
        }
        m.forward(&b, &mut p).unwrap().to_vec()
    };
    assert_eq!(run(&mut m, false), run(&mut m, true), "logits do not change when hidden states are kept");
}

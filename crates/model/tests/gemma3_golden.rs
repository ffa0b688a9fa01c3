//! Gemma 3 270M Q4_K_M (a registry model: gemma3 architecture, 262,144-token SentencePiece
//! vocabulary with BOS, five sliding-window layers of 512 to every global one) against
//! llama.cpp's golden data in tests/data/gemma3-270m: tokenizer ids, teacher-forced top-1
//! agreement over 2,199 positions (so the local layers' window slides), greedy continuations of
//! 16 tokens on 4 prompts, two of them longer than 600 tokens (see `golden/`).
//!
//! Measured (2 threads, default numerics, 2026-12-05): tokenizer 17 of 17; top-1 agreement
//! 100 % over 2,000 positions (all 2,199), perplexity equal to llama.cpp's, the largest
//! log-probability difference 5e-6 (the golden file's rounding); greedy 4 of 4. Found layer by
//! layer against `llama-eval-callback` (same file, flash attention off): the activations are bit
//! for bit llama.cpp's once GELU's table is built with the fused multiply-add ggml-cpu's compiler
//! forms (`gelu.rs`), Q6_K products of 8 or more rows take the tiled matmul's order
//! (`reference_q6k`), and the last layer's FFN runs over the logit rows only, as llama.cpp's
//! graph prunes them.

mod golden;
use golden::Spec;

const GEMMA3: Spec = Spec {
    name: "gemma3",
    model_file: "gemma3-270m.gguf",
    data_dir: "gemma3-270m",
    positions: 2000,
    min_agreement: 0.999,
    max_ppl_diff: 0.001,
    greedy_tokens: 16,
    min_greedy_matches: 4,
};

#[test]
fn gemma3_tokenizer_matches_llama_cpp() {
    golden::tokenizer_matches_llama_cpp(&GEMMA3, "gemma3_tokenizer_matches_llama_cpp");
}

#[test]
fn gemma3_teacher_forced_agreement() {
    golden::teacher_forced_agreement(&GEMMA3, "gemma3_teacher_forced_agreement");
}

#[test]
fn gemma3_greedy_matches_llama_cpp() {
    golden::greedy_matches_llama_cpp(&GEMMA3, "gemma3_greedy_matches_llama_cpp");
}

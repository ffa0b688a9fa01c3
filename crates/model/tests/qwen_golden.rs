//! Qwen2.5-Coder-1.5B-Instruct Q4_K_M (a registry model: qwen2 architecture, byte-level BPE
//! with the `qwen2` pre-tokenizer, ChatML) against llama.cpp's golden data in
//! tests/data/qwen2.5-coder-1.5b: tokenizer ids on varied strings, teacher-forced top-1
//! agreement over a Python source text, greedy continuations of 24 tokens (see `golden/`).
//!
//! Measured (2 threads, ggml attention numerics by default, 2026-12-05): top-1 agreement
//! 100 % (1,000 of 1,000; all 1,099 positions), perplexity equal to llama.cpp's, the largest
//! log-probability difference 5e-6 (the golden file's rounding), greedy 4 of 4. That needs every
//! product in llama.cpp's summation order for its row count: Q4_K in the repacked kernels'
//! orders (`reference_q4k`), Q6_K in the dot product's below 8 activation rows and the tiled
//! matmul's from 8 (`reference_q6k`), and the last layer's FFN over the logit rows only, as
//! llama.cpp's graph prunes them (so its products see those row counts).

mod golden;
use golden::Spec;

const QWEN: Spec = Spec {
    name: "qwen",
    model_file: "qwen2.5-coder-1.5b.gguf",
    data_dir: "qwen2.5-coder-1.5b",
    positions: 1000,
    min_agreement: 0.999,
    max_ppl_diff: 0.001,
    greedy_tokens: 24,
    min_greedy_matches: 4,
};

#[test]
fn qwen_tokenizer_matches_llama_cpp() {
    golden::tokenizer_matches_llama_cpp(&QWEN, "qwen_tokenizer_matches_llama_cpp");
}

#[test]
fn qwen_teacher_forced_agreement() {
    golden::teacher_forced_agreement(&QWEN, "qwen_teacher_forced_agreement");
}

#[test]
fn qwen_greedy_matches_llama_cpp() {
    golden::greedy_matches_llama_cpp(&QWEN, "qwen_greedy_matches_llama_cpp");
}

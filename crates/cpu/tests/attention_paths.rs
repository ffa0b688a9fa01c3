//! Every attention route × every KV format × window × GQA × q_len × context against its scalar
//! reference over the same scattered pages (see `attention_common::check_case`).

mod attention_common;

use attention_common::check_format;
use kvcache::KvFormat;

#[test]
fn f32_every_path_matches_reference() {
    check_format(KvFormat::F32);
}

#[test]
fn f16_every_path_matches_reference() {
    check_format(KvFormat::F16);
}

#[test]
fn bf16_every_path_matches_reference() {
    check_format(KvFormat::Bf16);
}

#[test]
fn q8_every_path_matches_reference() {
    check_format(KvFormat::Q8);
}

#[test]
fn q4_every_path_matches_reference() {
    check_format(KvFormat::Q4 { rotate: false });
}

#[test]
fn q4_rotated_every_path_matches_reference() {
    check_format(KvFormat::Q4 { rotate: true });
}

#[test]
fn turbo_k8v3_every_path_matches_reference() {
    check_format(KvFormat::Turbo { k_bits: 8, v_bits: 3 });
}

#[test]
fn turbo_k4v2_every_path_matches_reference() {
    check_format(KvFormat::Turbo { k_bits: 4, v_bits: 2 });
}

/// Tasks that serve several kv heads (8 kv heads; one thread, so the primitive path keeps all
/// heads in one task and the partitioned path splits them only into partitions) and tasks that
/// split them (two threads), every format, decode and a short causal prefill.
#[test]
fn multi_head_tasks_match_reference_for_every_format() {
    use attention_common::{check_case, Case, FORMATS};
    use pagekv_cpu::threadpool::ThreadPool;
    use std::sync::Arc;
    let pools = [Arc::new(ThreadPool::new(1)), Arc::new(ThreadPool::new(2))];
    let mut seed = 0;
    for format in FORMATS {
        for (pool, q_len, context) in [(0, 1, 700), (1, 1, 1300), (0, 7, 129), (1, 3, 40)] {
            seed += 1;
            let case = Case {
                format,
                head_dim: [128, 64, 80][seed % 3],
                num_kv_heads: 8,
                group: [4, 1, 3][seed % 3],
                q_len,
                causal: true,
                contexts: Case::pair(context, q_len),
                window: (seed % 2 == 0).then_some(300),
                block_size: 16,
                partition_size: 256,
                seed: 1000 + seed as u64,
            };
            check_case(&case, &pools[pool]);
        }
    }
}

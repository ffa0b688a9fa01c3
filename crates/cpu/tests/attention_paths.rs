//! Every attention path × every KV format × window × GQA × q_len × context against the
//! reference over the same scattered pages (see `attention_common::check_format`).

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

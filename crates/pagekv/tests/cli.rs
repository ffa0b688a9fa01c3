//! The `pagekv` binary's contract with its user: bad flags and bad `PAGEKV_*` values are one
//! clear line and a non-zero exit; the commands that need no model work; the model commands
//! run on the default model (skipped visibly when it is absent, unless PAGEKV_REQUIRE_MODEL=1).

use std::process::{Command, Output};

#[path = "../../model/tests/tiny_mtp/mod.rs"]
mod tiny_mtp;

fn pagekv(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pagekv"));
    c.args(args);
    for var in ["PAGEKV_KV_QUANT", "PAGEKV_ATTN_IMPL", "PAGEKV_THREADS", "PAGEKV_DEVICE", "PAGEKV_BLOCK_SIZE"] {
        c.env_remove(var);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run pagekv")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_flags_name_the_flag_and_the_accepted_values() {
    for (args, needle) in [
        (vec!["run", "--kv-quant", "q5", "x"], "q8"),
        (vec!["run", "--attn-impl", "fast", "x"], "partitioned"),
        (vec!["run", "--block-size", "12", "x"], "16"),
        (vec!["run", "--threads", "0", "x"], "threads"),
        (vec!["run", "--num-blocks", "0", "x"], "num-blocks"),
        (vec!["run", "--num-blocks", "-3", "x"], "-3"),
        (vec!["bench", "attention", "--shapes", "4096", "--runs", "1"], "BATCHxCONTEXT"),
        (vec!["bench", "attention", "--programmatic", "--runs", "1"], "--device cuda"),
        (vec!["bench", "attention", "--cooldown-ms", "100", "--runs", "1"], "--device cuda"),
        (vec!["bench", "attention", "--cooldown-ms", "soon", "--runs", "1"], "soon"),
        (vec!["bench", "cache", "--head-dim", "100"], "multiple of 32"),
        (vec!["frobnicate"], "frobnicate"),
    ] {
        let o = pagekv(&args, &[]);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn bad_environment_values_are_one_line_errors_naming_the_variable() {
    for (var, value) in [
        ("PAGEKV_KV_QUANT", "q5"),
        ("PAGEKV_DYNAMIC_KV", "maybe"),
        ("PAGEKV_BLOCK_SIZE", "12"),
        ("PAGEKV_ATTN_IMPL", "fast"),
        ("PAGEKV_THREADS", "zero"),
        ("PAGEKV_DEVICE", "gpu"),
    ] {
        let o = pagekv(&["run", "--max-tokens", "1", "hi"], &[(var, value)]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{var}={value}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("pagekv: error:") && last.contains(var), "{var}={value}: {err}");
    }
}

/// Every model command takes `--device cuda`. Without the `cuda` feature each refuses with the
/// one line every CUDA command gives, before it reads the model (here: a file that does not
/// exist); with the feature on a machine without a usable GPU, each is one clear line too
/// (no driver, no device) — never a panic.
#[test]
fn device_cuda_is_one_clear_line_without_a_usable_gpu() {
    let missing = "/nonexistent/pagekv-test-model.gguf";
    for args in [
        vec!["run", "--max-tokens", "1", "hi"],
        vec!["chat"],
        vec!["serve", "--port", "0"],
        vec!["eval", "--max-tokens", "8"],
        vec!["bench", "serve", "--clients", "1"],
        vec!["bench", "decode"],
    ] {
        for device in ["cuda", "cuda:1"] {
            let mut full = args.clone();
            full.extend(["--device", device, "--model", missing]);
            let o = pagekv(&full, &[]);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{full:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{full:?}: {err}");
            assert!(err.starts_with("pagekv: error:") && !err.contains("panicked"), "{full:?}: {err}");
            if cfg!(feature = "cuda") {
                // A GPU machine runs these for real; the file is missing there.
                assert!(err.contains("CUDA") || err.contains(missing), "{full:?}: {err}");
            } else {
                assert!(err.contains("built without CUDA") && err.contains("--features cuda"), "{full:?}: {err}");
            }
        }
    }
}

#[test]
fn missing_model_file_is_a_clear_error() {
    let o = pagekv(&["run", "--model", "/nonexistent/model.gguf", "hi"], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/nonexistent/model.gguf"), "{}", stderr(&o));
}

#[test]
fn corrupt_model_file_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("pagekv-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    for args in [vec!["run", "--model", path.to_str().unwrap(), "hi"], vec!["inspect", path.to_str().unwrap()]] {
        let o = pagekv(&args, &[]);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stderr(&o).starts_with("pagekv: error:"), "{}", stderr(&o));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_cache_prints_one_json_object_per_format_with_exact_bytes() {
    let o = pagekv(&["bench", "cache", "--json", "--runs", "1", "--layers", "2", "--formats", "f16,q8,q4r,turbo"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let bytes: Vec<(String, u64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r["format"].as_str().unwrap().to_string(),
                r["bytes_per_token"].as_u64().unwrap(),
                r["ratio_vs_f16"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        bytes,
        vec![
            ("f16".into(), 4096, 1.0),
            ("q8".into(), 2176, 0.5313),
            ("q4r".into(), 1152, 0.2813),
            ("turbo-k8v3".into(), 1552, 0.3789)
        ]
    );
    assert!(rows.iter().all(|r| r["append_gbps"].as_f64().unwrap() > 0.0));
}

#[test]
fn run_completes_greedily_on_the_default_model() {
    if pagekv_testkit::default_model("cli run").is_none() {
        return;
    }
    let o = pagekv(&["run", "--temperature", "0", "--max-tokens", "8", "The capital of France is"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Paris"), "{out}");
    // Same flags, same output (greedy is deterministic), and a seeded sample is reproducible.
    let again = pagekv(&["run", "--temperature", "0", "--max-tokens", "8", "The capital of France is"], &[]);
    assert_eq!(o.stdout, again.stdout);
    let s1 = pagekv(&["run", "--seed", "7", "--max-tokens", "12", "Once upon a time"], &[]);
    let s2 = pagekv(&["run", "--seed", "7", "--max-tokens", "12", "Once upon a time"], &[]);
    assert!(s1.status.success() && s1.stdout == s2.stdout);
}

#[test]
fn inspect_reports_the_default_model() {
    let Some(path) = pagekv_testkit::default_model("cli inspect") else { return };
    let o = pagekv(&["inspect", "--json", path.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["layers"], 30);
    assert_eq!(v["kv_heads"], 3);
    assert_eq!(v["head_dim"], 64);
    assert_eq!(v["tokenizer"]["pre"], "smollm");
    // f16: 30 layers × 3 kv heads × 64 × 2 (K, V) × 2 bytes.
    let f16 = v["kv_bytes_per_token"].as_array().unwrap().iter().find(|r| r["format"] == "f16").unwrap();
    assert_eq!(f16["bytes_per_token"], 30 * 3 * 64 * 2 * 2);
}

#[test]
fn eval_scores_formats_against_f16_with_and_without_exact_weights() {
    if pagekv_testkit::default_model("cli eval").is_none() {
        return;
    }
    let rows = |extra: &[&str]| -> Vec<serde_json::Value> {
        let mut args = vec!["eval", "--json", "--max-tokens", "96", "--formats", "f16,q8,q4"];
        args.extend_from_slice(extra);
        let o = pagekv(&args, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    for (extra, exact) in [(&[][..], false), (&["--exact-weights"][..], true)] {
        let r = rows(extra);
        assert_eq!(r.len(), 3, "{r:?}");
        let by = |f: &str| r.iter().find(|x| x["format"] == f).unwrap_or_else(|| panic!("no {f}: {r:?}"));
        for x in &r {
            assert_eq!((x["scored"].as_u64(), x["exact_weights"].as_bool()), (Some(95), Some(exact)), "{x}");
            // Every row on one numerics: the default `auto` is scored as `fast`.
            assert_eq!(x["attn_numerics"], "fast", "{x}");
            let top1 = x["top1_agreement"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&top1) && x["kl_mean"].as_f64().unwrap() >= 0.0, "{x}");
        }
        // f16 against itself is exact; q4 is further from f16 than q8 is.
        assert_eq!((by("f16")["kl_mean"].as_f64(), by("f16")["top1_agreement"].as_f64()), (Some(0.0), Some(1.0)));
        assert!(by("q4")["kl_mean"].as_f64() > by("q8")["kl_mean"].as_f64(), "{r:?}");
    }
    let o = pagekv(&["eval", "--formats", "q5"], &[]);
    assert!(!o.status.success() && stderr(&o).contains("q8"), "{}", stderr(&o));
    // An explicit `ggml` scores llama.cpp's numerics on f16, and refuses another format.
    let o = pagekv(&["eval", "--json", "--max-tokens", "32", "--formats", "f16", "--attn-numerics", "ggml"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(r#""attn_numerics":"ggml""#),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = pagekv(&["eval", "--max-tokens", "32", "--formats", "q8", "--attn-numerics", "ggml"], &[]);
    assert!(!o.status.success() && stderr(&o).contains("f16 KV cache"), "{}", stderr(&o));
}

/// `bench decode --llama-cpp PYTHON --llama-cpp-kv …` hands every KV setup to the Python side
/// with ggml's type ids and prints its rows under llama.cpp's name for the setup. A stand-in
/// interpreter echoes the setups back (type_k as pp, flash_attn as tg), so no llama.cpp is needed.
#[test]
fn bench_decode_passes_llama_cpp_kv_setups_through() {
    let o = pagekv(&["bench", "decode", "--llama-cpp-kv", "q5"], &[]);
    assert!(!o.status.success() && stderr(&o).contains("q8_0"), "{}", stderr(&o));
    let o = pagekv(&["bench", "decode", "--llama-cpp-kv", "q8_0"], &[]);
    assert!(!o.status.success() && stderr(&o).contains("--llama-cpp PYTHON"), "{}", stderr(&o));
    if pagekv_testkit::default_model("cli bench decode --llama-cpp-kv").is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("pagekv-cli-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("python");
    let echo = r#"import json,sys
c=json.loads(sys.argv[1])
for k in c["kv"]:
    for x in c["contexts"]:
        fa=k["flash_attn"]
        print(json.dumps({"kv":k["name"],"context":x,"pp":float(k["type_k"]+k["type_v"]),"tg":-1.0 if fa is None else float(fa)}))"#;
    // The bench runs `PYTHON -c SCRIPT CONFIG`: the stand-in runs the echo on CONFIG.
    std::fs::write(&fake, format!("#!/bin/sh\nexec python3 -c '{echo}' \"$3\"\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut args: Vec<&str> =
        "bench decode --json --contexts 16 --decode-tokens 2 --runs 1 --formats f16".split(' ').collect();
    args.extend(["--llama-cpp", fake.to_str().unwrap(), "--llama-cpp-kv", "f16,f16-fa,q8_0,q4_0"]);
    let o = pagekv(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let llama: Vec<(String, f64, f64)> = rows
        .iter()
        .filter(|r| r["engine"] == "llama.cpp")
        .map(|r| {
            assert_eq!(r["context"], 16, "{r}");
            let f = |k: &str| r[k].as_f64().unwrap();
            (r["format"].as_str().unwrap().to_string(), f("pp_tokens_per_s"), f("tg_tokens_per_s"))
        })
        .collect();
    let expect = [("f16", 2.0, -1.0), ("f16-fa", 2.0, 1.0), ("q8_0", 16.0, 1.0), ("q4_0", 4.0, 1.0)];
    let expect: Vec<(String, f64, f64)> = expect.iter().map(|&(n, p, t)| (n.to_string(), p, t)).collect();
    assert_eq!(llama, expect, "{rows:?}");
    assert!(rows.iter().any(|r| r["engine"] == "pagekv" && r["format"] == "f16"), "{rows:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A pool too small for the generation is an error naming the pool, after the text that fit —
/// never a silently short answer.
#[test]
fn run_out_of_pool_is_one_error_line() {
    if pagekv_testkit::default_model("cli run out of pool").is_none() {
        return;
    }
    let o = pagekv(
        &["run", "--num-blocks", "2", "--block-size", "8", "--temperature", "0", "-n", "64", "Once upon a time"],
        &[],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.starts_with("pagekv: error: KV pool exhausted") && l.contains("--num-blocks")),
        "{err}"
    );
    assert!(!o.stdout.is_empty(), "the tokens that fit are printed");
}

/// Writes the tiny MTP model (`nextn` next-token-prediction layers in its metadata; 0 leaves
/// the key out) to a fresh directory; returns the directory and the file.
fn tiny_mtp_file(nextn: u32, tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("pagekv-cli-mtp-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-mtp.gguf");
    let kind = tiny_mtp::Kind::Predictable { logit_scale: 8.0 };
    std::fs::write(&path, tiny_mtp::tiny_mtp("llama", 3, kind, nextn, None).bytes).unwrap();
    (dir, path)
}

#[test]
fn speculative_mtp_on_a_model_without_nextn_layers_is_one_error_line() {
    let (dir, path) = tiny_mtp_file(0, "none");
    let model = path.to_str().unwrap();
    let by_flag = pagekv(&["run", "--model", model, "--speculative", "mtp", "-n", "4", "w3"], &[]);
    let by_env = pagekv(&["run", "--model", model, "-n", "4", "w3"], &[("PAGEKV_SPECULATIVE", "mtp")]);
    for o in [by_flag, by_env] {
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("pagekv: error:"), "{err}");
        assert!(
            err.contains("has no next-token-prediction layers (llama.nextn_predict_layers is 0 or absent)"),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn speculative_mtp_runs_and_reports_its_drafts() {
    let (dir, path) = tiny_mtp_file(1, "run");
    let model = path.to_str().unwrap();
    let o = pagekv(&["inspect", model], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("2 layers") && out.contains("1 next-token-prediction layer after the 2 main ones"), "{out}");
    // Greedy, so the drafts (the model's own next choices) are all kept.
    let args = ["run", "--model", model, "--temperature", "0", "-n", "64", "-v", "--draft-tokens", "4", "w3 w17 w40"];
    let plain = pagekv(&args, &[]);
    let mtp = pagekv(&[&args[..], &["--speculative", "mtp"]].concat(), &[]);
    assert!(plain.status.success() && mtp.status.success(), "{}{}", stderr(&plain), stderr(&mtp));
    assert_eq!(plain.stdout, mtp.stdout, "the same text with drafts");
    let err = stderr(&mtp);
    let line = err.lines().find(|l| l.contains("speculative mtp: drafted")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("(100.0 %)"), "{line}");
    std::fs::remove_dir_all(&dir).unwrap();
}

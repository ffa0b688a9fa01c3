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

/// Records the settings parsed for this run. Called once, from `main`, before any
/// configuration is built; a second call is ignored (the first run's flags stand).
pub fn install(given: Vec<(&'static str, String)>) {
    let _ = GIVEN.set(given.into_iter().collect());
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

#[cfg(test)]
mod tests {
    use super::*;

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

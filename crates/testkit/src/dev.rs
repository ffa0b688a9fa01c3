//! The test harness's developer switches (the one place the test kit reads the environment):
//! where tests find the default model — `$PAGEKV_TEST_MODEL`, else
//! `$PAGEKV_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf` (`PAGEKV_HOME` defaults to
//! `~/.cache/pagekv`, where `pagekv` fetches it). Real-model tests skip with a visible message
//! when it is absent — unless `PAGEKV_REQUIRE_MODEL=1` (CI sets it), when absence fails them.
//! Tests of other registry models find them with [`registry_model`] and always skip when absent.

use std::path::PathBuf;

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the default model would be.
pub fn default_model_location() -> PathBuf {
    if let Some(p) = std::env::var_os("PAGEKV_TEST_MODEL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    models_dir().join(DEFAULT_MODEL_FILE)
}

/// `$PAGEKV_HOME/models` (`PAGEKV_HOME` defaulting to `~/.cache/pagekv`).
fn models_dir() -> PathBuf {
    let home = std::env::var_os("PAGEKV_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/pagekv"));
    home.join("models")
}

/// Another registry model than the default, `$PAGEKV_HOME/models/{file_name}`, for test `test`,
/// or `None` after printing that it is skipped. Not affected by `PAGEKV_REQUIRE_MODEL` (CI fetches
/// only the default model): such tests always skip when the file is absent.
pub fn registry_model(test: &str, file_name: &str) -> Option<PathBuf> {
    let p = models_dir().join(file_name);
    if p.is_file() {
        return Some(p);
    }
    eprintln!("skipped: {test}: {} not found (`pagekv models fetch` gets registry models)", p.display());
    None
}

/// The default model for test `test`, or `None` after printing that it is skipped.
///
/// # Panics
/// When the model is absent and `PAGEKV_REQUIRE_MODEL=1`: a required test must not skip.
pub fn default_model(test: &str) -> Option<PathBuf> {
    let p = default_model_location();
    if p.is_file() {
        return Some(p);
    }
    if std::env::var("PAGEKV_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
        panic!("{test}: the default model is required (PAGEKV_REQUIRE_MODEL=1) but {} is absent", p.display());
    }
    eprintln!("skipped: {test}: {} not found (`pagekv run` fetches it)", p.display());
    None
}

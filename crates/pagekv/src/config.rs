//! The binary's configuration surface: the one place that reads the process environment.
//!
//! Libraries take typed configuration values; those that parse `PAGEKV_*` text offer
//! `from_lookup(|name| …)` constructors, and this module hands them the environment.

/// The value of one environment variable, `None` when unset or not valid UTF-8.
pub fn env_lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

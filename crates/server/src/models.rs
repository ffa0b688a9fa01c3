//! The names the served model answers to (`--served-model-name NAME[,ALIAS…]`, vLLM's flag).
//!
//! The first name is the one `/v1/models` reports; a request's `model` may be any of them and
//! the response echoes the one it used. The wildcard `*` accepts every name (for clients that
//! insist on their own model name); a request naming anything else is a 404 `model_not_found`.

use crate::error::ApiError;

/// The wildcard name: accept whatever model a request names.
pub const ANY_MODEL: &str = "*";

/// The accepted model names, the reported one first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelNames {
    /// `[reported, aliases…]`; never empty.
    names: Vec<String>,
    /// `*` was among the configured names.
    any: bool,
}

impl ModelNames {
    /// The configured names (empty entries ignored), or `fallback` (the backend's own model id)
    /// when none is given or `*` is the only one.
    pub fn new(configured: &[String], fallback: &str) -> ModelNames {
        let mut names: Vec<String> = Vec::new();
        let mut any = false;
        for n in configured.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            if n == ANY_MODEL {
                any = true;
            } else if !names.iter().any(|m| m == n) {
                names.push(n.to_string());
            }
        }
        if names.is_empty() {
            names.push(fallback.to_string());
        }
        ModelNames { names, any }
    }

    /// Only `name`, no alias, no wildcard.
    pub fn single(name: &str) -> ModelNames {
        ModelNames::new(&[], name)
    }

    /// The name `/v1/models` and `/metrics` report.
    pub fn reported(&self) -> &str {
        &self.names[0]
    }

    /// Whether a request may name `model`.
    pub fn accepts(&self, model: &str) -> bool {
        self.any || self.names.iter().any(|n| n == model)
    }

    /// The name a response carries: the requested one when accepted, the reported one when
    /// absent; an unknown name is a 404.
    pub fn resolve(&self, requested: Option<String>) -> Result<String, ApiError> {
        match requested {
            None => Ok(self.reported().to_string()),
            Some(m) if self.accepts(&m) => Ok(m),
            Some(m) => Err(ApiError::model_not_found(&m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> ModelNames {
        ModelNames::new(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "file-stem")
    }

    #[test]
    fn first_name_is_reported_and_aliases_are_accepted() {
        let m = names(&["gpt-4o", "local", "gpt-4o"]);
        assert_eq!(m.reported(), "gpt-4o");
        assert!(m.accepts("gpt-4o") && m.accepts("local"));
        assert!(!m.accepts("file-stem"), "configured names replace the file's");
        assert_eq!(m.resolve(Some("local".into())).unwrap(), "local");
        assert_eq!(m.resolve(None).unwrap(), "gpt-4o");
        let e = m.resolve(Some("other".into())).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
    }

    #[test]
    fn wildcard_accepts_everything() {
        let m = names(&["*"]);
        assert_eq!(m.reported(), "file-stem");
        assert!(m.accepts("claude-sonnet-4") && m.accepts("file-stem"));
        assert_eq!(m.resolve(Some("whatever".into())).unwrap(), "whatever");
        let m = names(&["mine", "*"]);
        assert_eq!(m.reported(), "mine");
        assert!(m.accepts("anything"));
    }

    #[test]
    fn no_names_means_the_backend_id_only() {
        let m = names(&[" ", ""]);
        assert_eq!(m.reported(), "file-stem");
        assert!(m.accepts("file-stem") && !m.accepts("x"));
    }
}

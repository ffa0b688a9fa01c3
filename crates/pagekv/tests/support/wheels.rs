//! Fake wheels for the registry tests: zip files with the members pip needs to accept them from a
//! `--find-links` directory (`*.dist-info/METADATA`, `WHEEL`, `RECORD`) and one data member; and
//! the scratch directories they live in.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Writes `{package}-{version}-py3-none-any.whl` (name normalized as pip spells it) into `dir`
/// holding `member` = `data` (deflated, as real wheels are), and returns its path.
pub fn write_wheel(dir: &Path, package: &str, version: &str, member: &str, data: &[u8]) -> PathBuf {
    let norm = package.replace(['-', '.'], "_");
    let path = dir.join(format!("{norm}-{version}-py3-none-any.whl"));
    let info = format!("{norm}-{version}.dist-info");
    let files: Vec<(String, Vec<u8>)> = vec![
        (format!("{norm}/__init__.py"), Vec::new()),
        (member.to_string(), data.to_vec()),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n").into_bytes(),
        ),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: pagekv-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
        ),
    ];
    let mut record: String = files
        .iter()
        .map(|(name, bytes)| format!("{name},sha256={},{}\n", b64url(&Sha256::digest(bytes)), bytes.len()))
        .collect();
    record.push_str(&format!("{info}/RECORD,,\n"));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).expect("create wheel"));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in files.iter().chain([(format!("{info}/RECORD"), record.into_bytes())].iter()) {
        zip.start_file(name.as_str(), opts).expect("zip member");
        zip.write_all(bytes).expect("zip data");
    }
    zip.finish().expect("finish wheel");
    path
}

/// Deterministic bytes for part `seed`, `len` long (compressible enough to deflate, varied enough
/// that a swapped or missing part changes the hash).
pub fn part_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            if i % 64 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            (x >> (i % 8 * 8)) as u8 ^ (i / 4096) as u8
        })
        .collect()
}

/// URL-safe base64 without padding (what RECORD's hashes use).
fn b64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &b)| acc | (b as u32) << (16 - 8 * i));
        for k in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
        }
    }
    out
}

/// A scratch directory under the system temp dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `pagekv-{test}-{pid}`, emptied first.
    pub fn new(test: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("pagekv-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create scratch dir");
        Scratch(p)
    }

    /// The subdirectory `name`, created.
    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::create_dir_all(&p).expect("create scratch subdir");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

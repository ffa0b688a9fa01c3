#!/usr/bin/env bash
# Fuzzes the GGUF reader for a bounded time:  fuzz/run.sh [SECONDS]   (default 60)
#
# Installs cargo-fuzz if it is missing. Uses the nightly toolchain when rustup has one,
# otherwise stable with RUSTC_BOOTSTRAP=1 (cargo-fuzz passes nightly-only -Z flags).
# New corpus entries go to fuzz/corpus/gguf_parse (ignored by git); the committed seeds in
# fuzz/seeds/gguf_parse are read, never written. A crash leaves its input in
# fuzz/artifacts/gguf_parse and makes this script exit non-zero.
set -euo pipefail

secs="${1:-60}"
cd "$(dirname "$0")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

toolchain=()
if command -v rustup >/dev/null 2>&1 && rustup toolchain list | grep -q '^nightly'; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi

mkdir -p corpus/gguf_parse
# -malloc_limit_mb: any single allocation above 64 MiB is reported as a crash, which is
# how "no allocation of attacker-chosen size" is checked on inputs of at most 64 KiB.
cargo "${toolchain[@]}" fuzz run gguf_parse corpus/gguf_parse seeds/gguf_parse -- \
    -max_total_time="$secs" -max_len=65536 -malloc_limit_mb=64 -rss_limit_mb=2048 \
    -print_final_stats=1

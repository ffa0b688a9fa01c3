#!/usr/bin/env bash
# Copies the release test and example binaries of pagekv-cuda (built with
#   cargo build --release --features cuda -p pagekv-cuda --examples --tests)
# stripped into dist-cuda/ (git-ignored), with the kernel cache prebuilt when a local
# libnvrtc is on LD_LIBRARY_PATH, for the device run (`carry: ["dist-cuda"]`).
set -euo pipefail
cd "$(dirname "$0")/../../.."
T=${CARGO_TARGET_DIR:-target}/release
mkdir -p dist-cuda/home
newest() { ls -t $1 2>/dev/null | grep -v '\.d$' | head -1; }
cp "$(newest "$T/deps/gpu_kernels-*")" dist-cuda/gpu_kernels
cp "$(newest "$T/deps/pagekv_cuda-*")" dist-cuda/lib_tests
cp "$T/examples/bench_attention" dist-cuda/bench_attention
cp "$T/examples/prebuild" dist-cuda/prebuild
strip dist-cuda/gpu_kernels dist-cuda/lib_tests dist-cuda/bench_attention dist-cuda/prebuild
if [ -n "${LD_LIBRARY_PATH:-}" ]; then PAGEKV_HOME=dist-cuda/home dist-cuda/prebuild 90 | tail -1 || true; fi
du -sh dist-cuda

#!/usr/bin/env bash
# Copies the release test and example binaries of pagekv-cuda (built with
#   cargo build --release --features cuda -p pagekv-cuda --examples --tests)
# stripped into $DIST (default dist-cuda/; git-ignored), with the kernel cache prebuilt when a
# local libnvrtc is on LD_LIBRARY_PATH, for the device run (`carry: ["$DIST"]`).
set -euo pipefail
cd "$(dirname "$0")/../../.."
T=${CARGO_TARGET_DIR:-target}/release
D=${DIST:-dist-cuda}
mkdir -p "$D/home"
newest() { ls -t $1 2>/dev/null | grep -v '\.d$' | head -1; }
cp "$(newest "$T/deps/gpu_kernels-*")" "$D/gpu_kernels"
cp "$(newest "$T/deps/pagekv_cuda-*")" "$D/lib_tests"
cp "$T/examples/bench_attention" "$D/bench_attention"
cp "$T/examples/prebuild" "$D/prebuild"
strip "$D/gpu_kernels" "$D/lib_tests" "$D/bench_attention" "$D/prebuild"
if [ -n "${LD_LIBRARY_PATH:-}" ]; then PAGEKV_HOME=$D/home "$D/prebuild" 90 | tail -1 || true; fi
du -sh "$D"

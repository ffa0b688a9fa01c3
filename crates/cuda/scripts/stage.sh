#!/usr/bin/env bash
# Stages what a GPU machine's check (device_check.sh) needs into dist-cuda/ (git-ignored), stripped:
# the pagekv binary, the kernel and model test binaries, and the prebuilt kernel cache. Build first:
#   export CARGO_TARGET_DIR=target-cuda CARGO_PROFILE_RELEASE_DEBUG=0
#   cargo build --release --features cuda -p pagekv
#   cargo test --release --features cuda -p pagekv-model --test cuda_forward --no-run
#   cargo build --release --features cuda -p pagekv-cuda --tests --examples
# With SPLIT_MODEL=FILE, FILE is also cut into dist-cuda/m1/part.a and dist-cuda/m2/part.b
# (with its sha256) so a model larger than one call's carry limit travels in two calls.
set -euo pipefail
cd "$(dirname "$0")/../../.."
T=${CARGO_TARGET_DIR:-target}/release
mkdir -p dist-cuda/home
# The newest build of a test that has CUDA (cudarc) in it (a build without `--features cuda` leaves a
# newer binary of the same name that skips everything).
newest() {
    for f in $(ls -t $1 2>/dev/null | grep -v '\.d$'); do
        if grep -q cudarc "$f"; then echo "$f"; return; fi
    done
    echo "stage.sh: no CUDA build of $1" >&2; return 1
}
cp "$T/pagekv" dist-cuda/pagekv
cp "$(newest "$T/deps/cuda_forward-*")" dist-cuda/cuda_forward
cp "$(newest "$T/deps/gpu_model_ops-*")" dist-cuda/gpu_model_ops
cp "$(newest "$T/deps/gpu_kernels-*")" dist-cuda/gpu_kernels
cp "$(newest "$T/deps/gpu_prefill-*")" dist-cuda/gpu_prefill
cp "$(newest "$T/deps/gpu_topk-*")" dist-cuda/gpu_topk
cp "$(newest "$T/deps/gpu_qmatrix-*")" dist-cuda/gpu_qmatrix
cp "$(newest "$T/deps/pagekv_cuda-*")" dist-cuda/lib_tests
cp "$T/examples/prebuild" dist-cuda/prebuild
cp "$T/examples/bench_attention" dist-cuda/bench_attention
strip dist-cuda/pagekv dist-cuda/cuda_forward dist-cuda/gpu_model_ops dist-cuda/gpu_kernels dist-cuda/gpu_prefill \
    dist-cuda/gpu_topk dist-cuda/gpu_qmatrix dist-cuda/lib_tests \
    dist-cuda/prebuild dist-cuda/bench_attention
if [ -n "${LD_LIBRARY_PATH:-}" ]; then PAGEKV_HOME=dist-cuda/home dist-cuda/prebuild 90 | tail -1 || true; fi
if [ -n "${SPLIT_MODEL:-}" ]; then
    mkdir -p dist-cuda/m1 dist-cuda/m2
    size=$(stat -c %s "$SPLIT_MODEL")
    first=${FIRST_BYTES:-$((size / 2))}
    head -c "$first" "$SPLIT_MODEL" > dist-cuda/m1/part.a
    tail -c +$((first + 1)) "$SPLIT_MODEL" > dist-cuda/m2/part.b
    sha256sum "$SPLIT_MODEL" | cut -d' ' -f1 > dist-cuda/m2/sha256
fi
du -sh dist-cuda dist-cuda/* | sort -h | tail -12

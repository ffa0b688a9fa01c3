#!/usr/bin/env bash
# Runs on the GPU machine (no Rust there): the binaries built on the CPU machine by
#   crates/cuda/scripts/stage.sh   (copies them, stripped, into dist-cuda/)
# then: GPU facts, the kernel tests, the attention benchmark. Logs go to $OUT.
# Usage: bash crates/cuda/scripts/device_run.sh [tests] [bench ARGS...]
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PAGEKV_HOME=$PWD/dist-cuda/home
D=dist-cuda
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
mode=${1:-all}; shift || true
if [ "$mode" = all ] || [ "$mode" = tests ]; then
  "$D/lib_tests" 2>&1 | tail -3
  "$D/gpu_kernels" --test-threads 8 2>&1 | tee "$OUT/tests.log" | grep -E "SKIPPED|test |worst|^  |panicked|result" | head -150
fi
if [ "$mode" = all ] || [ "$mode" = bench ]; then
  "$D/bench_attention" "$@" > "$OUT/bench.jsonl" 2> "$OUT/bench.txt"
  echo "bench exit $?"
  cat "$OUT/bench.txt"
fi

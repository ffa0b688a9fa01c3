#!/usr/bin/env bash
# Issue-6 prefill device run (run tool, carry ["dist-prefill"]): the prefill kernel tests, the
# forward tests, the kernel timing, then `pagekv bench decode` pp before (PAGEKV_DEV_CUDA_PREFILL=0)
# and after, alternating, REPEAT times each. Logs under $OUT; a short table last.
# Stage first: binaries of target-prefill/release into dist-prefill/ (see RESULTS.md).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-prefill/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=dist-prefill
REPEAT=${REPEAT:-2}
summary=()
run() { # name, command...
    local name=$1; shift
    local t0=$SECONDS
    echo "===== $name: $*" > "$OUT/$name.log"
    "$@" >> "$OUT/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(grep -E 'test result' "$OUT/$name.log" | tail -1 | cut -c1-70)")")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
run prefill_tests $D/gpu_prefill --nocapture --test-threads 1
run forward_tests $D/cuda_forward --nocapture
run forward_tests_min2 env PAGEKV_DEV_CUDA_PREFILL_MIN=2 $D/cuda_forward --nocapture
run forward_tests_noprefill env PAGEKV_DEV_CUDA_PREFILL=0 $D/cuda_forward --nocapture
[ "${KERNEL_TESTS:-0}" = 1 ] && run kernel_tests $D/gpu_kernels --test-threads 8
run prefill_timing env PAGEKV_PREFILL_BENCH=1 $D/gpu_prefill prefill_kernel_timing --nocapture
for i in $(seq 1 "$REPEAT"); do
    run bench_before_$i env PAGEKV_DEV_CUDA_PREFILL=0 $D/pagekv bench decode --device cuda --model synthetic:llama3-8b \
        --contexts 1024,4096 --decode-tokens 8 --runs 1 --text README.md
    run bench_after_$i $D/pagekv bench decode --device cuda --model synthetic:llama3-8b \
        --contexts 1024,4096 --decode-tokens 8 --runs 1 --text README.md
done
cat "$OUT/gpu.txt"
grep -h "worst relative\|^  " "$OUT/prefill_tests.log" | head -30
grep -h '"bench"' "$OUT/prefill_timing.log"
for f in "$OUT"/bench_*.log; do echo "== $(basename "$f" .log)"; grep -E "pagekv-cuda|error" "$f" | head -4; done
printf '%s\n' "${summary[@]}"

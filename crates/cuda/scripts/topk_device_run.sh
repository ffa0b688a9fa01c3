#!/usr/bin/env bash
# Issue-6 device top-k run (run tool, carry ["dist-topk"]): the kernel tests (gpu_topk), the
# forward tests (cuda_forward, incl. forward_top_k against the CPU and fetch_logits after it),
# the kernel benchmark (bench_topk: every chunk size and the automatic one) and the decode-step
# timing with each way of sampling (PAGEKV_TOPK_BENCH=1). Logs under $OUT; a short table last.
#
# Stage first (this machine, no GPU needed; NVRTC precompiles every kernel into dist-topk/home):
#   export CARGO_TARGET_DIR=target-topk CARGO_PROFILE_RELEASE_DEBUG=0
#   cargo build --release --features cuda -p pagekv-cuda --tests --examples
#   cargo test --release --features cuda -p pagekv-model --test cuda_forward --no-run
#   LD_LIBRARY_PATH=/path/to/nvrtc/lib crates/cuda/scripts/topk_device_run.sh stage
set -uo pipefail
D=dist-topk
if [ "${1:-}" = stage ]; then
    cd "$(dirname "$0")/../../.."
    T=${CARGO_TARGET_DIR:-target}/release
    mkdir -p $D/home
    newest() { ls -t $1 2>/dev/null | grep -v '\.d$' | head -1; }
    cp "$(newest "$T/deps/gpu_topk-*")" $D/gpu_topk
    cp "$(newest "$T/deps/cuda_forward-*")" $D/cuda_forward
    cp "$T/examples/bench_topk" "$T/examples/prebuild" $D/
    strip $D/gpu_topk $D/cuda_forward $D/bench_topk $D/prebuild
    if [ -n "${LD_LIBRARY_PATH:-}" ]; then
        PAGEKV_HOME=$D/home $D/prebuild 90 | tail -1
        PAGEKV_HOME=$D/home $D/bench_topk --prebuild 90
    fi
    du -sh $D $D/* | sort -h | tail -8
    exit 0
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
summary=()
run() { # name, command...
    local name=$1; shift
    local t0=$SECONDS
    echo "===== $name: $*" > "$OUT/$name.log"
    timeout "${STEP_TIMEOUT:-150}" "$@" >> "$OUT/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-16s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(grep -E 'test result' "$OUT/$name.log" | tail -1 | cut -c1-70)")")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
run topk_tests $D/gpu_topk --test-threads 1
run forward_tests $D/cuda_forward --nocapture --test-threads 1
run bench_topk $D/bench_topk --ks 1,8,16,41,65 --chunks auto,1024,2048,4096 --prefilter auto,on,off
run step_timing env PAGEKV_TOPK_BENCH=1 $D/cuda_forward top_k_step_timing --nocapture
cat "$OUT/gpu.txt"
grep -E "FAILED|panicked|near-tie" "$OUT/topk_tests.log" "$OUT/forward_tests.log" | head -20
grep -E '\*' "$OUT/bench_topk.log" | head -40
grep -E ' us$' "$OUT/step_timing.log"
printf '%s\n' "${summary[@]}"

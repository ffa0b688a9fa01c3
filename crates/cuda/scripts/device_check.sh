#!/usr/bin/env bash
# The whole-backend check on a GPU machine (the device tool's run, carry ["dist-cuda"]): every GPU
# test binary, the decode benchmarks of synthetic:llama3-8b (bf16) and synthetic:llama3-8b-q4km
# (Q4_K_M blocks kept quantized) at batch 1 and 64 (the step at
# context 128 beside 1024 separates the KV reads from the weights), the headline attention
# benchmark (`pagekv bench attention --device cuda`), and one bad PAGEKV_DEV_CUDA_* value. Logs
# under $OUT (one per step); a table is printed last. Figures it reproduces: docs/performance.md.
#
# Stage first (this machine): build as crates/cuda/scripts/stage.sh says, then
#   bash crates/cuda/scripts/stage.sh
# and on the GPU machine: bash crates/cuda/scripts/device_check.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-cuda/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=dist-cuda
summary=()
run() { # name, command...
    local name=$1; shift
    local t0=$SECONDS
    echo "===== $name: $*" > "$OUT/$name.log"
    timeout "${STEP_TIMEOUT:-240}" "$@" >> "$OUT/$name.log" 2>&1
    local rc=$?
    local res rows
    res=$(grep -E 'test result' "$OUT/$name.log" | tail -1 | cut -c1-60)
    rows=$(grep -E '^pagekv-cuda' "$OUT/$name.log" | awk '{printf "%s@%s tg %s %s ms  ", $3, $4, $6, $7}')
    summary+=("$(printf '%-14s rc=%-3s %4ss  %s%s' "$name" "$rc" $((SECONDS - t0)) "$res" "$rows")")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
for t in lib_tests gpu_kernels gpu_prefill gpu_model_ops gpu_topk gpu_qmatrix; do run "$t" $D/$t; done
run cuda_forward $D/cuda_forward --test-threads 1
L3="$D/pagekv bench decode --device cuda --model synthetic:llama3-8b --runs 3 --text README.md"
run b1 $L3 --contexts 128,1024 --decode-tokens 64
run b64 $L3 --contexts 128,1024 --batch 64 --decode-tokens 32
Q4="$D/pagekv bench decode --device cuda --model synthetic:llama3-8b-q4km --runs 3 --text README.md"
run q4km_b1 $Q4 --contexts 128,1024 --decode-tokens 64
run q4km_b64 $Q4 --contexts 128,1024 --batch 64 --decode-tokens 32
run attention $D/pagekv bench attention --device cuda --formats bf16,q8,q4 --shapes 1x4096,16x4096,64x16384 --runs 30
# A bad switch must be one error line naming the accepted values (exit code non-zero).
run bad_env env PAGEKV_DEV_CUDA_GRAPH=maybe $D/pagekv bench decode --device cuda --model synthetic:smollm2 --contexts 128
grep -q 'accepted values are 1, 0, true' "$OUT/bad_env.log" && summary+=("bad_env: error line as expected") || summary+=("bad_env: NO error line")
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"

#!/usr/bin/env bash
# A/B of PAGEKV_DEV_CUDA_ATTN_PDL (the model step's cache write and tensor-core decode kernel as
# programmatic dependent launches) on the GPU machine (run tool, carry ["dist-cuda"]): batch-1
# decode of synthetic:llama3-8b alternated 3x off/on, then gpu_model_ops, cuda_forward and
# gpu_kernels. Logs under $OUT (one per step); a table is printed last.
# Stage first (this machine): LD_LIBRARY_PATH=/path/to/nvrtc/lib bash crates/cuda/scripts/stage_model.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-cuda/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=dist-cuda
summary=()
run() { # name, timeout, command...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "===== $name: $*" > "$OUT/$name.log"
    timeout "$limit" "$@" >> "$OUT/$name.log" 2>&1
    local rc=$?
    local res rows
    res=$(grep -E 'test result' "$OUT/$name.log" | tail -1 | cut -c1-60)
    rows=$(grep -E '^pagekv-cuda' "$OUT/$name.log" | awk '{printf "%s@%s tg %s %s  ", $3, $4, $6, $8}')
    summary+=("$(printf '%-14s rc=%-3s %4ss  %s%s' "$name" "$rc" $((SECONDS - t0)) "$res" "$rows")")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
L3="$D/pagekv bench decode --device cuda --model synthetic:llama3-8b --contexts 128,1024 --decode-tokens 64 --runs 3"
for i in 1 2 3; do
    run "pdl_off_$i" 60 env PAGEKV_DEV_CUDA_ATTN_PDL=0 $L3
    run "pdl_on_$i" 60 env PAGEKV_DEV_CUDA_ATTN_PDL=1 $L3
done
run gpu_model_ops 60 $D/gpu_model_ops
run cuda_forward 90 $D/cuda_forward --test-threads 1
run gpu_kernels "${KERNELS_TIMEOUT:-150}" $D/gpu_kernels
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"

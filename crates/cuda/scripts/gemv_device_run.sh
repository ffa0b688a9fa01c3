#!/usr/bin/env bash
# Device run of the split decode product (run tool, carry ["target-gemv/dist"]; stage first with a
# copy of crates/cuda/scripts/stage_model.sh writing target-gemv/dist): the kernel tests, the forward tests,
# then `pagekv bench decode` on synthetic:llama3-8b with the earlier kernel and routing ("base":
# PAGEKV_DEV_CUDA_GEMV_KERNEL=rows, PAGEKV_DEV_CUDA_GEMV_PDL=0, products ≤ 64 MiB fused) and the split
# kernel, alternated, then single variants. Every command's output goes to $OUT/<name>.log; a
# table of tg tok/s and roofline share is printed last.
#   gemv_device_run.sh [VARIANT_SET]   (VARIANT_SET: main (default), tune or final)
set -uo pipefail
D=${DIST:-target-gemv/dist}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SET=${1:-main}
summary=()
run() { # name, command...
    local name=$1; shift
    local t0=$SECONDS
    { echo "===== $name: $*"; timeout 300 "$@"; echo "rc=$?"; } > "$OUT/$name.log" 2>&1
    local res rows
    res=$(grep -E 'test result' "$OUT/$name.log" | tail -1 | cut -c1-70)
    rows=$(grep -E '^pagekv-cuda' "$OUT/$name.log" | awk '{printf "%s@%s %s %s  ", $3, $4, $6, $8}')
    summary+=("$(printf '%-22s %-5s %4ss  %s%s' "$name" "$(tail -1 "$OUT/$name.log")" $((SECONDS - t0)) "$res" "$rows")")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
L3="$D/pagekv bench decode --device cuda --model synthetic:llama3-8b --decode-tokens 64 --runs 3 --text README.md"
SM="$D/pagekv bench decode --device cuda --model synthetic:smollm2 --contexts 128 --decode-tokens 128 --runs 3 --text README.md"
BASE="PAGEKV_DEV_CUDA_GEMV_KERNEL=rows PAGEKV_DEV_CUDA_GEMV_PDL=0 PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=67108864"
case "$SET" in
main)
    run ops_tests $D/gpu_model_ops --test-threads 1
    run forward_tests $D/cuda_forward --test-threads 1
    for i in 1 2; do
        run base_$i env $BASE $L3 --contexts 128,1024
        run split_all_$i env PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=536870912 $L3 --contexts 128,1024
    done
    run split_small env PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=67108864 $L3 --contexts 128
    run split_all_nopdl env PAGEKV_DEV_CUDA_GEMV_PDL=0 PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=536870912 $L3 --contexts 128
    run split_all_w16 env PAGEKV_DEV_CUDA_GEMV_WARPS=16 PAGEKV_DEV_CUDA_GEMV_BPS=2 PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=536870912 $L3 --contexts 128
    run split_out env PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=100000000000 $L3 --contexts 128
    run smollm2_split $SM
    ;;
tune)
    # Prefetch depth, the 16-warp block beside the next product, and the routing cap; then a
    # profile (nsys, CUDA graph nodes traced) of the default at 1024 tokens when nsys is there.
    run ops_tests $D/gpu_model_ops --test-threads 1
    run forward_tests $D/cuda_forward --test-threads 1
    for i in 1 2; do
        run base_$i env $BASE $L3 --contexts 128,1024
        run default_$i $L3 --contexts 128,1024
    done
    run prefetch0 env PAGEKV_DEV_CUDA_GEMV_PREFETCH=0 $L3 --contexts 128,1024
    run prefetch4 env PAGEKV_DEV_CUDA_GEMV_PREFETCH=4 $L3 --contexts 128,1024
    run w16_bps1 env PAGEKV_DEV_CUDA_GEMV_WARPS=16 $L3 --contexts 128,1024
    run max512m env PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=536870912 $L3 --contexts 128,1024
    NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
    echo "nsys: ${NSYS:-none}; ncu: $(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)" > "$OUT/tools.txt"
    if [ -n "$NSYS" ]; then
        run nsys_default "$NSYS" profile --cuda-graph-trace=node -t cuda -o /tmp/gemv_prof --force-overwrite true \
            $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --contexts 1024 --decode-tokens 16 --runs 1 --text README.md
        "$NSYS" stats -r cuda_gpu_kern_sum -f csv -o "$OUT/prof" /tmp/gemv_prof.nsys-rep > /dev/null 2>&1
        "$NSYS" stats -r cuda_gpu_trace -f csv -o /tmp/prof /tmp/gemv_prof.nsys-rep > /dev/null 2>&1
        # The last decode steps' kernels are enough to see one step.
        f=$(ls /tmp/prof*gpu_trace*.csv 2>/dev/null | head -1)
        [ -n "$f" ] && tail -1300 "$f" | gzip > "$OUT/trace_tail.csv.gz"
    fi
    ;;
final)
    run ops_tests $D/gpu_model_ops --test-threads 1
    run forward_tests $D/cuda_forward --test-threads 1
    for i in 1 2 3; do
        run base_$i env $BASE $L3 --contexts 128,1024
        run default_$i $L3 --contexts 128,1024
    done
    run b4_base env $BASE $L3 --contexts 128 --batch 4
    run b4_default $L3 --contexts 128 --batch 4
    run smollm2_base env $BASE $SM
    run smollm2_default $SM
    # One decode step's five products (output, then layer 0's QKV, wo, gate|up, down), each alone
    # (ncu serializes and flushes caches), clocks as found.
    run ncu_products env PAGEKV_DEV_CUDA_GRAPH=0 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight \
        -k regex:pk_gemv_split --launch-skip 128 --launch-count 5 \
        $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --contexts 128 --decode-tokens 4 --runs 1 --text README.md
    ;;
*) echo "unknown set $SET: accepted values are main, tune, final"; exit 2 ;;
esac
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"

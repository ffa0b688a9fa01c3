#!/usr/bin/env bash
# The GPU model runtime's device runs (run tool; LD_LIBRARY_PATH with libcuda/libnvrtc/libcublas).
#   model_device_run.sh tests    kernel + forward tests (no model file), synthetic decode benches
#   model_device_run.sh smollm2  the real model (reassembled from dist-cuda/m1 + m2, xz): greedy
#                                GPU-vs-CPU test, `pagekv run --device cuda`, SmolLM2 decode bench
# Every command's output goes to $OUT/<mode>.log (headed by the command); a short table is printed last.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-cuda/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=dist-cuda
MODE=${1:-tests}
LOG=$OUT/$MODE.log
summary=()
run() { # name, command...
    local name=$1; shift
    local t0=$SECONDS tmp=/tmp/run-$name.log
    echo "===== $name: $*" >> "$LOG"
    "$@" > "$tmp" 2>&1
    local rc=$?
    cat "$tmp" >> "$LOG"
    summary+=("$(printf '%-24s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(grep -E 'test result' "$tmp" | tail -1 | cut -c1-80)")")
    case $name in bench_*) benches+=("== $name"$'\n'"$(grep -E 'pagekv-cuda|error' "$tmp")");; esac
}
benches=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
case "$MODE" in
tests)
    run ops_tests $D/gpu_model_ops --test-threads 1
    run forward_tests $D/cuda_forward --nocapture
    run lib_tests $D/lib_tests
    [ "${KERNEL_TESTS:-1}" = 1 ] && run kernel_tests $D/gpu_kernels --test-threads 8
    run bench_llama3_b1 $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --contexts 128,1024 --decode-tokens 64 --runs 3 --text README.md
    run bench_smollm2_b1 $D/pagekv bench decode --device cuda --model synthetic:smollm2 --contexts 128,1024 --decode-tokens 128 --runs 3 --text README.md
    run bench_llama3_b1_nograph env PAGEKV_DEV_CUDA_GRAPH=0 $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --contexts 128 --decode-tokens 64 --runs 3 --text README.md
    run bench_smollm2_b1_nograph env PAGEKV_DEV_CUDA_GRAPH=0 $D/pagekv bench decode --device cuda --model synthetic:smollm2 --contexts 128 --decode-tokens 128 --runs 3 --text README.md
    run bench_llama3_b1_cublas env PAGEKV_DEV_CUDA_GEMV=0 $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --contexts 128 --decode-tokens 64 --runs 3 --text README.md
    run bench_llama3_b64 $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --batch 64 --contexts 1024 --decode-tokens 32 --runs 2 --text README.md
    ;;
sweep)
    # The decode product's launch shape (rows per warp × blocks per SM), Llama-3-8B shape, batch 1.
    run ops_tests $D/gpu_model_ops --test-threads 1
    run forward_tests $D/cuda_forward --nocapture
    for r in 1 2 4; do for bps in 2 4 8 16; do
        run bench_r${r}_bps$bps env PAGEKV_DEV_CUDA_GEMV_R=$r PAGEKV_DEV_CUDA_GEMV_BPS=$bps $D/pagekv bench decode --device cuda \
            --model synthetic:llama3-8b --contexts 128 --decode-tokens 32 --runs 3 --text README.md
    done; done
    run bench_smollm2_r2_bps8 env PAGEKV_DEV_CUDA_GEMV_R=2 PAGEKV_DEV_CUDA_GEMV_BPS=8 $D/pagekv bench decode --device cuda \
        --model synthetic:smollm2 --contexts 128 --decode-tokens 128 --runs 3 --text README.md
    ;;
threshold)
    # Which products use the fused matrix-vector kernel: none (cuBLAS), ≤ 64 MiB (default), all.
    for t in 0 67108864 100000000000; do
        run bench_llama3_max$t env PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=$t $D/pagekv bench decode --device cuda \
            --model synthetic:llama3-8b --contexts 128 --decode-tokens 64 --runs 3 --text README.md
        run bench_smollm2_max$t env PAGEKV_DEV_CUDA_GEMV_MAX_BYTES=$t $D/pagekv bench decode --device cuda \
            --model synthetic:smollm2 --contexts 128 --decode-tokens 128 --runs 3 --text README.md
    done
    run bench_llama3_default_1024 $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --contexts 128,1024 \
        --decode-tokens 64 --runs 3 --text README.md
    run forward_tests $D/cuda_forward --nocapture
    ;;
smollm2)
    M=/tmp/smollm2.gguf
    cat $D/m1/part.a $D/m2/part.b | python3 -c 'import lzma,sys; sys.stdout.buffer.write(lzma.decompress(sys.stdin.buffer.read()))' > $M
    echo "sha256 $(sha256sum $M | cut -d' ' -f1) want $(cat $D/m2/sha256)" | tee "$OUT/model.txt"
    export PAGEKV_TEST_MODEL=$M PAGEKV_REQUIRE_MODEL=1
    run greedy_test $D/cuda_forward smollm2 --nocapture
    run run_cuda $D/pagekv run --device cuda -m $M --temperature 0 -n 48 -v "The capital of France is"
    run run_cuda_chat $D/pagekv run --device cuda -m $M --temperature 0 -n 48 -v --chat "What is the capital of France?"
    run run_cpu $D/pagekv run --device cpu -m $M --temperature 0 -n 48 -v "The capital of France is"
    run bench_smollm2_real $D/pagekv bench decode --device cuda -m $M --contexts 128,1024 --decode-tokens 128 --runs 3 --text README.md
    run bench_smollm2_real_f32 env PAGEKV_DEV_CUDA_WEIGHTS=f32 $D/pagekv bench decode --device cuda -m $M --contexts 128 --decode-tokens 128 --runs 3 --text README.md
    ;;
esac
cat "$OUT/gpu.txt"
printf '%s\n' "${benches[@]}"
printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# One device call (run tool, carry ["dist-cuda"], staged with stage_model.sh): the decode
# benchmark with the tensor-core decode launched plainly and as a programmatic dependent launch
# (`bench_attention --programmatic`, rows `<route>-pdl`), $REPEAT rounds alternated, formats
# $FORMATS, the issue's cases; then gpu_kernels (whole, 12 threads) and the model's checks of
# vreg_device_run.sh ($MODEL=1). Medians per (case, format, tag) and the q8/q4 ÷ bf16 ratios
# (tag_medians.py auto) last.
set -uo pipefail
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/pdl-summary.txt
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
for i in $(seq 1 "${REPEAT:-3}"); do
    for v in plain pdl; do
        F=""; [ $v = pdl ] && F="--programmatic"
        $D/bench_attention --formats "${FORMATS:-bf16,q8,q4}" --cases "${CASES:-1x4096,1x32768,16x4096,64x4096,64x16384}" \
            --warmup 5 --runs "${RUNS:-50}" --routes partitioned $F 2>> "$OUT/bench-err.log" \
            | sed "s/^{/{\"tag\":\"$v\",\"rep\":$i,/" >> "$OUT/pdl.jsonl"
    done
    echo "round $i done ($((SECONDS - t0)) s)" >> "$S"
done
python3 crates/cuda/scripts/tag_medians.py auto "$OUT/pdl.jsonl" >> "$S"
if [ "${TESTS:-1}" = 1 ]; then
    st=$SECONDS
    timeout "${TEST_TIMEOUT:-300}" $D/gpu_kernels --test-threads 12 > "$OUT/tests-gpu_kernels.log" 2>&1
    echo "gpu_kernels rc=$? ($((SECONDS - st)) s): $(grep -E '^test result' "$OUT/tests-gpu_kernels.log" | tail -1 | cut -c1-60)" >> "$S"
    grep -hE "panicked|FAILED|failures" "$OUT/tests-gpu_kernels.log" | head -5 >> "$S"
fi
echo "pdl part total $((SECONDS - t0)) s" >> "$S"
cat "$S"
if [ "${MODEL:-1}" = 1 ]; then REPEAT=${MODEL_REPEAT:-1} bash crates/cuda/scripts/vreg_device_run.sh > /dev/null; tail -45 "$OUT/summary.txt"; fi

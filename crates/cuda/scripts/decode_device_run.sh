#!/usr/bin/env bash
# One build-check-benchmark cycle of the paged decode kernels on the GPU machine (run tool,
# carry [$DIST]), from binaries staged by `DIST=... crates/cuda/scripts/stage.sh`:
#   1. GPU facts; 2. the kernel tests (gpu_kernels, lib_tests); 3. the benchmark
#   (bench_attention $BENCH_ARGS, then $REPEAT more processes of $REPEAT_ARGS, medians in
#   median.md); 4. tuning sweeps, one per "tag:VAR=V,VAR=V" in $SWEEP over
#   $SWEEP_ARGS (and $SWEEP2 over $SWEEP2_ARGS); 5. a short table last. Logs and JSON lines under $OUT.
# Usage: DIST=target-attn/dist BENCH_ARGS="--runs 50" SWEEP="a:PAGEKV_DEV_CUDA_TC_QSTAGES=2 b:..." \
#        SWEEP_ARGS="--formats q8,q4 --cases 64x16384" bash crates/cuda/scripts/decode_device_run.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv > "$OUT/gpu.txt" 2>&1
t0=$SECONDS
if [ "${TESTS:-1}" = 1 ]; then
    "$D/lib_tests" > "$OUT/tests.log" 2>&1; echo "lib_tests rc=$? ($((SECONDS - t0)) s)" >> "$OUT/summary.txt"
    "$D/gpu_kernels" --test-threads 10 >> "$OUT/tests.log" 2>&1
    echo "gpu_kernels rc=$? ($((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/tests.log")" >> "$OUT/summary.txt"
fi
if [ -n "${BENCH_ARGS+x}" ]; then
    "$D/bench_attention" $BENCH_ARGS > "$OUT/bench.jsonl" 2> "$OUT/bench.txt"
    echo "bench rc=$? ($((SECONDS - t0)) s)" >> "$OUT/summary.txt"
fi
# $REPEAT more processes of bench_attention $REPEAT_ARGS (bench-rep.jsonl, lines tagged "rep":
# i): the run-to-run spread. (The run tool returns at most eight files: keep it to these.)
for i in $(seq 1 "${REPEAT:-0}"); do
    "$D/bench_attention" ${REPEAT_ARGS:-} 2>> "$OUT/errors.log" | sed "s/^{/{\"rep\":$i,/" >> "$OUT/bench-rep.jsonl"
    echo "bench repeat $i rc=$? ($((SECONDS - t0)) s)" >> "$OUT/summary.txt"
done
sweep() { # variants, bench args
    for v in $1; do
        tag=${v%%:*}; assigns=${v#*:}
        env $(echo "$assigns" | tr ',' ' ') "$D/bench_attention" $2 2>> "$OUT/errors.log" \
            | sed "s/^{/{\"tag\":\"$tag\",/" >> "$OUT/sweep.jsonl"
        echo "sweep $v rc=$? ($((SECONDS - t0)) s)" >> "$OUT/summary.txt"
    done
}
sweep "${SWEEP:-}" "${SWEEP_ARGS:-}"
sweep "${SWEEP2:-}" "${SWEEP2_ARGS:-}"
cat "$OUT/gpu.txt"
grep -E "SKIPPED|panicked|FAILED|failures|relative error|^  [a-z0-9]" "$OUT/tests.log" 2>/dev/null | head -60
[ -s "$OUT/bench.txt" ] && grep -vE "^roofline-copy" "$OUT/bench.txt" | tail -60
[ -s "$OUT/sweep.jsonl" ] && python3 crates/cuda/scripts/summarize.py "$OUT/sweep.jsonl"
[ "${REPEAT:-0}" -gt 0 ] && python3 crates/cuda/scripts/median.py "$OUT/bench.jsonl" "$OUT/bench-rep.jsonl" \
    | grep -vE "roofline-(copy|paged-h8)" | tee -a "$OUT/summary.txt"
cat "$OUT/summary.txt"

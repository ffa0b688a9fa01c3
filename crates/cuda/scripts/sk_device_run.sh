#!/usr/bin/env bash
# One device call for the stream-K decode grid (run tool, carry ["dist-cuda"]): gpu_kernels
# test runs under the given environments, then $REPEAT rounds of bench_attention processes
# alternated — "base" (the binaries and kernel cache before the change, staged in
# dist-cuda/base/, partitioned route) and "new" (this build, the partitioned route and the
# stream-K grid as rows of the same process) — medians per tag last. Stage first:
#   cp -r <previous dist-cuda>/{bench_attention,home} dist-cuda/base/   (optional)
#   CARGO_TARGET_DIR=target-cuda CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release --features cuda \
#     -p pagekv-cuda --tests --examples
#   LD_LIBRARY_PATH=<libnvrtc.so.13 dir> DIST=dist-cuda bash crates/cuda/scripts/stage.sh
# Usage on the device: TESTS="sk:@decode_stream_k all:" REPEAT=3 bash crates/cuda/scripts/sk_device_run.sh
# TESTS="tag:VAR=V,...@filter ..." (each: gpu_kernels under that environment and name filter,
# $TEST_TIMEOUT s); TESTS_AFTER: the same, after the benches. VARIANTS="tag:VAR=V,... ..." adds
# processes of this build (routes $ROUTES) under those environments to each round.
set -uo pipefail
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
test_one() { # "tag:VAR=V,...@filter"
    local t=$1 tag=${1%%:*} rest=${1#*:}; local envs=${rest%%@*} filt=${rest#*@}; [ "$filt" = "$rest" ] && filt=""
    local st=$SECONDS
    env PAGEKV_HOME=$PWD/$D/home $(echo "$envs" | tr ',' ' ') timeout "${TEST_TIMEOUT:-280}" \
        $D/gpu_kernels $filt --test-threads "${TEST_THREADS:-12}" > "$OUT/tests-$tag.log" 2>&1
    echo "gpu_kernels [$tag: $envs $filt] rc=$? ($((SECONDS - st)) s): $(grep -E '^test result' "$OUT/tests-$tag.log" | tail -1 | cut -c1-60)" >> "$S"
    grep -hE "panicked|FAILED|failures" "$OUT/tests-$tag.log" | head -5 >> "$S"
}
tests() { # each argument one gpu_kernels run, in turn; PAR_TESTS=1: all at once
    for t in "$@"; do
        if [ "${PAR_TESTS:-0}" = 1 ]; then test_one "$t" & else test_one "$t"; fi
    done
    wait
}
tests ${TESTS:-}
B="--formats ${FORMATS:-bf16,q8,q4} --warmup 10 --runs ${RUNS:-50} ${VARGS:-}"
for i in $(seq 1 "${REPEAT:-0}"); do
    if [ -x "$D/base/bench_attention" ]; then
        PAGEKV_HOME=$PWD/$D/base/home $D/base/bench_attention $B --routes partitioned 2>> "$OUT/bench-err.log" \
            | sed "s/^{/{\"tag\":\"base\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    fi
    PAGEKV_HOME=$PWD/$D/home $D/bench_attention $B --routes ${ROUTES:-partitioned,stream-k} 2>> "$OUT/bench-err.log" \
        | sed "s/^{/{\"tag\":\"new\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    for v in ${VARIANTS:-}; do
        env PAGEKV_HOME=$PWD/$D/home $(echo "${v#*:}" | tr ',' ' ') $D/bench_attention $B --routes ${ROUTES:-partitioned,stream-k} \
            2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"${v%%:*}\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    done
    echo "round $i done ($((SECONDS - t0)) s)" >> "$S"
done
tests ${TESTS_AFTER:-}
grep -hE "^  (f16|bf16|q8|q4)" "$OUT"/tests-*.log 2>/dev/null | sort | awk '{k=$1" "$2" "$3; if(!(k in m)||$4>m[k])m[k]=$4} END{for(k in m)print "worst "k" "m[k]}' | sort >> "$S"
[ -s "$OUT/bench.jsonl" ] && python3 crates/cuda/scripts/tag_medians.py auto "$OUT/bench.jsonl" >> "$S"
echo "total $((SECONDS - t0)) s" >> "$S"
cat "$S"

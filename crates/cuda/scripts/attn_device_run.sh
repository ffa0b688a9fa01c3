#!/usr/bin/env bash
# One device call for the paged decode kernels (run tool, carry ["target-attn/dist"]):
# bench_attention alternating the previous kernel
# (PAGEKV_DEV_CUDA_TC_BASE=1, tag "base") with the current one (tag "new", queries rounded to the
# page type as the GPU model passes them; "newf32": full f32 queries), $REPEAT processes each;
# medians per tag; then the kernel, prefill and model tests; the summary last. Stage first (git-ignored target-attn/dist):
#   export CARGO_TARGET_DIR=target-attn CARGO_PROFILE_RELEASE_DEBUG=0
#   cargo build --release --features cuda -p pagekv-cuda --tests --examples
#   cargo build --release --features cuda -p pagekv
#   cargo test --release --features cuda -p pagekv-model --test cuda_forward --no-run
#   LD_LIBRARY_PATH=<libnvrtc.so.13 dir> DIST=target-attn/dist bash crates/cuda/scripts/stage.sh
#   cp target-attn/release/deps/{cuda_forward,gpu_prefill}-<newest> target-attn/dist/ (stripped)
# Usage on the device: TESTS=1 REPEAT=5 bash crates/cuda/scripts/attn_device_run.sh
set -uo pipefail
D=${DIST:-target-attn/dist}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
step() { # name, timeout, command...
    local name=$1 lim=$2; shift 2
    local t=$SECONDS
    timeout "$lim" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($((SECONDS - t)) s): $(grep -E '^test result' "$OUT/$name.log" | tail -1 | cut -c1-60)" >> "$S"
}
B="$D/bench_attention --formats ${FORMATS:-bf16,q8,q4} --warmup 10 --runs ${RUNS:-50}"
# VARIANTS="tag:VAR=V,VAR=V tag2:..." (tuning knobs; "ref:" for none): instead of base/new, each
# variant's process in turn, $REPEAT rounds, bench_attention $VARGS.
for i in $(seq 1 "${REPEAT:-0}"); do
    [ -n "${VARIANTS:-}" ] || continue
    for v in $VARIANTS; do
        env $(echo "${v#*:}" | tr ',' ' ') $B ${VARGS:-} 2>> "$OUT/bench-err.log" \
            | sed "s/^{/{\"tag\":\"${v%%:*}\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    done
done
for i in $(seq 1 "${REPEAT:-0}"); do
    [ -z "${VARIANTS:-}" ] || continue
    PAGEKV_DEV_CUDA_TC_BASE=1 $B 2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"base\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    $B 2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"new\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    if [ "$i" -le "${REPEAT_F32:-2}" ]; then
        $B --f32-queries 2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"newf32\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    fi
done
# Partition sizes of the small batches (current kernel), $PSWEEP processes.
for i in $(seq 1 "${PSWEEP:-0}"); do
    $D/bench_attention --formats bf16 --cases 1x4096,1x32768 --routes partitioned --warmup 10 --runs 100 \
        --partition-sizes 128,192,256,320,384,512,1024,1536,2048,4096 2>> "$OUT/bench-err.log" \
        | sed "s/^{/{\"tag\":\"ps\",\"rep\":$i,/" >> "$OUT/psweep.jsonl"
done
[ -s "$OUT/psweep.jsonl" ] && python3 - "$OUT/psweep.jsonl" >> "$S" <<'PYEOF'
import json, statistics, sys
v = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["impl"] == "partitioned":
        v.setdefault((r["batch"], r["context"], r["partition_size"]), []).append(r["us"])
for (b, c, p), us in sorted(v.items()):
    print(f"psweep bf16 {b}x{c} part {p}: {statistics.median(us):.2f} us ({min(us):.2f}-{max(us):.2f})")
PYEOF
echo "benches done ($((SECONDS - t0)) s)" >> "$S"
[ -s "$OUT/bench.jsonl" ] && python3 crates/cuda/scripts/tag_medians.py auto "$OUT/bench.jsonl" >> "$S"
if [ "${TESTS:-1}" = 1 ]; then
    step gpu_kernels 240 "$D/gpu_kernels" --test-threads 12
    [ -x "$D/gpu_prefill" ] && step gpu_prefill 120 "$D/gpu_prefill" --test-threads 8
    [ -x "$D/cuda_forward" ] && step cuda_forward 180 "$D/cuda_forward" --test-threads 4
fi
grep -hE "panicked|FAILED|failures:|relative error [0-9]" "$OUT"/gpu_kernels.log "$OUT"/gpu_prefill.log "$OUT"/cuda_forward.log 2>/dev/null | head -20
grep -hE "^  (f16|bf16|q8|q4)" "$OUT/gpu_kernels.log" 2>/dev/null | sort | awk '{k=$1" "$2" "$3; if(!(k in m)||$4>m[k])m[k]=$4} END{for(k in m)print "worst "k" "m[k]}' | sort | head -30
cat "$S"

#!/usr/bin/env bash
# One device call (run tool, carry ["dist-cuda"]) for the cluster merge of float pages:
# gpu_kernels decode_cluster first, then $REPEAT rounds of bench_attention processes alternated —
# base (dist-cuda/base: the build before the change), new, and new with PAGEKV_CUDA_TC_CLUSTER=1 —
# over the small batches at several partition sizes (bf16) and the issue's cases (bf16, q8, q4),
# optionally the copy-pipeline probes ($PROBES), then `gpu_kernels decode` ($TESTS_AFTER=1).
# Medians per (tag, case, partition size) last.
set -uo pipefail
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
PAGEKV_HOME=$PWD/$D/home timeout 200 $D/gpu_kernels decode_cluster --test-threads 4 > "$OUT/tests-cluster.log" 2>&1
echo "gpu_kernels decode_cluster rc=$? ($((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/tests-cluster.log" | tail -1 | cut -c1-60)" >> "$S"
grep -hE "panicked|FAILED|failures|relative error" "$OUT/tests-cluster.log" | head -8 >> "$S"
run() { # tag home command...
    local tag=$1 home=$2; shift 2
    env PAGEKV_HOME=$PWD/$home "$@" 2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"$tag\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
}
SMALL="--formats bf16 --cases 1x4096,1x32768 --warmup 10 --runs 50 --routes partitioned --partition-sizes 256,512,1024,2048,4096"
BIG="--formats bf16,q8,q4 --cases 16x4096,64x4096,64x16384 --warmup 10 --runs 30 --routes partitioned"
for i in $(seq 1 "${REPEAT:-3}"); do
    run base $D/base/home $D/base/bench_attention $SMALL
    run new $D/home $D/bench_attention $SMALL
    run cluster $D/home env PAGEKV_CUDA_TC_CLUSTER=1 $D/bench_attention $SMALL
    run base $D/base/home $D/base/bench_attention $BIG
    run new $D/home $D/bench_attention $BIG
    echo "round $i done ($((SECONDS - t0)) s)" >> "$S"
done
if [ -n "${PROBES:-}" ]; then
    for i in 1 2; do
        PAGEKV_HOME=$PWD/$D/home $D/bench_attention --formats bf16 --cases 16x4096,64x4096,64x16384 --warmup 5 --runs 30 \
            --routes partitioned --probes "$PROBES" 2>> "$OUT/probe-err.log" | sed "s/^{/{\"tag\":\"new\",\"rep\":$i,/" >> "$OUT/probe.jsonl"
    done
    # The same rows over consecutive block ids (a contiguous cache), for what scattering costs.
    PAGEKV_HOME=$PWD/$D/home $D/bench_attention --formats bf16 --cases 16x4096,64x4096,64x16384 --warmup 5 --runs 30 \
        --routes partitioned --contiguous --probes pipe:8:2:0:0,read:8:1024,read:8:0 2>> "$OUT/probe-err.log" \
        | sed "s/^{/{\"tag\":\"contig\",\"rep\":1,/" >> "$OUT/probe.jsonl"
    python3 -c 'import json,sys,statistics as st
d={}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r=json.loads(l); d.setdefault((r["batch"],r["context"],r["impl"],r["tag"]),[]).append(r["gbps"])
for k,v in sorted(d.items()): print("probe %dx%d %s %s: %.0f GB/s (n %d)" % (k[0],k[1],k[2],k[3],st.median(v),len(v)))' "$OUT/probe.jsonl" >> "$S"
fi
python3 -c 'import json,sys,statistics as st
d={}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r=json.loads(l)
        if r["impl"] in ("partitioned","primitive"): d.setdefault((r["format"],r["batch"],r["context"],r["partition_size"],r["tag"]),[]).append((r["gbps"],r["us"]))
for k,v in sorted(d.items()): print("%s %dx%d part %d %-8s %6.0f GB/s %8.2f us (n %d, %.0f-%.0f)" % (*k, st.median(x[0] for x in v), st.median(x[1] for x in v), len(v), min(x[0] for x in v), max(x[0] for x in v)))' "$OUT/bench.jsonl" >> "$S"
if [ "${TESTS_AFTER:-0}" = 1 ]; then
    PAGEKV_HOME=$PWD/$D/home timeout "${TEST_TIMEOUT:-280}" $D/gpu_kernels decode --test-threads 12 > "$OUT/tests-decode.log" 2>&1
    echo "gpu_kernels decode rc=$? ($((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/tests-decode.log" | tail -1 | cut -c1-60)" >> "$S"
    grep -hE "panicked|FAILED|failures" "$OUT/tests-decode.log" | head -8 >> "$S"
fi
grep -hE "^  (f16|bf16)" "$OUT"/tests-*.log 2>/dev/null | sort -u | head -40 >> "$S"
echo "total $((SECONDS - t0)) s" >> "$S"
cat "$S"

#!/usr/bin/env bash
# One device call (run tool, carry ["dist-cuda"]): the copy-pipeline probes of bench_attention
# (`--probes`, kernels/bench.cu `pk_paged_pipe` / `pk_paged_read` on the bf16 pages of each case)
# in $PROBE_REPEAT processes, then $REPEAT processes of the decode benchmark (q8/q4 ÷ bf16), then
# the GPU model checks ($MODEL=1: cuda_forward and the synthetic:llama3-8b decode at batch 1 and
# 64). Medians per row last. Stage first with crates/cuda/scripts/stage_model.sh (MODEL=1) or
# stage.sh.
set -uo pipefail
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
for i in $(seq 1 "${PROBE_REPEAT:-0}"); do
    $D/bench_attention --formats bf16 --cases "${PROBE_CASES:-16x4096,64x4096,64x16384}" --warmup 5 --runs 30 \
        --routes partitioned --probes "$PROBES" 2>> "$OUT/probe-err.log" \
        | sed "s/^{/{\"tag\":\"new\",\"rep\":$i,/" >> "$OUT/probe.jsonl"
    echo "probe round $i done ($((SECONDS - t0)) s)" >> "$S"
done
for i in $(seq 1 "${REPEAT:-0}"); do
    $D/bench_attention --formats "${FORMATS:-bf16,q8,q4,q4r}" --warmup 10 --runs 30 --routes partitioned \
        2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"new\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    echo "bench round $i done ($((SECONDS - t0)) s)" >> "$S"
done
# Small batches: bf16 at 1 × 4096 and 1 × 32768 over partition sizes, under each of
# $SMALL_VARIANTS ("tag:VAR=V,..."; "default:" the defaults), $SMALL_REPEAT rounds.
for i in $(seq 1 "${SMALL_REPEAT:-0}"); do
    for v in ${SMALL_VARIANTS:-default:}; do
        env $(echo "${v#*:}" | tr ',' ' ') $D/bench_attention --formats bf16 --cases 1x4096,1x32768 --warmup 10 --runs 50 \
            --routes partitioned --partition-sizes "${SMALL_PARTS:-128,256,512,1024,2048}" 2>> "$OUT/small-err.log" \
            | sed "s/^{/{\"tag\":\"${v%%:*}\",\"rep\":$i,/" >> "$OUT/small.jsonl"
    done
    echo "small round $i done ($((SECONDS - t0)) s)" >> "$S"
done
[ -s "$OUT/small.jsonl" ] && python3 -c 'import json,sys,statistics as st
d={}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r=json.loads(l)
        if r["impl"]=="partitioned": d.setdefault((r["batch"],r["context"],r["partition_size"],r["tag"]),[]).append(r["gbps"])
for k,v in sorted(d.items()): print("small %dx%d part %d %s: %.0f GB/s (%.0f-%.0f, n %d)" % (*k, st.median(v), min(v), max(v), len(v)))' "$OUT/small.jsonl" >> "$S"
if [ "${MODEL:-0}" = 1 ]; then
    timeout 200 $D/cuda_forward --test-threads 1 > "$OUT/cuda_forward.log" 2>&1
    echo "cuda_forward rc=$? $(grep -E '^test result' "$OUT/cuda_forward.log" | tail -1 | cut -c1-60)" >> "$S"
    L3="$D/pagekv bench decode --device cuda --model synthetic:llama3-8b --runs 3 --text README.md --json"
    timeout 200 $L3 --contexts 128,1024 --decode-tokens 64 > "$OUT/decode-b1.log" 2>&1; echo "decode b1 rc=$?" >> "$S"
    timeout 200 $L3 --contexts 128,1024 --batch 64 --decode-tokens 32 > "$OUT/decode-b64.log" 2>&1; echo "decode b64 rc=$?" >> "$S"
    grep -h '^{' "$OUT"/decode-b*.log | python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l); print("decode batch %d ctx %d: tg %.1f tok/s, %.3f ms/step, %.1f %% of roofline" % (r["batch"], r["context"], r["tg_tokens_per_s"], r["ms_per_step"], 100*r["steps_per_s_vs_roofline"]))' >> "$S"
fi
for f in probe bench; do
    [ -s "$OUT/$f.jsonl" ] && python3 crates/cuda/scripts/tag_medians.py auto "$OUT/$f.jsonl" >> "$S"
done
echo "total $((SECONDS - t0)) s" >> "$S"
cat "$S"

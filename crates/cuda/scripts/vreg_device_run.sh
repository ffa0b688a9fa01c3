#!/usr/bin/env bash
# One device call (run tool, carry ["dist-cuda"], staged with stage_model.sh, plus the modules of
# PAGEKV_DEV_CUDA_TC_VREG=0 prebuilt): the GPU model's tests, `pagekv bench decode` of the synthetic
# Llama-3-8B at batch 64 × context 1024 with pk_decode_tc_vreg off (v0) and routed (auto),
# $REPEAT rounds alternated, batch 1 once, and the issue's `pagekv bench attention --device cuda
# --json` (bf16, q8, q4) in $ATTN_REPEAT processes (medians over them, each process's µs after).
# Logs in $OUT; a short table last.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-cuda/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=dist-cuda S=$OUT/summary.txt
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
for t in "cuda_forward:$D/cuda_forward" "model_ops:$D/gpu_model_ops --test-threads 1"; do
    st=$SECONDS
    timeout "${TEST_TIMEOUT:-150}" ${t#*:} > "$OUT/tests-${t%%:*}.log" 2>&1
    echo "${t%%:*} rc=$? ($((SECONDS - st)) s): $(grep -E '^test result' "$OUT/tests-${t%%:*}.log" | tail -1 | cut -c1-60)" >> "$S"
done
bench() { # tag, env, args...
    local tag=$1 envs=$2; shift 2
    env $envs $D/pagekv bench decode --device cuda --model synthetic:llama3-8b --json --text README.md "$@" > "$OUT/decode-$tag.log" 2>&1
    echo "decode $tag ($envs $*): rc=$? $(grep '^{' "$OUT/decode-$tag.log" | python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l); print("b%d c%d %.3f ms/step %.1f tg tok/s;" % (r["batch"], r["context"], r["ms_per_step"], r["tg_tokens_per_s"]), end=" ")')" >> "$S"
    grep -iE "error|panick" "$OUT/decode-$tag.log" | head -3 >> "$S"
}
for i in $(seq 1 "${REPEAT:-2}"); do
    bench "b64-v0-$i" PAGEKV_DEV_CUDA_TC_VREG=0 --batch 64 --contexts 1024 --decode-tokens 32 --runs 2
    bench "b64-auto-$i" PAGEKV_DEV_CUDA_TC_VREG=auto --batch 64 --contexts 1024 --decode-tokens 32 --runs 2
done
bench b1 PAGEKV_DEV_CUDA_TC_VREG=auto --contexts 1024 --decode-tokens 64 --runs 3
for i in $(seq 1 "${ATTN_REPEAT:-1}"); do
    $D/pagekv bench attention --device cuda --json --formats bf16,q8,q4 --shapes 1x4096,1x32768,16x4096,64x4096,64x16384 \
        --runs 30 > "$OUT/attention-$i.jsonl" 2>> "$OUT/attention-err.log"
    echo "== bench attention $i rc=$?" >> "$S"
done
python3 - "$OUT"/attention-*.jsonl >> "$S" <<'PY'
import json, statistics as st, sys
agg = {}
for path in sys.argv[1:]:
    for l in open(path):
        if l.startswith("{"):
            r = json.loads(l)
            if r["impl"] in ("partitioned", "auto", "primitive") or r["impl"].startswith("roofline-read") or r["impl"] == "roofline-paged-h1":
                agg.setdefault((r["impl"], r.get("format", "-"), r["batch"], r["context"]), []).append((r["ms"] * 1e3, r["gbps"], r.get("partition_size", "")))
for (impl, fmt, b, c), v in sorted(agg.items()):
    us = " ".join("%.2f" % x[0] for x in v)
    print("%-17s %-5s %2dx%-6d %9.2f us %6.0f GB/s part %s (%s)" % (impl, fmt, b, c, st.median(x[0] for x in v), st.median(x[1] for x in v), v[0][2], us))
PY
echo "total $((SECONDS - t0)) s" >> "$S"
cat "$S"

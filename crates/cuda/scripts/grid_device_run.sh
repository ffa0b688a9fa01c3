#!/usr/bin/env bash
# One device call (run tool, carry ["dist-cuda"]): the tensor-core decode's CTA shape against its
# grid — bf16 pages, the partitioned route over $PARTS partition sizes ("auto": the router's),
# under each of $VARIANTS ("tag:VAR=V,..."; "w8s2:" the defaults; an item starting with "--" is a
# bench_attention flag instead, e.g. "pdl:--programmatic"), $REPEAT rounds alternated;
# optional $PROBES in the first variant's process; then gpu_kernels under each of $TESTS
# ("tag:VAR=V,...@filter"). Medians per (tag, case, partition size) last. Stage with stage.sh.
set -uo pipefail
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
for i in $(seq 1 "${REPEAT:-1}"); do
    first=1
    for v in ${VARIANTS:-w8s2:}; do
        P=""; [ $first = 1 ] && [ -n "${PROBES:-}" ] && P="--probes $PROBES"; first=0
        PS="--partition-sizes ${PARTS:-1024,2048,4096,16384}"; [ "${PARTS:-}" = auto ] && PS=""
        items=$(echo "${v#*:}" | tr ',' ' ')
        envs=$(for x in $items; do case $x in --*) ;; *) echo "$x" ;; esac; done)
        flags=$(for x in $items; do case $x in --*) echo "$x" ;; esac; done)
        env $envs $D/bench_attention --formats "${FORMATS:-bf16}" --cases "${CASES:-16x4096,64x4096,64x16384}" \
            --warmup "${WARMUP:-5}" --runs "${RUNS:-30}" --routes partitioned $PS $P $flags \
            2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"${v%%:*}\",\"rep\":$i,/" >> "$OUT/grid.jsonl"
    done
    echo "round $i done ($((SECONDS - t0)) s)" >> "$S"
done
for t in ${TESTS:-}; do
    tag=${t%%:*} rest=${t#*:}; envs=${rest%%@*} filt=${rest#*@}; [ "$filt" = "$rest" ] && filt=""
    st=$SECONDS
    env $(echo "$envs" | tr ',' ' ') timeout "${TEST_TIMEOUT:-280}" $D/gpu_kernels $filt --test-threads 12 > "$OUT/tests-$tag.log" 2>&1
    echo "gpu_kernels [$tag: $envs $filt] rc=$? ($((SECONDS - st)) s): $(grep -E '^test result' "$OUT/tests-$tag.log" | tail -1 | cut -c1-60)" >> "$S"
    grep -hE "panicked|FAILED|failures" "$OUT/tests-$tag.log" | head -5 >> "$S"
done
python3 - "$OUT/grid.jsonl" >> "$S" <<'PY'
import json, sys, statistics as st
d = {}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        d.setdefault((r["batch"], r["context"], r["impl"], r.get("partition_size", 0), r["tag"]), []).append((r["gbps"], r["us"]))
for k, v in sorted(d.items()):
    print("%dx%d %s part %s %s: %.0f GB/s, %.2f us (n %d)" % (*k, st.median(x[0] for x in v), st.median(x[1] for x in v), len(v)))
PY
echo "total $((SECONDS - t0)) s" >> "$S"
cat "$S"

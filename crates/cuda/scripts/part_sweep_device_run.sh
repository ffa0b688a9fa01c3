#!/usr/bin/env bash
# One device call (run tool, carry ["dist-cuda"]): bf16 decode at the small-batch cases over
# partition sizes × {plain, programmatic} × V-in-registers {auto, 1}, $REPEAT rounds alternated.
# Each process is one (case, partition size, launch, vreg); its tag names them. Medians last.
set -uo pipefail
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/sweep-summary.txt; J=$OUT/sweep.jsonl
t0=$SECONDS
# case:partition sizes
SWEEP=${SWEEP:-"1x4096:128,192,256,320,384,512 16x4096:4096,2048,1024,512 1x32768:1024,2048,4096"}
for i in $(seq 1 "${REPEAT:-3}"); do
    for cp in $SWEEP; do
        c=${cp%%:*}
        for ps in ${cp#*:}; do ps=${ps//,/ }; for p in $ps; do
            for v in plain pdl; do for vr in ${VREGS:-auto 1}; do
                F=""; [ $v = pdl ] && F="--programmatic"
                PAGEKV_CUDA_TC_VREG=$vr $D/bench_attention --formats bf16 --cases "$c" --partition-sizes "$p" \
                    --warmup 10 --runs "${RUNS:-100}" --routes partitioned $F 2>> "$OUT/bench-err.log" \
                    | grep '"impl":"partitioned' | sed "s/^{/{\"tag\":\"$v-p$p-v$vr\",\"rep\":$i,/" >> "$J"
            done; done
        done; done
    done
    echo "round $i done ($((SECONDS - t0)) s)" >> "$S"
done
python3 - "$J" >> "$S" <<'PY'
import json, statistics, sys
agg = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    agg.setdefault((r["batch"], r["context"], r["tag"]), []).append(r["us"])
print("| case | tag | us median (min-max) | GB/s | n |")
for (b, c, t), v in sorted(agg.items()):
    m = statistics.median(v)
    print(f"| {b}x{c} | {t} | {m:.2f} ({min(v):.2f}-{max(v):.2f}) | {b * c * 8 * 128 * 4 / m / 1e3:.0f} | {len(v)} |")
PY
echo "total $((SECONDS - t0)) s" >> "$S"
cat "$S"

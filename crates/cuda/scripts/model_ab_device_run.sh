#!/usr/bin/env bash
# One device call (run tool, carry the variants' folders): `pagekv bench decode` of the synthetic
# Llama-3-8B at batch 1 under each of $VARIANTS, $REPEAT rounds alternated, medians of tokens/s and
# of the share of the same run's weight-read roofline per (context, tag) last. A variant is
# "tag:DIR:VAR=V,..." — DIR holds a `pagekv` binary and its kernel cache `home/` (empty: dist-cuda),
# then environment assignments (may be empty). $UNPACK names .tar.xz files to unpack in dist-cuda/
# first (for variants that together pass one call's carry limit).
#   VARIANTS="new:: old:dist-cuda/old: nogemv::PAGEKV_DEV_CUDA_GEMV_PDL=0" bash crates/cuda/scripts/model_ab_device_run.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
J=$OUT/model-ab.jsonl
for f in ${UNPACK:-}; do tar -C dist-cuda -xJf "$f" || { echo "model_ab_device_run.sh: cannot unpack $f" >&2; exit 1; }; done
for i in $(seq 1 "${REPEAT:-3}"); do
    for v in ${VARIANTS:-default::}; do
        tag=${v%%:*} rest=${v#*:}; dir=${rest%%:*} envs=${rest#*:}; dir=${dir:-dist-cuda}
        env PAGEKV_HOME="$PWD/$dir/home" $(echo "$envs" | tr ',' ' ') "$dir/pagekv" bench decode --device cuda \
            --model synthetic:llama3-8b --json --text README.md --contexts "${CONTEXTS:-128,1024}" \
            --decode-tokens "${DECODE_TOKENS:-64}" --runs "${RUNS:-3}" 2>> "$OUT/model-ab-err.log" \
            | grep '^{' | sed "s/^{/{\"tag\":\"$tag\",\"rep\":$i,/" >> "$J"
    done
done
python3 - "$J" <<'PY'
import json, statistics as st, sys
agg = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    agg.setdefault((r["context"], r["tag"]), []).append((r["tg_tokens_per_s"], r["steps_per_s_vs_roofline"]))
print("| context | tag | tok/s median (min-max) | share of the roofline | n |")
for (c, t), v in sorted(agg.items()):
    tg = [x[0] for x in v]
    print(f"| {c} | {t} | {st.median(tg):.1f} ({min(tg):.1f}-{max(tg):.1f}) | {100 * st.median(x[1] for x in v):.1f} % | {len(v)} |")
PY
tail -3 "$OUT/model-ab-err.log" 2>/dev/null

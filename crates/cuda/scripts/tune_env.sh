#!/usr/bin/env bash
# Tuning sweep on the GPU machine: one bench_attention run per variant, a variant being a tag
# and environment assignments (tag:VAR=V,VAR=V); JSON lines tagged, then the summary table.
# Usage: bash crates/cuda/scripts/tune_env.sh "tag:PAGEKV_DEV_CUDA_TC_QSTAGES=2" ... -- BENCH ARGS
set -o pipefail
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-cuda/home
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do variants+=("$1"); shift; done
shift || true
for v in "${variants[@]}"; do
  tag=${v%%:*}; assigns=${v#*:}
  env $(echo "$assigns" | tr ',' ' ') dist-cuda/bench_attention "$@" 2>>"$OUT/tune.err" \
    | sed "s/^{/{\"tag\":\"$tag\",/" >> "$OUT/tune.jsonl"
  echo "variant $v: exit $?" >&2
done
python3 crates/cuda/scripts/summarize.py "$OUT/tune.jsonl"

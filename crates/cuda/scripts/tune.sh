#!/usr/bin/env bash
# Tuning sweep on the GPU machine: runs bench_attention once per variant of the tensor-core
# kernel (PAGEKV_DEV_CUDA_TC_WARPS/STAGES/HPC), tagging each JSON line, then prints the summary.
# Usage: bash crates/cuda/scripts/tune.sh "W S HPC" ... -- BENCH ARGS
set -o pipefail
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-cuda/home
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do variants+=("$1"); shift; done
shift || true
for v in "${variants[@]}"; do
  set -- $v "${@}"
  w=$1 s=$2 hpc=$3; shift 3
  PAGEKV_DEV_CUDA_TC_WARPS=$w PAGEKV_DEV_CUDA_TC_STAGES=$s PAGEKV_DEV_CUDA_TC_HPC=$hpc dist-cuda/bench_attention "$@" \
    2>>"$OUT/tune.err" | sed "s/^{/{\"tag\":\"w${w}s${s}h${hpc}\",/" >> "$OUT/tune.jsonl"
  echo "variant $v: exit $?" >&2
done
tail -3 "$OUT/tune.err"
python3 crates/cuda/scripts/summarize.py "$OUT/tune.jsonl"

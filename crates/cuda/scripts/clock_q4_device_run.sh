#!/usr/bin/env bash
# One device call (run tool, carry dist-cuda/{bench_attention,home,pagekv}): does q4 decode follow
# the SM clock? nvidia-smi samples clocks.sm, power, temperature and the clock-event reasons every
# 250 ms while bench_attention (bf16, q4 at 64 × 16384) runs 3 processes "cold", 3 right after a
# batch-64 synthetic-model benchmark ($MODEL_RUNS runs, heats the GPU), and 3 after 20 s of rest.
# Prints each process's µs, the phase marks, and every 4th sample.
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PAGEKV_HOME=$PWD/dist-cuda/home
Q=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv,noheader -lms 250 > $OUT/smi.csv 2>&1 &
SMI=$!
q4() { for i in 1 2 3; do echo "$(date +%T.%N | cut -c1-12) $1" >> $OUT/marks.txt; dist-cuda/bench_attention --formats bf16,q4 --cases 64x16384 --routes partitioned --warmup 10 --runs 100 2>/dev/null | sed "s/^{/{\"tag\":\"$1\",\"rep\":$i,/" >> $OUT/q4.jsonl; done; }
q4 cold
echo "$(date +%T.%N | cut -c1-12) model" >> $OUT/marks.txt
timeout 100 dist-cuda/pagekv bench decode --device cuda --model synthetic:llama3-8b --json --text README.md --batch 64 --contexts 1024 --decode-tokens 32 --runs ${MODEL_RUNS:-4} > $OUT/model.log 2>&1
q4 warm
sleep 20; q4 rest
kill $SMI
python3 - <<'PY'
import json,os,statistics as st
O=os.environ['OUT']
for l in open(O+'/q4.jsonl'):
    r=json.loads(l)
    if r['impl']=='partitioned': print(r['tag'],r['rep'],r['format'],r['us'])
PY
cat $OUT/marks.txt; awk -F', ' '{print $1" "$2" "$3" "$4" "$5}' $OUT/smi.csv | awk 'NR%4==1' | cut -c12-80

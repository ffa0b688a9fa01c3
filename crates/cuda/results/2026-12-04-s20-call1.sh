# Session 20, call 1 (run tool, carry dist-cuda/{pagekv,home,bench_attention,gpu_kernels,cuda_forward,gpu_model_ops,gpu_prefill,gpu_topk},
# staged by stage_model.sh at 6d0b21f): every GPU test binary, the issue's bench attention command in 2 processes,
# the copy probes (pipe, tma, pipews, tmaws) and batch 1 of synthetic:llama3-8b. Run as: bash <this file>.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/dist-cuda/home
D=dist-cuda S=$OUT/summary.txt; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> $S
for t in "kernels:$D/gpu_kernels --test-threads 14" "forward:$D/cuda_forward" "ops:$D/gpu_model_ops --test-threads 1" "prefill:$D/gpu_prefill" "topk:$D/gpu_topk" "lib:$D/lib_tests"; do
  st=$SECONDS; timeout 260 ${t#*:} > $OUT/t-${t%%:*}.log 2>&1; rc=$?
  echo "${t%%:*} rc=$rc $((SECONDS-st)) s $(grep -E '^test result' $OUT/t-${t%%:*}.log | tail -1 | cut -c1-50)" >> $S
done
grep -hE "worst|skipped" $OUT/t-kernels.log | head -8 >> $S
for i in 1 2; do $D/pagekv bench attention --device cuda --json --formats bf16,q8,q4 --shapes 1x4096,1x32768,16x4096,64x4096,64x16384 --runs 30 > $OUT/attn-$i.jsonl 2>>$OUT/attn-err.log; echo "attn $i rc=$? $((SECONDS-t0)) s" >> $S; done
$D/bench_attention --formats bf16 --cases 16x4096,64x16384 --routes partitioned --warmup 10 --runs 30 --probes pipe:8:2:0:0,tma:8:2:0:0,pipews:8:2:0:0,tmaws:8:2:0:0 > $OUT/probes.jsonl 2>$OUT/probes-err.log; echo "probes rc=$? $((SECONDS-t0)) s" >> $S
$D/pagekv bench decode --device cuda --model synthetic:llama3-8b --json --text README.md --contexts 128,1024 --decode-tokens 64 --runs 3 > $OUT/b1.log 2>&1; echo "b1 rc=$?" >> $S
grep '^{' $OUT/b1.log | cut -c1-400 >> $S
python3 - $OUT/attn-*.jsonl >> $S <<'PY'
import json,statistics as st,sys
agg={}
for p in sys.argv[1:]:
    for l in open(p):
        if l.startswith("{"):
            r=json.loads(l)
            if r["impl"] in ("partitioned","roofline-paged-h1"): agg.setdefault((r["impl"],r["format"],r["batch"],r["context"]),[]).append((r["us"],r["gbps"],r.get("sm_mhz")))
bf={}
for k,v in sorted(agg.items(),key=lambda kv:(kv[0][2],kv[0][3],kv[0][0],kv[0][1])):
    us=st.median(x[0] for x in v); print("%-18s %-5s %2dx%-6d %8.2f us %6.0f GB/s MHz %s"%(k[0],k[1],k[2],k[3],us,st.median(x[1] for x in v),[x[2] for x in v]))
PY
python3 - $OUT/probes.jsonl >> $S <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r=json.loads(l); print("probe %-22s %2dx%-6d %8.2f us %6.0f GB/s"%(r["impl"],r["batch"],r["context"],r["us"],r["gbps"]))
PY
echo "total $((SECONDS-t0)) s" >> $S; cat $S

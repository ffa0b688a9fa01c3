# Session 20, call 2 (run tool, carry dist-cuda/{bench_attention,home,old}): the copy probes of
# kernels/bench.cu before (dist-cuda/old: 6d0b21f's bench_attention and kernel cache) and after their
# shared copy / read-back helpers (this commit), alternated 3 rounds, one process each.
# Run as: bash <this file>.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
S=$OUT/summary.txt
P=pipe:8:2:0:0,pipe:8:2:250:0,tma:8:2:0:0,tma:8:2:250:0,pipews:8:2:0:0,pipews:8:2:250:0,tmaws:8:2:0:0,tmaws:8:2:250:0
for i in 1 2 3; do
  for tag in old new; do
    if [ $tag = old ]; then B=dist-cuda/old/bench_attention H=dist-cuda/old/home; else B=dist-cuda/bench_attention H=dist-cuda/home; fi
    PAGEKV_HOME=$PWD/$H $B --formats bf16 --cases 16x4096,64x4096,64x16384 --routes partitioned --warmup 10 --runs 30 \
      --probes $P > $OUT/$tag-$i.jsonl 2>> $OUT/err.log
    echo "$tag $i rc=$?" >> $S
  done
done
python3 - $OUT >> $S <<'PY'
import json, statistics as st, sys, glob, os
agg = {}
for p in glob.glob(sys.argv[1] + "/*-*.jsonl"):
    tag = os.path.basename(p).split("-")[0]
    for l in open(p):
        if l.startswith("{"):
            r = json.loads(l)
            if r["impl"].startswith("probe-") or r["impl"] in ("partitioned", "roofline-paged-h1"):
                agg.setdefault((r["impl"], r["batch"], r["context"]), {}).setdefault(tag, []).append(r["gbps"])
print("%-28s %-9s %8s %8s" % ("row", "case", "old", "new"))
for (impl, b, c), v in sorted(agg.items()):
    print("%-28s %2dx%-6d %8.0f %8.0f" % (impl, b, c, st.median(v.get("old", [0])), st.median(v.get("new", [0]))))
PY
cat $S

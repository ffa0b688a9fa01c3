#!/usr/bin/env bash
# One device call (run tool, carry dist-cuda/{pagekv,home}): the issue's attention command
# $REPEAT rounds, each round once per cooldown in $COOLDOWNS (ms, `--cooldown-ms`; "-" leaves the
# flag out: the default, 100 ms), with nvidia-smi sampling the SM clock, power and the
# clock-event reasons every $SMI_MS ms beside it. Every bench row carries `sm_mhz`, the SM clock averaged over the row's
# timed runs. Prints every decode row (µs, sm_mhz), the q8 / q4 ratios to bf16 at 64 × 16384 per
# process, then per process the samples' clock range and how many had the software power cap
# (reason 0x4) active.
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PAGEKV_HOME=$PWD/dist-cuda/home
Q=timestamp,clocks.sm,power.draw,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv,noheader -lms "${SMI_MS:-20}" > "$OUT/smi.csv" 2>&1 &
SMI=$!
n=0
for r in $(seq 1 "${REPEAT:-3}"); do
    for c in ${COOLDOWNS:--}; do
        n=$((n + 1)); flag=""; [ "$c" != - ] && flag="--cooldown-ms $c"
        echo "$n start $(date +%s.%N) $c" >> "$OUT/marks.txt"
        dist-cuda/pagekv bench attention --device cuda --json --formats bf16,q8,q4 \
            --shapes 1x4096,1x32768,16x4096,64x4096,64x16384 --runs 30 $flag 2>> "$OUT/bench-err.log" \
            | sed "s/^{/{\"rep\":$n,\"cooldown\":\"$c\",/" >> "$OUT/attention.jsonl"
        echo "$n end $(date +%s.%N) $c" >> "$OUT/marks.txt"
    done
done
kill $SMI
python3 - <<'PY'
import json, os, statistics as st, datetime as dt
O = os.environ["OUT"]
rows = [json.loads(l) for l in open(O + "/attention.jsonl") if l.startswith("{")]
print("rep cooldown format case impl us sm_mhz")
for r in rows:
    if r["impl"] in ("primitive", "partitioned") and r["format"] != "-":
        print(r["rep"], r["cooldown"], r["format"], "%dx%d" % (r["batch"], r["context"]), r["impl"], r["us"], r["sm_mhz"])
by = {}
for r in rows:
    if r["impl"] == "partitioned":
        by.setdefault((r["cooldown"], r["format"], r["batch"], r["context"]), []).append((r["us"], r["sm_mhz"], r["gbps"]))
print("medians: cooldown format case us GB/s sm_mhz (n)")
for k, v in sorted(by.items()):
    print(k[0], k[1], "%dx%d" % k[2:], st.median(x[0] for x in v), st.median(x[2] for x in v), st.median(x[1] for x in v), len(v))
for rep in sorted({r["rep"] for r in rows}):
    t = {r["format"]: r["us"] for r in rows if r["rep"] == rep and r["impl"] == "partitioned"
         and (r["batch"], r["context"]) == (64, 16384)}
    c = next(r["cooldown"] for r in rows if r["rep"] == rep)
    if "bf16" in t:
        print("rep %d (cooldown %s) 64x16384: q8/bf16 %.3f q4/bf16 %.3f" % (rep, c, t.get("q8", 0) / t["bf16"], t.get("q4", 0) / t["bf16"]))
marks = {}
for l in open(O + "/marks.txt"):
    i, what, ts = l.split()[:3]
    marks.setdefault(int(i), {})[what] = float(ts)
samples = []
for l in open(O + "/smi.csv"):
    f = [x.strip() for x in l.split(",")]
    if len(f) < 4 or "MHz" not in f[1]:
        continue
    ts = dt.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    samples.append((ts, int(f[1].split()[0]), float(f[2].split()[0]), int(f[3], 16)))
for i, m in sorted(marks.items()):
    s = [x for x in samples if m["start"] <= x[0] <= m["end"] and x[1] > 1000]
    if s:
        cap = sum(1 for x in s if x[3] & 0x4)
        print("rep %d: %d busy samples, SM %d-%d MHz (median %d), power max %.0f W, power cap in %d"
              % (i, len(s), min(x[1] for x in s), max(x[1] for x in s), st.median(x[1] for x in s), max(x[2] for x in s), cap))
PY

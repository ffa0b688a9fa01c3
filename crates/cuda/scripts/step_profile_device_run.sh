#!/usr/bin/env bash
# One device call (run tool, carry dist-cuda/{pagekv,home}): where a decode step of the synthetic
# Llama-3-8B goes, measured. `nsys` traces `pagekv bench decode --device cuda --batch $BATCH
# --contexts $CONTEXT` (one run, $TOKENS decode tokens, graphs traced node by node); the kernels
# after the prefill's last `pk_prefill*` are the decode steps. Their GPU time per step is summed by
# kernel family (cuBLAS products, GEMV, attention + merge, cache write, norms and RoPE, SiLU·mul,
# the rest), against the steps' wall time on the GPU (the difference: gaps between kernels).
# Steps = attention launches ÷ $LAYERS.
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PAGEKV_HOME=$PWD/dist-cuda/home
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -z "$NSYS" ]; then
    # No Nsight Systems: Nsight Compute times every kernel alone (one metric, clocks and caches
    # left as they are), so the kernel times are right but the gaps between them are not seen.
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    [ -n "$NCU" ] || { echo "step_profile_device_run.sh: neither nsys nor ncu on this machine"; exit 1; }
    "$NCU" --version | tail -1
    timeout "${NCU_TIMEOUT:-420}" "$NCU" --csv --print-units base --metrics gpu__time_duration.sum --clock-control none \
        --cache-control none --log-file "$OUT/ncu.csv" \
        dist-cuda/pagekv bench decode --device cuda --model synthetic:llama3-8b --json --text README.md \
        --batch "${BATCH:-64}" --contexts "${CONTEXT:-1024}" --decode-tokens "${TOKENS:-4}" --runs 1 > "$OUT/bench.log" 2>&1
    echo "ncu rc=$?"
    LAYERS=${LAYERS:-32} python3 - <<'PY'
import csv, os, re
O, L = os.environ["OUT"], int(os.environ["LAYERS"])
rows = [r for r in csv.reader(open(O + "/ncu.csv")) if len(r) > 10]
h = rows[0]
ki, mi, vi, ii = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
k = [(int(r[ii]), r[ki], float(r[vi].replace(",", ""))) for r in rows[1:] if r[mi] == "gpu__time_duration.sum"]
k.sort()
last = max((i for i, (_, n, _) in enumerate(k) if n.startswith("pk_prefill")), default=-1)
dec = k[last + 1:]
attn = sum(1 for _, n, _ in dec if n.startswith("pk_decode"))
steps = attn / L
fam = [("attention + merge", r"^pk_decode|^pk_merge"), ("GEMV", r"^pk_gemv"), ("cache write", r"^pk_cache_write"),
       ("RMSNorm", r"^pk_rms_norm"), ("QKV + RoPE", r"^pk_qkv_rope"), ("SiLU·mul", r"^pk_silu"),
       ("embedding", r"^pk_embed"), ("sampling inputs", r"^pk_argmax|^pk_topk"),
       ("cuBLAS products", r"gemm|xmma|cutlass|sm90|nvjet|cublas")]
tot = {}
for _, n, t in dec:
    f = next((f for f, rx in fam if re.search(rx, n, re.I)), "other: " + n[:50])
    tot[f] = tot.get(f, 0.0) + t
print("%d kernels timed, the last pk_prefill* at %d; decode: %d kernels, %d attention launches = %.2f steps" % (len(k), last, len(dec), attn, steps))
busy = sum(tot.values())
if steps:
    print("kernel time per step %.3f ms (each kernel alone, ncu)" % (busy / steps / 1e6))
    for f, t in sorted(tot.items(), key=lambda x: -x[1]):
        print("  %-34s %8.3f ms/step  %5.1f %% of the kernel time" % (f, t / steps / 1e6, 100 * t / busy))
PY
    exit 0
fi
"$NSYS" --version
"$NSYS" profile -t cuda --cuda-graph-trace=node -f true -o "$OUT/step" \
    dist-cuda/pagekv bench decode --device cuda --model synthetic:llama3-8b --json --text README.md \
    --batch "${BATCH:-64}" --contexts "${CONTEXT:-1024}" --decode-tokens "${TOKENS:-32}" --runs 1 > "$OUT/bench.log" 2>&1
grep '^{' "$OUT/bench.log" | cut -c1-400
"$NSYS" export --type sqlite -f true -o "$OUT/step.sqlite" "$OUT/step.nsys-rep" > /dev/null 2>&1
rm -f "$OUT/step.nsys-rep"
LAYERS=${LAYERS:-32} python3 - <<'PY'
import os, re, sqlite3
O, L = os.environ["OUT"], int(os.environ["LAYERS"])
db = sqlite3.connect(O + "/step.sqlite")
names = dict(db.execute("select id, value from StringIds"))
k = [(s, e, names.get(n, "?")) for s, e, n in
     db.execute("select start, end, coalesce(demangledName, shortName) from CUPTI_ACTIVITY_KIND_KERNEL order by start")]
last_prefill = max((e for s, e, n in k if n.startswith("pk_prefill")), default=0)
dec = [(s, e, n) for s, e, n in k if s >= last_prefill]
attn = sum(1 for s, e, n in dec if re.match(r"pk_decode", n))
steps = attn / L if attn else 0
fam = [("attention + merge", r"pk_decode|pk_merge"), ("GEMV (batch-1 products)", r"pk_gemv"),
       ("cuBLAS products", r"gemm|xmma|cutlass|sm90|cublas|nvjet|Kernel2"), ("cache write", r"pk_cache_write"),
       ("RMSNorm", r"pk_rms_norm"), ("QKV + RoPE", r"pk_qkv_rope"), ("SiLU·mul", r"pk_silu"),
       ("embedding", r"pk_embed"), ("sampling inputs", r"pk_argmax|pk_topk")]
tot = {}
for s, e, n in dec:
    f = next((f for f, rx in fam if re.search(rx, n, re.I)), "other: " + n[:60])
    tot[f] = tot.get(f, 0) + (e - s)
wall = (dec[-1][1] - dec[0][0]) if dec else 0
busy = sum(tot.values())
print("%d kernels traced, %d of them pk_prefill*" % (len(k), sum(1 for s, e, n in k if n.startswith("pk_prefill"))))
print("decode window: %d kernels, %d attention launches = %.1f steps (%d layers)" % (len(dec), attn, steps, L))
if steps:
    print("GPU wall per step %.3f ms, kernel time per step %.3f ms (%.1f %%)" % (wall / steps / 1e6, busy / steps / 1e6, 100 * busy / wall))
    for f, t in sorted(tot.items(), key=lambda x: -x[1]):
        print("  %-40s %8.3f ms/step  %5.1f %% of the step" % (f, t / steps / 1e6, 100 * t / wall))
PY

"""Best GB/s per (tag, impl family, format, case) from bench JSON lines (stdin or files);
lines may carry a "tag" (tuning variant). Prints one compact table."""
import json, sys
rows = []
for path in sys.argv[1:] or ["-"]:
    f = sys.stdin if path == "-" else open(path)
    for line in f:
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            if "gbps" in r:
                rows.append(r)
best = {}
for r in rows:
    fam = r["impl"].split("-simt")[0] + ("-simt" if "-simt" in r["impl"] else "")
    key = (r.get("tag", ""), fam, r.get("format", "-"), r["batch"], r["context"])
    if key not in best or r["gbps"] > best[key]["gbps"]:
        best[key] = r
cases = sorted({(k[3], k[4]) for k in best})
groups = sorted({k[:3] for k in best})
print(f"{'tag':<8} {'impl':<18} {'format':<11} " + " ".join(f"{b}x{c}".rjust(13) for b, c in cases))
for g in groups:
    cells = []
    for b, c in cases:
        r = best.get(g + (b, c))
        cells.append(f"{r['gbps']:.0f}/{r.get('partition_size', 0)}".rjust(13) if r else "-".rjust(13))
    print(f"{g[0]:<8} {g[1]:<18} {g[2]:<11} " + " ".join(cells))

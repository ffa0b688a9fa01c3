"""Median (min–max) GB/s and µs per (impl, format, batch × context) over repeated bench_attention
processes (JSON lines, files given as arguments: one process per file, or per value of a line's
`rep` field within a file; `tag` ignored). The decode rows are the
`partitioned` rows with the automatic partition size — the route `auto` takes (with one
partition that launch is the primitive route's). Prints a markdown table."""
import json, statistics, sys
runs = {}  # (impl family, format, case) -> list of (gbps, us, part)
for path in sys.argv[1:]:
    best = {}  # (process, key) -> (gbps, us, part)
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r["impl"] == "primitive":
            continue
        fam = "decode" if r["impl"] == "partitioned" else r["impl"]
        key = (r.get("rep", 0), (fam, r["format"], r["batch"], r["context"]))
        if key not in best or r["gbps"] > best[key][0]:
            best[key] = (r["gbps"], r["us"], r.get("partition_size", 0))
    for (_, k), v in best.items():
        runs.setdefault(k, []).append(v)
print("| impl | format | batch × ctx | GB/s median (min–max) | µs median | processes | partition |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for (fam, fmt, b, c), v in sorted(runs.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][0], kv[0][1])):
    g = [x[0] for x in v]
    us = statistics.median(x[1] for x in v)
    parts = sorted({x[2] for x in v})
    print(f"| {fam} | {fmt} | {b} × {c} | {statistics.median(g):.0f} ({min(g):.0f}–{max(g):.0f}) | {us:.1f} | {len(v)} | {','.join(map(str, parts))} |")

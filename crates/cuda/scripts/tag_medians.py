"""Medians over processes of bench_attention JSON lines carrying "tag" and "rep" (one process per
(tag, rep)), per tag, format and case, and q8/q4 time ÷ bf16 time of the same process (median).
Prints a markdown table and the ratio lines. Usage: tag_medians.py MODE FILE, where MODE picks
the rows:
  auto  the decode rows are the `partitioned` rows (the route `auto` takes), best per process,
        and `stream-k` rows (the stream-K grid) a family of their own;
        every roofline but roofline-copy / roofline-paged-h8, from the tags "new" and "ref" only
        (attn_device_run.sh);
  best  the decode rows are the better of `primitive` and `partitioned` per process, beside
        roofline-paged-h1 (ncu_device_run.sh)."""
import json, statistics, sys


def family(r, mode):
    """The row's family in the table, or None to skip it. A `-pdl` row (`--programmatic`) is its
    route's family: the tag tells the launches apart."""
    impl = r["impl"].removesuffix("-pdl")
    if mode == "auto":
        if impl in ("primitive", "roofline-copy", "roofline-paged-h8"):
            return None
        if impl.startswith("roofline") and r["tag"] not in ("new", "ref"):
            return None
        return "decode" if impl == "partitioned" else impl
    if impl in ("primitive", "partitioned"):
        return "decode"
    return "roof-h1" if impl == "roofline-paged-h1" else None


mode, path = sys.argv[1], sys.argv[2]
if mode not in ("auto", "best"):
    sys.exit(f"tag_medians.py: mode {mode!r}: accepted values are auto, best")
best = {}
for line in open(path):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    fam = family(r, mode)
    if fam is None:
        continue
    k = (r["tag"], r["rep"], fam, r["format"], r["batch"], r["context"])
    if k not in best or r["gbps"] > best[k]["gbps"]:
        best[k] = r
agg = {}
for (tag, rep, fam, fmt, b, c), r in best.items():
    agg.setdefault((fam, fmt, b, c, tag), []).append((r["gbps"], r["us"]))
print("| impl | format | case | tag | GB/s median (min-max) | us | n |")
for (fam, fmt, b, c, tag), v in sorted(agg.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][0], kv[0][1], kv[0][4])):
    g = [x[0] for x in v]
    print(f"| {fam} | {fmt} | {b}x{c} | {tag} | {statistics.median(g):.0f} ({min(g):.0f}-{max(g):.0f}) | {statistics.median(x[1] for x in v):.1f} | {len(v)} |")
ratios = {}
for (tag, rep, fam, fmt, b, c), r in best.items():
    if fam in ("decode", "stream-k") and fmt in ("q8", "q4") and (tag, rep, fam, "bf16", b, c) in best:
        ratios.setdefault((fmt, b, c, tag, fam), []).append(r["us"] / best[(tag, rep, fam, "bf16", b, c)]["us"])
for (fmt, b, c, tag, fam), v in sorted(ratios.items()):
    name = tag if fam == "decode" else f"{tag} {fam}"
    print(f"ratio {fmt}/bf16 {b}x{c} {name}: median {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")

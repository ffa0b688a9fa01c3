#!/usr/bin/env python3
"""Where a GPU decode step's time goes, from an nsys trace of `pagekv bench decode --device cuda`
(run by hand; docs/performance.md, "Where a Q4_K_M decode step goes in the graph").

Usage: nsys_step.py TRACE.csv [--steps 5]

TRACE.csv is `nsys stats -r cuda_gpu_trace -f csv` of a profile taken with
`--cuda-graph-trace=node`. Steps begin at the embedding lookup (`pk_qrows_*` or `pk_embed_*`);
the last STEPS whole steps are read. Launches overlap (each is scheduled while the one before
runs and waits for it in-kernel), so a launch's share of the step is the time from the end of
the launch before to its own end. Matrix products are named by their place in a layer: the one
after attention is wo, then gate|up, then down; those before RoPE are wq|wk|wv; those after the
last layer are the output. Prints, per launch kind, launches a step, the median share (µs) and
the µs a step; and the median lead, how long before the end of the launch before it began
(its blocks were resident: positive when it overlapped, as a programmatic launch does).
"""
import argparse
import csv
import statistics


def launches(path):
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            name = r["Name"].split("(")[0]
            if name.startswith("pk_"):
                start, dur = int(r["Start (ns)"]), int(r["Duration (ns)"])
                out.append((start, start + dur, name))
    return sorted(out)


def roles(step):
    """The kind of each launch of one step (its products named by their place in a layer)."""
    kinds, role = [], None
    for i, (_, _, name) in enumerate(step):
        if not name.startswith("pk_qgemv") and not name.startswith("pk_gemv"):
            kinds.append(name)
            continue
        before = step[i - 1][2] if i > 0 else ""
        if before.startswith("pk_decode") or before == "pk_merge":
            role = "wo"
        elif role == "wo":
            role = "gate|up"
        elif role == "gate|up":
            role = "down"
        elif role in ("down", None, "output"):
            rope_follows = any(n in ("pk_qkv_rope", "pk_qkv_rope_write") for _, _, n in step[i + 1:])
            role = "wq|wk|wv" if rope_follows else "output"
        kinds.append(role + " " + name)
    return kinds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    ks = launches(a.trace)
    starts = [i for i, k in enumerate(ks) if k[2].startswith(("pk_qrows", "pk_embed"))]
    if len(starts) < 2:
        raise SystemExit("fewer than two steps in the trace")
    pairs = list(zip(starts, starts[1:]))[-a.steps:]
    shares, leads, spans = {}, {}, []
    for lo, hi in pairs:
        step = ks[lo:hi]
        spans.append((step[-1][1] - step[0][0]) / 1e3)
        for i, kind in enumerate(roles(step)):
            if i > 0:
                shares.setdefault(kind, []).append((step[i][1] - step[i - 1][1]) / 1e3)
                leads.setdefault(kind, []).append((step[i - 1][1] - step[i][0]) / 1e3)
    n = len(pairs)
    print(f"{n} steps of {min(spans):.0f}-{max(spans):.0f} us")
    print(f"{'launch':40} {'a step':>7} {'median us':>10} {'us a step':>10} {'lead us':>8}")
    for kind, v in sorted(shares.items(), key=lambda kv: -sum(kv[1])):
        lead = statistics.median(leads[kind])
        print(f"{kind:40} {len(v) / n:7.1f} {statistics.median(v):10.2f} {sum(v) / n:10.1f} {lead:8.2f}")


if __name__ == "__main__":
    main()

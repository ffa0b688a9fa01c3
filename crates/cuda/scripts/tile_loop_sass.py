#!/usr/bin/env python3
"""Instruction count of pk_decode_tc's tile loop, without a GPU.

Compiles the decode module the way compile.rs does (the kernel sources joined in its order,
its -D options), for sm_90 with NVRTC through ctypes, disassembles it with cuobjdump, and
prints the size and opcode mix of the tile loop: the smallest backward-branch loop of
pk_decode_tc that holds an HMMA.

    python3 crates/cuda/scripts/tile_loop_sass.py --rev 07d1e2b bf16 128 4 --warps 8 --stages 2

Needs libnvrtc.so.13 (--nvrtc, or PAGEKV_NVRTC) and cuobjdump with nvdisasm on PATH (the PyPI
wheels nvidia-cuda-nvrtc, nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry them).
--rev takes the kernel sources of a commit (default: the working tree). --force-aligned
compiles the rejected aligned-copy path of def8a25 alone (its run-time `aligned` flag set to
true), as RESULTS.md's session-9 counts did. --pair (PK_TC_PAIR) follows compile::tc_pair by
default: q4 at head_dim <= 128 and groups <= 4 take two tiles per step (give --stages 4, their
default), and the loop printed is one step. --dump FILE writes the loop's instructions.
Measurements only, by patching the sources as --force-aligned does: --p-parts-1 splits p into one
f16 part instead of two for quantized pages (RESULTS.md session 18: what the exact split costs),
--pair-any-group lifts the kernel's group <= 4 rule for two tiles per step (its register count at
group 8). The register and spill counts of pk_decode_tc are printed too.
"""
import argparse
import collections
import ctypes
import os
import re
import subprocess
import sys
import tempfile

SOURCES = ["common.cuh", "cache_write.cu", "decode.cu", "decode_tc.cu", "prefill_tc.cu"]
CODECS = {"f16": 1, "bf16": 2, "q8": 3, "q4": 4}
BITS = {"f16": 16, "bf16": 16, "q8": 8, "q4": 4}
ALIGNED = "const bool aligned = log2_bs >= 4 && (start & 15u) == 0;"
P_PARTS = "constexpr int SP = BF ? 3 : 2;"
PAIR_GROUPS = "constexpr int TS = PK_TC_PAIR != 0 && QUANT && PK_G <= 4 ? 2 : 1;"


def source(rev):
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
    parts = []
    for name in SOURCES:
        path = f"crates/cuda/kernels/{name}"
        if rev:
            parts.append(subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True, check=True).stdout)
        else:
            parts.append(open(os.path.join(root, path)).read())
    return "\n".join(parts)


def compile_cubin(src, opts, nvrtc):
    lib = ctypes.CDLL(nvrtc)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"pagekv.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    ok = lib.nvrtcCompileProgram(prog, len(opts), arr) == 0
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if not ok:
        sys.exit(log.value.decode())
    n = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw, log.value.decode()


def resources(log, func):
    """'N registers, S bytes spilled' of func from ptxas's -v output."""
    lines = log.split("\n")
    for i, line in enumerate(lines):
        if f"Compiling entry function '{func}'" in line:
            text = " ".join(lines[i:i + 4])
            regs = re.search(r"Used (\d+) registers", text)
            spill = re.search(r"(\d+) bytes spill stores", text)
            return f"{regs.group(1) if regs else '?'} registers, {spill.group(1) if spill else '?'} bytes spilled"
    return "registers unknown"


def tile_loop(sass, func):
    body = next(p for p in re.split(r"\n\s*Function : ", sass)[1:] if p.split("\n")[0].strip() == func)
    ins = []  # (address, instruction)
    for line in body.split("\n"):
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    index = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, s) in enumerate(ins):
        m = re.search(r"BRA(?:\.\w+)*\s+(?:\w+,\s*)?0x([0-9a-f]+)", s)
        if m and int(m.group(1), 16) <= a:
            lo = index[int(m.group(1), 16)]
            if any("HMMA" in t for _, t in ins[lo:i + 1]):
                loops.append(ins[lo:i + 1])
    if not loops:
        sys.exit(f"{func}: no loop with an HMMA")
    return min(loops, key=len)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("format", choices=sorted(CODECS))
    ap.add_argument("head_dim", type=int)
    ap.add_argument("group", type=int)
    ap.add_argument("--warps", type=int, required=True, help="PK_TC_WARPS (compile::tc_shape)")
    ap.add_argument("--stages", type=int, required=True, help="PK_TC_STAGES (compile::tc_shape)")
    ap.add_argument("--rev", default="", help="git commit of the kernel sources")
    ap.add_argument("--force-aligned", action="store_true")
    ap.add_argument("--nvrtc", default=os.environ.get("PAGEKV_NVRTC", "libnvrtc.so.13"))
    ap.add_argument("--pair", choices=["auto", "0", "1"], default="auto", help="PK_TC_PAIR (compile::tc_pair)")
    ap.add_argument("--dump", default="", help="write the loop's instructions to this file")
    ap.add_argument("--p-parts-1", action="store_true", help="quantized pages: p in one f16 part (a measurement)")
    ap.add_argument("--pair-any-group", action="store_true", help="two tiles per step at any group (a measurement)")
    a = ap.parse_args()
    src = source(a.rev)
    if a.force_aligned:
        if ALIGNED not in src:
            sys.exit("--force-aligned: these sources have no aligned-copy flag")
        src = src.replace(ALIGNED, "const bool aligned = true;")
    for flag, old, new in [(a.p_parts_1, P_PARTS, "constexpr int SP = BF ? 3 : (QUANT ? 1 : 2);"),
                           (a.pair_any_group, PAIR_GROUPS, "constexpr int TS = PK_TC_PAIR != 0 && QUANT ? 2 : 1;")]:
        if flag:
            if old not in src:
                sys.exit(f"these sources have no line {old!r}")
            src = src.replace(old, new)
    c, d = CODECS[a.format], a.head_dim
    # compile::tc_eager (q4) and compile::tc_evict_first (f16, bf16, q8), as measured.
    opts = ["--gpu-architecture=sm_90", "-std=c++17", f"-DPK_KC={c}", f"-DPK_KBITS={BITS[a.format]}", f"-DPK_VC={c}",
            f"-DPK_VBITS={BITS[a.format]}", f"-DPK_D={d}", f"-DPK_G={a.group}", f"-DPK_ROT_BLOCK={d & -d}",
            f"-DPK_TC_WARPS={a.warps}", f"-DPK_TC_STAGES={a.stages}", "-DPK_TC_MINB=0",
            f"-DPK_TC_EAGER={int(a.format == 'q4')}", f"-DPK_TC_EF={int(a.format != 'q4')}"]
    quant = a.format in ("q4", "q8")
    pair = {"1": quant, "0": False}.get(a.pair, a.format == "q4" and d <= 128)
    pair = pair and (a.group <= 4 or a.pair_any_group) and a.stages >= 4
    opts += [f"-DPK_TC_PAIR={int(pair)}", "--ptxas-options=-v"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "module.cubin")
        with open(path, "wb") as f:
            cubin, log = compile_cubin(src, opts, a.nvrtc)
            f.write(cubin)
        sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    loop = tile_loop(sass, "pk_decode_tc")
    if a.dump:
        with open(a.dump, "w") as f:
            f.write("\n".join(f"{addr:05x} {ins}" for addr, ins in loop) + "\n")
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", s).split()[0].split(".")[0] for _, s in loop)
    print(f"{a.format} d{d} g{a.group} w{a.warps} s{a.stages}{' aligned' if a.force_aligned else ''}"
          f"{' (two tiles per step)' if pair else ''}{' (p: one part)' if a.p_parts_1 else ''}, "
          f"{resources(log, 'pk_decode_tc')}: {len(loop)} instructions: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(12)))


if __name__ == "__main__":
    main()

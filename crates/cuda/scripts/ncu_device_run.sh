#!/usr/bin/env bash
# One device call (run tool, carry ["dist-cuda"]): Nsight Compute on the tensor-core decode
# kernel at the issue's shapes, then $REPEAT baseline bench_attention processes. Stage first with
# crates/cuda/scripts/stage.sh (DIST=dist-cuda). Clocks are left as found (--clock-control none).
# Usage on the device: REPEAT=2 NCU_CASES="bf16:64x16384 bf16:16x4096 q4:64x16384" \
#   bash crates/cuda/scripts/ncu_device_run.sh
# Optional: NCU_ENV="VAR=V ..." (environment of the profiled processes; NCU_CASES="" for none),
# TESTS="tag:VAR=V,...@filter ..." (gpu_kernels first, under that environment and name filter),
# VARIANTS="tag:VAR=V,VAR=V tag2:..." (alternated bench processes, $REPEAT rounds).
set -uo pipefail
D=${DIST:-dist-cuda}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PAGEKV_HOME=$PWD/$D/home
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
DETAILS="--print-details all"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >> "$S" 2>&1
echo "ncu: $NCU $($NCU --version 2>&1 | tail -1)" >> "$S"
$NCU --help 2>&1 | grep -q -- "--print-details" || DETAILS=""
SECTIONS="--section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis \
 --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis"
METRICS="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
for t in ${TESTS:-}; do
    tag=${t%%:*}; rest=${t#*:}; envs=${rest%%@*}; filt=${rest#*@}; [ "$filt" = "$rest" ] && filt=""
    st=$SECONDS
    env $(echo "$envs" | tr ',' ' ') timeout ${TEST_TIMEOUT:-240} $D/gpu_kernels $filt --test-threads 12 > "$OUT/tests-$tag.log" 2>&1
    echo "gpu_kernels [$tag: $envs $filt] rc=$? ($((SECONDS - st)) s): $(grep -E '^test result' "$OUT/tests-$tag.log" | tail -1 | cut -c1-60)" >> "$S"
    grep -hE "panicked|FAILED" "$OUT/tests-$tag.log" | head -5 >> "$S"
done
for c in ${NCU_CASES-bf16:64x16384 bf16:16x4096 q4:64x16384}; do
    fmt=${c%%:*}; shape=${c#*:}
    k=${NCU_KERNEL:-pk_decode_tc.*}
    log=$OUT/ncu-$fmt-$shape${NCU_TAG:-}.log
    env ${NCU_ENV:-} timeout ${NCU_TIMEOUT:-120} $NCU --clock-control none -k "regex:^${k}\$" --launch-skip 2 --launch-count 1 \
        $SECTIONS $METRICS $DETAILS \
        $D/bench_attention --formats "$fmt" --cases "$shape" --routes primitive --warmup 2 --runs 2 > "$log" 2>&1
    echo "ncu $fmt $shape rc=$?" >> "$S"
done
# The paged-read roofline kernel at one shape, for the DRAM figures of a read with nothing computed.
if [ -n "${NCU_ROOF-64x4096}" ]; then
    timeout 120 $NCU --clock-control none -k "regex:^pk_paged_read\$" --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy $METRICS $DETAILS \
        $D/bench_attention --formats bf16 --cases "${NCU_ROOF:-64x4096}" --routes primitive --warmup 2 --runs 2 \
        > "$OUT/ncu-paged-read.log" 2>&1
    echo "ncu paged_read rc=$?" >> "$S"
fi
B="$D/bench_attention --formats ${FORMATS:-bf16,q8,q4} --warmup 10 --runs ${RUNS:-50}"
for i in $(seq 1 "${REPEAT:-0}"); do
    for v in ${VARIANTS:-ref:}; do
        env $(echo "${v#*:}" | tr ',' ' ') $B ${VARGS:-} 2>> "$OUT/bench-err.log" \
            | sed "s/^{/{\"tag\":\"${v%%:*}\",\"rep\":$i,/" >> "$OUT/bench.jsonl"
    done
done
# Partition sizes at the large shapes (is the tail of the last CTAs what is left?), $PSWEEP processes.
for i in $(seq 1 "${PSWEEP:-0}"); do
    for cs in "16x4096,64x4096:512,1024,2048" "64x16384:2048,4096,8192"; do
        $D/bench_attention --formats bf16 --cases "${cs%%:*}" --routes partitioned --warmup 5 --runs 30 \
            --partition-sizes "${cs#*:}" 2>> "$OUT/bench-err.log" | sed "s/^{/{\"tag\":\"ps\",\"rep\":$i,/" >> "$OUT/psweep.jsonl"
    done
done
[ -s "$OUT/psweep.jsonl" ] && python3 - "$OUT/psweep.jsonl" >> "$S" <<'PYEOF'
import json, statistics, sys
v = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["impl"] == "partitioned":
        v.setdefault((r["batch"], r["context"], r["partition_size"]), []).append(r["gbps"])
for (b, c, p), g in sorted(v.items()):
    print(f"psweep bf16 {b}x{c} part {p}: {statistics.median(g):.0f} GB/s ({min(g):.0f}-{max(g):.0f})")
PYEOF
# Key ncu figures per profile, one block each.
for f in "$OUT"/ncu-*.log; do
    echo "== $(basename "$f")" >> "$S"
    grep -E "^\s+(DRAM Throughput|Memory Throughput|Duration|Registers Per Thread|Dynamic Shared Memory Per Block|Achieved Occupancy|Theoretical Occupancy|Block Limit (Registers|Shared Mem)|Warp Cycles Per Issued Instruction|Issued Ipc Active|No Eligible|Compute \(SM\) Throughput|L2 Hit Rate|Mem Busy|Max Bandwidth|dram__bytes_read.sum.per_second)" "$f" | sed 's/  */ /g' >> "$S"
    grep -E "smsp__average_warps_issue_stalled_.*_per_issue_active.ratio" "$f" | awk '{v=$NF; if (v+0 >= 0.05) print}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/  */ /g' >> "$S"
    grep -E "==PROF==|==ERROR==|ERR_NVGPU" "$f" | head -3 >> "$S"
done
[ -s "$OUT/bench.jsonl" ] && python3 crates/cuda/scripts/tag_medians.py best "$OUT/bench.jsonl" >> "$S"
cat "$S"

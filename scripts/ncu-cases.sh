#!/usr/bin/env bash
# One device call: ncu profiles (speed of light, memory, occupancy, warp
# states, scheduler, instruction mix) of chosen kernels of a carried
# library (scripts/build-device-library.sh, xz as library-ab.sh takes it),
# one kernel_times.py case each; reports under $OUT, a summary of the
# headline metrics printed last.
#
#   LIB_XZ=.devlib/new-<stamp>.so.xz \
#     NCU_CASES='mnist-like:1x128:bf16:dot=tc_fwd_kernel;...' \
#     bash scripts/ncu-cases.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/device-env.sh
OUT=${OUT:-./ncu-out}
mkdir -p "$OUT"
unxz "$LIB_XZ" /tmp/lib.so || exit 1
export PYG_DFGNN_LIBRARY=/tmp/lib.so
IFS=';' read -ra CASES <<<"$NCU_CASES"
i=0
for spec in "${CASES[@]}"; do
  case_=${spec%%=*}; regex=${spec#*=}; i=$((i + 1))
  f="$OUT/ncu-$i-$(echo "$case_" | tr ':@/' '___')-${regex//[^A-Za-z0-9_]/}.txt"
  timeout ${NCU_TIMEOUT:-150} ncu --kernel-name "regex:$regex" \
    --launch-skip ${NCU_SKIP:-1} --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section InstructionStats \
    --section ComputeWorkloadAnalysis \
    --metrics smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio \
    python scripts/kernel_times.py "$case_" --steps 2 >"$f" 2>&1
  echo "== $i $case_ [$regex] rc=$?"
  grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit (Registers|Shared Mem)|Issued Ipc Active|No Eligible|Warp Cycles Per Issued Instruction|Executed Instructions|Dynamic Shared Memory Per Block)\b" "$f" | sed 's/  \+/ /g'
  grep -E "issue_stalled" "$f" | awk '$NF+0 >= 0.3 {print "   ", $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
done

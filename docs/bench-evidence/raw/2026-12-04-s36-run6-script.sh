#!/usr/bin/env bash
# session 36 run 6: Nsight Compute on run 4's form of the wide GEMM (gate_up and lm_head at M = 32)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/.exp/w4 PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc6
date -u
cd .exp/w4 && timeout 60 python3 ncu_driver.py time 2>&1 | grep -v Warning
for mode in gate_up lm_head; do
  timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section InstructionStats \
    --metrics smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active -k regex:wide_gemm --launch-skip 2 -c 1 python3 ncu_driver.py $mode > $OUT/ncu-$mode.txt 2>&1
  echo "== $mode rc $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles Per Issued|Issued Warp|Eligible|Active Warps Per|Achieved Occupancy|Registers Per|L2 Hit|L1/TEX Hit|Executed Ipc|stalled|dram__|inst_executed|warps_active|sector_hit" $OUT/ncu-$mode.txt | head -60
done

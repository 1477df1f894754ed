#!/usr/bin/env bash
# session 30, device run 5: Nsight Compute on the conv prefill (8 channels, conv.vec4) and the gated
# RMSNorm at 2 x 1,024 tokens (final tree): where their bandwidth goes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cc5
D=docs/bench-evidence/raw/2026-12-02-s30-ncu-driver.py
ncu --version | tail -1
timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  -k regex:"conv_prefill|gated_rms" --launch-skip 1 -o /tmp/r5 -f python3 $D > $OUT/ncu-run.txt 2>&1
tail -2 $OUT/ncu-run.txt
ncu -i /tmp/r5.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
grep -E "conv_prefill|gated_rms|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Stall|Issue Slots Busy|Compute \(SM\) Throughput|Waves Per SM|L2 Hit|Mem Busy|Max Bandwidth|Warp Cycles Per Issued" $OUT/ncu-details.txt | head -80

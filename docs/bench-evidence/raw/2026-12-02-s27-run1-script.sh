#!/usr/bin/env bash
# session 27, device run 1: Nsight Compute on the hot kernels (the GDN split passes and the attention
# at prefill 2 x 1,024, K4 and the projections at decode batch 32); the decode split sweep on the new
# combine; the prefill 2 x 1,024 step with and without conv.vec4 (A B B A).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
D=docs/bench-evidence/raw/2026-12-02-s27-ncu-driver.py
mkdir -p $OUT/ncu
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/ncu/smi.txt
which ncu >> $OUT/ncu/smi.txt 2>&1; ncu --version >> $OUT/ncu/smi.txt 2>&1
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats"
prof() {  # $1 label, $2 driver mode, rest: ncu filters
  local label=$1 mode=$2; shift 2
  timeout 150 ncu --clock-control none --import-source yes $SECS "$@" -o /tmp/$label -f python3 $D $mode > $OUT/ncu/$label-run.txt 2>&1
  ncu -i /tmp/$label.ncu-rep --page details > $OUT/ncu/$label-details.txt 2>&1
  ncu -i /tmp/$label.ncu-rep --page source --csv --print-source cuda > $OUT/ncu/$label-src.csv 2>&1 \
    || ncu -i /tmp/$label.ncu-rep --page source --csv > $OUT/ncu/$label-src.csv 2>&1
  echo "== $label: $(grep -c '' $OUT/ncu/$label-details.txt) detail lines, $(grep -c '' $OUT/ncu/$label-src.csv) source lines"
  grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per" $OUT/ncu/$label-details.txt | head -12
}
prof prep prep -k regex:gdn_chunk_prep --launch-skip 1 -c 1
prof state state -k regex:gdn_chunk_state --launch-skip 1 -c 1
prof attn attn -k regex:paged_attn --launch-skip 3 -c 3
prof k4 k4 -k regex:gdn_decode --launch-skip 1 -c 1
prof gemm gemm --nvtx --nvtx-include "regex:m(32|8)_.*/" -c 12
(cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu)

timeout 200 python3 -m engine.bench.attention --skip prefill --sweep > $OUT/sweep.txt 2>&1
grep -E "sweep decode b32|sweep decode b8 |decode  *b" $OUT/sweep.txt | head -40

DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = label, rest = extra arms
  local label=$1; shift
  timeout 120 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 \
     --graph-capture lazy --steps prefill --kernel-arms $DEF "$@" > $OUT/steps-$label.txt 2>&1
  echo "== $label"; grep -A3 "^step " $OUT/steps-$label.txt | head -4 | cut -c1-130
}
steps 1-A; steps 2-B conv.vec4; steps 3-B conv.vec4; steps 4-A

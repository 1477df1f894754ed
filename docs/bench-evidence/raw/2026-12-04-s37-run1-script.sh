#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git log --oneline -1 2>/dev/null
timeout 240 python3 -m pytest -q -m gpu tests/ops/test_attention_cuda.py -x -k "q_in_registers or other_inst or w1_like or kernel_res or mixed_batch" -rf > $OUT/tests.txt 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.txt
timeout 200 python3 .exp/s37/pa_ab.py ab > $OUT/ab.txt 2>&1; echo "ab rc $?"
for sh in default 32,8,2; do
  timeout 90 ncu --clock-control none --print-details all --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --metrics smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum -k regex:paged_attn_kernel --launch-skip 1 -c 1 python3 .exp/s37/pa_ab.py one $sh > $OUT/ncu-$sh.txt 2>&1; echo "ncu $sh rc $?"
done
for sh in default 32,8,2; do echo "== $sh"; grep -E "Duration|Shared|Tensor|Issued|Eligible|Active Warps|Achieved Occ|Registers|inst_executed|bank_conf|Stall|Pipe|L1/TEX|Memory Throughput|Compute \(SM\)" $OUT/ncu-$sh.txt | head -50; done
tail -32 $OUT/ab.txt

#!/usr/bin/env bash
# session 40 run 6: cache hints, same bits: K4's fp32 state loads / stores (K4_HINT 0-3) with
# engine.bench.decode, and the attention's K/V cp.async prefetch size (PA_HINT 0-2) with
# engine.bench.attention --skip prefill; variants in mirrored order, one process each
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc6
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
n=0
for h in 0 1 2 3 3 2 1 0; do
  n=$((n+1)); sed -i "s/^#define K4_HINT [0-9]/#define K4_HINT $h/" cuda/gdn/decode.cu
  timeout 120 python3 -m engine.bench.decode > $OUT/k4-$n-h$h.txt 2>&1; rc=$?
  echo "K4_HINT $h (run $n, rc $rc): $(grep -E '^  B=' $OUT/k4-$n-h$h.txt | sed -E 's/, 4 ops.*//' | tr '\n' ' ')"
done
sed -i "s/^#define K4_HINT [0-9]/#define K4_HINT 0/" cuda/gdn/decode.cu
n=0
for h in 0 1 2 2 1 0; do
  n=$((n+1)); sed -i "s/^#define PA_HINT [0-9]/#define PA_HINT $h/" cuda/attention/pa_util.cuh
  timeout 90 python3 -m engine.bench.attention --skip prefill > $OUT/pa-$n-h$h.txt 2>&1; rc=$?
  echo "PA_HINT $h (run $n, rc $rc): $(grep -E '^  decode +b(1|8|32|64) x 1101 +cuda bn' $OUT/pa-$n-h$h.txt | awk '{print $2, $(NF-9)}' | tr '\n' ' ')"
done
sed -i "s/^#define PA_HINT [0-9]/#define PA_HINT 0/" cuda/attention/pa_util.cuh

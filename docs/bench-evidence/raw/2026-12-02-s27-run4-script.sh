#!/usr/bin/env bash
# session 27, device run 4: Nsight Compute's per-source-line view (warp stall samples) of the prefill
# attention tile (2 x 1,024) and of the GDN prep pass, for the next session's attention work; the
# kernels compiled fresh (empty CuPy cache) with -lineinfo, NVRTC's source kept (see the driver).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc-ncu
D=docs/bench-evidence/raw/2026-12-02-s27-ncu-driver.py
mkdir -p $OUT/src
prof() {  # $1 label, $2 driver mode, rest: ncu filters
  local label=$1 mode=$2; shift 2
  rm -rf /tmp/cc-ncu
  timeout 120 ncu --clock-control none --import-source yes --section SourceCounters --section WarpStateStats \
    "$@" -o /tmp/$label -f python3 $D $mode > $OUT/src/$label-run.txt 2>&1
  timeout 60 ncu -i /tmp/$label.ncu-rep --page source --csv --print-source cuda > $OUT/src/$label-cuda.csv 2>&1
  timeout 60 ncu -i /tmp/$label.ncu-rep --page source --csv --print-source sass > $OUT/src/$label-sass.csv 2>&1
  timeout 60 ncu -i /tmp/$label.ncu-rep --page details --print-details all > $OUT/src/$label-details.txt 2>&1
  echo "== $label: $(grep -c '' $OUT/src/$label-cuda.csv) cuda lines, $(grep -c '' $OUT/src/$label-sass.csv) sass lines"
  head -c 300 $OUT/src/$label-cuda.csv; echo
}
prof attn attn -k regex:paged_attn_kernel --launch-skip 2 -c 1
prof prep prep -k regex:gdn_chunk_prep --launch-skip 1 -c 1
ls /tmp/ds-nvrtc-* 2>/dev/null | head -3
(cd $OUT && tar czf src.tgz src && rm -rf src)

#!/usr/bin/env bash
# Build the FlashInfer peer folder that engine/bench/flashinfer_peer.py loads (FLASHINFER_PEER_PATH,
# default <repo>/.fi), from PyPI wheels, on a machine with nvcc but no GPU.
#
# Usage: deploy/flashinfer-peer.sh OUT_DIR
#   e.g. deploy/flashinfer-peer.sh .fi      (the repo root's .fi is git-ignored)
#
# Produces, in OUT_DIR (only these four entries are replaced; a failed run leaves OUT_DIR alone):
#   site/           flashinfer-python 0.6.0 and apache-tvm-ffi 0.1.15.post2 (cp312 x86_64 wheel, the
#                   GPU host's Python), pruned by deploy/flashinfer_peer/prune.py to what the bench uses
#   aot/<uri>/      the three modules the bench needs (batch decode, batch prefill fa2 and fa3), built
#                   ahead of time for sm_90a by deploy/flashinfer_peer/build_aot.py
#   cutlass.tar.xz  the cutlass/cute headers the fa3 module includes, for a JIT build on the host
#   README.txt      generated: versions, toolchain, sizes, date, how to use it
#
# Takes about 6-11 minutes on 2 cores (nearly all of it nvcc on the fa2/fa3 kernels; MAX_JOBS
# defaults to nproc). Size budget: 25 MiB for the whole folder (it goes to an offline GPU host with a
# 64 MiB upload limit); the script prints the total and fails when it is over. Expect about 21 MiB.
#
# Needs: network access to the package index (pip download), nvcc 13 (CUDA_HOME, default
# /usr/local/cuda), a C compiler, ninja, unzip, and a Python with torch (a CPU build is enough), pip
# and jinja2 (PYTHON, default python3: run it inside the repo's venv). The AOT build runs on this
# Python, so tvm_ffi is downloaded a second time for this Python's version when that is not 3.12
# (the built .so files use no Python ABI). einops and nvidia-ml-py (imported by flashinfer),
# nvidia-curand's headers (when CUDA_HOME has no curand_kernel.h) and a libcuda.so link stub (when
# CUDA_HOME has none) are fetched or made in the temporary build folder only.
# Env: PYTHON, CUDA_HOME, MAX_JOBS, KEEP_WORK=1 (keep the temporary build folder).
set -euo pipefail

FLASHINFER_VERSION=0.6.0
TVM_FFI_VERSION=0.1.15.post2
HOST_PYTHON=3.12                    # the GPU host's Python: site/tvm_ffi is built for it
ARCH=9.0a                           # H200
BUDGET=$((25 * 1024 * 1024))        # bytes
EINOPS_VERSION=0.8.2                # build-time only, when this Python lacks them
NVIDIA_ML_PY_VERSION=13.615.71
NVIDIA_CURAND_VERSION=10.4.0.35     # the CUDA 13 curand headers

usage() { sed -n '2,27p' "${BASH_SOURCE[0]}"; }
if [[ $# -ne 1 || "$1" == -* ]]; then
    usage
    [[ $# -eq 1 && ( "$1" == -h || "$1" == --help ) ]] && exit 0
    exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
scripts="$here/flashinfer_peer"
repo="$(cd "$here/.." && pwd)"
out="$(realpath -m "$1")"
python="${PYTHON:-python3}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
jobs="${MAX_JOBS:-$(nproc)}"
start=$SECONDS

die() { echo "flashinfer-peer: $*" >&2; exit 1; }
for tool in ninja unzip cc; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
[[ -x "$cuda_home/bin/nvcc" ]] || die "no nvcc at $cuda_home/bin/nvcc (set CUDA_HOME)"
"$python" -c 'import torch, jinja2, pip' 2>/dev/null || die "$python cannot import torch, jinja2 and pip"
build_python="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

work="$(mktemp -d "${TMPDIR:-/tmp}/flashinfer-peer.XXXXXX")"
cleanup() {
    local rc=$?
    if [[ $rc -ne 0 || "${KEEP_WORK:-}" == 1 ]]; then
        echo "flashinfer-peer: build folder kept: $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

download() {  # download DEST PIP_ARGS...: wheels only, no dependencies
    local dest="$1"
    shift
    "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dest" "$@"
}
unpack() {  # unpack DEST WHEEL...
    local dest="$1" whl
    shift
    mkdir -p "$dest"
    for whl in "$@"; do unzip -q -o "$whl" -d "$dest"; done
}
platform=(--python-version "$HOST_PYTHON" --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

echo "== download flashinfer-python $FLASHINFER_VERSION, apache-tvm-ffi $TVM_FFI_VERSION (cp${HOST_PYTHON/./})"
download "$work/whl/site" "${platform[@]}" \
    "flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION"
unpack "$work/flashinfer" "$work"/whl/site/flashinfer_python-*.whl
unpack "$work/tvm_ffi-host" "$work"/whl/site/apache_tvm_ffi-*.whl

# what the build imports: flashinfer from the same tree prune.py reads (the deps log names its files),
# tvm_ffi for this Python, and flashinfer's pure-Python imports this Python lacks
build_path="$work/flashinfer"
if [[ "$build_python" != "$HOST_PYTHON" ]]; then
    echo "== download apache-tvm-ffi $TVM_FFI_VERSION for the build Python ($build_python)"
    download "$work/whl/build" --python-version "$build_python" --implementation cp \
        "apache-tvm-ffi==$TVM_FFI_VERSION"
    unpack "$work/build-py" "$work"/whl/build/apache_tvm_ffi-*.whl
    build_path="$build_path:$work/build-py"
else
    build_path="$build_path:$work/tvm_ffi-host"
fi
helpers=()
"$python" -c 'import einops' 2>/dev/null || helpers+=("einops==$EINOPS_VERSION")
"$python" -c 'import pynvml' 2>/dev/null || helpers+=("nvidia-ml-py==$NVIDIA_ML_PY_VERSION")
if [[ ${#helpers[@]} -gt 0 ]]; then
    echo "== download build-time helpers: ${helpers[*]}"
    download "$work/whl/helpers" "${helpers[@]}"
    unpack "$work/helpers" "$work"/whl/helpers/*.whl
    build_path="$build_path:$work/helpers"
fi

# flashinfer links -lcuda and includes curand_kernel.h; a toolkit without a driver may have neither
ldflags="" cudaflags=""
if ! compgen -G "$cuda_home/lib*/libcuda.so" >/dev/null && ! compgen -G "$cuda_home/lib*/stubs/libcuda.so" >/dev/null; then
    mkdir -p "$work/stubs"
    cc -shared -o "$work/stubs/libcuda.so" -x c /dev/null  # dropped again by --as-needed
    ldflags="-L$work/stubs"
fi
if [[ ! -e "$cuda_home/include/curand_kernel.h" ]]; then
    echo "== download nvidia-curand $NVIDIA_CURAND_VERSION (headers only)"
    download "$work/whl/curand" "nvidia-curand==$NVIDIA_CURAND_VERSION"
    unpack "$work/curand" "$work"/whl/curand/*.whl
    header="$(find "$work/curand" -name curand_kernel.h -print -quit)"
    [[ -n "$header" ]] || die "no curand_kernel.h in nvidia-curand $NVIDIA_CURAND_VERSION"
    cudaflags="-isystem $(dirname "$header")"
fi

build_env=(
    PYTHONPATH="$build_path" PYTHONDONTWRITEBYTECODE=1
    FLASHINFER_WORKSPACE_BASE="$work/ws" FLASHINFER_CUDA_ARCH_LIST="$ARCH" CUDA_HOME="$cuda_home"
    MAX_JOBS="$jobs" FLASHINFER_EXTRA_LDFLAGS="$ldflags" FLASHINFER_EXTRA_CUDAFLAGS="$cudaflags"
    TVM_FFI_DISABLE_TORCH_C_DLPACK=1  # else tvm_ffi JIT-builds a torch addon at import
)
stage="$work/out"
log="$work/build_aot.log"
echo "== AOT build for sm_${ARCH/./} with $python ($build_python), MAX_JOBS=$jobs (log: $log)"
if ! (cd "$work" && env "${build_env[@]}" "$python" "$scripts/build_aot.py" "$stage" >"$log" 2>&1); then
    tail -n 40 "$log" >&2
    die "AOT build failed (full log: $log)"
fi
grep -E '\.so: [0-9]+ bytes$' "$log" | sed 's/^/   /'
jit_dir="$(cd "$work" && env "${build_env[@]}" "$python" -c \
    'from flashinfer.jit import env; print(env.FLASHINFER_JIT_DIR)' 2>/dev/null | tail -n 1)"

echo "== prune into site/ and cutlass.tar.xz"
"$python" "$scripts/prune.py" "$stage" "$work/flashinfer/flashinfer" "$work/tvm_ffi-host/tvm_ffi" "$jit_dir"

size() { du -sb "$1" | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
row() { printf '  %-16s %10d bytes  %s\n' "$1" "$(size "$stage/$1")" "$(mib "$(size "$stage/$1")")"; }
tvm_wheel="$(basename "$work"/whl/site/apache_tvm_ffi-*.whl)"
fi_wheel="$(basename "$work"/whl/site/flashinfer_python-*.whl)"
nvcc_version="$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([^,]*\), \(V[^ ]*\).*/\1 (\2)/p')"
cc_version="$(cc --version | head -n 1)"
glibc_version="$(ldd --version | head -n 1 | awk '{print $NF}')"
commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
{
    cat <<EOF
FlashInfer peer for engine/bench/flashinfer_peer.py -- generated by deploy/flashinfer-peer.sh
$(date -u '+%Y-%m-%d %H:%M UTC'), repo commit $commit; do not edit, rebuild:
  deploy/flashinfer-peer.sh OUT_DIR        (in the repo's venv; about 6-11 min on 2 cores)

Versions
  flashinfer-python  $FLASHINFER_VERSION   $fi_wheel
  apache-tvm-ffi     $TVM_FFI_VERSION   $tvm_wheel
  aot/ built for sm_${ARCH/./} with nvcc $nvcc_version; host compiler: $cc_version;
    glibc $glibc_version, Python $build_python. The modules use no Python ABI and not torch's: they
    need libcudart.so.13, libstdc++ and the TVMFFI* symbols of the tvm_ffi loaded beside them.

Sizes (budget 25 MiB for the whole folder)
EOF
    row site/flashinfer
    row site/tvm_ffi
    row cutlass.tar.xz
    for so in "$stage"/aot/*/*.so; do
        case "$so" in
            */batch_decode_*) label="aot decode" ;;
            *_sm90.so) label="aot prefill fa3" ;;
            *) label="aot prefill fa2" ;;
        esac
        printf '  %-16s %10d bytes  %s\n' "$label" "$(size "$so")" "$(mib "$(size "$so")")"
        printf '    %s\n' "$(basename "$so")"
    done
    cat <<'EOF'

What is here
  site/flashinfer  every .py of the wheel; of flashinfer/data only what the three modules need: the
                   csrc templates/sources their generators read and the headers their objects
                   included (from ninja's deps log of the AOT build), cutlass excepted
  site/tvm_ffi     the wheel without 3rdparty/ and src/ (sources)
  aot/<uri>/       prebuilt modules: batch decode (CUDA cores) and batch prefill fa2 / fa3 for bf16,
                   int32 indices, head dim 256, no pos-encoding / sliding window / soft cap
  cutlass.tar.xz   the cutlass/cute headers the fa3 module includes; the bench unpacks it under
                   $FLASHINFER_WORKSPACE_BASE only when it falls back to a JIT build
  `import flashinfer` also needs torch, numpy, jinja2, filelock, requests, tqdm, packaging, einops,
  tabulate, pynvml (nvidia-ml-py) and typing_extensions>=4.13 from the host.

Use (GPU host, repo root; writes only under /tmp)
  FLASHINFER_PEER_PATH=<this folder> python3 -m engine.bench.flashinfer_peer
  The bench loads aot/*.so on an sm_90 GPU, else JIT-builds the modules from site/ (nvcc 13,
  CUDA_HOME); FLASHINFER_PEER_NO_AOT=1 forces the JIT, FLASHINFER_WORKSPACE_BASE sets its cache.
EOF
} >"$stage/README.txt"

echo "== install into $out"
mkdir -p "$out"
rm -rf "$out/site" "$out/aot" "$out/cutlass.tar.xz" "$out/README.txt"
mv "$stage/site" "$stage/aot" "$stage/cutlass.tar.xz" "$stage/README.txt" "$out/"

total="$(size "$out")"
elapsed=$((SECONDS - start))
echo "flashinfer-peer: $out is $total bytes ($(mib "$total")), budget $(mib "$BUDGET"); took $((elapsed / 60))m$((elapsed % 60))s"
if ((total > BUDGET)); then
    die "$out is over the $(mib "$BUDGET") budget"
fi

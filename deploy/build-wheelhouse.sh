#!/usr/bin/env bash
# Build a wheelhouse of deltaserve's runtime dependencies for an offline GPU host:
# CPython 3.12, x86_64 Linux (manylinux). The host is assumed to have torch, numpy, tokenizers,
# safetensors and jinja2 already (the CUDA images we target ship them); the server's web and IPC
# stack is what it lacks, so that is what goes in, plus a wheel of deltaserve itself.
#
# Usage: deploy/build-wheelhouse.sh [OUT_DIR] [--with-deps] [--with-tests]
#   OUT_DIR      where the wheels go (default: .whl in the repo root, which git ignores)
#   --with-deps  let pip resolve dependencies too. The default is --no-deps: every wheel is named
#                below with the exact version the project is tested with, so the set is fixed and
#                holds one version of each package (two versions of one package break the install).
#   --with-tests add the test runner (pytest, pytest-asyncio and theirs) at the versions CI uses, so
#                the whole suite, `pytest -m gpu tests` included, runs on the offline host; without
#                it only the test folders that need no pytest-asyncio run there.
#
# On the offline host:
#   python3 -m pip install --no-index --no-deps --no-compile --target /tmp/site OUT_DIR/*.whl
#   export PYTHONPATH=/tmp/site
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
out="$repo/.whl"
deps_flag="--no-deps"
tests=""
for arg in "$@"; do
    case "$arg" in
        --with-deps) deps_flag="" ;;
        --with-tests) tests=1 ;;
        -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
        -*) echo "unknown option: $arg" >&2; exit 2 ;;
        *) out="$arg" ;;
    esac
done
mkdir -p "$out"
python="${PYTHON:-python3}"

# Pinned to the versions in the development environment (pydantic and pydantic-core must match).
packages=(
    fastapi==0.165.0
    starlette==1.10.0
    uvicorn==0.54.0
    pydantic==2.14.4
    pydantic-core==2.50.5
    annotated-types==0.8.0
    annotated-doc==0.0.7
    typing-inspection==0.4.5
    typing-extensions==4.16.0
    pyzmq==27.3.0
    msgspec==0.22.0
    prometheus-client==0.26.0
    anyio==4.16.0
    sniffio==1.3.1
    h11==0.16.0
    click==8.5.1
    idna==3.20
    httpx==0.28.1
    httpcore==1.0.9
    certifi==2026.10.19.post1
    opentelemetry-api==1.45.2
)
if [ -n "$tests" ]; then
    # the versions the development environment and CI run (pyproject's test extra gives the lower bounds)
    packages+=(pytest==9.2.0 pytest-asyncio==1.5.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0)
fi

# pip matches each manylinux tag exactly, so list the usual ones (binary wheels name one of them).
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
    platforms+=(--platform "$tag")
done

# shellcheck disable=SC2086  # deps_flag is empty or one word on purpose
"$python" -m pip download $deps_flag --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$out" "${packages[@]}"

# deltaserve itself: a pure-Python wheel, built in pip's isolated build environment so that the
# build backend pyproject.toml asks for (setuptools>=77, for the PEP 639 license string) is fetched
# there, whatever setuptools this host has (this script needs the network anyway).
"$python" -m pip wheel --no-deps -w "$out" "$repo"

echo "wheelhouse: $out"
ls -1 "$out"
du -sh "$out"

"""Lay out OUT_DIR/site and OUT_DIR/cutlass.tar.xz from the unpacked wheels, keeping only what is used.

  python prune.py OUT_DIR FLASHINFER_PKG_DIR TVM_FFI_PKG_DIR JIT_DIR

FLASHINFER_PKG_DIR  the flashinfer/ folder of the unpacked flashinfer-python 0.6.0 wheel
TVM_FFI_PKG_DIR     the tvm_ffi/ folder of the unpacked apache-tvm-ffi wheel for the GPU host's Python
JIT_DIR             the cached_ops folder build_aot.py compiled in: ninja's deps log there lists every
                    header each object included (nvcc's own dependency output)

What it writes (replacing what was there):
- OUT_DIR/site/flashinfer: every .py of the package (`import flashinfer` imports most of them), and of
  flashinfer/data (45 MB in the wheel) only build_backend.py, build_utils.py, the csrc templates and
  sources the three module generators read or copy (CSRC below) and the headers under data/ that the
  build included, except cutlass;
- OUT_DIR/cutlass.tar.xz: the included cutlass/cute headers (about 22 MB unpacked, under 1 MB packed);
  only a JIT build of the fa3 module on the GPU host needs them, and the bench unpacks them itself;
- OUT_DIR/site/tvm_ffi: the package without 3rdparty/ and src/ (sources; the dlpack headers there
  are duplicated in include/). lib/libtvm_ffi_testing.so stays: core.so links it.
__pycache__ folders are never copied.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# flashinfer/data/csrc files the decode / fa2 / fa3 generators render (jinja) or copy into the
# generated sources; the compiled objects then include the copies, so ninja's deps log does not name them
CSRC = (
    "batch_decode_customize_config.jinja",
    "batch_decode_kernel_inst.jinja",
    "batch_decode.cu",
    "batch_decode_jit_binding.cu",
    "batch_prefill_customize_config.jinja",
    "batch_prefill_paged_kernel_inst.jinja",
    "batch_prefill_ragged_kernel_inst.jinja",
    "batch_prefill.cu",
    "batch_prefill_jit_binding.cu",
    "batch_prefill_sm90_customize_config.jinja",
    "batch_prefill_paged_sm90_kernel_inst.jinja",
    "batch_prefill_ragged_sm90_kernel_inst.jinja",
    "batch_prefill_sm90.cu",
    "batch_prefill_sm90_jit_binding.cu",
)
TVM_FFI_DROP = ("3rdparty", "src")


def included_headers(jit_dir: Path) -> set[Path]:
    """Every file ninja recorded as a dependency of an object built in jit_dir (resolved paths)."""
    manifests = sorted(jit_dir.glob("*/build.ninja")) + sorted(jit_dir.glob("tmp/*.ninja"))
    if not manifests:
        raise SystemExit(f"no ninja build files under {jit_dir}: run build_aot.py first")
    found: set[Path] = set()
    for manifest in manifests:
        cmd = ["ninja", "-C", str(jit_dir), "-f", str(manifest), "-t", "deps"]
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        # `ninja -t deps` prints "<object>: #deps N, ..." then one indented line per dependency
        found.update(Path(line.strip()).resolve() for line in text.splitlines() if line.startswith("    "))
    return found


def layout_flashinfer(fi: Path, jit_dir: Path, site: Path, tarball: Path) -> int:
    """Copy flashinfer's Python side and the used part of data/ to site, cutlass to tarball."""
    data = fi / "data"
    keep = {data / "build_backend.py", data / "build_utils.py"} | {data / "csrc" / n for n in CSRC}
    missing = sorted(str(p) for p in keep if not p.is_file())
    if missing:
        raise SystemExit(f"not in the flashinfer package (wrong version?): {missing}")
    keep |= {p for p in included_headers(jit_dir) if p.is_relative_to(data)}

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or (Path(folder) == fi and n == "data")]

    shutil.copytree(fi, site / "flashinfer", ignore=ignore)
    with tempfile.TemporaryDirectory() as stage:
        for src in sorted(keep):
            rel = src.relative_to(data)
            root = Path(stage) if rel.parts[0] == "cutlass" else site / "flashinfer" / "data"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
        if not (Path(stage) / "cutlass").is_dir():
            raise SystemExit(f"no cutlass header in the deps log of {jit_dir}: was the fa3 module built?")
        with tarfile.open(tarball, "w:xz") as tar:
            tar.add(Path(stage) / "cutlass", arcname="cutlass")
    return len(keep)


def layout_tvm_ffi(tvm: Path, site: Path) -> None:
    def ignore(folder: str, names: list[str]) -> list[str]:
        top = Path(folder) == tvm
        return [n for n in names if n == "__pycache__" or (top and n in TVM_FFI_DROP)]

    shutil.copytree(tvm, site / "tvm_ffi", ignore=ignore)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__)
        return 2
    out, fi, tvm, jit_dir = (Path(a).resolve() for a in argv)
    for pkg, marker in ((fi, "jit"), (tvm, "lib")):
        if not (pkg / "__init__.py").is_file() or not (pkg / marker).is_dir():
            raise SystemExit(f"{pkg} does not look like an unpacked package folder")
    site, tarball = out / "site", out / "cutlass.tar.xz"
    shutil.rmtree(site, ignore_errors=True)
    tarball.unlink(missing_ok=True)
    kept = layout_flashinfer(fi, jit_dir, site, tarball)
    layout_tvm_ffi(tvm, site)
    print(f"prune: kept {kept} of flashinfer's data files; wrote {site} and {tarball}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Build ahead of time the FlashInfer JIT modules that engine.bench.flashinfer_peer loads (no GPU needed).

The bench compares against FlashInfer's paged attention for one configuration only: bf16 query, KV
cache and output, int32 indices, head dim 256 (qk and vo), no positional encoding, no sliding window,
no logits soft cap. That takes three modules: the CUDA-core batch decode, and the batch prefill with
the fa2 and the fa3 (sm90) backend. This script asks FlashInfer's own generators for those three
JitSpecs, has FlashInfer compile them with nvcc/ninja, and copies each resulting library to
OUT_DIR/aot/<uri>/<uri>.so, the layout FlashInfer expects under FLASHINFER_AOT_DIR.

  python build_aot.py OUT_DIR [decode] [fa2] [fa3]        (default: all three)

Run it with flashinfer-python 0.6.0 and an apache-tvm-ffi built for this Python importable (through
PYTHONPATH), torch importable (the CPU build is enough: only its dtypes are used), and the usual
FlashInfer build env: FLASHINFER_WORKSPACE_BASE (where the sources are generated and compiled; its
cached_ops folder is what prune.py reads afterwards), FLASHINFER_CUDA_ARCH_LIST (default 9.0a here),
CUDA_HOME, MAX_JOBS, FLASHINFER_EXTRA_LDFLAGS / FLASHINFER_EXTRA_CUDAFLAGS. deploy/flashinfer-peer.sh
sets all of that up.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

MODULES = ("decode", "fa2", "fa3")


def jit_specs(which: list[str]) -> list:
    """The JitSpecs of the requested modules, in the order given."""
    import torch
    from flashinfer.jit.attention.modules import gen_batch_decode_module, gen_batch_prefill_module

    bf16 = torch.bfloat16
    # dtype q / kv / o, index dtype, head dim qk / vo, pos_encoding_mode (0: NONE), use_swa, use_logits_cap
    common = (bf16, bf16, bf16, torch.int32, 256, 256, 0, False, False)
    specs = []
    for name in which:
        if name == "decode":
            specs.append(gen_batch_decode_module(*common))
        else:  # the trailing False: use_fp16_qk_reduction
            specs.append(gen_batch_prefill_module(name, *common, False))
    return specs


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out, which = Path(argv[0]).resolve(), argv[1:] or list(MODULES)
    unknown = sorted(set(which) - set(MODULES))
    if unknown:
        print(f"unknown module(s) {unknown}; choose from {list(MODULES)}", file=sys.stderr)
        return 2
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")  # read when flashinfer.jit is imported
    from flashinfer.jit.core import build_jit_specs

    specs = jit_specs(which)
    build_jit_specs(specs, verbose=True, skip_prebuilt=False)
    for spec in specs:
        dest = out / "aot" / spec.name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, dest / f"{spec.name}.so")
        print(f"{spec.name}.so: {spec.jit_library_path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

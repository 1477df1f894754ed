"""``python -m engine.bench.flashinfer_peer``: FlashInfer's paged attention (flashinfer-python 0.6.0,
vendored pruned in .fi/) on the batches of engine.bench.attention, beside our kernel without gate.

Qwen3.5-4B shapes: H 16, Hkv 4, D 256, KV page 32, bf16, sm_scale 1/16. FlashInfer reads OUR caches
in place (NHD tuple (k_cache, v_cache) [pages, 32, 4, 256]; indptr / indices / last_page_len from
our block tables). Correctness first (rel against reference_fp32 without gate; over 2e-2: not
timed), then CUDA-graph replay (kernels.replay_us over attention.sets' rotated inputs, median of 20;
"eager" in the row: capture failed, CUDA events over 20 eager passes). Rows as attention.row():
- decode b1 / 8 / 32 / 64 x 1,101, BatchDecodeWithPagedKVCacheWrapper: CUDA-core kernel and
  use_tensor_cores (fa2, fa3): us, TB/s on the KV bytes as a fraction of the measured copy;
- prefill 32 x 1,024 and mixed 2 x 1,024 + 32 decodes, causal, BatchPrefillWithPagedKVCacheWrapper
  fa2 and fa3: us, causal TFLOP/s as a fraction of the measured bf16 matmul.
Env (optional): FLASHINFER_PEER_PATH (default <repo>/.fi: site/ goes on sys.path, aot/ has prebuilt
sm_90a modules), FLASHINFER_WORKSPACE_BASE (JIT cache, default /tmp/fi_peer), CUDA_HOME (JIT when
the prebuilt do not load), FLASHINFER_PEER_NO_AOT=1 (always JIT). No FlashInfer: one line, exit 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tarfile
from pathlib import Path

import torch

from engine.bench import attention as A
from engine.bench import kernels as B
from engine.ops.attention.batches import Batch, make_batch, reference_fp32, rel

H, HKV, D, BS, CTX = A.H, A.HKV, A.D, A.BS, A.CTX
FI = Path(os.environ.get("FLASHINFER_PEER_PATH") or Path(__file__).resolve().parents[2] / ".fi")
MAX_ERR = 2e-2
WS: dict[str, torch.Tensor] = {}
FAILED: dict[tuple[str, str], str] = {}  # (kind, backend) -> why it failed (a JIT build, say)
KEEP: list = []  # the probed prebuilt libraries, kept loaded


def add_flag(var: str, flag: str) -> None:
    os.environ[var] = f"{os.environ.get(var, '')} {flag}".strip()


def setup_env() -> None:
    """Env flashinfer reads at import; for a JIT build: libcuda.so to link, curand headers (fa3)."""
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/fi_peer")
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")  # else it JIT-builds a torch addon
    if "CUDA_HOME" not in os.environ:  # flashinfer's own guess, dirname(dirname(which nvcc)), misses wrappers
        nvcc = Path(os.path.realpath(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"))
        ok = (nvcc.parents[1] / "include" / "cuda_runtime.h").exists()
        os.environ["CUDA_HOME"] = str(nvcc.parents[1] if ok else "/usr/local/cuda")
    home = Path(os.environ["CUDA_HOME"])
    if not any((home / d / "libcuda.so").exists() for d in ("lib64", "lib64/stubs", "lib")):
        lib = next((p for p in Path("/proc/self/maps").read_text().split() if "/libcuda.so" in p), None)
        stub = Path(os.environ["FLASHINFER_WORKSPACE_BASE"]) / "stubs"
        if lib and not (stub / "libcuda.so").exists():
            stub.mkdir(parents=True, exist_ok=True)
            (stub / "libcuda.so").symlink_to(lib)
        add_flag("FLASHINFER_EXTRA_LDFLAGS", f"-L{stub}")
    nv = importlib.util.find_spec("nvidia")
    if not (home / "include" / "curand_kernel.h").exists() and nv and nv.submodule_search_locations:
        hits = [h for r in nv.submodule_search_locations for h in Path(r).glob("*/include/curand_kernel.h")]
        if hits:
            add_flag("FLASHINFER_EXTRA_CUDAFLAGS", f"-isystem {hits[0].parent}")


def load_flashinfer():
    """flashinfer with prebuilt modules when they load here, else JIT; None with a printed reason."""
    setup_env()
    sys.path.insert(0, str(FI / "site"))
    try:
        import flashinfer
        import tvm_ffi
        from flashinfer.jit import env as jit_env
    except Exception as e:  # noqa: BLE001 - any failure means no peer to compare
        print(f"flashinfer peer skipped: import failed ({type(e).__name__}: {e}) from {FI / 'site'}")
        return None
    aot, mods = FI / "aot", []
    try:
        if os.environ.get("FLASHINFER_PEER_NO_AOT") == "1" or torch.cuda.get_device_capability() != (9, 0):
            raise RuntimeError("not used (FLASHINFER_PEER_NO_AOT=1 or not an sm_90 device)")
        mods = [tvm_ffi.load_module(str(p)) for p in sorted(aot.glob("*/*.so"))]
        if not mods:
            raise RuntimeError(f"none in {aot}")
        jit_env.FLASHINFER_AOT_DIR = aot
        how = f"{len(mods)} prebuilt sm_90a modules from {aot}"
    except Exception as e:  # noqa: BLE001 - fall back to flashinfer's JIT (minutes per module)
        how = f"JIT into {jit_env.FLASHINFER_JIT_DIR} (prebuilt: {type(e).__name__}: {e})"
        cut = Path(os.environ["FLASHINFER_WORKSPACE_BASE"]) / "cutlass"  # the fa3 build's headers
        if not (cut / "include").exists() and (FI / "cutlass.tar.xz").exists():
            with tarfile.open(FI / "cutlass.tar.xz") as tar:
                tar.extractall(cut.parent, filter="data")
        jit_env.CUTLASS_INCLUDE_DIRS = [cut / "include", cut / "tools" / "util" / "include"]
    print(f"flashinfer {flashinfer.__version__} from {Path(flashinfer.__file__).parent}; {how}", flush=True)
    KEEP.extend(mods)
    return flashinfer


def workspace() -> torch.Tensor:
    """One float workspace for every wrapper: calls run one after another on one stream."""
    if "f" not in WS:
        WS["f"] = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    return WS["f"]


def page_table(b: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len) of our block table."""
    lens = b.seq_lens.long()
    pages = (lens + BS - 1) // BS
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = torch.cumsum(pages, 0)
    cols = torch.arange(b.block_table.shape[1], device=lens.device)
    indices = b.block_table[cols[None, :] < pages[:, None]].to(torch.int32)  # row-major: per sequence
    return indptr, indices, ((lens - 1) % BS + 1).to(torch.int32)


def fi_call(fi, b: Batch, kind: str, backend: str):
    """A planned zero-arg call: kind decode (CUDA cores), tc (decode on prefill kernels), prefill."""
    indptr, indices, last = page_table(b)
    common = dict(pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    if kind == "prefill":
        w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", backend=backend)
        w.plan(
            b.query_start_loc, indptr, indices, last, H, HKV, D, BS, causal=True, sm_scale=D**-0.5, **common
        )
    else:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace(), "NHD", use_tensor_cores=kind == "tc", backend=backend if kind == "tc" else "auto"
        )
        w.plan(indptr, indices, last, H, HKV, D, BS, sm_scale=D**-0.5, **common)
    out = torch.empty_like(b.q)
    kv = (b.k_cache, b.v_cache)
    return lambda: w.run(b.q, kv, out=out)


def timed(calls) -> tuple[float, str]:
    try:
        return B.replay_us(calls), ""
    except Exception as e:  # noqa: BLE001 - capture failed: time eager passes instead
        torch.cuda.synchronize()
        print(f"    graph capture failed ({type(e).__name__}: {e}); timing eager", flush=True)
        return B.time_eager(lambda: [c() for c in calls], reps=20) / len(calls), ", eager"


def peer(fi, label: str, batches: list[Batch], kind: str, backend: str, note, op: str) -> None:
    """Check the first batch against the fp32 reference, then time all of them; failures print."""
    name = {"decode": "decode", "tc": "decode tensor-core", "prefill": "prefill"}[kind]
    impl = f"flashinfer {backend if kind != 'decode' else 'cuda-core'} {name}"
    module = (kind, backend)
    if module in FAILED:
        print(f"  {impl} on {label}: skipped ({FAILED[module]})", flush=True)
        return
    try:
        calls = [fi_call(fi, b, kind, backend) for b in batches]
        err = rel(calls[0](), reference_fp32(batches[0], False))
    except Exception as e:  # noqa: BLE001 - a missing module / failed JIT build: report, go on
        FAILED[module] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        print(f"  {impl} on {label}: failed ({FAILED[module]})", flush=True)
        return
    print(f"  check {impl:<40} {label:<24} rel {err:.2e}", flush=True)
    if not err < MAX_ERR:
        print(f"  {impl} on {label}: rel {err:.2e} > {MAX_ERR:g}, not timed", flush=True)
        return
    us, how = timed(calls)
    A.row(op, label, impl + how, us, note(us))


def ours(label: str, batches: list[Batch], note, op: str) -> None:
    """Our tensor-core kernel on the same inputs, no output gate (FlashInfer applies none)."""
    us = B.replay_us([A.call(b, gate=False) for b in batches])
    A.row(op, label, f"ours {A.short(A.plan_of(batches[0]))}, no gate", us, note(us))


def bench_decode(fi, copy_bw: float, backends: list[str], with_ours: bool) -> None:
    for batch_size in (1, 8, 32, 64):
        specs = [(CTX, 1)] * batch_size
        nbytes = A.kv_bytes(make_batch(specs, BS, HKV, H // HKV, D, seed=1))
        batches = A.sets(specs, nbytes, seed=100)
        floor = nbytes / copy_bw * 1e6

        def note(us: float, nbytes: int = nbytes, floor: float = floor) -> str:
            bw = nbytes / (us * 1e-6)
            return f"{bw / 1e12:.2f} TB/s = {bw / copy_bw:.0%} copy; floor {floor:.1f} us"

        label = f"b{batch_size} x {CTX + 1}"
        if with_ours:
            ours(label, batches, note, "decode")
        peer(fi, label, batches, "decode", "fa2", note, "decode")
        for backend in backends:
            peer(fi, label, batches, "tc", backend, note, "decode")
        torch.cuda.empty_cache()


def bench_prefill(fi, mm_rate: float, backends: list[str], with_ours: bool) -> None:
    shapes = {
        "prefill 32 x 1024": [(0, 1024)] * 32,
        "mixed 2x1024 + 32 dec": [(CTX, 1)] * 32 + [(0, 1024)] * 2,
    }
    for label, specs in shapes.items():
        batch = make_batch(specs, BS, HKV, H // HKV, D, seed=7)
        fl = A.causal_flops(batch)

        def note(us: float, fl: float = fl) -> str:
            return f"{fl / us / 1e6:.1f} TFLOP/s = {fl / (us * 1e-6) / mm_rate:.1%} bf16 mm"

        if with_ours:
            ours(label, [batch] * 4, note, "prefill")
        for backend in backends:
            peer(fi, label, [batch] * 4, "prefill", backend, note, "prefill")
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", choices=("decode", "prefill"), action="append", default=[])
    p.add_argument("--backends", default="fa2,fa3", help="tensor-core backends (decode tc, prefill)")
    p.add_argument("--no-ours", action="store_true", help="only FlashInfer rows")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("flashinfer peer skipped: needs a CUDA GPU")
        return 0
    torch.cuda.init()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    fi = load_flashinfer()
    if fi is None:
        return 0
    backends = [b for b in args.backends.split(",") if b]
    mm_rate = A.matmul_rate()  # first: it also brings the clocks up
    copy_bw = max(A.copy_bandwidth())
    rates = f"copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul 8192^3 {mm_rate / 1e12:.0f} TFLOP/s"
    print(f"  measured {rates}", flush=True)
    if "decode" not in args.skip:
        bench_decode(fi, copy_bw, backends, not args.no_ours)
    if "prefill" not in args.skip:
        bench_prefill(fi, mm_rate, backends, not args.no_ours)
    print(f"\nmeasured {rates}")
    print("| op | shape | impl | us | note |\n|---|---|---|---|---|")
    for op, shape, impl, us, note in A.ROWS:
        print(f"| {op} | {shape} | {impl} | {us:.1f} | {note} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - a peer comparison: never fail the device script
        print(f"flashinfer peer stopped: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")

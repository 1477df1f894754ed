"""Compile the hand-written kernels in the repo's ``cuda/`` folder with NVRTC through CuPy.

One :class:`cupy.RawModule` per (source file, template instantiation set, architecture), cached with
``functools.cache`` for the process and by CuPy on disk. ``#include "x.cuh"`` lines are inlined here
so CuPy's cache key (which hashes the source text, not included files) changes with the headers.
CuPy itself adds ``-arch=sm_<cc>`` for the current device (a cubin when NVRTC knows the arch, 12.8+
for sm_120), so only ``-std=c++17`` and the ``DS_SM`` define are passed.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy

from engine.ops import launch_ex

# Sources sit in one folder per op (gdn/, conv/, norm/, attention/, gemm/); shared headers in common/.
ARCH_HEADER = "common/arch_params.cuh"


def _find_cuda_dir() -> Path:
    """Kernel sources: $DELTASERVE_CUDA_DIR, else the checkout's cuda/ (engine/ops/compile.py ->
    repo root), else <prefix>/share/deltaserve/cuda where a non-editable install puts them."""
    env = os.environ.get("DELTASERVE_CUDA_DIR")
    candidates = [Path(env)] if env else []
    candidates += [
        Path(__file__).resolve().parents[2] / "cuda",
        Path(sys.prefix) / "share" / "deltaserve" / "cuda",
    ]
    for c in candidates:
        if (c / ARCH_HEADER).is_file():
            return c
    return candidates[0]


CUDA_DIR = _find_cuda_dir()

log = logging.getLogger(__name__)
# A module load from CuPy's disk cache takes milliseconds; an NVRTC compile takes about a second.
SLOW_COMPILE_S = 0.2


@dataclass
class CompileStats:
    """This process's RawModule builds: every one by name, their total time, and those slow enough to
    have been real NVRTC compiles rather than loads from CuPy's disk cache."""

    seconds: float = 0.0
    names: list[str] = field(default_factory=list)  # every build, "file:instantiation", in order
    slow: list[str] = field(default_factory=list)


STATS = CompileStats()

_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.MULTILINE)
_ROW = re.compile(r"X\((\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\)")


@dataclass(frozen=True)
class ArchParams:
    """One row of ``cuda/common/arch_params.cuh`` (see the header for what each number means)."""

    sm: int
    conv_threads: int
    delta_rg: int
    delta_warps: int
    norm_warps: int


def arch_table() -> dict[int, ArchParams]:
    text = (CUDA_DIR / ARCH_HEADER).read_text()
    rows = [ArchParams(*map(int, m.groups())) for m in _ROW.finditer(text)]
    if not rows:
        raise RuntimeError(f"no DS_ARCH_TABLE rows parsed from {CUDA_DIR / ARCH_HEADER}")
    return {r.sm: r for r in rows}


_TRIPLE = re.compile(r"X\((\d+),\s*(\d+),\s*(\d+)\)")


@functools.cache
def tuning_table(filename: str, macro: str) -> dict[int, tuple[int, int]]:
    """A kernel family's ``#define MACRO(X) X(sm, a, b) ...`` rows (up to the next ``template <int SM>``):
    sm -> (a, b). The .cu file is the single source; its kernels read the same rows."""
    text = (CUDA_DIR / filename).read_text()
    start = text.find(f"#define {macro}")
    end = text.find("template <int SM>", start)
    block = text[start:end] if start >= 0 and end > start else ""
    rows = {int(m[1]): (int(m[2]), int(m[3])) for m in _TRIPLE.finditer(block)}
    if not rows:
        raise RuntimeError(f"no {macro} rows parsed from {CUDA_DIR / filename}")
    return rows


def tuning_row(filename: str, macro: str, cc: int | None = None) -> tuple[int, int]:
    """The row for sm_``cc`` (default: the current device): the newest row not newer than it."""
    cc = device_cc() if cc is None else cc
    table = tuning_table(filename, macro)
    fits = [sm for sm in table if sm <= cc]
    if not fits:
        raise RuntimeError(f"sm_{cc} is older than every {macro} row ({sorted(table)})")
    return table[max(fits)]


@functools.cache
def device_cc() -> int:
    """Compute capability of torch's current device as an int (90 for sm_90, 120 for sm_120)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


@functools.cache
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (what the launch plans size their grids by)."""
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def arch_params(cc: int | None = None) -> ArchParams:
    """The table row for ``cc``: the newest row not newer than the device (sm_89 uses sm_80's)."""
    cc = device_cc() if cc is None else cc
    table = arch_table()
    fits = [sm for sm in table if sm <= cc]
    if not fits:
        raise RuntimeError(f"sm_{cc} is older than every row of {ARCH_HEADER} ({sorted(table)})")
    return table[max(fits)]


def _resolve_include(name: str, including: Path) -> Path:
    """``#include "x.cuh"``: beside the including file first, then from the cuda/ root (as ``-I cuda``)."""
    for base in (including.parent, CUDA_DIR):
        if (base / name).is_file():
            return (base / name).resolve()
    raise FileNotFoundError(f'{including}: #include "{name}" found neither beside it nor under {CUDA_DIR}')


def read_source(filename: str) -> str:
    """The .cu text (``filename`` relative to the cuda/ dir, e.g. "gdn/chunk.cu") with local includes
    inlined, each header once."""
    seen: set[Path] = set()

    def expand(path: Path) -> str:
        def sub(m: re.Match[str]) -> str:
            header = _resolve_include(m.group(1), path)
            if header in seen:
                return ""
            seen.add(header)
            return expand(header)

        return _INCLUDE.sub(sub, path.read_text())

    return expand(CUDA_DIR / filename)


@functools.cache
def module(filename: str, names: tuple[str, ...]):
    """Compiled RawModule holding the template instantiations ``names`` (call before graph capture)."""
    import cupy

    cc = device_cc()
    t0 = time.perf_counter()
    mod = cupy.RawModule(
        code=read_source(filename),
        options=("-std=c++17", f"-DDS_SM={cc}"),
        name_expressions=list(names),
    )
    mod.compile()
    dt = time.perf_counter() - t0
    STATS.seconds += dt
    STATS.names.append(f"{filename}:{','.join(names)}")
    if dt >= SLOW_COMPILE_S:
        STATS.slow.append(STATS.names[-1])
        # after start-up this is a step stalled by a compile: the warm-up missed a launch shape
        log.info("compiled %s %s for sm_%d in %.2f s", filename, ",".join(names), cc, dt)
    return mod


@functools.cache
def kernel(filename: str, name: str):
    """One kernel function; every instantiation is compiled in its own small module so adding an
    arm never recompiles the others."""
    fn = module(filename, (name,)).get_function(name)
    if fn.local_size_bytes != 0:
        # CI (tests/test_cuda_compile.py) fails hot kernels that spill; here only say so
        warnings.warn(f"{name}: {fn.local_size_bytes} bytes of local memory per thread", stacklevel=2)
    return fn


class _Stream:
    """What CuPy's ``Function.__call__`` reads from its ``stream`` argument: the raw handle."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


_STREAMS: dict[int, _Stream] = {}
# id(RawKernel) -> (the RawKernel, kept so its id stays its own; its cupy.cuda.function.Function)
_FUNCTIONS: dict[int, tuple[object, object]] = {}


@functools.cache
def _stream_getter():
    """A callable giving torch's current stream on the current device as the driver handle.
    ``torch.cuda.current_stream()`` builds a Python stream object and resolves the device on every
    call (~10 us, once per launch); the private accessor returns the handle itself."""
    import torch

    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is None:  # a torch without it: the public, slower path
        return lambda: int(torch.cuda.current_stream().cuda_stream)
    device = torch._C._cuda_getDevice
    return lambda: int(get(device()))


def _function(fn):
    """The launchable Function inside a CuPy RawKernel (cached: ``RawKernel.kernel`` looks up the
    device each time); a Function is returned as is."""
    hit = _FUNCTIONS.get(id(fn))
    if hit is None:
        hit = _FUNCTIONS[id(fn)] = (fn, getattr(fn, "kernel", fn))
    return hit[1]


def launch(
    fn, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0, pdl: bool = False
) -> None:
    """Launch on torch's current stream; never synchronises, never allocates through CuPy.

    ``pdl``: the kernel waits (``cuda/common/pdl.cuh``) before it reads what earlier kernels wrote, so
    inside :func:`engine.ops.launch_ex.programmatic_launches` on sm_90+ it is launched with
    programmatic stream serialization (it may start while the kernel before it finishes)."""
    stream = _stream_getter()()
    if pdl and launch_ex.active() and device_cc() >= 90:
        launch_ex.launch_pdl(fn, grid, block, args, shared_mem, stream)
        return
    s = _STREAMS.get(stream)
    if s is None:
        s = _STREAMS[stream] = _Stream(stream)
    _function(fn)(grid, block, args, shared_mem, s)


def ptr(t) -> object:
    """A tensor's device address as the 8-byte integer a kernel pointer parameter expects."""
    return numpy.uint64(t.data_ptr())


def i32(x: int) -> object:
    return numpy.int32(x)


def i64(x: int) -> object:
    return numpy.int64(x)


def f32(x: float) -> object:
    return numpy.float32(x)


def require(cond: bool, msg: str) -> None:
    """For checks off the per-launch path: ``msg`` is built before the call, so on a path that runs
    for every launch an f-string with shapes or devices costs its formatting even when the check
    passes; write ``if not cond: raise ValueError(f"...")`` there."""
    if not cond:
        raise ValueError(msg)


def check_cuda(name: str, t, dtype=None, dim: int | None = None) -> None:
    """Device, dtype and rank checks with the op/tensor named in the error. Called for every tensor
    of every launch, so the messages are formatted only when a check fails."""
    if not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dims, got shape {tuple(t.shape)}")


def output(op: str, out, shape: tuple[int, ...], dtype, device):
    """A kernel's output: a new contiguous ``shape`` tensor, or the caller's ``out`` (a static buffer)
    checked to be ``dtype``, contiguous and of as many values, then viewed as ``shape``."""
    import torch

    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_cuda(f"{op} out", out, dtype)
    n = 1
    for s in shape:
        n *= s
    if out.numel() != n or not out.is_contiguous():
        raise ValueError(f"{op}: out must be contiguous with {n} values, got {tuple(out.shape)}")
    return out.view(shape)


def as_i32(t):
    """int32 view of an index tensor (converted by torch if it is int64)."""
    import torch

    return t if t.dtype == torch.int32 else t.to(torch.int32)


def as_u8(t):
    """uint8 view of a bool/uint8 flag tensor, without a copy when possible."""
    import torch

    if t.dtype in (torch.bool, torch.uint8):
        return t.contiguous().view(torch.uint8)
    return (t != 0).view(torch.uint8)


def aligned16(t) -> bool:
    return t.data_ptr() % 16 == 0

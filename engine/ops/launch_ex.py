"""Programmatic dependent launch (PDL) through the driver's ``cuLaunchKernelEx``.

CuPy launches with ``cuLaunchKernel``, which takes no launch attributes. A kernel launched here with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` may start while the kernel before it in the
stream still runs; it must execute ``griddepcontrol.wait`` before touching what that kernel writes
(``cuda/common/pdl.cuh`` says which kernels do and where). Captured into a CUDA graph, the launch
becomes a programmatic edge, so a replay overlaps each kernel's launch and prologue with the tail of
the one before it: at batch 1 a decode step is ~290 short kernels, and their boundaries cost as much
as the tails of the skinny GEMMs.

Only :func:`engine.ops.compile.launch` calls this, and only inside :func:`programmatic_launches`
(the decode-graph capture) for kernels that declare ``pdl=True``; everything else keeps CuPy's launch.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager

import numpy

# cuda.h: CUlaunchAttributeID
_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _AttrValue(ctypes.Union):
    # CUlaunchAttributeValue: a 64-byte union, 8-byte aligned
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_void_p), ("i", ctypes.c_int)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("grid_x", ctypes.c_uint),
        ("grid_y", ctypes.c_uint),
        ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint),
        ("block_y", ctypes.c_uint),
        ("block_z", ctypes.c_uint),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)),
        ("num_attrs", ctypes.c_uint),
    ]


assert ctypes.sizeof(_Attr) == 72 and ctypes.sizeof(_Config) == 56


@functools.cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [
        ctypes.POINTER(_Config),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


@functools.cache
def _attr() -> _Attr:
    a = _Attr()
    a.id = _PROGRAMMATIC_STREAM_SERIALIZATION
    a.value.i = 1
    return a


_active = 0
launches = 0  # programmatic launches issued by this process (tests check that a capture used them)


@contextmanager
def programmatic_launches() -> Iterator[None]:
    """Within this block, launches that declare ``pdl=True`` carry the PDL attribute (sm_90+)."""
    global _active
    _active += 1
    try:
        yield
    finally:
        _active -= 1


def active() -> bool:
    return _active > 0


def _pack(args: tuple) -> tuple[numpy.ndarray, ctypes.Array]:
    """Each argument in its own 8-byte cell (kernel parameters are at most 8 bytes here), and the
    array of cell addresses ``cuLaunchKernelEx`` reads them through."""
    cells = numpy.zeros(len(args), dtype=numpy.uint64)
    raw = cells.view(numpy.uint8).reshape(len(args), 8)
    for i, a in enumerate(args):
        if not isinstance(a, numpy.generic) or a.nbytes > 8:
            raise TypeError(
                f"PDL launch: argument {i} is {type(a).__name__}; pass numpy scalars (ptr, i32, f32)"
            )
        raw[i, : a.nbytes] = numpy.frombuffer(a.tobytes(), dtype=numpy.uint8)
    base = cells.ctypes.data
    params = (ctypes.c_void_p * len(args))(*[base + 8 * i for i in range(len(args))])
    return cells, params


def launch_pdl(
    fn, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int, stream: int
) -> None:
    """``fn`` (a CuPy RawKernel or Function) on ``stream`` with programmatic stream serialization allowed."""
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    global launches
    cfg = _Config(*g, *b, shared_mem, stream, ctypes.pointer(_attr()), 1)
    cells, params = _pack(args)
    lib = _driver()
    func = getattr(fn, "kernel", fn)  # a RawKernel holds its cupy.cuda.function.Function
    rc = lib.cuLaunchKernelEx(ctypes.byref(cfg), func.ptr, params, None)
    del cells  # the driver copied the parameters at launch
    launches += 1
    if rc != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"cuLaunchKernelEx failed ({rc}): {(msg.value or b'').decode()}")

"""Device regions whose address range is reserved once and whose memory is mapped as it is needed.

The GDN recurrent-state pool is one slot row per running request and layer: 64 fp32 slots of the 4B
are 3.1 GiB, which a server running 32 requests never touches half of. :class:`GrowingRegions`
reserves the whole pool's virtual address range at start-up (so every tensor view, kernel argument
and captured CUDA graph keeps one fixed address) and maps physical memory behind a prefix of rows in
every region when a row is first handed out (CUDA's virtual memory management: ``cuMemAddressReserve``
once, then ``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess`` per region and growth; the driver API
through ctypes, since CuPy does not wrap it). Memory is mapped in the allocation granularity (2 MiB
on the H200), which is one fp32 state row of the 4B.

Rows below ``first_row`` hold nothing: the GDN kernels never read or write a slot <= 0. The granules
wholly below it (slot 0 of the 4B's fp32 state) are one physical page mapped into every region, so
each region's base address is mapped (torch asks the driver which device a pointer is on) and slot 0
costs one granule for all layers, as the shared padding row of the plain pools does.

Memory is never unmapped while the regions live (the pool keeps its high-water mark); closing the
regions (or dropping the last tensor view) synchronises the device and returns everything.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

import torch

log = logging.getLogger(__name__)

# cuda.h enum values (CUDA 11.2+, unchanged through 13)
_ALLOCATION_TYPE_PINNED = 0x1
_LOCATION_TYPE_DEVICE = 0x1
_ACCESS_READWRITE = 0x3
_GRANULARITY_MINIMUM = 0x0
_ERROR_OUT_OF_MEMORY = 2


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class DriverError(RuntimeError):
    def __init__(self, call: str, code: int, message: str) -> None:
        super().__init__(f"{call} failed: CUDA driver error {code} ({message})")
        self.code = code


_lib: Any = None
_lib_lock = threading.Lock()


_u64, _size, _ptr = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
_SIGNATURES: dict[str, list[Any]] = {
    "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    "cuMemGetAllocationGranularity": [ctypes.POINTER(_size), ctypes.POINTER(_Prop), ctypes.c_int],
    "cuMemAddressReserve": [ctypes.POINTER(_u64), _size, _size, _u64, _u64],
    "cuMemAddressFree": [_u64, _size],
    "cuMemCreate": [ctypes.POINTER(_u64), _size, ctypes.POINTER(_Prop), _u64],
    "cuMemRelease": [_u64],
    "cuMemMap": [_u64, _size, _size, _u64, _u64],
    "cuMemUnmap": [_u64, _size],
    "cuMemSetAccess": [_u64, _size, ctypes.POINTER(_AccessDesc), _size],
    "cuCtxGetCurrent": [ctypes.POINTER(_ptr)],
    "cuCtxSetCurrent": [_ptr],
    "cuCtxSynchronize": [],
    "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_ptr), ctypes.c_int],
}
"""The driver entry points used, with their C argument types (cuda.h; none has a _v2 alias)."""


def _driver() -> Any:
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            for name, args in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, ctypes.c_int
            _lib = lib
        return _lib


def _check(call: str, code: int) -> None:
    if code:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(code, ctypes.byref(text))
        raise DriverError(call, code, (text.value or b"unknown").decode())


def chunk_span(first_row: int, rows: int, row_bytes: int, granularity: int) -> tuple[int, int]:
    """Granules ``[lo, hi)`` of one region that back rows ``[first_row, rows)``; ``(lo, lo)`` when that
    row range is empty."""
    lo = first_row * row_bytes // granularity
    if rows <= first_row:
        return lo, lo
    return lo, -(-rows * row_bytes // granularity)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class _CudaArray:
    """A raw device range as ``__cuda_array_interface__``, so torch wraps it without copying; torch keeps
    a reference to the object, which holds the regions alive as long as any view exists."""

    def __init__(self, owner: GrowingRegions, ptr: int, nbytes: int) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


class GrowingRegions:
    """``count`` regions of ``rows`` rows of ``row_bytes`` each, in one reserved address range; rows
    ``[first_row, mapped_rows)`` are backed by device memory in every region (module docstring), the
    first of them from the start."""

    def __init__(
        self, device: torch.device, count: int, rows: int, row_bytes: int, first_row: int = 1
    ) -> None:
        if count < 1 or rows < 1 or row_bytes < 1 or not 0 <= first_row < rows:
            raise ValueError(f"bad regions: {count} x {rows} rows of {row_bytes} bytes from row {first_row}")
        torch.cuda.init()
        self.device_index = device.index if device.index is not None else torch.cuda.current_device()
        self.count, self.rows, self.row_bytes, self.first_row = count, rows, row_bytes, first_row
        self._lock = threading.Lock()
        self._mapped: list[tuple[int, int]] = []  # (address, bytes) of every mapping made
        self._physical = 0  # device bytes behind them
        self._base = 0
        self.mapped_rows = first_row
        lib = _driver()
        self._current()
        self._prop = _Prop()
        self._prop.type = _ALLOCATION_TYPE_PINNED
        self._prop.location = _Location(_LOCATION_TYPE_DEVICE, self.device_index)
        gran = ctypes.c_size_t()
        _check(
            "cuMemGetAllocationGranularity",
            lib.cuMemGetAllocationGranularity(
                ctypes.byref(gran), ctypes.byref(self._prop), _GRANULARITY_MINIMUM
            ),
        )
        self.granularity = gran.value
        self.region_bytes = _round_up(rows * row_bytes, self.granularity)
        self.reserved_bytes = count * self.region_bytes
        base = ctypes.c_uint64()
        _check(
            "cuMemAddressReserve",
            lib.cuMemAddressReserve(ctypes.byref(base), self.reserved_bytes, self.granularity, 0, 0),
        )
        self._base = base.value
        pad = first_row * row_bytes // self.granularity  # granules no live row touches
        try:
            if pad:
                self._map(0, pad, shared=True)
            # the first live row at once: every region's base address is mapped from here on
            if not self.ensure(first_row + 1):
                raise torch.OutOfMemoryError(f"no device memory for row {first_row} of {count} regions")
        except BaseException:
            self.close()
            raise

    def _current(self) -> None:
        """Make the device's primary context (torch's) current on this thread: driver calls need one."""
        lib = _driver()
        ctx = ctypes.c_void_p()
        _check("cuCtxGetCurrent", lib.cuCtxGetCurrent(ctypes.byref(ctx)))
        if ctx.value is None:
            dev = ctypes.c_int()
            _check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), self.device_index))
            _check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
            _check("cuCtxSetCurrent", lib.cuCtxSetCurrent(ctx))  # torch's context, retained once more

    @property
    def full_bytes(self) -> int:
        """Device memory behind the regions once every row from ``first_row`` on is mapped."""
        lo, hi = chunk_span(self.first_row, self.rows, self.row_bytes, self.granularity)
        return (self.count * (hi - lo) + lo) * self.granularity

    @property
    def mapped_bytes(self) -> int:
        """Device memory behind the regions now (the shared padding page counted once)."""
        return self._physical

    def view(self, index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """Region ``index`` as a tensor of ``shape`` (``rows`` rows of ``row_bytes``); only mapped rows
        may be touched. The view holds the regions alive."""
        if not 0 <= index < self.count:
            raise IndexError(f"region {index} of {self.count}")
        itemsize = torch.tensor([], dtype=dtype).element_size()
        if shape[0] != self.rows or _prod(shape) * itemsize != self.rows * self.row_bytes:
            raise ValueError(f"shape {shape} of {dtype} is not {self.rows} rows of {self.row_bytes} bytes")
        ptr = self._base + index * self.region_bytes
        raw = torch.as_tensor(_CudaArray(self, ptr, self.rows * self.row_bytes), device=self._device())
        return raw.view(dtype).view(shape)

    def _device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    def ensure(self, rows: int) -> bool:
        """Back rows ``[first_row, rows)`` in every region; True when they are (now or already), False
        when the device has no memory for them (nothing changes then)."""
        rows = min(rows, self.rows)
        if rows <= self.mapped_rows:  # every step asks: no lock when nothing is to map (it only grows)
            return True
        with self._lock:
            if rows <= self.mapped_rows:
                return True
            _, have = chunk_span(self.first_row, self.mapped_rows, self.row_bytes, self.granularity)
            _, want = chunk_span(self.first_row, rows, self.row_bytes, self.granularity)
            if want > have:
                try:
                    self._map(have, want)
                except DriverError as e:
                    if e.code != _ERROR_OUT_OF_MEMORY:
                        raise
                    log.warning("GDN state: no device memory for rows up to %d (%s)", rows, e)
                    return False
            self.mapped_rows = rows
            return True

    def _map(self, lo: int, hi: int, shared: bool = False) -> None:
        """Map granules ``[lo, hi)`` of every region, all or nothing: one physical allocation per
        region (the driver maps an allocation from its start only), or with ``shared`` one that every
        region maps (the padding page)."""
        lib = _driver()
        self._current()
        size = (hi - lo) * self.granularity
        prop = ctypes.byref(self._prop)
        access = _AccessDesc(_Location(_LOCATION_TYPE_DEVICE, self.device_index), _ACCESS_READWRITE)
        handles: list[int] = []
        done: list[tuple[int, int]] = []
        try:
            for _ in range(1 if shared else self.count):
                handle = ctypes.c_uint64()
                _check("cuMemCreate", lib.cuMemCreate(ctypes.byref(handle), size, prop, 0))
                handles.append(handle.value)
            for j in range(self.count):
                addr = self._base + j * self.region_bytes + lo * self.granularity
                _check("cuMemMap", lib.cuMemMap(addr, size, 0, handles[0 if shared else j], 0))
                done.append((addr, size))
                _check("cuMemSetAccess", lib.cuMemSetAccess(addr, size, ctypes.byref(access), 1))
        except DriverError:
            for addr, n in done:
                lib.cuMemUnmap(addr, n)
            raise
        finally:
            # the mappings hold the memory from here on: it is freed when the last one is unmapped
            for h in handles:
                lib.cuMemRelease(h)
        self._mapped.extend(done)
        self._physical += size * len(handles)

    def close(self) -> None:
        """Wait for the device, unmap every row and give the address range back; idempotent. No view
        may be used afterwards."""
        with self._lock:
            if not self._base:
                return
            lib = _driver()
            self._current()
            lib.cuCtxSynchronize()
            for addr, n in self._mapped:
                lib.cuMemUnmap(addr, n)
            self._mapped.clear()
            self._physical = 0
            lib.cuMemAddressFree(self._base, self.reserved_bytes)
            self._base = 0
            self.mapped_rows = self.first_row

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n

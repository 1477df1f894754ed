"""The PDL launch path's host side (engine/ops/launch_ex.py): the driver structs' layout and the
parameter cells, checked on any machine; the launches themselves run in the GPU tests
(tests/model/test_small_model_gpu.py, graph replay with arm graphs.pdl bit-equal to eager)."""

from __future__ import annotations

import ctypes

import numpy
import pytest

from engine.ops import launch_ex
from engine.ops.compile import f32, i32, ptr


class _FakeTensor:
    def __init__(self, addr: int):
        self.addr = addr

    def data_ptr(self) -> int:
        return self.addr


def test_driver_struct_layout_matches_cuda_h():
    # CUlaunchConfig: 7 uints, then the stream at 32, attrs at 40, numAttrs at 48 (56 bytes)
    assert launch_ex._Config.stream.offset == 32
    assert launch_ex._Config.attrs.offset == 40
    assert launch_ex._Config.num_attrs.offset == 48
    # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union
    assert launch_ex._Attr.value.offset == 8 and ctypes.sizeof(launch_ex._Attr) == 72
    a = launch_ex._attr()
    assert a.id == 6 and a.value.i == 1  # programmatic stream serialization allowed


def test_parameters_packed_one_per_cell():
    args = (ptr(_FakeTensor(0x7F00_1234_5678)), i32(-3), f32(0.5), numpy.int64(1 << 40))
    cells, params = launch_ex._pack(args)
    assert len(params) == 4
    base = cells.ctypes.data
    assert [params[i] for i in range(4)] == [base + 8 * i for i in range(4)]
    raw = cells.view(numpy.uint8).reshape(4, 8)
    assert int(cells[0]) == 0x7F00_1234_5678
    assert raw[1, :4].view(numpy.int32)[0] == -3
    assert raw[2, :4].view(numpy.float32)[0] == 0.5
    assert int(cells[3]) == 1 << 40


def test_plain_python_numbers_are_refused():
    with pytest.raises(TypeError, match="argument 1 is int"):
        launch_ex._pack((i32(1), 7))


def test_programmatic_launches_nest():
    assert not launch_ex.active()
    with launch_ex.programmatic_launches():
        with launch_ex.programmatic_launches():
            assert launch_ex.active()
        assert launch_ex.active()
    assert not launch_ex.active()

"""The on-demand GDN state regions (engine/model/vmm.py) on a real device: one reserved address range,
memory mapped behind a growing prefix of rows in every region, rows that keep their contents and
addresses as the regions grow, slot 0 never backed, and every byte back on close."""

from __future__ import annotations

import gc

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.model.cache import CacheSpec, ModelCache  # noqa: E402
from engine.model.vmm import GrowingRegions, chunk_span  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda", 0)


def _warm(dtype: torch.dtype) -> None:
    """The elementwise kernels the tests run, loaded before memory is read (torch loads modules lazily:
    the first test saw 92 MiB of them after its baseline)."""
    x = torch.zeros(8, 4, dtype=dtype, device=DEV)
    x[1:3].fill_(1)
    assert bool((x[1:3] == 1).all()) and not bool((x[3:] == -1).all())
    x.zero_()


def _free() -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(DEV)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_are_mapped_as_asked_keep_their_contents_and_all_return_on_close(dtype):
    """The 4B's state row (32 x 128 x 128) is one 2 MiB granule in fp32 and half of one in bf16."""
    shape = (32, 128, 128)
    row = 32 * 128 * 128 * torch.tensor([], dtype=dtype).element_size()
    _warm(dtype)
    before = _free()
    g = GrowingRegions(DEV, count=3, rows=9, row_bytes=row, first_row=1)
    gran = g.granularity
    pad = row // gran  # granules wholly below row 1: one page shared by the regions (fp32: slot 0)
    lo, hi = chunk_span(1, 2, row, gran)
    assert lo == pad and g.mapped_rows == 2  # row 1 of every region from the start
    assert g.mapped_bytes == (pad + 3 * (hi - lo)) * gran
    assert g.region_bytes % gran == 0 and g.region_bytes >= 9 * row
    assert before - _free() < g.mapped_bytes + gran  # the address range itself takes no memory
    views = [g.view(j, dtype, (9, *shape)) for j in range(3)]
    bases = [v.data_ptr() for v in views]
    assert all(b % gran == 0 for b in bases) and len(set(bases)) == 3

    assert g.ensure(3)  # rows 1 and 2 in every region
    lo, hi = chunk_span(1, 3, row, gran)
    assert g.mapped_rows == 3 and g.mapped_bytes == (pad + 3 * (hi - lo)) * gran
    for j, v in enumerate(views):
        v[1:3].fill_(j + 1)
    torch.cuda.synchronize()
    assert g.ensure(2) and g.ensure(3) and g.mapped_bytes == (pad + 3 * (hi - lo)) * gran  # no more

    assert g.ensure(100)  # clamped to every row
    assert g.mapped_rows == 9 and g.mapped_bytes == g.full_bytes
    assert before - _free() >= g.full_bytes  # the device really holds it now
    for j, v in enumerate(views):
        assert v.data_ptr() == bases[j]  # growth never moves a view
        assert (v[1:3] == j + 1).all()  # nor loses what the rows held
        v[3:].fill_(-(j + 1))
    for j, v in enumerate(views):
        assert (v[1:3] == j + 1).all() and (v[3:] == -(j + 1)).all()  # regions do not overlap

    g.close()
    g.close()  # idempotent
    del views, v
    gc.collect()
    assert abs(_free() - before) < gran


def test_the_last_view_gives_the_memory_back():
    _warm(torch.float32)
    before = _free()
    g = GrowingRegions(DEV, count=2, rows=4, row_bytes=2 << 20, first_row=1)
    assert g.ensure(4)
    v = g.view(1, torch.float32, (4, 512, 1024))
    del g
    gc.collect()
    assert before - _free() >= 6 << 20  # the view holds the regions alive
    v[1:].zero_()
    torch.cuda.synchronize()
    del v
    gc.collect()
    assert abs(_free() - before) < 2 << 20


def test_bad_views_and_regions_are_refused():
    with pytest.raises(ValueError, match="bad regions"):
        GrowingRegions(DEV, count=0, rows=4, row_bytes=16)
    with pytest.raises(ValueError, match="bad regions"):
        GrowingRegions(DEV, count=1, rows=4, row_bytes=16, first_row=4)
    g = GrowingRegions(DEV, count=2, rows=4, row_bytes=64)
    with pytest.raises(IndexError):
        g.view(2, torch.float32, (4, 16))
    with pytest.raises(ValueError, match="not 4 rows of 64 bytes"):
        g.view(0, torch.float32, (4, 8))
    g.close()


def test_model_cache_maps_a_slot_when_it_is_ensured():
    spec = CacheSpec(
        num_kv_layers=1, kv_token_shape=(2, 64), num_state_layers=4,
        conv_state_shape=(96, 3), ssm_state_shape=(32, 128, 128),
    )  # fmt: skip
    row = 32 * 128 * 128 * 4  # one 2 MiB granule
    c = ModelCache.allocate(spec, 4, 16, 17, torch.bfloat16, DEV, shared_pad_slot=True, state_on_demand=True)
    assert c.grown is not None and c.grown.mapped_rows == 2  # slot 1 at once, slot 0 one shared page
    conv = c.state_bytes - c.grown.mapped_bytes
    assert conv == (4 * 16 + 1) * 96 * 3 * 2  # the conv state: one allocation, shared padding row
    assert all(v.shape == (17, 32, 128, 128) and v.dtype == torch.float32 for v in c.ssm_state)
    assert c.ensure_slot(1) and c.grown.mapped_rows == 2
    assert c.ensure_slot(9) and c.grown.mapped_rows == 10
    assert c.grown.mapped_bytes == (4 * 9 + 1) * row  # 2 MiB rows: slots 1..9 + the padding page
    assert c.state_reserved_bytes == conv + (4 * 16 + 1) * row
    for j, v in enumerate(c.ssm_state):
        v[1:10].fill_(j)
    assert all((v[1:10] == j).all() for j, v in enumerate(c.ssm_state))
    c.close()

"""The device pools' layout (engine/model/cache.py): one allocation per pool kind with per-layer views,
and the GDN layers sharing one padding row when the CUDA kernels run them."""

from __future__ import annotations

import pytest
import torch

from engine.model.cache import CacheSpec, ModelCache, state_bytes_per_slot

SPEC = CacheSpec(
    num_kv_layers=2,
    kv_token_shape=(2, 8),
    num_state_layers=3,
    conv_state_shape=(6, 3),
    ssm_state_shape=(2, 4, 4),
)


def _pools(shared: bool, slots: int = 5) -> ModelCache:
    return ModelCache.allocate(SPEC, 4, 16, slots, torch.bfloat16, "cpu", shared_pad_slot=shared)


def test_plain_pools_give_every_layer_its_own_slot_zero():
    c = _pools(False)
    assert c.state_bytes == 5 * state_bytes_per_slot(SPEC, torch.bfloat16)
    rows = [v.data_ptr() for v in c.ssm_state]
    assert len(set(rows)) == 3 and all(v.shape == (5, 2, 4, 4) for v in c.ssm_state)


@pytest.mark.parametrize("slots", [2, 5])
def test_shared_padding_row_saves_a_slot_row_per_layer_but_one(slots):
    c = _pools(True, slots)
    row = state_bytes_per_slot(SPEC, torch.bfloat16) // SPEC.num_state_layers
    assert c.state_bytes == (SPEC.num_state_layers * (slots - 1) + 1) * row
    for views, shape in ((c.conv_state, (6, 3)), (c.ssm_state, (2, 4, 4))):
        assert all(v.shape == (slots, *shape) and v.is_contiguous() for v in views)
        for j in range(1, len(views)):  # slot 0 of layer j is the last slot of layer j-1
            assert views[j][0].data_ptr() == views[j - 1][slots - 1].data_ptr()
        # the live slots (1..) of the layers are disjoint: writing one layer's changes no other's
        for j, v in enumerate(views):
            v[1:].fill_(j + 1)
        for j, v in enumerate(views):
            assert (v[1:] == j + 1).all()
        assert (views[0][0] == 0).all()  # the one row of its own, layer 0's padding slot


def test_too_few_slots_are_refused_either_way():
    for shared in (False, True):
        with pytest.raises(ValueError, match="at least 2 KV blocks and 2 state slots"):
            _pools(shared, 1)


@pytest.mark.parametrize(
    ("first", "rows", "row", "span"),
    [
        (1, 1, 2 << 20, (1, 1)),  # nothing asked: nothing mapped
        (1, 2, 2 << 20, (1, 2)),  # one fp32 4B row is one 2 MiB granule; slot 0's is never mapped
        (1, 9, 2 << 20, (1, 9)),
        (1, 2, 1 << 20, (0, 1)),  # bf16: slots 0 and 1 share granule 0
        (1, 4, 1 << 20, (0, 2)),
        (1, 3, 3 << 20, (1, 5)),  # rows straddling granules: bytes [3, 9) MiB
        (0, 1, 100, (0, 1)),
    ],
)
def test_on_demand_rows_map_whole_granules_from_the_first_row(first, rows, row, span):
    from engine.model.vmm import chunk_span

    assert chunk_span(first, rows, row, 2 << 20) == span

"""CPU CI for the paged-attention wrapper's host side (engine.ops.attention.cuda): split selection, the
launch plan, the per-arch tile table, shared-memory fit, argument checks; and the .cu file compiled
standalone by nvcc for sm_120 and sm_90 without spills (skipped without nvcc)."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.ops.attention import cuda as attn
from engine.ops.attention.batches import make_batch
from tests.test_cuda_compile import CUDA_DIR, _compile, parse_ptxas

H200_SLOTS = 132 * 4  # one-warp D=256 decode CTAs resident on an H200 (56 KB of shared memory each)


def test_pick_splits_fills_the_device_for_small_batches():
    tiles = -(-1101 // 16)
    s1 = attn.pick_splits(4, tiles, H200_SLOTS)  # batch 1: as many splits as the cap allows
    assert s1 <= attn.MAX_SPLITS and -(-tiles // s1) <= 2
    s32 = attn.pick_splits(128, tiles, H200_SLOTS)  # batch 32 x 4 kv heads
    assert 128 * s32 <= H200_SLOTS and s32 >= 2  # one wave, more than one split
    s64 = attn.pick_splits(256, tiles, H200_SLOTS)  # batch 64: 256 items leave a third of the slots idle
    assert -(-256 * s64 // H200_SLOTS) <= 2 and s64 <= s32 + 1


def test_pick_splits_bounds():
    assert attn.pick_splits(1, 1, 1000) == 1  # never more splits than tiles
    assert attn.pick_splits(1, 500, 1000, max_splits=8) == 8
    assert attn.pick_splits(10_000, 500, 264) == 1  # a big prefill grid is never split
    with pytest.raises(ValueError, match="split inputs"):
        attn.pick_splits(0, 4, 10)


def _slots(shape):
    return H200_SLOTS if shape[1] == 1 else 264


def _shape(nw):
    return attn.tile_shape(256, nw, cc=90)


def test_make_plan_decode_and_prefill():
    dec = attn.make_plan(32, 32, 16, 4, 256, 1, 1101, _slots, _shape)
    assert (dec.warps, dec.tile_n, dec.stages) == (1, 16, 3) and dec.grid == (128, 1, dec.splits)
    assert dec.splits > 1 and dec.name == "paged_attn_kernel<256, 16, 1, 3>"
    pre = attn.make_plan(32 * 1024, 32, 16, 4, 256, 1024, 1024, _slots, _shape)
    assert (pre.warps, pre.tile_n, pre.stages, pre.splits, pre.grid) == (4, 32, 2, 1, (128, 64, 1))
    mixed = attn.make_plan(2 * 1024 + 32, 34, 16, 4, 256, 1024, 1101, _slots, _shape)
    assert (mixed.warps, mixed.grid[:2]) == (4, (136, 64))
    spec = attn.make_plan(8, 4, 16, 4, 256, 2, 1101, _slots, _shape)  # 2 tokens x 4 heads: one warp
    assert spec.warps == 1
    forced = attn.make_plan(4, 4, 16, 4, 256, 1, 1101, _slots, _shape, splits=7)
    assert forced.splits == 7 and forced.grid[2] == 7
    with pytest.raises(ValueError, match="splits"):
        attn.make_plan(4, 4, 16, 4, 256, 1, 1101, _slots, _shape, splits=attn.MAX_SPLITS + 1)


def test_workspace_cap_limits_splits():
    plan = attn.make_plan(20_000, 1, 16, 4, 256, 20_000, 40_000, lambda s: 10_000, _shape)
    assert plan.splits * 20_000 * 16 * 257 * 4 <= attn.WORKSPACE_BYTES or plan.splits == 1


def test_max_splits_mirrors_the_kernel():
    text = (CUDA_DIR / attn.SRC).read_text()
    assert f"#define PA_MAX_SPLITS {attn.MAX_SPLITS}" in text
    for per in attn.COMBINE_PER:  # every combine the wrapper can name is instantiated
        assert f"paged_attn_combine_kernel<D, {per}>" in text
    combine = (CUDA_DIR / attn.COMBINE).read_text()
    assert f"constexpr int CT = D / 4, P = {attn.COMBINE_GROUPS};" in combine


def test_combine_takes_the_smallest_instantiation():
    names = [attn.combine_name(256, s) for s in (2, 4, 5, 16, 17, 35, 64)]
    assert [n.split(", ")[1] for n in names] == ["1>", "1>", "4>", "4>", "16>", "16>", "16>"]
    assert attn.COMBINE_GROUPS * attn.COMBINE_PER[-1] == attn.MAX_SPLITS
    with pytest.raises(ValueError, match="65 splits"):
        attn.combine_name(256, 65)


@pytest.mark.parametrize("cc", [80, 86, 90, 120])
def test_tiles_fit_shared_memory(cc):
    for d in attn.HEAD_DIMS:
        for nw in (1, 4):
            bn, w, stages = attn.tile_shape(d, nw, cc)
            assert bn % 16 == 0 and w == nw and stages >= 2
            assert attn.smem_bytes(d, bn, nw, stages) <= 99 * 1024, (cc, d, bn, nw, stages)


def test_argument_errors_name_the_tensor():
    b = make_batch([(5, 3), (0, 2)], 16, 2, 2, 64, seed=0, device="cpu")
    a = list(b.args())
    cases = [
        ((a[0].float(), *a[1:]), {}, "q must be bfloat16"),
        ((a[0][..., :48].contiguous(), *a[1:]), {}, "head dim 48"),
        ((a[0], a[1][:, :8].contiguous(), a[2][:, :8].contiguous(), *a[3:]), {}, "block size 8"),
        ((a[0], a[1], a[2][..., :1, :].contiguous(), *a[3:]), {}, "differ"),
        ((*a[:4], a[4][:-1], *a[5:]), {}, "query_start_loc must be"),
        ((*a[:5], a[5].float(), *a[6:]), {}, "seq_lens must be int32"),
        ((*a[:7], -1.0, *a[8:]), {}, "scale"),
        (tuple(a), {"gate": b.gate[:1]}, "gate must be"),
        (tuple(a), {}, "q must be a CUDA tensor"),
    ]
    for args, kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            attn.paged_attention(*args, **kw)


def test_reference_gate_is_the_model_composition():
    b = make_batch([(5, 3), (0, 2)], 16, 2, 2, 64, seed=1, device="cpu")
    from engine.ops import reference as ref

    plain = ref.paged_attention(*b.args())
    assert torch.equal(ref.paged_attention(*b.args(), gate=b.gate), plain * torch.sigmoid(b.gate))


@pytest.mark.parametrize("arch", [120, 90])
def test_kernel_compiles_without_spills(arch, tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    rc, log = _compile(CUDA_DIR / "attention" / "paged_attention.cu", arch, tmp_path)
    assert rc == 0, log
    rows = parse_ptxas(log)
    names = [r["name"] for r in rows]
    assert sum("paged_attn_kernel" in n for n in names) == 6 and sum("combine" in n for n in names) == 9
    for r in rows:
        assert r["spill"] == 0, f"{r['name']} sm_{arch} spills {r['spill']} bytes"

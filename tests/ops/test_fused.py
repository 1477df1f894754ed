"""Fused elementwise ops (add_rms_norm, silu_mul, qk_norm_rope_kv) on the CPU.

Each reference composition equals the separate ops the model called before, bitwise, on fp32 and bf16
inputs shaped like the model's (strided projection views, scattered paged slots), and the op tables
wire the CUDA kernels only under their arms. The kernels themselves: tests/ops/test_fused_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.ops import OP_NAMES, make_ops
from engine.ops import reference as ref
from tests.ops.fused_check import DTYPES, attn_views, paged, rand


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_is_the_old_add_then_norm(dtype):
    rng = np.random.default_rng(1)
    x, res = rand(rng, 9, 64, dtype=dtype), rand(rng, 9, 64, scale=3.0, dtype=dtype)
    w = rand(rng, 64, scale=0.1, dtype=dtype)
    y, h = ref.add_rms_norm(x, res, w, 1e-6)
    old_h = res + x  # the model's ``h = h + x``
    assert torch.equal(h, old_h) and h.dtype == dtype
    assert torch.equal(y, ref.rms_norm(old_h, w, 1e-6))
    y0, h0 = ref.add_rms_norm(x, None, w, 1e-6)
    assert h0 is x and torch.equal(y0, ref.rms_norm(x, w, 1e-6))
    if dtype == torch.bfloat16:  # the add rounds once to bf16, as torch's bf16 add does
        assert torch.equal(h, (res.float() + x.float()).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_h_out_in_place_and_apart(dtype):
    """h_out receives h (a separate buffer, or the residual itself updated in place) and y is unchanged."""
    rng = np.random.default_rng(2)
    x, res = rand(rng, 7, 64, dtype=dtype), rand(rng, 7, 64, scale=3.0, dtype=dtype)
    w = rand(rng, 64, scale=0.1, dtype=dtype)
    want_y, want_h = ref.add_rms_norm(x, res, w, 1e-6)
    out = torch.full_like(res, float("nan"))
    y, h = ref.add_rms_norm(x, res, w, 1e-6, h_out=out)
    assert h is out and torch.equal(out, want_h) and torch.equal(y, want_y)
    stream = res.clone()
    y, h = ref.add_rms_norm(x, stream, w, 1e-6, h_out=stream)
    assert h is stream and torch.equal(stream, want_h) and torch.equal(y, want_y)
    with pytest.raises(ValueError, match="h_out needs a residual"):
        ref.add_rms_norm(x, None, w, 1e-6, h_out=out)
    y_buf = torch.full_like(res, float("nan"))
    y, h = ref.add_rms_norm(x, res, w, 1e-6, y_out=y_buf)
    assert y is y_buf and torch.equal(y, want_y) and torch.equal(h, want_h)


def test_silu_mul_reference_out():
    rng = np.random.default_rng(3)
    gu = rand(rng, 5, 32, dtype=torch.bfloat16)
    out = torch.full((5, 16), float("nan"), dtype=torch.bfloat16)
    assert ref.silu_mul(gu, out=out) is out and torch.equal(out, ref.silu_mul(gu))
    # in place over the gate half, as the piecewise MLP runs it: the same values, the up half kept
    own = gu.clone()
    act = ref.silu_mul(own, out=own[:, :16])
    assert act.data_ptr() == own.data_ptr() and torch.equal(act, out) and torch.equal(own[:, 16:], gu[:, 16:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_the_old_mlp_activation(dtype):
    rng = np.random.default_rng(2)
    inter = 40
    gu = rand(rng, 7, 2 * inter + 6, scale=3.0, dtype=dtype)[:, 3 : 3 + 2 * inter]  # strided rows
    out = ref.silu_mul(gu)
    assert out.shape == (7, inter) and out.dtype == dtype
    assert torch.equal(out, F.silu(gu[:, :inter]) * gu[:, inter:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("h", "hkv", "d", "rot", "bs"), [(4, 2, 32, 8, 16), (4, 2, 64, 64, 32), (8, 2, 64, 16, 16)]
)
def test_qk_norm_rope_kv_is_the_old_attention_prologue(dtype, h, hkv, d, rot, bs):
    rng = np.random.default_rng(3)
    t = 37
    qg, k, v = attn_views(rng, t, h, hkv, d, dtype)
    qn, kn = rand(rng, d, scale=0.2, dtype=dtype), rand(rng, d, scale=0.2, dtype=dtype)
    pos = torch.from_numpy(rng.integers(0, 50_000, t)).to(torch.int64)
    kc, vc, slots = paged(rng, t, bs, hkv, d, dtype)
    kc_old, vc_old = kc.clone(), vc.clone()
    q = ref.qk_norm_rope_kv(qg, k, v, qn, kn, 1e-6, pos, rot, 1e7, kc, vc, slots)
    # the separate calls GatedAttention.forward made before the fused op
    q_old = ref.rms_norm(qg[..., :d].reshape(-1, d), qn, 1e-6).reshape(t, h, d)
    k_old = ref.rms_norm(k.reshape(-1, d), kn, 1e-6).reshape(t, hkv, d)
    q_old, k_old = ref.apply_rope(q_old, k_old, pos, rot, 1e7)
    ref.write_kv(k_old, v, kc_old, vc_old, slots)
    assert q.is_contiguous() and q.dtype == dtype
    assert torch.equal(q, q_old)
    assert torch.equal(kc, kc_old) and torch.equal(vc, vc_old)
    flat = vc.view(-1, hkv, d)
    assert torch.equal(flat[slots], v), "v goes to the cache unchanged"
    # out= (rows of a wider scratch buffer, as a whole-step graph lends them): the same values there
    scratch = torch.full(((t + 1) * h * d,), float("nan"), dtype=dtype)
    got = ref.qk_norm_rope_kv(qg, k, v, qn, kn, 1e-6, pos, rot, 1e7, kc, vc, slots, out=scratch[: t * h * d])
    assert got.data_ptr() == scratch.data_ptr() and got.shape == (t, h, d) and torch.equal(got, q)
    assert torch.isnan(scratch[t * h * d :].float()).all(), "wrote past out"
    with pytest.raises(RuntimeError, match="invalid for input of size"):  # more values than q
        ref.qk_norm_rope_kv(qg, k, v, qn, kn, 1e-6, pos, rot, 1e7, kc, vc, slots, out=scratch)


def test_op_table_carries_the_fused_ops():
    ops = make_ops("torch")
    assert {"add_rms_norm", "silu_mul", "qk_norm_rope_kv"} <= set(OP_NAMES)
    assert ops.add_rms_norm is ref.add_rms_norm and ops.silu_mul is ref.silu_mul
    assert ops.qk_norm_rope_kv is ref.qk_norm_rope_kv


def test_cuda_table_uses_the_kernels_only_under_their_arms():
    from engine.ops.arms import ARMS, cuda_overrides
    from engine.ops.attention import cuda as attention
    from engine.ops.norm import fused_cuda

    assert {"norm.fused", "attention.qk_fused", "attention.paged"} <= set(ARMS)
    base = frozenset({"conv.chunk8", "conv.k4", "decode.fused", "prefill.tensorcore"})
    off = cuda_overrides(base)
    assert not {"add_rms_norm", "silu_mul", "qk_norm_rope_kv", "paged_attention"} & set(off)
    norm_on = cuda_overrides(base | {"norm.fused"})
    assert norm_on["add_rms_norm"] is fused_cuda.add_rms_norm and norm_on["silu_mul"] is fused_cuda.silu_mul
    assert "qk_norm_rope_kv" not in norm_on
    qk_on = cuda_overrides(frozenset({"attention.qk_fused"}))
    assert qk_on["qk_norm_rope_kv"] is fused_cuda.qk_norm_rope_kv and "add_rms_norm" not in qk_on
    paged_on = cuda_overrides(frozenset({"attention.paged"}))
    assert paged_on["paged_attention"] is attention.paged_attention and "qk_norm_rope_kv" not in paged_on


@pytest.mark.parametrize("d", [64, 256, 2560, 4096, 5120])
def test_norm_layouts_cover_every_row(d):
    from engine.ops.norm.fused_cuda import norm_shape

    vpt, tpr, rows = norm_shape(d)
    assert vpt * tpr * 8 == d and tpr * rows <= 512
    assert (tpr <= 32 and tpr & (tpr - 1) == 0) or (tpr % 32 == 0 and rows == 1)


def test_norm_layout_rejects_rows_it_cannot_split():
    from engine.ops.norm.fused_cuda import norm_shape

    with pytest.raises(ValueError, match="multiple of 8"):
        norm_shape(100)
    with pytest.raises(ValueError, match="power of two"):
        norm_shape(96)

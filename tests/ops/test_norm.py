"""rms_norm, gated_rms_norm and gdn_gating vs hand-written formulas and HF's modules (CPU); the CUDA
gated RMSNorm vs the reference (gpu)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.ops import reference as ref
from engine.ops.norm import cuda as norm
from engine.ops.reference import gated_rms_norm, gdn_gating, rms_norm
from tests.ops.kernel_check import DEV, bf16, rel, twice

DTYPES = [torch.float32, torch.bfloat16]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_per_row_loop(dtype: torch.dtype) -> None:
    gen = _gen(1)
    x = (torch.randn(7, 48, generator=gen) * 3).to(dtype)
    w = (torch.randn(48, generator=gen) * 0.1).to(dtype)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    for i in range(x.shape[0]):
        row = x[i].double()
        ref = row / torch.sqrt(row.pow(2).mean() + 1e-6) * (1.0 + w.double())
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out[i].double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_bit_exact_vs_hf(dtype: torch.dtype) -> None:
    m = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = _gen(2)
    x = torch.randn(5, 3, 64, generator=gen).to(dtype)  # [T, H, D] like q_norm
    norm = m.Qwen3_5RMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=gen) * 0.2)
        ref = norm(x)
    assert torch.equal(rms_norm(x, norm.weight.detach(), 1e-6), ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_bit_exact_vs_hf(dtype: torch.dtype, weight_dtype: torch.dtype) -> None:
    m = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = _gen(3)
    x = torch.randn(9, 32, generator=gen).to(dtype)
    z = torch.randn(9, 32, generator=gen).to(dtype)
    norm = m.Qwen3_5RMSNormGated(32, eps=1e-6).to(weight_dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randn(32, generator=gen) * 0.2)
        ref = norm(x, z)
    out = gated_rms_norm(x, z, norm.weight.detach(), 1e-6)
    assert out.dtype == ref.dtype
    assert torch.equal(out, ref)


def test_gated_rms_norm_matches_formula() -> None:
    gen = _gen(4)
    x, z = torch.randn(2, 6, 16, generator=gen, dtype=torch.float64)
    w = torch.rand(16, generator=gen, dtype=torch.float64) + 0.5
    out = gated_rms_norm(x.float(), z.float(), w.float(), 1e-6).double()
    for i in range(6):
        ref = w * x[i] / torch.sqrt(x[i].pow(2).mean() + 1e-6) * z[i] * torch.sigmoid(z[i])
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_gating(dtype: torch.dtype) -> None:
    gen = _gen(5)
    a = torch.randn(11, 6, generator=gen).to(dtype)
    b = torch.randn(11, 6, generator=gen).to(dtype)
    A_log = torch.log(torch.rand(6, generator=gen) * 15 + 0.01)
    dt_bias = torch.randn(6, generator=gen).to(dtype)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == torch.float32
    # HF: g = -A_log.float().exp() * softplus(a.float() + dt_bias); beta = b.sigmoid() in b's dtype
    assert torch.equal(g, -A_log.float().exp() * F.softplus(a.float() + dt_bias))
    assert torch.equal(beta, b.sigmoid().float())
    assert bool((g <= 0).all())
    for t in range(11):
        for h in range(6):
            sp = torch.log1p(torch.exp(a[t, h].double() + dt_bias[h].double()))
            ref = -torch.exp(A_log[h].double()) * sp
            torch.testing.assert_close(g[t, h].double(), ref, atol=1e-4, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm(wdtype):
    torch.manual_seed(0)
    N, dv = 1000 * 4 + 3, 128
    x = bf16(N, dv, scale=2.0)
    z = bf16(N, 2 * dv)[:, dv:]
    w = (torch.rand(dv, device=DEV) + 0.5).to(wdtype)
    want = ref.gated_rms_norm(x, z, w, 1e-6)
    got = twice(lambda: norm.gated_rms_norm(x, z, w, 1e-6), [], ((N, dv), torch.bfloat16))
    assert rel(got, want) < 2e-3
    # out= (any contiguous buffer of N * dv values, as the piecewise graphs' [T, Nv * dv] core buffer)
    # gets the same bits, and so in the reference
    out = torch.full((N * dv,), float("nan"), dtype=torch.bfloat16, device=DEV)
    assert norm.gated_rms_norm(x, z, w, 1e-6, out=out).data_ptr() == out.data_ptr()
    assert torch.equal(out.view(N, dv), got)
    assert torch.equal(ref.gated_rms_norm(x, z, w, 1e-6, out=out).view(N, dv), want)
    with pytest.raises(ValueError, match="out must be contiguous"):
        norm.gated_rms_norm(x, z, w, 1e-6, out=out[:-8])
    # in place (the GDN core normalises the delta rule's output where it lies): the same bits
    own = x.clone()
    assert norm.gated_rms_norm(own, z, w, 1e-6, out=own).data_ptr() == own.data_ptr()
    assert torch.equal(own, got)


@pytest.mark.gpu
def test_gated_rms_norm_reads_head_strided_rows():
    """The GDN core's call: x the delta rule's [T, Nv, dv] output, z the [T, Nv, dv] view of the fused
    projection (rows wider than z, so no [T * Nv, dv] view exists). The kernel reads both where they
    lie and gives the bits it gives over contiguous copies; the reference agrees within bf16."""
    torch.manual_seed(1)
    T, H, dv = 517, 32, 128
    proj = bf16(T, 8 + H * dv + 64)  # [.. | z | ..]: a token stride that is not H * dv
    z = proj[:, 8 : 8 + H * dv].view(T, H, dv)
    x = bf16(T, H, dv, scale=2.0)
    w = (torch.rand(dv, device=DEV) + 0.5).to(torch.bfloat16)
    flat = norm.gated_rms_norm(x.reshape(-1, dv), z.reshape(-1, dv).contiguous(), w, 1e-6)
    got = twice(lambda: norm.gated_rms_norm(x, z, w, 1e-6), [], ((T * H, dv), torch.bfloat16))
    assert got.shape == (T, H, dv)
    assert torch.equal(got.view(-1, dv), flat)
    assert rel(got, ref.gated_rms_norm(x, z, w, 1e-6)) < 2e-3
    # into the piecewise core buffer ([T, Nv * dv]) and in place over x, as the model calls it
    out = torch.full((T, H * dv), float("nan"), dtype=torch.bfloat16, device=DEV)
    norm.gated_rms_norm(x, z, w, 1e-6, out=out.view(T, H, dv))
    assert torch.equal(out.view(-1, dv), flat)
    own = x.clone()
    norm.gated_rms_norm(own, z, w, 1e-6, out=own)
    assert torch.equal(own.view(-1, dv), flat)


@pytest.mark.gpu
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 4003])
def test_two_rows_per_warp_give_the_one_row_kernels_bits(wdtype, n):
    """gated_rms_norm2_kernel (a half warp per row, 8 values a lane) reduces each row's squares in
    gated_norm_row4's order, so it gives the one-row kernel's bits (K4's epilogue is that one) on
    every row count (a warp's second row past the end included), head-strided rows and in place."""
    g = torch.Generator(device=DEV).manual_seed(n)
    x = (torch.randn(n, 128, device=DEV, generator=g) * 3).to(torch.bfloat16)
    z = torch.randn(n, 3 * 128, device=DEV, generator=g).to(torch.bfloat16)[:, 128:256]
    w = (torch.rand(128, device=DEV, generator=g) + 0.5).to(wdtype)
    one = norm.gated_rms_norm(x, z, w, 1e-6, per_lane=4)
    two = twice(lambda: norm.gated_rms_norm(x, z, w, 1e-6), [], ((n, 128), torch.bfloat16))
    assert torch.equal(one, two)
    assert rel(two, ref.gated_rms_norm(x, z, w, 1e-6)) < 2e-3
    own = x.clone()
    norm.gated_rms_norm(own, z, w, 1e-6, out=own)
    assert torch.equal(own, one)
    # a misaligned z (8-byte) falls back to the one-row kernel: still the same bits
    zz = torch.randn(n, 2 * 128 + 4, device=DEV, generator=g).to(torch.bfloat16)[:, 4:132]
    assert torch.equal(norm.gated_rms_norm(x, zz, w, 1e-6), norm.gated_rms_norm(x, zz, w, 1e-6, per_lane=4))
    with pytest.raises(ValueError, match="per_lane must be 4 or 8"):
        norm.gated_rms_norm(x, z, w, 1e-6, per_lane=2)

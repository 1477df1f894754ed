"""Arm linear.split_norm on a GPU (engine/ops/gemm/split_norm.py; CPU side: test_split_norm.py).

The kernel part is exact: add_rms_norm_kernel over S fp32 partials equals, bit for bit, the bf16 path
fed the partials' sum taken in split order and rounded once. The op as a whole computes the projection
with a different fp32 summation order than cuBLAS, so it is held to the fp32 product instead: the
projection it implies (h - residual) within one bf16 rounding of the exact product, y within the fused
norm's own bound (tests/ops/test_fused_gpu.py) of the norm of the rounded exact product. Outside its
rows, layouts and dtypes it must be the composition exactly. Outputs are poisoned before each run;
graph replay equals the eager call bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.ops.fused_check import BOUND, rand
from tests.ops.kernel_check import poison

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture
def mods():
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from engine.ops.gemm import cuda as gemm
    from engine.ops.gemm import split_norm
    from engine.ops.norm import fused_cuda

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 product below must be fp32
    yield gemm, split_norm, fused_cuda
    torch.backends.cuda.matmul.allow_tf32 = tf32


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("n,d", [(9, 2560), (33, 2560), (64, 2560), (20, 256)])
def test_partials_equal_the_bf16_path_fed_their_sum(mods, splits, n, d):
    _, _, fused_cuda = mods
    rng = np.random.default_rng(1000 * splits + n + d)
    parts = rand(rng, splits, n, d, scale=3.0, device=DEV)
    residual = rand(rng, n, d, scale=2.0, dtype=torch.bfloat16, device=DEV)
    weight = rand(rng, d, scale=0.5, dtype=torch.bfloat16, device=DEV)
    x = parts[0].clone()
    for j in range(1, splits):
        x = x + parts[j]  # the kernel's order: ((p0 + p1) + p2) + p3, one rounding to bf16 after
    want_y, want_h = fused_cuda.add_rms_norm(x.to(torch.bfloat16), residual, weight, 1e-6)
    poison(((n, d), torch.bfloat16), ((n, d), torch.bfloat16))
    y, h = fused_cuda.add_rms_norm_partials(parts, residual, weight, 1e-6)
    assert torch.equal(_bits(y), _bits(want_y)) and torch.equal(_bits(h), _bits(want_h))
    # in place (the residual stream) and into a given y
    res2, y_out = residual.clone(), torch.full((n, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    y2, h2 = fused_cuda.add_rms_norm_partials(parts, res2, weight, 1e-6, h_out=res2, y_out=y_out)
    assert h2.data_ptr() == res2.data_ptr() and y2.data_ptr() == y_out.data_ptr()
    assert torch.equal(_bits(y2), _bits(want_y)) and torch.equal(_bits(res2), _bits(want_h))


def test_partials_refused_by_name(mods):
    _, _, fused_cuda = mods
    res = torch.zeros(4, 256, dtype=torch.bfloat16, device=DEV)
    w = torch.zeros(256, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="S in"):
        fused_cuda.add_rms_norm_partials(torch.zeros(3, 4, 256, device=DEV), res, w, 1e-6)
    with pytest.raises(ValueError, match="parts: expected dtype"):
        bf16 = torch.zeros(2, 4, 256, dtype=torch.bfloat16, device=DEV)
        fused_cuda.add_rms_norm_partials(bf16, res, w, 1e-6)
    with pytest.raises(ValueError, match="residual"):
        fused_cuda.add_rms_norm_partials(torch.zeros(2, 5, 256, device=DEV), res, w, 1e-6)


def _case(rng, m, k, n, dtype=torch.bfloat16):
    a = rand(rng, m, k, dtype=dtype, device=DEV)
    w = rand(rng, n, k, scale=k**-0.5, dtype=dtype, device=DEV)
    residual = rand(rng, m, n, scale=2.0, dtype=dtype, device=DEV)
    norm_w = rand(rng, n, scale=0.5, dtype=dtype, device=DEV)
    return a, w, residual, norm_w


def _op(mods):
    gemm, split_norm, fused_cuda = mods

    def op(*args, **kw):
        kw |= {"linear": gemm.linear, "add_rms_norm": fused_cuda.add_rms_norm}
        return split_norm.linear_add_rms_norm(*args, **kw)

    return op


# the 4B's GDN out_proj / attention o_proj (K 4,096 -> 4 splits) and down-sized shapes (K 384 -> 2)
@pytest.mark.parametrize("k,n,splits", [(4096, 2560, 4), (384, 256, 2)])
@pytest.mark.parametrize("m", [9, 32, 64])
def test_split_path_within_one_rounding_of_the_fp32_product(mods, k, n, splits, m):
    _, split_norm, fused_cuda = mods
    rng = np.random.default_rng(7 * m + k)
    a, w, residual, norm_w = _case(rng, m, k, n)
    assert split_norm.split_count(a, w, residual) == splits
    exact = a.float() @ w.float().T
    x_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    poison(((m, n), torch.bfloat16), ((m, n), torch.bfloat16))
    y, h = _op(mods)(a, w, residual, norm_w, 1e-6, x_out=x_out)
    assert torch.isnan(x_out.float()).all(), "the split path never writes the projection"
    # h = bf16(residual + bf16(x)): within one rounding of x and one of the add
    tol = 2.1 * 2.0**-8 * (residual.float().abs() + exact.abs()) + 1e-6
    assert ((h.float() - (residual.float() + exact)).abs() <= tol).all()
    want_y, _ = fused_cuda.add_rms_norm(exact.to(torch.bfloat16), residual, norm_w, 1e-6)
    g, ww = y.float(), want_y.float()
    assert ((g - ww).abs().amax(-1) / ww.abs().amax(-1)).max().item() <= BOUND
    # run to run, and replayed from a CUDA graph, bit for bit
    y2, h2 = _op(mods)(a, w, residual, norm_w, 1e-6)
    assert torch.equal(_bits(y), _bits(y2)) and torch.equal(_bits(h), _bits(h2))
    torch.cuda.synchronize()
    g_ = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_):
        gy, gh = _op(mods)(a, w, residual, norm_w, 1e-6)
    gy.fill_(float("nan"))
    g_.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(gy), _bits(y)) and torch.equal(_bits(gh), _bits(h))


@pytest.mark.parametrize(
    "m,k,n,dtype",
    [
        (8, 4096, 2560, torch.bfloat16),  # the skinny GEMM's rows: no cuBLAS reduce to remove
        (65, 4096, 2560, torch.bfloat16),  # past the measured rows
        (32, 4104, 2560, torch.bfloat16),  # K not whole 64-element blocks per split
        (32, 512, 256, torch.float32),
    ],
)
def test_outside_its_range_the_op_is_the_composition(mods, m, k, n, dtype):
    gemm, split_norm, fused_cuda = mods
    rng = np.random.default_rng(m + k)
    a, w, residual, norm_w = _case(rng, m, k, n, dtype)
    assert split_norm.split_count(a, w, residual) == 0
    if dtype == torch.bfloat16:
        x_out = torch.empty(m, n, dtype=dtype, device=DEV)
        y, h = _op(mods)(a, w, residual, norm_w, 1e-6, x_out=x_out)
        x = gemm.linear(a, w)
        want_y, want_h = fused_cuda.add_rms_norm(x, residual, norm_w, 1e-6)
        assert torch.equal(_bits(x_out), _bits(x))
        assert torch.equal(_bits(y), _bits(want_y)) and torch.equal(_bits(h), _bits(want_h))
    else:  # fp32 activations: the table's reference ops
        from engine.ops import reference as ref

        y, h = split_norm.linear_add_rms_norm(
            a, w, residual, norm_w, 1e-6, linear=ref.linear, add_rms_norm=ref.add_rms_norm
        )
        want_y, want_h = ref.add_rms_norm(ref.linear(a, w), residual, norm_w, 1e-6)
        assert torch.equal(y, want_y) and torch.equal(h, want_h)

"""Fused elementwise kernels (cuda/norm/fused.cu) on a GPU; the references: tests/ops/test_fused.py.

Each kernel against the fp32-internal torch reference (engine.ops.reference) on the same bf16 inputs,
the composition the model runs today. Bound: the largest error of a row divided by the row's largest
reference value, at most 8e-3, i.e. one bf16 ulp at the row scale (2^-7 = 7.8e-3): the kernels round
where the reference rounds, so only a different fp32 summation order (the norms) or silu_mul's single
rounding (the reference rounds silu(g) first) separates them. The norms must also agree bitwise on
>= 99% of the values. Against the same math on inputs upcast to fp32 (no intermediate bf16 at all) the
bound is one ulp for add_rms_norm (h and y each round once, 2 x 2^-8) and silu_mul, and 2^-6 for
qk_norm_rope_kv, whose rotated values pass through four bf16 roundings in the reference (norm,
cos/sin, both products, their sum). Outputs are poisoned before each run and every run is repeated and
compared bitwise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.ops import reference as ref
from tests.ops.fused_check import BOUND, attn_views, paged, rand
from tests.ops.kernel_check import poison


@pytest.fixture
def fused_cuda():
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from engine.ops.norm import fused_cuda as mod

    return mod


def row_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max over rows of max |got - want| / max |want| (rows = all but the last dim)."""
    g, w = got.float().reshape(-1, got.shape[-1]), want.float().reshape(-1, want.shape[-1])
    assert torch.isfinite(g).all(), "non-finite output (an unwritten, poisoned element?)"
    scale = w.abs().amax(-1).clamp_min(1e-30)
    return ((g - w).abs().amax(-1) / scale).max().item()


def twice(fn, shapes, state=()):
    """Run fn twice on poisoned outputs (restoring ``state`` tensors between); results must match bitwise."""
    saved = [s.clone() for s in state]
    poison(*((s, torch.bfloat16) for s in shapes))
    a = fn()
    after = [s.clone() for s in state]
    for s, v in zip(state, saved, strict=True):
        s.copy_(v)
    poison(*((s, torch.bfloat16) for s in shapes))
    b = fn()
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,), strict=True):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16)), "run-to-run mismatch"
    for s, v in zip(state, after, strict=True):
        assert torch.equal(s, v), "state run-to-run mismatch"
    return a


GPU_N = [1, 3, 63, 1000]


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("d", [64, 128, 256, 2560])
@pytest.mark.parametrize("with_res", [True, False])
def test_add_rms_norm_kernel(fused_cuda, n, d, with_res):
    rng = np.random.default_rng(10 + n + d)
    x = rand(rng, n, d + 16, scale=2.0, dtype=torch.bfloat16, device="cuda")[:, 8 : 8 + d]  # row stride
    res = rand(rng, n, d, scale=4.0, dtype=torch.bfloat16, device="cuda") if with_res else None
    w = rand(rng, d, scale=0.3, dtype=torch.bfloat16, device="cuda")
    y, h = twice(lambda: fused_cuda.add_rms_norm(x, res, w, 1e-6), [(n, d), (n, d)])
    want_y, want_h = ref.add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(h, want_h), "the residual add rounds exactly like torch's bf16 add"
    assert row_err(y, want_y) <= BOUND and (y != want_y).float().mean().item() < 0.01
    hf = x.float() if res is None else res.float() + x.float()
    assert row_err(y, ref.rms_norm(hf, w.float(), 1e-6)) <= BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("d", [64, 2560])
def test_add_rms_norm_kernel_writes_h_in_place(fused_cuda, n, d):
    """h_out = the residual (the piecewise graphs' residual stream, a row-strided view) gets exactly
    the h a separate output gets, and y does not change."""
    rng = np.random.default_rng(30 + n + d)
    x = rand(rng, n, d, scale=2.0, dtype=torch.bfloat16, device="cuda")
    base = rand(rng, n, d + 8, scale=4.0, dtype=torch.bfloat16, device="cuda")
    res0 = base[:, :d].clone()  # the residual before the in-place update below
    w = rand(rng, d, scale=0.3, dtype=torch.bfloat16, device="cuda")
    want_y, want_h = fused_cuda.add_rms_norm(x, base[:, :d].contiguous(), w, 1e-6)
    assert torch.equal(want_h, ref.add_rms_norm(x, base[:, :d], w, 1e-6)[1])
    tail = base[:, d:].clone()
    stream = base[:, :d]  # rows strided by d + 8, as a view into a wider buffer
    y, h = fused_cuda.add_rms_norm(x, stream, w, 1e-6, h_out=stream)
    assert h is stream and torch.equal(stream, want_h) and torch.equal(y, want_y)
    assert torch.equal(base[:, d:], tail), "wrote past the rows' d values"
    with pytest.raises(ValueError, match="h_out needs a residual"):
        fused_cuda.add_rms_norm(x, None, w, 1e-6, h_out=stream)
    # y_out (the piecewise graphs' static x) gets the same y bits; it may not overlap an input
    y_buf = torch.full((n + 1, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    y2, h2 = fused_cuda.add_rms_norm(x, res0, w, 1e-6, y_out=y_buf[:n])
    assert y2.data_ptr() == y_buf.data_ptr() and torch.equal(y2, want_y) and torch.equal(h2, want_h)
    assert torch.isnan(y_buf[n:].float()).all(), "wrote past y_out"
    with pytest.raises(ValueError, match="y_out overlaps x"):
        fused_cuda.add_rms_norm(x, h2, w, 1e-6, y_out=x)
    with pytest.raises(ValueError, match="y_out overlaps residual"):
        fused_cuda.add_rms_norm(x, h2, w, 1e-6, h_out=h2, y_out=h2)


@pytest.mark.gpu
def test_add_rms_norm_kernel_fp32_weight(fused_cuda):
    rng = np.random.default_rng(5)
    x, res = (rand(rng, 63, 2560, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    w = rand(rng, 2560, scale=0.3, device="cuda")
    y, h = fused_cuda.add_rms_norm(x, res, w, 1e-6)
    want_y, want_h = ref.add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(h, want_h) and row_err(y, want_y) <= BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("inter", [9216, 256, 100])
def test_silu_mul_kernel(fused_cuda, n, inter):
    rng = np.random.default_rng(20 + n + inter)
    gu = rand(rng, n, 2 * inter + 16, scale=3.0, dtype=torch.bfloat16, device="cuda")[:, 8 : 8 + 2 * inter]
    out = twice(lambda: fused_cuda.silu_mul(gu), [(n, inter)])
    assert row_err(out, ref.silu_mul(gu)) <= BOUND
    want = ref.silu_mul(gu.float())
    assert row_err(out, want) <= BOUND
    # one rounding of the fp32 value: within half a bf16 ulp (2^-8 relative) of it
    assert ((out.float() - want).abs() <= want.abs() * 2**-8 * (1 + 1e-5) + 1e-30).all()
    # out= (rows of a wider scratch buffer, as the piecewise graphs lend theirs) gets the same bits
    scratch = torch.full(((n + 1) * inter,), float("nan"), dtype=torch.bfloat16, device="cuda")
    dst = scratch[: n * inter].view(n, inter)
    assert fused_cuda.silu_mul(gu, out=dst).data_ptr() == dst.data_ptr() and torch.equal(dst, out)
    assert torch.isnan(scratch[n * inter :].float()).all(), "wrote past out"
    with pytest.raises(ValueError, match="out must be contiguous"):
        fused_cuda.silu_mul(gu, out=scratch[: (n + 1) * inter].view(n + 1, inter))
    # a row-strided out (every other row of a wider buffer) gets the same bits, and nothing between
    wide = torch.full((n, 2 * inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert fused_cuda.silu_mul(gu, out=wide[:, :inter]).data_ptr() == wide.data_ptr()
    assert torch.equal(wide[:, :inter], out) and torch.isnan(wide[:, inter:].float()).all()
    # in place over its own gate half (the piecewise MLP): the same bits, the up half untouched
    own = gu.clone()
    act = fused_cuda.silu_mul(own, out=own[:, :inter])
    assert act.data_ptr() == own.data_ptr() and act.stride(0) == own.stride(0)
    assert torch.equal(act, out) and torch.equal(own[:, inter:], gu[:, inter:])
    if n > 1:  # any other overlap with gu would read values another thread already overwrote
        with pytest.raises(ValueError, match="overlaps gu"):
            fused_cuda.silu_mul(own, out=own[:, 1 : 1 + inter])


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize(
    ("h", "hkv", "d", "rot"), [(16, 4, 256, 64), (4, 2, 64, 64), (4, 2, 128, 128), (8, 1, 128, 24)]
)
@pytest.mark.parametrize("bs", [16, 32])
def test_qk_norm_rope_kv_kernel(fused_cuda, n, h, hkv, d, rot, bs):
    rng = np.random.default_rng(30 + n + d + rot + bs)
    qg, k, v = attn_views(rng, n, h, hkv, d, torch.bfloat16, "cuda")
    qn = rand(rng, d, scale=0.3, dtype=torch.bfloat16, device="cuda")
    kn = rand(rng, d, scale=0.3, dtype=torch.bfloat16, device="cuda")
    pos = torch.from_numpy(rng.integers(0, 200_000, n)).to("cuda")
    kc, vc, slots = paged(rng, n, bs, hkv, d, torch.bfloat16, "cuda")
    kc0, vc0 = kc.clone(), vc.clone()
    args = (1e-6, pos, rot, 1e7)
    q = twice(
        lambda: fused_cuda.qk_norm_rope_kv(qg, k, v, qn, kn, *args, kc, vc, slots), [(n, h, d)], (kc, vc)
    )
    kflat = kc.view(-1, hkv, d)
    assert torch.equal(vc.view(-1, hkv, d)[slots], v)
    untouched = torch.ones(kflat.shape[0], dtype=torch.bool, device="cuda")
    untouched[slots] = False
    assert torch.equal(kflat[untouched], kc0.view(-1, hkv, d)[untouched])
    assert torch.equal(vc.view(-1, hkv, d)[untouched], vc0.view(-1, hkv, d)[untouched])
    # the reference on the same bf16 inputs: the same roundings in the same places
    kcb, vcb = kc0.clone(), vc0.clone()
    qb = ref.qk_norm_rope_kv(qg, k, v, qn, kn, *args, kcb, vcb, slots)
    assert row_err(q, qb) <= BOUND and (q != qb).float().mean().item() < 0.01
    assert row_err(kflat[slots], kcb.view(-1, hkv, d)[slots]) <= BOUND
    assert (kc != kcb).float().mean().item() < 0.01 and torch.equal(vc, vcb)
    # the same math on fp32 inputs, without the reference's intermediate bf16 roundings
    kc32, vc32 = kc0.float(), vc0.float()
    q32 = ref.qk_norm_rope_kv(
        qg.float(), k.float(), v.float(), qn.float(), kn.float(), *args, kc32, vc32, slots
    )
    assert row_err(q, q32) <= 2**-6
    assert row_err(kflat[slots], kc32.view(-1, hkv, d)[slots]) <= 2**-6
    # out= (rows of a wider scratch buffer, as a whole-step graph lends them): the same bits, nothing
    # written past it, the same cache writes
    scratch = torch.full(((n + 1) * h * d + 8,), float("nan"), dtype=torch.bfloat16, device="cuda")
    kc2, vc2 = kc0.clone(), vc0.clone()
    got = fused_cuda.qk_norm_rope_kv(qg, k, v, qn, kn, *args, kc2, vc2, slots, out=scratch[: n * h * d])
    assert got.data_ptr() == scratch.data_ptr() and got.shape == (n, h, d) and torch.equal(got, q)
    assert torch.isnan(scratch[n * h * d :].float()).all(), "wrote past out"
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    with pytest.raises(ValueError, match="16-byte aligned"):
        fused_cuda.qk_norm_rope_kv(qg, k, v, qn, kn, *args, kc2, vc2, slots, out=scratch[4 : 4 + n * h * d])


@pytest.mark.gpu
def test_fused_ops_replay_in_a_cuda_graph(fused_cuda):
    rng = np.random.default_rng(40)
    t, h, hkv, d, hid, inter = 32, 16, 4, 256, 2560, 9216
    x, res = (rand(rng, t, hid, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    w = rand(rng, hid, scale=0.3, dtype=torch.bfloat16, device="cuda")
    gu = rand(rng, t, 2 * inter, dtype=torch.bfloat16, device="cuda")
    qg, k, v = attn_views(rng, t, h, hkv, d, torch.bfloat16, "cuda")
    qn, kn = (rand(rng, d, scale=0.3, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    pos = torch.from_numpy(rng.integers(0, 4096, t)).to("cuda")
    kc, vc, slots = paged(rng, t, 16, hkv, d, torch.bfloat16, "cuda")

    def step():
        y, hh = fused_cuda.add_rms_norm(x, res, w, 1e-6)
        q = fused_cuda.qk_norm_rope_kv(qg, k, v, qn, kn, 1e-6, pos, 64, 1e7, kc, vc, slots)
        return y, hh, fused_cuda.silu_mul(gu), q

    eager = [o.clone() for o in step()]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    for o in outs:
        o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(outs, eager, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_bad_inputs_name_the_tensor(fused_cuda):
    x = torch.zeros(4, 64, dtype=torch.float32, device="cuda")
    w = torch.zeros(64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="add_rms_norm x: expected dtype"):
        fused_cuda.add_rms_norm(x, None, w, 1e-6)
    with pytest.raises(ValueError, match="weight must be"):
        fused_cuda.add_rms_norm(x.bfloat16(), None, w[:32], 1e-6)
    with pytest.raises(ValueError, match="silu_mul gu"):
        fused_cuda.silu_mul(torch.zeros(4, 3, 8, dtype=torch.bfloat16, device="cuda"))

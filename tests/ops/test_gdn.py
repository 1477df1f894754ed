"""Chunked and recurrent gated delta rules vs a per-token fp64 loop, each other, and HF's kernels (CPU);
the CUDA gating, fp32 delta-rule kernels and a graph-captured layer vs the reference (gpu). The
tensor-core chunk (K2+K3) and the fused decode (K4) have their own files, test_gdn_chunk.py and
test_gdn_decode.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.ops import reference as ref
from engine.ops.gdn import gating
from engine.ops.gdn import recurrent as delta
from engine.ops.reference import chunk_gated_delta_rule, recurrent_gated_delta_rule
from tests.ops.kernel_check import DEV, bf16, gdn_inputs, rel, twice, varlen
from tests.ops.kernel_check import LENS as KLENS

DK, DV, S = 16, 8, 12
LENS = [1, 2, 3, 63, 64, 65, 130]


def _qsl(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _inputs(n: int, nk: int, nv: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, nk, DK, generator=gen).to(dtype)
    k = torch.randn(n, nk, DK, generator=gen).to(dtype)
    v = torch.randn(n, nv, DV, generator=gen).to(dtype)
    # realistic gates: g = -exp(A_log) * softplus(a + dt_bias) <= 0, beta = sigmoid(b) in (0, 1)
    g = -torch.rand(nv, generator=gen) * F.softplus(torch.randn(n, nv, generator=gen) - 1.0)
    beta = torch.sigmoid(torch.randn(n, nv, generator=gen))
    return q, k, v, g, beta


def _pool(nv: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(S, nv, DK, DV, generator=gen) * 0.3


def _naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, token by token (all heads at once), fp64. Value head j reads key head j // (Nv // Nk)."""
    n, nk, _ = q.shape
    nv = v.shape[1]
    kv_head = torch.arange(nv) // (nv // nk)  # [Nv]
    s = state.double().clone()  # [Nv, dk, dv]
    out = torch.empty(n, nv, DV, dtype=torch.float64)
    for t in range(n):
        qt, kt = q[t, kv_head].double(), k[t, kv_head].double()  # [Nv, dk]
        qt = qt / torch.sqrt((qt * qt).sum(-1, keepdim=True) + 1e-6) / DK**0.5
        kt = kt / torch.sqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
        s = s * torch.exp(g[t].double())[:, None, None]  # decay first
        delta = beta[t].double()[:, None] * (v[t].double() - torch.einsum("hk,hkv->hv", kt, s))
        s = s + kt[:, :, None] * delta[:, None, :]  # delta-rule write
        out[t] = torch.einsum("hk,hkv->hv", qt, s)  # read after the write
    return out, s


@pytest.mark.parametrize("nk,nv", [(2, 2), (2, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_varlen_vs_loop(nk: int, nv: int, dtype: torch.dtype) -> None:
    lens = LENS + [2, 66]
    q, k, v, g, beta = _inputs(sum(lens), nk, nv, dtype, seed=1)
    pool = _pool(nv, seed=2)
    before = pool.clone()
    gen = torch.Generator().manual_seed(3)
    slots = (torch.randperm(S - 1, generator=gen)[: len(lens)] + 1).to(torch.int32)
    has = torch.tensor([i % 2 == 0 for i in range(len(lens))])
    out = chunk_gated_delta_rule(q, k, v, g, beta, pool, _qsl(lens), slots, has, max(lens))
    assert out.dtype == dtype and out.shape == v.shape
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    start = 0
    for i, n in enumerate(lens):
        init = before[slots[i]] if has[i] else torch.zeros(nv, DK, DV)
        sl = slice(start, start + n)
        ref, state = _naive(q[sl], k[sl], v[sl], g[sl], beta[sl], init)
        torch.testing.assert_close(out[sl].double(), ref, atol=tol, rtol=tol)
        torch.testing.assert_close(pool[slots[i]].double(), state, atol=1e-4, rtol=1e-4)
        start += n
    untouched = [s for s in range(S) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recurrent_batch_vs_loop(dtype: torch.dtype) -> None:
    nk, nv, b = 2, 4, 5
    q, k, v, g, beta = _inputs(b, nk, nv, dtype, seed=4)
    pool = _pool(nv, seed=5)
    before = pool.clone()
    slots = torch.tensor([3, 9, 1, 11, 6], dtype=torch.int32)
    out = recurrent_gated_delta_rule(q, k, v, g, beta, pool, slots)
    assert out.dtype == dtype and out.shape == v.shape
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for i in range(b):
        ref, state = _naive(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], before[slots[i]]
        )
        torch.testing.assert_close(out[i].double(), ref[0], atol=tol, rtol=tol)
        torch.testing.assert_close(pool[slots[i]].double(), state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("has_init", [False, True])
def test_chunk_vs_recurrent_65_tokens(has_init: bool) -> None:
    nk, nv, n = 2, 4, 65
    q, k, v, g, beta = _inputs(n, nk, nv, torch.float32, seed=6)
    pool_c = _pool(nv, seed=7)
    pool_r = pool_c.clone()
    slot = torch.tensor([4], dtype=torch.int32)
    if not has_init:
        pool_r[4] = 0.0  # the recurrent op always reads its slot: start it from zeros
    out_c = chunk_gated_delta_rule(q, k, v, g, beta, pool_c, _qsl([n]), slot, torch.tensor([has_init]), n)
    out_r = torch.cat(
        [
            recurrent_gated_delta_rule(
                q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], pool_r, slot
            )
            for t in range(n)
        ]
    )
    torch.testing.assert_close(out_c, out_r, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool_c, pool_r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("split", [1, 2, 7, 64])
def test_chunk_split_continuation(split: int) -> None:
    nk, nv, n = 2, 2, 80
    q, k, v, g, beta = _inputs(n, nk, nv, torch.float32, seed=8)
    pool = _pool(nv, seed=9)
    one, two = pool.clone(), pool.clone()
    slot = torch.tensor([2], dtype=torch.int32)
    ref = chunk_gated_delta_rule(q, k, v, g, beta, one, _qsl([n]), slot, torch.tensor([False]), n)
    a, b_ = slice(0, split), slice(split, n)
    o1 = chunk_gated_delta_rule(
        q[a], k[a], v[a], g[a], beta[a], two, _qsl([split]), slot, torch.tensor([False]), split
    )
    o2 = chunk_gated_delta_rule(
        q[b_], k[b_], v[b_], g[b_], beta[b_], two, _qsl([n - split]), slot, torch.tensor([True]), n - split
    )
    torch.testing.assert_close(torch.cat([o1, o2]), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(two, one, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n", [1, 65, 130])
@pytest.mark.parametrize("nk,nv", [(2, 2), (2, 4)])
def test_bit_exact_vs_hf(n: int, nk: int, nv: int) -> None:
    m = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    q, k, v, g, beta = _inputs(n, nk, nv, torch.float32, seed=10)
    pool = _pool(nv, seed=11)
    init = pool[5].clone()
    slot = torch.tensor([5], dtype=torch.int32)
    out = chunk_gated_delta_rule(q, k, v, g, beta, pool, _qsl([n]), slot, torch.tensor([True]), n)
    # HF's layer repeats the key heads before it calls the function (older versions of the function
    # take equal head counts only), so it is given them repeated
    rep = nv // nk
    ref, ref_state = m.torch_chunk_gated_delta_rule(
        q.repeat_interleave(rep, dim=1)[None],
        k.repeat_interleave(rep, dim=1)[None],
        v[None],
        g[None],
        beta[None],
        initial_state=init[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(out, ref[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(pool[5], ref_state[0], atol=1e-6, rtol=0)

    # recurrent: HF with batch b and one token each is exactly our decode batch
    pool = _pool(nv, seed=12)
    slots = torch.tensor([7, 2, 9], dtype=torch.int32)
    init = pool[slots.long()].clone()
    q, k, v, g, beta = _inputs(3, nk, nv, torch.float32, seed=13)
    out = recurrent_gated_delta_rule(q, k, v, g, beta, pool, slots)
    ref, ref_state = m.torch_recurrent_gated_delta_rule(
        q.repeat_interleave(rep, dim=1)[:, None],
        k.repeat_interleave(rep, dim=1)[:, None],
        v[:, None],
        g[:, None],
        beta[:, None],
        initial_state=init,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(out, ref[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(pool[slots.long()], ref_state, atol=1e-6, rtol=0)


# CUDA kernels ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("a_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d_dtype", [torch.float32, torch.bfloat16])
def test_gating(a_dtype, d_dtype):
    """Both parameters read in their own dtype (the model's are bf16; no widened copies)."""
    torch.manual_seed(0)
    T, nv = 1100, 32
    ab = bf16(T, 3 * nv, scale=3.0)
    a, b = ab[:, :nv], ab[:, nv : 2 * nv]  # strided column slices, as from a fused projection
    A_log = (torch.rand(nv, device=DEV) * 3 - 1).to(a_dtype)
    dt_bias = bf16(nv).to(d_dtype)
    g_ref, beta_ref = ref.gdn_gating(a, b, A_log, dt_bias)
    g, beta = twice(lambda: gating.gdn_gating(a, b, A_log, dt_bias), [], ((T, nv), torch.float32))
    assert rel(g, g_ref) < 1e-5
    assert rel(beta, beta_ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_gated_delta_rule(ratio, init):
    torch.manual_seed(0)
    nk, S = 2, 12
    nv = nk * ratio
    qsl, slots, hinit, maxlen, B = varlen(KLENS, [init, not init] * 4, seed=2)
    T = int(qsl[-1])
    q, k, v, g, beta = gdn_inputs(T, nk, nv, scale_g=0.3)
    st0 = torch.randn(S, nv, 128, 128, device=DEV) * 0.1
    st_ref, st = st0.clone(), st0.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, st_ref, qsl, slots, hinit, maxlen)
    got = twice(
        lambda: delta.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, maxlen),
        [st],
        ((T, nv, 128), torch.bfloat16),
    )
    assert rel(got, want) < 2e-3
    for s in slots[slots > 0].tolist():
        assert rel(st[s], st_ref[s]) < 1e-3, f"slot {s}"
    assert torch.equal(st[0], st0[0])


@pytest.mark.gpu
@pytest.mark.parametrize("ratio", [1, 2])
def test_recurrent_gated_delta_rule(ratio):
    torch.manual_seed(0)
    nk, S, B = 16 // ratio, 40, 33
    nv = nk * ratio
    q, k, v, g, beta = gdn_inputs(B, nk, nv)
    slots = torch.randperm(S - 1, device=DEV)[:B].to(torch.int32) + 1
    slots[7] = 0
    st0 = torch.randn(S, nv, 128, 128, device=DEV) * 0.1
    st_ref, st = st0.clone(), st0.clone()
    want = ref.recurrent_gated_delta_rule(q, k, v, g, beta, st_ref, slots)
    got = twice(
        lambda: delta.recurrent_gated_delta_rule(q, k, v, g, beta, st, slots),
        [st],
        ((B, nv, 128), torch.bfloat16),
    )
    keep = slots > 0
    assert rel(got[keep], want[keep]) < 2e-3
    for s in slots[keep].tolist():
        assert rel(st[s], st_ref[s]) < 1e-3
    assert torch.equal(st[0], st0[0])


@pytest.mark.gpu
def test_cuda_graph_decode_and_prefill_equal_eager():
    """conv decode + gating + recurrent + norm, and a varlen prefill, captured and replayed."""
    torch.manual_seed(0)
    from engine.ops.arms import cuda_overrides

    ops = cuda_overrides(frozenset({"conv.chunk8", "conv.k4"}))
    B, C, nk, nv, S = 8, 8192, 16, 32, 12
    x = bf16(B, C)
    w = bf16(C, 4, scale=0.5)
    ab = bf16(B, 2 * nv)
    A_log, dt_bias = torch.rand(nv, device=DEV), bf16(nv)
    z = bf16(B * nv, 128)
    nw = torch.rand(128, device=DEV) + 0.5
    slots = torch.arange(1, B + 1, dtype=torch.int32, device=DEV)
    cst0, sst0 = bf16(S, C, 3), torch.randn(S, nv, 128, 128, device=DEV) * 0.1
    cst, sst = cst0.clone(), sst0.clone()

    def step():
        y = ops["causal_conv1d_decode"](x, w, cst, slots)
        q, k, v = y[:, :2048].view(B, nk, 128), y[:, 2048:4096].view(B, nk, 128), y[:, 4096:].view(B, nv, 128)
        g, beta = ops["gdn_gating"](ab[:, :nv], ab[:, nv:], A_log, dt_bias)
        o = ops["recurrent_gated_delta_rule"](q, k, v, g, beta, sst, slots)
        return ops["gated_rms_norm"](o.view(-1, 128), z, nw, 1e-6)

    qsl, pslots, hinit, maxlen, _ = varlen((5, 64, 130), [True, False, True], seed=3)
    T = int(qsl[-1])
    px, pw = bf16(T, C), w
    pg, pb = -torch.rand(T, nv, device=DEV) * 0.3, torch.rand(T, nv, device=DEV)

    def prefill():
        y = ops["causal_conv1d_prefill"](px, pw, cst, qsl, pslots, hinit, maxlen)
        q, k, v = y[:, :2048].view(T, nk, 128), y[:, 2048:4096].view(T, nk, 128), y[:, 4096:].view(T, nv, 128)
        return ops["chunk_gated_delta_rule"](q, k, v, pg, pb, sst, qsl, pslots, hinit, maxlen)

    def both():
        return prefill(), step()

    eager = both()  # also compiles everything before capture
    eager_states = (cst.clone(), sst.clone())
    cst.copy_(cst0)
    sst.copy_(sst0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = both()
    cst.copy_(cst0)
    sst.copy_(sst0)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(static, eager, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(cst, eager_states[0]) and torch.equal(sst, eager_states[1])

"""CUDA GDN kernels (engine.ops.arms) against the fp32 torch reference (engine.ops.reference).

Every kernel and arm on random data: varlen batches with lengths 1, 2, 3, 63, 64, 65, 1000, with and
without initial state, Nv = Nk and Nv = 2 Nk, a padding sequence (slot 0) in every batch; outputs
poisoned before each run; each run twice and compared bitwise; a CUDA-graph replay equal to eager.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.ops import reference as ref  # noqa: E402
from engine.ops.conv import cuda as conv  # noqa: E402
from engine.ops.gdn import gating  # noqa: E402
from engine.ops.gdn import recurrent as delta  # noqa: E402
from engine.ops.norm import cuda as norm  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
LENS = (1, 2, 3, 63, 64, 65, 1000)
CONV_ARMS = [
    frozenset(),
    frozenset({"conv.chunk8"}),
    frozenset({"conv.chunk8", "conv.k4"}),
    frozenset({"conv.chunk8", "conv.vec4"}),
    frozenset({"conv.chunk8", "conv.k4", "conv.vec4"}),
]


def poison(*shapes_dtypes) -> None:
    """Fill, then free, blocks of the sizes the op will allocate, so torch's caching allocator hands
    the op NaN-filled memory: an element the kernel forgets to write stays NaN."""
    for shape, dtype in shapes_dtypes:
        torch.empty(shape, dtype=dtype, device=DEV).fill_(float("nan"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all(), "non-finite values (an unwritten or poisoned element?)"
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def varlen(lens, init_mask, seed):
    """qsl [B+1], slots [B] (a zero-length padding sequence with slot 0 appended), has_init [B]."""
    g = torch.Generator().manual_seed(seed)
    lens = list(lens) + [0]
    B = len(lens)
    qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    slots = (torch.randperm(B - 1, generator=g) + 1).tolist() + [0]
    has_init = list(init_mask)[: B - 1] + [False]
    return (
        qsl.to(DEV),
        torch.tensor(slots, dtype=torch.int32, device=DEV),
        torch.tensor(has_init, device=DEV),
        max(lens),
        B,
    )


def bf16(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(torch.bfloat16)


def twice(fn, pools, *poison_spec):
    """Run fn twice from the same pool contents; both runs must agree bitwise."""
    saved = [p.clone() for p in pools]
    poison(*poison_spec)
    out1 = fn()
    after1 = [p.clone() for p in pools]
    for p, s in zip(pools, saved, strict=True):
        p.copy_(s)
    poison(*poison_spec)
    out2 = fn()
    outs1 = out1 if isinstance(out1, tuple) else (out1,)
    outs2 = out2 if isinstance(out2, tuple) else (out2,)
    for a, b in zip(outs1, outs2, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) or torch.equal(a, b), (
            "run-to-run mismatch"
        )
    for a, p in zip(after1, pools, strict=True):
        assert torch.equal(a, p), "state run-to-run mismatch"
    return out1


@pytest.mark.parametrize("arms", CONV_ARMS, ids=lambda a: "+".join(sorted(a)) or "plain")
@pytest.mark.parametrize("init", [False, True])
def test_conv_prefill(arms, init):
    torch.manual_seed(0)
    C, K, S = 512, 4, 12
    qsl, slots, hinit, maxlen, B = varlen(LENS, [init, not init] * 4, seed=1)
    T = int(qsl[-1])
    x = bf16(T + 3, C)[3:]  # offset view: a row stride check without misalignment (3 * 512 * 2 bytes)
    w = bf16(C, K, scale=0.5)
    st0 = bf16(S, C, K - 1)
    st_ref, st = st0.clone(), st0.clone()
    want = ref.causal_conv1d_prefill(x, w, st_ref, qsl, slots, hinit, maxlen)
    got = twice(
        lambda: conv.causal_conv1d_prefill(x, w, st, qsl, slots, hinit, maxlen, arms=arms),
        [st],
        ((T, C), torch.bfloat16),
    )
    assert rel(got, want) < 2e-3
    live = slots[slots > 0].long()
    assert torch.equal(st[live], st_ref[live])
    assert torch.equal(st[0], st0[0]), "padding slot 0 must not be written"


@pytest.mark.parametrize("arms", CONV_ARMS[:3], ids=lambda a: "+".join(sorted(a)) or "plain")
def test_conv_decode(arms):
    torch.manual_seed(0)
    C, K, S, B = 8192, 4, 40, 33
    x = bf16(B, C)
    w = bf16(C, K, scale=0.5)
    st0 = bf16(S, C, K - 1)
    slots = torch.randperm(S - 1, device=DEV)[:B].to(torch.int32) + 1
    slots[5] = 0  # padding row
    st_ref, st = st0.clone(), st0.clone()
    want = ref.causal_conv1d_decode(x, w, st_ref, slots)
    got = twice(lambda: conv.causal_conv1d_decode(x, w, st, slots, arms=arms), [st], ((B, C), torch.bfloat16))
    keep = torch.ones(B, dtype=torch.bool, device=DEV)
    keep[5] = False
    assert rel(got[keep], want[keep]) < 2e-3
    live = slots[keep].long()
    assert torch.equal(st[live], st_ref[live])
    assert torch.equal(st[0], st0[0])


def test_gating():
    torch.manual_seed(0)
    T, nv = 1100, 32
    ab = bf16(T, 3 * nv, scale=3.0)
    a, b = ab[:, :nv], ab[:, nv : 2 * nv]  # strided column slices, as from a fused projection
    A_log = torch.rand(nv, device=DEV) * 3 - 1
    dt_bias = bf16(nv)
    g_ref, beta_ref = ref.gdn_gating(a, b, A_log, dt_bias)
    g, beta = twice(lambda: gating.gdn_gating(a, b, A_log, dt_bias), [], ((T, nv), torch.float32))
    assert rel(g, g_ref) < 1e-5
    assert rel(beta, beta_ref) < 1e-5


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


def gdn_inputs(T, nk, nv, scale_g=1.0):
    q = bf16(T, nk, 128)
    k = bf16(T, nk, 128)
    v = bf16(T, nv, 128)
    g = -torch.rand(T, nv, device=DEV) * scale_g  # log decay <= 0
    beta = torch.rand(T, nv, device=DEV).to(torch.bfloat16).float()
    return q, k, v, g, beta


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_gated_delta_rule(ratio, init):
    torch.manual_seed(0)
    nk, S = 2, 12
    nv = nk * ratio
    qsl, slots, hinit, maxlen, B = varlen(LENS, [init, not init] * 4, seed=2)
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

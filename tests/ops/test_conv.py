"""causal_conv1d_prefill / _decode: the reference vs a per-token loop, HF's conv functions and split
continuation (CPU); the CUDA kernels and their arms vs the reference (gpu)."""

from __future__ import annotations

import pytest
import torch

from engine.ops import reference as ref
from engine.ops.conv import cuda as conv
from engine.ops.reference import causal_conv1d_decode, causal_conv1d_prefill
from tests.ops.kernel_check import DEV, bf16, rel, twice, varlen
from tests.ops.kernel_check import LENS as KLENS

C, K, S = 24, 4, 12
LENS = [1, 2, 3, 63, 64, 65, 130]


def _qsl(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _naive(x: torch.Tensor, hist: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loop in fp64: x [n, C], hist [C, K-1] (the K-1 previous inputs) -> (out [n, C], state)."""
    full = torch.cat([hist.double().T, x.double()], dim=0)  # [K-1+n, C]
    out = torch.empty(x.shape[0], C, dtype=torch.float64)
    for t in range(x.shape[0]):
        acc = torch.zeros(C, dtype=torch.float64)
        for j in range(K):
            acc += w[:, j].double() * full[t + j]
        out[t] = acc * torch.sigmoid(acc)
    return out, full[-(K - 1) :].T


def _setup(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(C, K, generator=gen) * 0.5).to(dtype)
    pool = torch.randn(S, C, K - 1, generator=gen).to(dtype)
    return w, pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_varlen_vs_loop(dtype: torch.dtype) -> None:
    w, pool = _setup(dtype, 0)
    gen = torch.Generator().manual_seed(1)
    lens = LENS + [2, 65, 1]  # the trailing 1 has history: its new state is 2 old columns + 1 input
    x = torch.randn(sum(lens), C, generator=gen).to(dtype)
    slots = torch.randperm(S - 1, generator=gen)[: len(lens)].to(torch.int32) + 1
    has = torch.tensor([i % 2 == 1 for i in range(len(lens))])
    before = pool.clone()
    out = causal_conv1d_prefill(x, w, pool, _qsl(lens), slots, has, max(lens))
    assert out.dtype == dtype and out.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    start = 0
    for i, n in enumerate(lens):
        hist = before[slots[i]] if has[i] else torch.zeros(C, K - 1, dtype=dtype)
        ref, state = _naive(x[start : start + n], hist, w)
        torch.testing.assert_close(out[start : start + n].double(), ref, atol=tol, rtol=tol)
        # the state holds raw inputs, so it is an exact copy (history included when n < K-1)
        assert torch.equal(pool[slots[i]].double(), state)
        start += n
    untouched = [s for s in range(S) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("split", [1, 2, 7, 64])
def test_prefill_split_continuation(split: int) -> None:
    w, pool = _setup(torch.float32, 2)
    gen = torch.Generator().manual_seed(3)
    n = 80
    x = torch.randn(n, C, generator=gen)
    slot = torch.tensor([5], dtype=torch.int32)
    one = pool.clone()
    ref = causal_conv1d_prefill(x, w, one, _qsl([n]), slot, torch.tensor([False]), n)
    two = pool.clone()
    a = causal_conv1d_prefill(x[:split], w, two, _qsl([split]), slot, torch.tensor([False]), split)
    b = causal_conv1d_prefill(x[split:], w, two, _qsl([n - split]), slot, torch.tensor([True]), n - split)
    torch.testing.assert_close(torch.cat([a, b]), ref, atol=1e-6, rtol=1e-6)
    assert torch.equal(two, one)


def test_decode_continuation_and_loop() -> None:
    w, pool = _setup(torch.float32, 4)
    gen = torch.Generator().manual_seed(5)
    n, prompt = 9, 2  # prompt shorter than K-1: the state mixes zero padding and inputs
    xs = torch.randn(3, n, C, generator=gen)  # three sequences decoded together
    slots = torch.tensor([7, 2, 9], dtype=torch.int32)
    one = pool.clone()
    refs = []
    for b in range(3):
        refs.append(
            causal_conv1d_prefill(xs[b], w, one, _qsl([n]), slots[b : b + 1], torch.tensor([False]), n)
        )
    flat = xs[:, :prompt].reshape(-1, C)
    out = [
        causal_conv1d_prefill(flat, w, pool, _qsl([prompt] * 3), slots, torch.zeros(3, dtype=torch.bool), 2)
    ]
    for t in range(prompt, n):
        out.append(causal_conv1d_decode(xs[:, t], w, pool, slots))
    got = torch.cat([out[0].view(3, prompt, C), torch.stack(out[1:], dim=1)], dim=1)  # [3, n, C]
    torch.testing.assert_close(got, torch.stack(refs), atol=1e-6, rtol=1e-6)
    assert torch.equal(pool[slots.long()], one[slots.long()])
    for b in range(3):
        ref, _ = _naive(xs[b], torch.zeros(C, K - 1), w)
        torch.testing.assert_close(got[b].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bit_exact_vs_hf(dtype: torch.dtype) -> None:
    m = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    w, pool = _setup(dtype, 6)
    gen = torch.Generator().manual_seed(7)
    n = 70
    x = torch.randn(n, C, generator=gen).to(dtype)
    slot = torch.tensor([3], dtype=torch.int32)
    # prefill without history: HF runs causal_conv1d_fn on [1, C, n] with left padding K-1
    ref = m.causal_conv1d_fn(x.T[None], w, None, activation="silu")[0].T
    out = causal_conv1d_prefill(x, w, pool, _qsl([n]), slot, torch.tensor([False]), n)
    assert torch.equal(out, ref)
    # decode: HF keeps K state columns, the oldest never reaches the output
    hf_state = torch.cat([torch.randn(C, 1, generator=gen).to(dtype), pool[3]], dim=-1)[None]  # [1, C, K]
    xt = torch.randn(1, C, generator=gen).to(dtype)
    ref_t = m.causal_conv1d_update(xt[:, :, None], hf_state, w, None, activation="silu")[:, :, 0]
    out_t = causal_conv1d_decode(xt, w, pool, slot)
    assert torch.equal(out_t, ref_t)
    assert torch.equal(pool[3], hf_state[0, :, 1:])


# CUDA kernels ----------------------------------------------------------------------------------
CONV_ARMS = [
    frozenset(),
    frozenset({"conv.chunk8"}),
    frozenset({"conv.chunk8", "conv.k4"}),
    frozenset({"conv.chunk8", "conv.vec4"}),
    frozenset({"conv.chunk8", "conv.k4", "conv.vec4"}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("arms", CONV_ARMS, ids=lambda a: "+".join(sorted(a)) or "plain")
@pytest.mark.parametrize("init", [False, True])
def test_conv_prefill(arms, init):
    torch.manual_seed(0)
    C, K, S = 512, 4, 12
    qsl, slots, hinit, maxlen, B = varlen(KLENS, [init, not init] * 4, seed=1)
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
    # into a static buffer (a whole-step graph's): the same bits there, in the reference too
    st.copy_(st0)
    buf = torch.full((T * C,), float("nan"), dtype=torch.bfloat16, device=DEV)
    into = conv.causal_conv1d_prefill(x, w, st, qsl, slots, hinit, maxlen, out=buf, arms=arms)
    assert into.data_ptr() == buf.data_ptr() and torch.equal(into, got)
    st_ref.copy_(st0)
    assert torch.equal(ref.causal_conv1d_prefill(x, w, st_ref, qsl, slots, hinit, maxlen, out=buf), want)
    with pytest.raises(ValueError, match="out must be contiguous"):
        conv.causal_conv1d_prefill(x, w, st, qsl, slots, hinit, maxlen, out=buf[:-8], arms=arms)


@pytest.mark.gpu
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

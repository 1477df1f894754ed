"""The torch reference delta rules with a bf16 recurrent-state pool (--mamba-ssm-cache-dtype bfloat16):
against a naive fp32 token loop that rounds the state to bf16 exactly where the ops store it (after
every decode step; at the end of a prefill call, never between its 64-token chunks), and against the
same ops on an fp32 pool holding the same values (equal outputs, the state equal once rounded). The
pool allocation in each dtype and its byte count. Seeded data from numpy Generators. The CUDA
kernels' bf16 cases: test_gdn_state_cuda.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.cache import CacheSpec, ModelCache, state_bytes_per_slot
from engine.model.qwen3_5.config import Qwen35Config
from engine.ops.reference import chunk_gated_delta_rule, recurrent_gated_delta_rule

DK, DV, S = 16, 8, 12
BF16 = torch.bfloat16
ULP = 2.0**-7  # a bf16 ulp relative to the value is at most 2^-7


def _t(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))


def _inputs(rng: np.random.Generator, n: int, nk: int, nv: int) -> tuple[torch.Tensor, ...]:
    q, k, v = _t(rng, n, nk, DK), _t(rng, n, nk, DK), _t(rng, n, nv, DV)
    g = torch.from_numpy(-rng.uniform(0.0, 0.5, (n, nv)).astype(np.float32))  # log decay <= 0
    beta = torch.from_numpy(rng.uniform(0.0, 1.0, (n, nv)).astype(np.float32))
    return q, k, v, g, beta


def _bf16_pool(rng: np.random.Generator, nv: int) -> torch.Tensor:
    return _t(rng, S, nv, DK, DV, scale=0.3).to(BF16)


def _qsl(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32)


def _naive(
    q, k, v, g, beta, state: torch.Tensor, round_each_token: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence token by token in fp32 from ``state`` (fp32 values); the state is rounded to bf16
    after every token when ``round_each_token`` (decode steps), else the caller rounds it once."""
    n, nk, _ = q.shape
    nv = v.shape[1]
    head = torch.arange(nv) // (nv // nk)
    s = state.float().clone()
    out = torch.empty(n, nv, DV)
    for t in range(n):
        qt, kt = q[t, head].float(), k[t, head].float()
        qt = qt * torch.rsqrt((qt * qt).sum(-1, keepdim=True) + 1e-6) * DK**-0.5
        kt = kt * torch.rsqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
        s = s * torch.exp(g[t])[:, None, None]
        d = beta[t][:, None] * (v[t].float() - torch.einsum("hk,hkv->hv", kt, s))
        s = s + kt[:, :, None] * d[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", qt, s)  # from the fp32 state, before any rounding
        if round_each_token:
            s = s.to(BF16).float()
    return out, s


def _assert_bf16_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """bf16 values rounded from fp32 values that differ only by fp32 rounding: equal, or one ulp off."""
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), want.to(BF16).float(), rtol=ULP, atol=1e-6, msg=what)
    same = (got == want.to(BF16)).float().mean().item()
    assert same > 0.97, f"{what}: only {same:.3f} of the elements round alike"


@pytest.mark.parametrize("nk,nv", [(2, 2), (2, 4)])
def test_recurrent_bf16_state_rounded_after_every_step(nk: int, nv: int) -> None:
    rng = np.random.default_rng(1)
    b, steps = 5, 6
    pool = _bf16_pool(rng, nv)
    before = pool.clone()
    slots = torch.tensor([3, 9, 1, 11, 6], dtype=torch.int32)
    naive = [before[s].float() for s in slots.tolist()]
    for step in range(steps):
        q, k, v, g, beta = _inputs(rng, b, nk, nv)
        out = recurrent_gated_delta_rule(q, k, v, g, beta, pool, slots)
        assert pool.dtype == BF16 and out.dtype == torch.float32
        for i, s in enumerate(slots.tolist()):
            o, naive[i] = _naive(
                q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], naive[i], True
            )
            torch.testing.assert_close(out[i], o[0], rtol=1e-4, atol=1e-5)
            _assert_bf16_close(pool[s], naive[i], f"step {step} slot {s}")
            naive[i] = pool[s].float()  # continue from what the pool holds, as the next step does
    untouched = [s for s in range(S) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("nk,nv", [(2, 2), (2, 4)])
def test_chunk_bf16_state_rounded_once_per_call(nk: int, nv: int) -> None:
    rng = np.random.default_rng(2)
    lens = [1, 2, 3, 63, 64, 65, 130]
    q, k, v, g, beta = _inputs(rng, sum(lens), nk, nv)
    pool = _bf16_pool(rng, nv)
    before = pool.clone()
    slots = torch.from_numpy(rng.permutation(S - 1)[: len(lens)] + 1).to(torch.int32)
    has = torch.tensor([i % 2 == 0 for i in range(len(lens))])
    out = chunk_gated_delta_rule(q, k, v, g, beta, pool, _qsl(lens), slots, has, max(lens))
    start = 0
    for i, n in enumerate(lens):
        init = before[slots[i]].float() if has[i] else torch.zeros(nv, DK, DV)
        sl = slice(start, start + n)
        o, state = _naive(q[sl], k[sl], v[sl], g[sl], beta[sl], init, False)
        torch.testing.assert_close(out[sl], o, rtol=1e-4, atol=1e-4)
        _assert_bf16_close(pool[slots[i]], state, f"sequence {i} ({n} tokens)")
        start += n
    untouched = [s for s in range(S) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("split", [1, 7, 64])
def test_chunk_bf16_state_split_rounds_at_the_split(split: int) -> None:
    """A prefill in two calls (two scheduler chunks) rounds the state once more, at the split."""
    rng = np.random.default_rng(3)
    nk, nv, n = 2, 2, 80
    q, k, v, g, beta = _inputs(rng, n, nk, nv)
    pool = _bf16_pool(rng, nv)
    slot = torch.tensor([2], dtype=torch.int32)
    a, b = slice(0, split), slice(split, n)
    o1 = chunk_gated_delta_rule(
        q[a], k[a], v[a], g[a], beta[a], pool, _qsl([split]), slot, torch.tensor([False]), split
    )
    o2 = chunk_gated_delta_rule(
        q[b], k[b], v[b], g[b], beta[b], pool, _qsl([n - split]), slot, torch.tensor([True]), n - split
    )
    w1, s1 = _naive(q[a], k[a], v[a], g[a], beta[a], torch.zeros(nv, DK, DV), False)
    w2, s2 = _naive(q[b], k[b], v[b], g[b], beta[b], s1.to(BF16).float(), False)
    torch.testing.assert_close(torch.cat([o1, o2]), torch.cat([w1, w2]), rtol=1e-4, atol=1e-4)
    _assert_bf16_close(pool[2], s2, f"split {split}")


@pytest.mark.parametrize("op", ["recurrent", "chunk"])
def test_bf16_pool_equals_fp32_pool_rounded(op: str) -> None:
    """Same values in an fp32 and a bf16 pool: identical outputs (both read fp32 values and compute
    in fp32), and the bf16 pool holds exactly the fp32 pool's new state rounded to bf16."""
    rng = np.random.default_rng(4)
    nk, nv = 2, 4
    p16 = _bf16_pool(rng, nv)
    p32 = p16.float()
    if op == "recurrent":
        slots = torch.tensor([3, 9, 1], dtype=torch.int32)
        args = _inputs(rng, 3, nk, nv)
        o16 = recurrent_gated_delta_rule(*args, p16, slots)
        o32 = recurrent_gated_delta_rule(*args, p32, slots)
    else:
        lens = [5, 64, 70]
        slots = torch.tensor([4, 2, 8], dtype=torch.int32)
        args = _inputs(rng, sum(lens), nk, nv)
        has = torch.tensor([True, False, True])
        o16 = chunk_gated_delta_rule(*args, p16, _qsl(lens), slots, has, max(lens))
        o32 = chunk_gated_delta_rule(*args, p32, _qsl(lens), slots, has, max(lens))
    assert torch.equal(o16, o32)
    assert torch.equal(p16, p32.to(BF16))


def _spec_4b() -> CacheSpec:
    from engine.checkpoints.presets import qwen35_4b_config
    from engine.model.qwen3_5.model import cache_spec

    return cache_spec(Qwen35Config.from_dict(qwen35_4b_config()))


def test_state_slot_bytes_of_the_4b_halve_with_a_bf16_state() -> None:
    spec = _spec_4b()
    conv = 24 * 8192 * 3 * 2  # 24 GDN layers, conv state [8192, 3] bf16
    assert state_bytes_per_slot(spec, BF16) == conv + 48 * 2**20  # fp32 recurrent state: 48 MiB
    assert state_bytes_per_slot(spec, BF16, torch.float32) == conv + 48 * 2**20
    assert state_bytes_per_slot(spec, BF16, BF16) == conv + 24 * 2**20


@pytest.mark.parametrize("ssm_dtype", [torch.float32, BF16])
def test_pool_allocation_in_the_ssm_dtype(ssm_dtype: torch.dtype) -> None:
    spec = CacheSpec(2, (2, 8), 3, (24, 3), (4, DK, DV))
    cache = ModelCache.allocate(spec, 4, 16, 5, torch.float32, "cpu", ssm_dtype=ssm_dtype)
    assert [t.dtype for t in cache.ssm_state] == [ssm_dtype] * 3
    assert all(t.dtype == torch.float32 for t in cache.conv_state + cache.k_cache + cache.v_cache)
    assert all(tuple(t.shape) == (5, 4, DK, DV) for t in cache.ssm_state)
    held = sum(t.numel() * t.element_size() for t in cache.conv_state + cache.ssm_state)
    assert held == 5 * state_bytes_per_slot(spec, torch.float32, ssm_dtype)
    assert ModelCache.allocate(spec, 4, 16, 5, torch.float32, "cpu").ssm_state[0].dtype == torch.float32


def test_pool_refuses_other_state_dtypes() -> None:
    spec = CacheSpec(1, (2, 8), 1, (24, 3), (4, DK, DV))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        ModelCache.allocate(spec, 4, 16, 3, torch.float32, "cpu", ssm_dtype=torch.float16)

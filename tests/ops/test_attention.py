"""apply_rope, write_kv and paged_attention vs per-token / per-sequence loops and HF's rotary code."""

from __future__ import annotations

import math

import pytest
import torch

from engine.ops.attention import reference as attn_mod
from engine.ops.reference import apply_rope, paged_attention, write_kv

D = 32


def _qsl(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_vs_loop_and_hf(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    rot, theta = 16, 1e7
    q = torch.randn(6, 4, D, generator=gen).to(dtype)
    k = torch.randn(6, 2, D, generator=gen).to(dtype)
    positions = torch.tensor([0, 1, 2, 7, 1000, 5])
    qo, ko = apply_rope(q, k, positions, rot, theta)
    assert qo.dtype == dtype and ko.shape == k.shape
    # untouched tail
    assert torch.equal(qo[..., rot:], q[..., rot:]) and torch.equal(ko[..., rot:], k[..., rot:])
    # naive: dim i pairs with i + rot/2, angle pos * theta^(-2i/rot), in fp64
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for t in range(6):
        for i in range(rot // 2):
            ang = positions[t].item() * theta ** (-2 * i / rot)
            c, s = math.cos(ang), math.sin(ang)
            for x, o in ((q, qo), (k, ko)):
                a, b = x[t, :, i].double(), x[t, :, i + rot // 2].double()
                torch.testing.assert_close(o[t, :, i].double(), a * c - b * s, atol=tol, rtol=tol)
                torch.testing.assert_close(o[t, :, i + rot // 2].double(), b * c + a * s, atol=tol, rtol=tol)
    # bit-exact vs HF: inv_freq as HF's default rope init, cos/sin cast to the activation dtype
    m = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    freqs = positions[None, :, None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)  # [1, T, rot]
    rq, rk = m.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    assert torch.equal(qo, rq[0].transpose(0, 1)) and torch.equal(ko, rk[0].transpose(0, 1))


def test_write_kv() -> None:
    gen = torch.Generator().manual_seed(1)
    kc, vc = torch.randn(2, 5, 4, 2, D, generator=gen)  # [NB, bs, Hkv, D]
    before_k, before_v = kc.clone(), vc.clone()
    k, v = torch.randn(2, 3, 2, D, generator=gen)
    slots = torch.tensor([17, 2, 8])
    write_kv(k, v, kc, vc, slots)
    for t, s in enumerate(slots.tolist()):
        assert torch.equal(kc[s // 4, s % 4], k[t]) and torch.equal(vc[s // 4, s % 4], v[t])
    rest = torch.ones(20, dtype=torch.bool)
    rest[slots] = False
    assert torch.equal(kc.view(20, 2, D)[rest], before_k.view(20, 2, D)[rest])
    assert torch.equal(vc.view(20, 2, D)[rest], before_v.view(20, 2, D)[rest])


# (num_computed, new tokens): decodes, a fresh prefill, prefix-cached prefills, awkward lengths
SEQS = [(5, 1), (64, 1), (0, 1), (0, 3), (17, 13), (1, 63), (0, 65), (40, 24)]


def _paged_case(
    block_size: int, h: int, hkv: int, dtype: torch.dtype, seed: int, seqs: list[tuple[int, int]] = SEQS
) -> dict:
    gen = torch.Generator().manual_seed(seed)
    totals = [c + n for c, n in seqs]
    need = [-(-t // block_size) for t in totals]
    num_blocks = sum(need) + 3
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 stays the null block
    table = torch.zeros(len(seqs), max(need) + 1, dtype=torch.int32)
    kc = torch.randn(num_blocks, block_size, hkv, D, generator=gen).to(dtype)  # garbage everywhere else
    vc = torch.randn(num_blocks, block_size, hkv, D, generator=gen).to(dtype)
    dense_k, dense_v, slot_maps = [], [], []
    for b, t in enumerate(totals):
        table[b, : need[b]] = torch.tensor([ids.pop() for _ in range(need[b])])
        dense_k.append(torch.randn(t, hkv, D, generator=gen).to(dtype))
        dense_v.append(torch.randn(t, hkv, D, generator=gen).to(dtype))
        pos = torch.arange(t)
        slot_maps.append(table[b].long()[pos // block_size] * block_size + pos % block_size)
    # every cached position (prefix and this step's tokens) is written before attention
    write_kv(torch.cat(dense_k), torch.cat(dense_v), kc, vc, torch.cat(slot_maps))
    lens = [n for _, n in seqs]
    q = torch.randn(sum(lens), h, D, generator=gen).to(dtype)
    return dict(q=q, kc=kc, vc=vc, table=table, lens=lens, totals=totals, dk=dense_k, dv=dense_v)


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """One sequence, per query token, fp64: token j at start + j sees keys 0 .. start + j."""
    h, hkv = q.shape[1], k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for j in range(q.shape[0]):
        for head in range(h):
            kv = head // (h // hkv)
            keys = k[: start + j + 1, kv].double()
            p = torch.softmax(keys @ q[j, head].double() * scale, dim=0)
            out[j, head] = p @ v[: start + j + 1, kv].double()
    return out


DECODES = [(5, 1), (64, 1), (1, 1), (30, 1)]


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("h,hkv", [(4, 2), (2, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seqs", [SEQS, DECODES], ids=["mixed", "decode"])
def test_paged_attention_vs_dense(
    block_size: int, h: int, hkv: int, dtype: torch.dtype, seqs: list[tuple[int, int]]
) -> None:
    c = _paged_case(block_size, h, hkv, dtype, seed=block_size + h, seqs=seqs)
    scale = D**-0.5
    lens, totals = c["lens"], c["totals"]
    out = paged_attention(
        c["q"],
        c["kc"],
        c["vc"],
        c["table"],
        _qsl(lens),
        torch.tensor(totals, dtype=torch.int32),
        torch.tensor([n for n, _ in seqs], dtype=torch.int32),
        scale,
        max(lens),
        max(totals),
    )
    assert out.dtype == dtype and out.shape == c["q"].shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    start = 0
    for b, (computed, n) in enumerate(seqs):
        ref = _dense(c["q"][start : start + n], c["dk"][b], c["dv"][b], computed, scale)
        torch.testing.assert_close(out[start : start + n].double(), ref, atol=tol, rtol=tol)
        start += n


def test_paged_attention_head_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny score budget forces one kv head per step; the result must not change."""
    c = _paged_case(4, 8, 4, torch.float32, seed=3)
    lens, totals = c["lens"], c["totals"]
    args = (
        c["q"],
        c["kc"],
        c["vc"],
        c["table"],
        _qsl(lens),
        torch.tensor(totals, dtype=torch.int32),
        torch.tensor([n for n, _ in SEQS], dtype=torch.int32),
        0.1,
        max(lens),
        max(totals),
    )
    full = paged_attention(*args)
    monkeypatch.setattr(attn_mod, "_SCORE_BUDGET", 1)
    assert torch.equal(paged_attention(*args), full)

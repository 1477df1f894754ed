"""Ops.logprobs: the one-read kernel (cuda/sample/logprobs.cu, arm sample.logprobs) against the reference.

CPU: the reference's contract on hand-checked rows (the target's log-softmax, its rank, top-k, the
optional parts); the wrapper sends CPU and fp32 input to the reference; the arm puts the kernel in
the op table; the sampler and the prompt scorer call the table's op; the scorer refuses prompt tokens
outside the vocabulary. GPU: on bf16 rows of the 4B's vocabulary and awkward widths the target's
logprob within two fp32 ulps of the reference's, the rank exact, the top-1 index torch's argmax
(first NaN, else largest, lowest index on ties), the top-k values as the reference's;
rows with NaN, -inf masks and +inf; strided views; repeated runs bit-equal; scoring rows through
``score_rows`` with either op gives the same tokens and ranks and logprobs within 2e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.ops import make_ops
from engine.ops.sample import logprobs as lp
from engine.ops.sample import reference as ref
from engine.sampling_params import SamplingParams
from engine.worker.prompt_logprobs import score_rows
from engine.worker.sampler import Sampler


def test_reference_contract() -> None:
    x = torch.tensor([[0.0, 2.0, 1.0, 2.0], [math.log(3.0), 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    chosen, rank, top_v, top_i = ref.logprobs(x, torch.tensor([2, 0]), 2)
    lse0 = math.log(1 + 2 * math.e**2 + math.e)
    assert chosen.dtype == torch.float32 and rank is not None and top_v is not None and top_i is not None
    assert chosen.tolist() == pytest.approx([1.0 - lse0, math.log(3.0 / 6.0)], abs=1e-2)  # bf16 log 3
    assert rank.tolist() == [3, 1]  # two entries above 1.0; nothing above row 1's largest
    assert top_v[0].tolist() == pytest.approx([2.0 - lse0, 2.0 - lse0], abs=1e-6)
    assert sorted(top_i[0].tolist()) == [1, 3] and top_i[1, 0].item() == 0
    c2, r2, v2, i2 = ref.logprobs(x, torch.tensor([2, 0]), 0, rank=False)
    assert r2 is None and v2 is None and i2 is None and torch.equal(c2, chosen)


def test_cpu_and_fp32_go_to_the_reference() -> None:
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((3, 64), dtype=np.float32))
    t = torch.tensor([0, 5, 63])
    assert not lp.takes(x, t) and not lp.takes(x.to(torch.bfloat16), t)
    got, want = lp.logprobs(x, t, 3), ref.logprobs(x, t, 3)
    for g, w in zip(got, want, strict=True):
        assert g is not None and w is not None and torch.equal(g, w)


def test_arm_puts_the_kernel_in_the_table() -> None:
    assert make_ops("torch").logprobs is ref.logprobs
    assert make_ops("cuda", frozenset()).logprobs is ref.logprobs
    assert make_ops("cuda", frozenset({"sample.logprobs"})).logprobs is lp.logprobs


def test_sampler_and_scorer_take_the_tables_op() -> None:
    seen: list[tuple[tuple[int, ...], int, bool]] = []

    def counted(x: torch.Tensor, t: torch.Tensor, k: int, rank: bool = True) -> tuple:
        seen.append((tuple(x.shape), k, rank))
        return ref.logprobs(x, t, k, rank)

    s = Sampler("cpu", logprobs=counted)
    logits = torch.tensor([[0.0, 2.0, 1.0, 0.5], [3.0, 0.0, 0.0, 1.0]])
    b = s.prepare([SamplingParams(temperature=0.0, logprobs=2)] * 2, [0, 0], 4)
    tokens, lps = s.sample(logits, b)
    assert tokens == [1, 0] and seen == [((2, 4), 2, False)]
    assert lps[0] is not None and lps[0].token_id == 1 and [t for t, _ in lps[0].top] == [1, 2]

    hidden = torch.eye(4)
    out = score_rows(lambda h: h * 3.0, hidden, [0, 2], [0, 1], 1, logprobs=counted)
    assert seen[-1] == ((2, 4), 1, True)
    assert [(o.token_id, o.rank) for o in out] == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="prompt token ids"):
        score_rows(lambda h: h, hidden, [0], [4], 0)


# ------------------------------------------------------------------------------------------------ GPU

VOCABS = [248320, 151936, 4104, 1000]
ROWS = [1, 3, 32, 200]
# one or two fp32 ulps of the logprob: x - (m + log s) against torch's (x - m) - log s
TOL = {"rtol": 4e-7, "atol": 2e-6}


def _logits(rng: np.random.Generator, rows: int, vocab: int) -> torch.Tensor:
    a = rng.standard_normal((rows, vocab), dtype=np.float32) * np.float32(4)
    return torch.from_numpy(a).to(device="cuda", dtype=torch.bfloat16)


def _check(x: torch.Tensor, t: torch.Tensor, k: int) -> None:
    c, r, v, i = lp.logprobs(x, t, k)
    wc, wr, wv, _ = ref.logprobs(x, t, k)
    finite = torch.isfinite(wc)
    assert torch.equal(torch.isnan(c), torch.isnan(wc))
    assert torch.allclose(c[finite], wc[finite], **TOL), (c - wc).abs().max().item()
    assert r is not None and wr is not None and torch.equal(r, wr)
    if k:
        assert v is not None and wv is not None and i is not None
        assert torch.allclose(v, wv, **TOL, equal_nan=True)
        if k == 1:  # the kernel's own top-1: torch's argmax order, whatever the ties
            assert torch.equal(i[:, 0], x.argmax(dim=-1))
        else:  # torch's topk over the raw logits: a largest entry first, ties in its own order
            assert torch.equal(x.gather(1, i[:, :1])[:, 0], x.max(dim=-1).values)
        logp = torch.log_softmax(x, dim=-1, dtype=torch.float32)
        assert torch.allclose(v, logp.gather(1, i), **TOL)  # the values of its own indices
    again = lp.logprobs(x, t, k)
    for g, h in zip((c, r, v, i), again, strict=True):
        assert (g is None and h is None) or torch.equal(g, h)  # repeatable bit for bit  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", [0, 1, 5])
def test_kernel_equals_reference(vocab: int, rows: int, k: int) -> None:
    rng = np.random.default_rng(rows * 31 + vocab + k)
    x = _logits(rng, rows, vocab)
    t = torch.from_numpy(rng.integers(0, vocab, rows)).to("cuda")
    t[0] = int(x[0].argmax())  # rank 1
    if rows > 1:
        t[1] = int(x[1].argmin())
    assert lp.takes(x, t)
    _check(x, t, k)


@pytest.mark.gpu
def test_special_values() -> None:
    rng = np.random.default_rng(7)
    x = _logits(rng, 6, 248320)
    x[0, 1000] = float("nan")  # the whole row's logprobs NaN, rank 1
    x[1, 4000:] = -float("inf")  # a masked tail
    x[2, 17] = x[2, 99] = x[2].max() + 2  # a tie for the top: the lower index
    x[3] = x[3].clamp(max=1.0)  # tens of thousands tie at the top
    x[4, 5] = float("inf")  # +inf: NaN row under log_softmax, as the reference
    t = torch.tensor([3, 5000 - 1000, 99, 1, 5, 248319], device="cuda")
    c, r, v, i = lp.logprobs(x, t, 1)
    wc, wr, wv, _ = ref.logprobs(x, t, 1)
    assert r is not None and wr is not None and v is not None and i is not None
    assert math.isnan(c[0].item()) and r[0].item() == 1 and math.isnan(wc[0].item()) and wr[0].item() == 1
    assert torch.allclose(c[1:4], wc[1:4], **TOL) and torch.equal(r[1:4], wr[1:4])
    assert i[2].item() == 17 and torch.equal(i[:, 0], x.argmax(dim=-1))
    assert math.isnan(c[4].item()) and math.isnan(wc[4].item())
    assert torch.allclose(c[5], wc[5], **TOL) and r[5].item() == wr[5].item()
    assert torch.allclose(v[1], wv[1], **TOL)


@pytest.mark.gpu
def test_strided_view_and_score_rows() -> None:
    rng = np.random.default_rng(11)
    wide = _logits(rng, 16, 248320 + 64)
    view = wide[:, 8:248328]
    t = torch.from_numpy(rng.integers(0, 248320, 16)).to("cuda")
    assert lp.takes(view, t)
    _check(view, t, 3)
    # score_rows with a bf16 lm_head: same tokens and ranks, logprobs within 2e-5
    hidden = torch.from_numpy(rng.standard_normal((40, 64), dtype=np.float32)).to("cuda", torch.bfloat16)
    head = torch.from_numpy(rng.standard_normal((4096, 64), dtype=np.float32)).to("cuda", torch.bfloat16)
    rows, targets = list(range(3, 40)), [int(v) for v in rng.integers(0, 4096, 37)]
    got = score_rows(lambda h: h @ head.t(), hidden, rows, targets, 1, chunk_rows=16, logprobs=lp.logprobs)
    want = score_rows(lambda h: h @ head.t(), hidden, rows, targets, 1, chunk_rows=16)
    assert [(g.token_id, g.rank) for g in got] == [(w.token_id, w.rank) for w in want]
    assert max(abs(g.logprob - w.logprob) for g, w in zip(got, want, strict=True)) < 2e-5
    assert len({g.logprob for g in got}) > 30

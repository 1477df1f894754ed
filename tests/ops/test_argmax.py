"""Ops.argmax: the split argmax kernel (cuda/sample/argmax.cu, arm sample.argmax) against torch's.

CPU: the launch plan covers every entry once with non-empty, vector-aligned chunks; the wrapper
sends what the kernel does not take to torch; the arm puts the kernel in the op table and the runner's
sampler uses the table's argmax. GPU: the kernel's index equals ``x.argmax(-1)`` exactly on bf16 and
fp32 rows of the 4B's vocabulary and awkward widths, with ties planted across chunk boundaries (and
the natural ties of bf16 data), NaNs, all -inf rows and row-strided views; repeated runs agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.ops import make_ops
from engine.ops import reference as ref
from engine.ops.compile import sm_count
from engine.ops.sample import cuda as sample

VOCABS = [248320, 151936, 4096 + 8, 1000]
ROWS = [1, 2, 3, 8, 32, 64, 100]


@pytest.mark.parametrize("vocab", [*VOCABS, 8, 2048, 2056])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("vec", [8, 4])
@pytest.mark.parametrize("sms", [132, 70, 1])
def test_plan_covers_every_entry_once(vocab: int, rows: int, vec: int, sms: int) -> None:
    assert vocab % vec == 0  # (rows of other widths go to torch: test_cpu_and_odd_inputs_go_to_torch)
    splits, chunk = sample.plan(rows, vocab, vec, sms)
    assert splits >= 1 and chunk % vec == 0
    assert (splits - 1) * chunk < vocab <= splits * chunk  # the last split is not empty
    assert chunk >= min(vocab, sample.THREADS * vec)  # at least one pass of the CTA
    assert splits <= -(-2 * sms // rows)  # about two CTAs a multiprocessor over all rows, not more


def test_cpu_and_odd_inputs_go_to_torch() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 0.0, float("nan"), 2.0, 1.0]])
    assert not sample.takes(x)  # CPU
    assert sample.argmax(x).tolist() == [3]
    assert ref.argmax(x).tolist() == [3]  # the first NaN wins
    ties = torch.tensor([[0.0, 5.0, 1.0, 5.0], [-float("inf")] * 4])
    assert sample.argmax(ties).tolist() == [1, 0]


def test_arm_puts_the_kernel_in_the_table() -> None:
    assert make_ops("torch").argmax is ref.argmax
    assert make_ops("cuda", frozenset()).argmax is ref.argmax
    assert make_ops("cuda", frozenset({"sample.argmax"})).argmax is sample.argmax


def test_sampler_takes_the_tables_argmax() -> None:
    from engine.sampling_params import SamplingParams
    from engine.worker.sampler import Sampler

    seen = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(x.shape))
        return ref.argmax(x)

    s = Sampler("cpu", argmax=counted)
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, 0.0, 0.0, 3.0]])
    b = s.prepare([SamplingParams(temperature=0.0)] * 2, [0, 0], 4)
    assert s.sample(logits, b)[0] == [1, 0]
    assert seen == [(2, 4)]


# ------------------------------------------------------------------------------------------------ GPU


def _rows(rng: np.random.Generator, rows: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    a = rng.standard_normal((rows, vocab), dtype=np.float32) * np.float32(3)
    return torch.from_numpy(a).to(device="cuda", dtype=dtype)


def _plant(x: torch.Tensor, rng: np.random.Generator) -> None:
    """Row by row: ties of the row's maximum straddling the chunk boundaries, NaNs, all -inf, +inf."""
    rows, vocab = x.shape
    vec = 8 if x.dtype == torch.bfloat16 else 4
    splits, chunk = sample.plan(rows, vocab, vec, sm_count(0))
    top = float(x.float().max()) + 1.0
    for r in range(rows):
        kind = r % 6
        if kind == 1 and splits > 1:  # a tie on both sides of a chunk boundary: the lower one wins
            b = chunk * int(rng.integers(1, splits))
            x[r, b - 1] = top
            x[r, b] = top
        elif kind == 2:  # ties spread over the row
            for i in sorted(rng.choice(vocab, size=min(5, vocab), replace=False)):
                x[r, int(i)] = top
        elif kind == 3:  # NaNs beat every number; the first one wins
            i, j = sorted(int(v) for v in rng.choice(vocab, size=2, replace=False))
            x[r, j] = float("nan")
            x[r, i] = float("nan")
            x[r, 0] = float("inf")
        elif kind == 4:
            x[r] = -float("inf")
        elif kind == 5:
            x[r, vocab - 1] = float("inf")  # the very last entry


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("rows", ROWS)
def test_kernel_equals_torch(dtype: torch.dtype, vocab: int, rows: int) -> None:
    rng = np.random.default_rng(rows * 7919 + vocab)
    x = _rows(rng, rows, vocab, dtype)
    _plant(x, rng)
    assert sample.takes(x)
    want = x.argmax(dim=-1)
    got = sample.argmax(x)
    assert got.dtype == torch.int64 and got.shape == (rows,)
    assert torch.equal(got, want), (got != want).nonzero().flatten().tolist()[:8]
    assert torch.equal(sample.argmax(x), got)  # repeatable


@pytest.mark.gpu
def test_natural_bf16_ties() -> None:
    # values clipped at a ceiling (as saturated logits are): a quarter of each row ties for the
    # maximum, in every chunk; then integer-rounded rows whose maxima tie a few times
    rng = np.random.default_rng(5)
    x = _rows(rng, 32, 248320, torch.float32).clamp(max=2.0).to(torch.bfloat16)
    counts = (x == x.max(dim=-1, keepdim=True).values).sum(-1)
    assert int(counts.min()) > 10_000
    assert torch.equal(sample.argmax(x), x.argmax(dim=-1))
    x = _rows(rng, 32, 248320, torch.float32).div(2).round().to(torch.bfloat16)
    counts = (x == x.max(dim=-1, keepdim=True).values).sum(-1)
    assert int(counts.max()) > 1
    assert torch.equal(sample.argmax(x), x.argmax(dim=-1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_strided_views_and_fallbacks(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(11)
    wide = _rows(rng, 16, 248320 + 64, dtype)
    view = wide[:, 8:248328]  # starts 16 or 32 bytes in: aligned, rows a vector-multiple apart
    assert sample.takes(view)
    assert torch.equal(sample.argmax(view), view.argmax(dim=-1))
    odd = wide[:, 1:4097]  # misaligned start: torch runs it
    assert not sample.takes(odd)
    assert torch.equal(sample.argmax(odd), odd.argmax(dim=-1))
    ragged = wide[:, :4099]  # not a whole number of vectors: torch runs it
    assert not sample.takes(ragged)
    assert torch.equal(sample.argmax(ragged), ragged.argmax(dim=-1))
    cols = wide.t()[:100, :16]  # column-strided: torch runs it
    assert not sample.takes(cols)
    assert torch.equal(sample.argmax(cols), cols.argmax(dim=-1))

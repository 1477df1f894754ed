"""Penalties, logit_bias, bad words and min_tokens against hand-computed logits (vLLM's definitions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.sampling_params import SamplingParams
from engine.worker.penalties import adjust_logits, banned_by_bad_words, token_counts
from engine.worker.sampler import Sampler

INF = math.inf


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float32)


def test_repetition_penalty_divides_positive_multiplies_negative_over_prompt_and_output() -> None:
    logits = _row([2.0, -1.0, 3.0, -2.0, 0.5])
    p = SamplingParams(repetition_penalty=2.0)
    # prompt [0, 1], output [3]: tokens 0, 1, 3 are penalised, 2 and 4 are not.
    out = adjust_logits(logits, [p], [[0, 1, 3]], [2])
    assert out.tolist() == [[1.0, -2.0, 3.0, -4.0, 0.5]]
    assert logits.tolist() == [[2.0, -1.0, 3.0, -2.0, 0.5]], "the input logits must stay untouched"


def test_frequency_and_presence_count_output_tokens_only() -> None:
    logits = _row([1.0, 1.0, 1.0, 1.0])
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    # prompt [2, 2, 2] is ignored by both; output has token 1 three times, token 3 once.
    out = adjust_logits(logits, [p], [[2, 2, 2, 1, 3, 1, 1]], [3])
    expect = [1.0, 1.0 - 3 * 0.5 - 0.25, 1.0, 1.0 - 0.5 - 0.25]
    assert out[0].tolist() == pytest.approx(expect)


def test_all_penalties_in_vllm_order() -> None:
    # Repetition first (on the raw logit), then frequency, then presence.
    logits = _row([4.0, -3.0, 0.0])
    p = SamplingParams(repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=0.5)
    out = adjust_logits(logits, [p], [[2, 0, 0, 1]], [1])
    expect = [4.0 / 1.5 - 2 * 1.0 - 0.5, -3.0 * 1.5 - 1.0 - 0.5, 0.0 * 1.5]
    assert out[0].tolist() == pytest.approx(expect)


def test_negative_presence_and_frequency_encourage_repeats() -> None:
    out = adjust_logits(_row([0.0, 0.0]), [SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5)],
                        [[1, 1]], [0])  # fmt: skip
    assert out[0].tolist() == pytest.approx([0.0, 1.0 + 2 * 0.5])


def test_logit_bias_adds_and_min_tokens_bans_stop_tokens() -> None:
    logits = _row([0.0, 1.0, 2.0, 3.0, 4.0])
    p = SamplingParams(logit_bias=((1, 5.0), (4, -100.0)), min_tokens=2, stop_token_ids=(2,))
    out = adjust_logits(logits, [p], [[7 % 5, 1]], [1], eos_token_ids=(3,))  # one output token so far
    assert out[0].tolist() == [0.0, 6.0, -INF, -INF, -96.0]
    # Once min_tokens outputs exist, stop tokens are allowed again.
    out = adjust_logits(logits, [p], [[0, 1, 1]], [1], eos_token_ids=(3,))
    assert out[0].tolist() == [0.0, 6.0, 2.0, 3.0, -96.0]
    # ignore_eos keeps EOS allowed even before min_tokens (only stop_token_ids are banned).
    q = SamplingParams(min_tokens=5, ignore_eos=True, stop_token_ids=(2,))
    assert adjust_logits(logits, [q], [[0]], [1], eos_token_ids=(3,))[0].tolist() == [0, 1, -INF, 3, 4]


def test_bad_words_ban_the_last_token_after_the_prefix() -> None:
    words = ((4,), (1, 2), (5, 6, 7))
    assert banned_by_bad_words(words, []) == [4]
    assert banned_by_bad_words(words, [3, 1]) == [4, 2]
    assert banned_by_bad_words(words, [5, 6]) == [4, 7]
    assert banned_by_bad_words(words, [6, 5]) == [4]
    logits = torch.zeros(1, 8)
    out = adjust_logits(logits, [SamplingParams(bad_words=words)], [[0, 5, 6]], [1])
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [4, 7]


def test_rows_without_adjustments_are_unchanged_in_a_mixed_batch() -> None:
    rng = np.random.default_rng(3)
    logits = torch.from_numpy(rng.standard_normal((3, 50)).astype(np.float32))
    params = [SamplingParams(), SamplingParams(frequency_penalty=1.0), SamplingParams()]
    out = adjust_logits(logits, params, [[], [1, 2, 2], []], [0, 1, 0])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    expect = logits[1].clone()
    expect[2] -= 2.0
    assert torch.equal(out[1], expect)


def test_token_counts_match_numpy() -> None:
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 30, size=int(n)).tolist() for n in (0, 7, 40)]
    got = token_counts(rows, 30, torch.device("cpu")).numpy()
    for r, row in enumerate(rows):
        assert got[r].tolist() == np.bincount(np.asarray(row, dtype=np.int64), minlength=30).tolist()


def test_greedy_follows_the_adjusted_logits_and_logprobs_stay_raw() -> None:
    sampler = Sampler("cpu")
    logits = _row([5.0, 4.0, 0.0])
    p = SamplingParams(temperature=0.0, frequency_penalty=2.0, logprobs=1)
    vocab = logits.shape[-1]
    ids, lps = sampler.sample(logits, sampler.prepare([p], [1], vocab, [[9 % 3, 0]], [1]))  # output: [0]
    assert ids == [1]  # 5 - 2 < 4
    raw = torch.log_softmax(logits, -1)[0]
    assert lps[0] is not None and lps[0].logprob == pytest.approx(raw[1].item())


def test_seeded_sampling_with_penalties_is_reproducible() -> None:
    rng = np.random.default_rng(11)
    row = rng.standard_normal(200).astype(np.float32)
    logits = torch.from_numpy(np.stack([row, row]))  # same row twice: the batch position must not matter
    p = SamplingParams(temperature=1.0, seed=42, presence_penalty=1.2, repetition_penalty=1.3,
                       logit_bias=((7, 3.0),))  # fmt: skip
    hist = rng.integers(0, 200, size=30).tolist()

    def draw(seed: int) -> list[int]:
        s = Sampler("cpu", seed=seed)
        return s.sample(logits, s.prepare([p, p], [4, 4], 200, [hist, hist], [10, 10]))[0]

    a, b = draw(1), draw(2)
    assert a == b and a[0] == a[1]


def test_raw_bf16_logits_are_adjusted_in_fp32() -> None:
    """The graphs hand over raw bf16 logits: the adjusted rows are computed from their exact fp32
    widening and returned in fp32 (rounded back to bf16 they would differ: a division by 1.3 and a
    penalty of 0.37 per count are rarely bf16 values), the rows that adjust nothing widened as is."""
    rng = np.random.default_rng(21)
    raw = torch.from_numpy(rng.standard_normal((3, 40)).astype(np.float32) * 4).to(torch.bfloat16)
    params = [
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.37),
        SamplingParams(),
        SamplingParams(presence_penalty=0.61, bad_words=((7,),)),
    ]
    hist, prompt = [[1, 2, 3, 3, 9], [4], [8, 8, 11]], [2, 1, 1]
    got = adjust_logits(raw, params, hist, prompt)
    want = adjust_logits(raw.float(), params, hist, prompt)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert not torch.equal(got, got.to(torch.bfloat16).float()), "the adjustments left bf16 values"
    assert torch.equal(got[1], raw[1].float()) and raw.dtype == torch.bfloat16

"""The sampler on CPU: prepare builds a step's tensors once, sample draws from them (greedy exact,
filters as documented, seeded rows independent of the batch around them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sampling_params import SamplingParams
from engine.worker.sampler import Sampler

VOCAB = 64


def logits(rows: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal((rows, VOCAB)).astype(np.float32) * 3)


def run(params: list[SamplingParams], x: torch.Tensor, steps: list[int] | None = None, seed: int = 0):
    s = Sampler("cpu", seed)
    return s.sample(x, s.prepare(params, steps or [0] * len(params), VOCAB))


def test_prepare_builds_only_the_filters_some_row_uses() -> None:
    s = Sampler("cpu")
    b = s.prepare([SamplingParams(temperature=0.0), SamplingParams(top_k=5)], [0, 3], VOCAB)
    assert b.random_rows == [1] and b.max_logprobs is None
    assert b.top_k is not None and b.top_k.tolist() == [5]
    assert b.top_p is None and b.min_p is None
    # top_k >= vocab disables the filter for that row, and for the step when no row needs it
    assert s.prepare([SamplingParams(top_k=VOCAB)], [0], VOCAB).top_k is None
    greedy = s.prepare([SamplingParams(temperature=0.0, logprobs=2)], [0], VOCAB)
    assert greedy.temperatures is None and greedy.random_rows == [] and greedy.max_logprobs == 2


def test_greedy_is_argmax_with_lowest_index_on_ties() -> None:
    x = logits(4, 1)
    x[2, 7] = x[2, 9] = x[2].max() + 1.0
    ids, lps = run([SamplingParams(temperature=0.0)] * 4, x)
    assert ids == x.argmax(dim=-1).tolist() and ids[2] == 7 and lps == [None] * 4


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    x = logits(6, 2)
    params = [SamplingParams(top_k=1)] * 3 + [SamplingParams(top_p=1e-6)] * 3
    assert run(params, x)[0] == x.argmax(dim=-1).tolist()


def test_min_p_keeps_only_tokens_near_the_best() -> None:
    x = logits(1, 3).repeat(200, 1)
    ids, _ = run([SamplingParams(min_p=0.5)] * 200, x)
    probs = x[0].softmax(-1)
    allowed = set(torch.nonzero(probs >= 0.5 * probs.max()).flatten().tolist())
    assert set(ids) <= allowed and len(allowed) < VOCAB


def test_seeded_rows_do_not_depend_on_the_batch_or_the_sampler_seed() -> None:
    x = logits(3, 4)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone, _ = run([seeded], x[1:2], [5], seed=0)
    in_batch, _ = run([SamplingParams(), seeded, SamplingParams(top_k=3)], x, [0, 5, 2], seed=99)
    assert in_batch[1] == alone[0]
    other_step, _ = run([seeded] * 50, x[1:2].repeat(50, 1), list(range(50)))
    assert len(set(other_step)) > 1  # the step index enters the seed


@pytest.mark.parametrize("k", [0, 3])
def test_logprobs_of_the_chosen_token_and_its_alternatives(k: int) -> None:
    x = logits(2, 5)
    ids, lps = run([SamplingParams(temperature=0.0, logprobs=k), SamplingParams(temperature=0.0)], x)
    ref = torch.log_softmax(x, -1)
    assert lps[1] is None and lps[0] is not None
    assert lps[0].token_id == ids[0] and lps[0].logprob == pytest.approx(ref[0, ids[0]].item())
    assert [t for t, _ in lps[0].top] == ref[0].topk(k).indices.tolist() if k else lps[0].top == []


def _bf16_with_ties(rows: int, seed: int) -> torch.Tensor:
    """bf16 logits whose rows have their maximum at two or three indices (bf16's coarse steps make
    near-ties exact ties, the case where a widened and an unwidened argmax could part)."""
    x = logits(rows, seed).to(torch.bfloat16)
    rng = np.random.default_rng(seed + 100)
    for r in range(rows):
        top = x[r].max()
        for j in rng.choice(VOCAB, size=1 + r % 3, replace=False):
            x[r, int(j)] = top
    return x


def test_greedy_on_raw_bf16_logits_equals_greedy_on_their_fp32_widening() -> None:
    """The graphs hand the sampler their raw bf16 logits: an all-greedy step takes their argmax
    unwidened, and it is the token the fp32 path picks, ties included (lowest index)."""
    x = _bf16_with_ties(8, 6)
    greedy = [SamplingParams(temperature=0.0)] * 8
    ids, _ = run(greedy, x)
    want, _ = run(greedy, x.float())
    assert ids == want == x.float().argmax(dim=-1).tolist()
    assert all(x[r, ids[r]] == x[r].max() and (x[r, : ids[r]] < x[r].max()).all() for r in range(8))


def test_raw_bf16_logits_are_widened_for_logprobs_and_sampling() -> None:
    """Logprobs, seeded sampling and logit adjustments see the fp32 widening of raw bf16 logits, so
    each gives exactly what it gives on the fp32 tensor."""
    x = _bf16_with_ties(5, 7)
    params = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.8, seed=11),
        SamplingParams(temperature=0.0, presence_penalty=1.5),
        SamplingParams(temperature=1.3, seed=12, top_k=5, top_p=0.9, min_p=0.05, logprobs=2),
        SamplingParams(temperature=0.7, seed=13, repetition_penalty=1.2, logit_bias=((4, 2.0),)),
    ]
    s_raw, s_f32 = Sampler("cpu", 5), Sampler("cpu", 5)
    hist = ([1, 2], [3], [4, 4, 5], [6], [4, 7, 7])
    steps, prompt = [0, 2, 1, 3, 1], [1, 1, 1, 1, 2]
    draws = []
    for s, x_in in ((s_raw, x), (s_f32, x.float())):
        draws.append([s.sample(x_in, s.prepare(params, steps, VOCAB, hist, prompt)) for _ in range(3)])
    for (ids, lps), (want_ids, want_lps) in zip(*draws, strict=True):
        assert ids == want_ids
        for r in (0, 3):
            assert lps[r] is not None and want_lps[r] is not None
            assert lps[r].logprob == want_lps[r].logprob and lps[r].top == want_lps[r].top

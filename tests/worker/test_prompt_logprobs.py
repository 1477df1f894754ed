"""Prompt logprobs on the embedded tiny model: equal to the log-softmax of whole-prompt logits, across
prefill chunks, through the scheduler (chunked prefill, max_tokens 0) and with top-k and ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.generate import score_prompts
from engine.messages import AddRequests, EngineRequest
from engine.model.forward_batch import ForwardBatch, SeqSpec
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner
from engine.worker.prompt_logprobs import score_rows
from engine.worker.resolve import resolve_model


def _config(budget: int = 2048) -> EngineConfig:
    return EngineConfig(
        model=resolve_model(ModelConfig(device="cpu", max_model_len=1024)),  # the CPU fp32 path, everywhere
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4),
    )


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(_config())


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


def _reference(runner: ModelRunner, prompt: list[int]) -> torch.Tensor:
    """log_softmax over whole-prompt logits: row p scores token p + 1."""
    blocks = list(range(1, len(prompt) // runner.block_size + 2))
    spec = SeqSpec(token_ids=prompt, num_computed=0, block_ids=blocks, state_slot=1)
    fb = ForwardBatch.build([spec], runner.block_size, runner.device, all_logits=True)
    return torch.log_softmax(runner.execute(fb), dim=-1)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(1.0, abs(b))


def test_prompt_logprobs_equal_full_log_softmax(runner: ModelRunner) -> None:
    prompt = _prompt(301, 0)
    ref = _reference(runner, prompt)
    scored = score_prompts(runner, [prompt], top_k=4)[0]
    assert len(scored) == len(prompt) - 1
    for p, s in enumerate(scored):
        row = ref[p]
        assert s.token_id == prompt[p + 1]
        assert s.logprob == row[prompt[p + 1]].item()
        assert s.rank == int((row > row[prompt[p + 1]]).sum()) + 1
        top = row.topk(4)
        assert [t for t, _ in s.top] == top.indices.tolist()
        assert [v for _, v in s.top] == top.values.tolist()


def test_prompt_logprobs_across_prefill_chunks(runner: ModelRunner) -> None:
    prompt = _prompt(200, 1)
    ref = _reference(runner, prompt)
    whole = score_prompts(runner, [prompt])[0]
    chunked = score_prompts(runner, [prompt], token_budget=13)[0]
    assert [s.token_id for s in chunked] == prompt[1:]
    for p, s in enumerate(chunked):
        assert _close(s.logprob, ref[p, prompt[p + 1]].item()), p
        assert _close(s.logprob, whole[p].logprob), p


def test_scoring_in_small_row_chunks_is_exact(runner: ModelRunner) -> None:
    prompt = _prompt(90, 2)
    blocks = list(range(1, 8))
    fb = ForwardBatch.build([SeqSpec(prompt, 0, blocks, 1)], runner.block_size, runner.device)
    hidden = runner.model.hidden_states(fb, runner.cache)
    rows, targets = list(range(89)), prompt[1:]

    def per_row(h: torch.Tensor) -> torch.Tensor:
        # one row at a time, so the logits do not depend on how many rows a chunk holds: a CPU BLAS
        # may round an [89, hidden] product differently from a [7, hidden] one (seen on an AMD EPYC)
        return torch.cat([runner.model.compute_logits(r[None]) for r in h])

    big = score_rows(per_row, hidden, rows, targets, 2, chunk_rows=512)
    small = score_rows(per_row, hidden, rows, targets, 2, chunk_rows=7)
    assert big == small
    assert [s.token_id for s in big] == targets and len({s.logprob for s in big}) > 1


def _run(core: EngineCore, reqs: list[EngineRequest]) -> dict[str, list]:
    core.add_requests(AddRequests(reqs))
    outs: dict[str, list] = {r.request_id: [] for r in reqs}
    for _ in range(200):
        if not core.has_work():
            break
        for o in core.step().outputs:
            outs[o.request_id].append(o)
    core.scheduler.check_invariants()
    return outs


def test_engine_scores_prompts_with_chunked_prefill_and_max_tokens_zero(runner: ModelRunner) -> None:
    # A 64-token budget splits the 150-token prompts over three steps, two prompts sharing steps.
    core = EngineCore(_config(budget=64), runner)
    a, b = _prompt(150, 3), _prompt(150, 4)
    only = SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs=1)
    gen = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    outs = _run(core, [EngineRequest("a", a, only), EngineRequest("b", b, gen)])
    (oa,) = outs["a"]
    assert oa.finish_reason == "length" and oa.new_token_ids == []
    ref_a = _reference(runner, a)
    assert [s.token_id for s in oa.prompt_logprobs] == a[1:]
    for p, s in enumerate(oa.prompt_logprobs):
        assert _close(s.logprob, ref_a[p, a[p + 1]].item())
        assert len(s.top) == 1
    ob = outs["b"]
    assert sum(len(o.new_token_ids) for o in ob) == 3
    assert ob[0].prompt_logprobs is not None and all(o.prompt_logprobs is None for o in ob[1:])
    assert [s.token_id for s in ob[0].prompt_logprobs] == b[1:]
    ref_b = _reference(runner, b)
    assert all(_close(s.logprob, ref_b[p, b[p + 1]].item()) for p, s in enumerate(ob[0].prompt_logprobs))


def test_engine_penalised_seeded_request_repeats_exactly(runner: ModelRunner) -> None:
    prompt = _prompt(40, 5)
    p = SamplingParams(max_tokens=12, temperature=0.8, seed=7, ignore_eos=True, frequency_penalty=1.5,
                       presence_penalty=0.5, repetition_penalty=1.2, logit_bias=((5, 2.0),))  # fmt: skip
    runs = []
    for i in range(2):
        core = EngineCore(_config(), runner)
        other = EngineRequest("other", _prompt(20 + i * 9, 6), SamplingParams(max_tokens=4))
        outs = _run(core, [other, EngineRequest("x", prompt, p)] if i else [EngineRequest("x", prompt, p)])
        runs.append([t for o in outs["x"] for t in o.new_token_ids])
    assert runs[0] == runs[1] and len(runs[0]) == 12
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = _run(EngineCore(_config(), runner), [EngineRequest("g", prompt, greedy)])["g"]
    penalised = SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, presence_penalty=2.0, frequency_penalty=2.0
    )
    pen = _run(EngineCore(_config(), runner), [EngineRequest("g", prompt, penalised)])["g"]
    # Greedy text of a random model repeats; penalised greedy must repeat less.
    toks = [t for o in plain for t in o.new_token_ids]
    ptoks = [t for o in pen for t in o.new_token_ids]
    assert len(set(ptoks)) >= len(set(toks))

"""Offline batch generation through the real scheduler: an EngineCore over a ModelRunner, stepped
in this thread (no server, no ZeroMQ), as nano-vllm's ``LLMEngine.generate`` does.

Used by the oracle tests, ``deltaserve generate`` and prompt scoring (``score_prompts``). Every
prompt is one request of a single wave; ``token_budget`` is the scheduler's per-step token budget,
so a small one splits prefills into chunks at the scheduler's own boundaries and mixes them with
decodes, which must not change the result.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams, TokenLogprobs
from engine.worker.model_runner import ModelRunner


def _core(runner: ModelRunner, budget: int, num_requests: int) -> EngineCore:
    config = EngineConfig(
        model=runner.model_config,
        cache=CacheConfig(block_size=runner.block_size),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=runner.num_state_slots - 1,
            max_waiting_requests=max(num_requests, 1),
        ),
    )
    return EngineCore(config, runner)


def _run(core: EngineCore, prompts: Sequence[Sequence[int]], params: SamplingParams) -> dict[str, list]:
    """Every prompt as one request of a single wave, stepped to the end: id -> its outputs."""
    ids = [str(i) for i in range(len(prompts))]
    core.add_requests(
        AddRequests([EngineRequest(r, list(p), params) for r, p in zip(ids, prompts, strict=True)])
    )
    outs: dict[str, list] = {r: [] for r in ids}
    while core.has_work():
        for out in core.step().outputs:
            if out.error is not None:
                raise ValueError(f"prompt {out.request_id}: {out.error}")
            outs[out.request_id].append(out)
    return outs


def generate(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    params: SamplingParams | None = None,
    token_budget: int | None = None,
    stop_at_eos: bool = False,
) -> list[list[int]]:
    """``max_tokens`` tokens for each prompt (greedy unless ``params`` says otherwise); with
    ``stop_at_eos`` a prompt stops early at an EOS or stop token."""
    params = params or SamplingParams(temperature=0.0)
    params = msgspec.structs.replace(
        params, max_tokens=max_tokens, ignore_eos=params.ignore_eos or not stop_at_eos
    )
    if not stop_at_eos:
        params = msgspec.structs.replace(params, stop_token_ids=())
    budget = token_budget or max(2048, sum(len(p) for p in prompts))
    outs = _run(_core(runner, budget, len(prompts)), prompts, params)
    return [[t for o in outs[str(i)] for t in o.new_token_ids] for i in range(len(prompts))]


def score_prompts(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    top_k: int = 0,
    token_budget: int | None = None,
) -> list[list[TokenLogprobs]]:
    """Prompt logprobs (tokens 1..) of each prompt from its prefill, nothing generated; a small
    ``token_budget`` scores a prompt across several prefill chunks."""
    params = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=top_k)
    budget = token_budget or max(2048, max((len(p) for p in prompts), default=1))
    outs = _run(_core(runner, budget, len(prompts)), prompts, params)
    scored = []
    for i in range(len(prompts)):
        got = [lp for o in outs[str(i)] for lp in (o.prompt_logprobs or [])]
        scored.append(got)
    return scored

"""Offline batch generation through the real scheduler: an EngineCore over a ModelRunner, stepped
in this thread (no server, no ZeroMQ), as nano-vllm's ``LLMEngine.generate`` does.

Used by the oracle tests and ``deltaserve generate``. Every prompt is one request of a single wave;
``token_budget`` is the scheduler's per-step token budget, so a small one splits prefills into chunks
at the scheduler's own boundaries and mixes them with decodes, which must not change the result.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner


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
    config = EngineConfig(
        model=runner.model_config,
        cache=CacheConfig(block_size=runner.block_size),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=runner.num_state_slots - 1,
            max_waiting_requests=max(len(prompts), 1),
        ),
    )
    core = EngineCore(config, runner)
    ids = [str(i) for i in range(len(prompts))]
    core.add_requests(
        AddRequests([EngineRequest(r, list(p), params) for r, p in zip(ids, prompts, strict=True)])
    )
    outs: dict[str, list[int]] = {r: [] for r in ids}
    while core.has_work():
        for out in core.step().outputs:
            if out.error is not None:
                raise ValueError(f"prompt {out.request_id}: {out.error}")
            outs[out.request_id].extend(out.new_token_ids)
    return [outs[r] for r in ids]

"""Preemption by recompute on the real tiny model (CPU, fp32): a KV pool too small for the batch
forces the scheduler to evict and re-prefill requests, and every request still returns exactly the
tokens of an unpressured run (RELIABILITY 12)."""

from __future__ import annotations

import asyncio

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, ServerConfig
from engine.frontend.async_llm import AsyncLLM
from engine.sampling_params import SamplingParams
from engine.worker.resolve import resolve_model

PROMPTS = [[(11 * i + 7 * j) % 400 for j in range(40 + 3 * i)] for i in range(6)]
MAX_TOKENS = 24


async def _run(num_blocks: int) -> tuple[list[list[int]], int]:
    cfg = EngineConfig(
        model=resolve_model(ModelConfig(device="cpu", gdn_backend="torch", dtype="float32")),
        cache=CacheConfig(block_size=16, num_gpu_blocks_override=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
    )
    llm = await AsyncLLM.create(cfg, ServerConfig(), in_process=True)
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

        async def one(i: int) -> list[int]:
            toks: list[int] = []
            async for out in llm.generate(PROMPTS[i], params, f"p{i}"):
                toks += out.new_token_ids
            return toks

        outs = list(await asyncio.gather(*(one(i) for i in range(len(PROMPTS)))))
        stats = await llm.call_utility("stats")
        assert (stats["kv_blocks_used"], stats["slots_used"]) == (0, 0)
        return outs, stats["total_preemptions"]
    finally:
        await llm.shutdown()


def test_preempted_requests_match_unpressured_run():
    roomy, roomy_preempted = asyncio.run(_run(num_blocks=200))
    tight, tight_preempted = asyncio.run(_run(num_blocks=12))  # 11 usable blocks: ~2.5 requests
    assert roomy_preempted == 0
    assert tight_preempted > 0, "the small pool never forced a preemption; the test proves nothing"
    assert tight == roomy

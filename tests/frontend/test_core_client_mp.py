"""A real EngineCore child process (fake runner injected by import path) behind MPClient."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, ServerConfig
from engine.frontend.async_llm import AsyncLLM, EngineDeadError
from engine.frontend.core_client import MPClient
from engine.sampling_params import SamplingParams
from tests.core.fake_runner import CharTokenizer, expected_tokens

CFG = EngineConfig(
    model=ModelConfig(max_model_len=100_000),
    cache=CacheConfig(block_size=4, num_gpu_blocks_override=30_000),
    scheduler=SchedulerConfig(max_num_seqs=8),
)


async def start(factory: str) -> AsyncLLM:
    return await AsyncLLM.create(CFG, ServerConfig(), runner_factory=factory, tokenizer=CharTokenizer())


async def test_mp_generate_and_clean_shutdown():
    llm = await start("tests.core.fake_runner:make")
    client = llm.client
    assert isinstance(client, MPClient)
    ipc_dir = client._dir
    assert os.stat(ipc_dir).st_mode & 0o777 == 0o700
    try:
        assert llm.max_model_len == 100_000 and llm.eos_token_ids == [0]
        outs = [o async for o in llm.generate([5, 6, 7], SamplingParams(max_tokens=5), "a")]
        assert [t for o in outs for t in o.new_token_ids] == expected_tokens([5, 6, 7], 5)
        # A malformed frame sent into the engine's input is dropped; the engine keeps serving.
        client._enqueue(b"\x93\xa3bad", 1)  # through the I/O thread, the socket's only user
        outs = [o async for o in llm.generate([8], SamplingParams(max_tokens=2), "b")]
        assert outs[-1].finished
        assert await llm.call_utility("check") is True
    finally:
        await llm.shutdown()
    assert client.proc.exitcode == 0
    assert not os.path.exists(ipc_dir)


async def test_killed_engine_raises_dead_within_5s():
    llm = await start("tests.core.fake_runner:make_slow")
    try:
        it = llm.generate([1, 2, 3], SamplingParams(max_tokens=50_000), "k")
        first = await anext(it)
        assert first.new_token_ids
        client = llm.client
        assert isinstance(client, MPClient)
        t0 = time.monotonic()
        client.proc.kill()
        with pytest.raises(EngineDeadError):
            async for _ in it:
                pass
        assert time.monotonic() - t0 < 5
        assert not llm.is_alive and not llm.is_ready()
        with pytest.raises(EngineDeadError):
            llm.generate([1], SamplingParams(), "late")
    finally:
        await llm.shutdown()


async def test_engine_start_failure_is_reported():
    with pytest.raises(EngineDeadError, match="failed to start"):
        await asyncio.to_thread(MPClient, CFG, asyncio.get_running_loop(), "tests.core.fake_runner:nope", 60)

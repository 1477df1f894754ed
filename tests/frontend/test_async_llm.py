"""AsyncLLM over the in-process client with the fake runner: waves, stops, aborts, overload, death."""

from __future__ import annotations

import asyncio

import pytest

from engine.config import EngineConfig, SchedulerConfig, ServerConfig
from engine.frontend.async_llm import (
    AsyncLLM,
    ContextLengthError,
    EngineDeadError,
    InvalidRequestError,
    PromptRequest,
    QueueFullError,
    RequestOutput,
    RequestRejectedError,
)
from engine.sampling_params import SamplingParams
from tests.core.fake_runner import CharTokenizer, FakeRunner, expected_tokens


async def make_llm(runner: FakeRunner | None = None, **sched) -> AsyncLLM:
    cfg = EngineConfig(scheduler=SchedulerConfig(**{"max_num_seqs": 32, "max_waiting_requests": 8, **sched}))
    runner = runner or FakeRunner(num_kv_blocks=512, num_state_slots=33, block_size=4, max_model_len=512)
    return await AsyncLLM.create(
        cfg, ServerConfig(), in_process=True, runner=runner, tokenizer=CharTokenizer()
    )


async def collect(it) -> list[RequestOutput]:
    return [o async for o in it]


async def test_generate_tokens_text_and_usage():
    llm = await make_llm()
    try:
        outs = await collect(llm.generate([1, 2, 3], SamplingParams(max_tokens=6, logprobs=1), "r1"))
        ids = [t for o in outs for t in o.new_token_ids]
        assert ids == expected_tokens([1, 2, 3], 6)
        assert "".join(o.new_text for o in outs) == CharTokenizer().decode(ids)
        last = outs[-1]
        assert last.finished and last.finish_reason == "length" and last.num_output_tokens == 6
        assert last.first_token_time is not None and last.first_token_time >= last.arrival_time
        assert last.num_prompt_tokens == 3
        assert all(o.logprobs and len(o.logprobs) == len(o.new_token_ids) for o in outs)
        assert (await llm.call_utility("stats"))["kv_blocks_used"] == 0
    finally:
        await llm.shutdown()


async def test_wave_admitted_in_one_step():
    llm = await make_llm(max_waiting_requests=64)
    try:
        its = [llm.generate([i + 1] * 10, SamplingParams(max_tokens=3), f"w{i}") for i in range(32)]
        await asyncio.gather(*(collect(it) for it in its))
        assert 32 in llm.stats.recent_admitted
        assert llm.stats.latest is not None and llm.stats.total_steps >= 3
    finally:
        await llm.shutdown()


async def test_stop_string_truncates_and_frees():
    llm = await make_llm()
    try:
        ids = expected_tokens([9, 9], 40)
        text = CharTokenizer().decode(ids)
        stop = text[10:13]
        cut = text.find(stop)
        outs = await collect(llm.generate([9, 9], SamplingParams(max_tokens=40), "s", stop=[stop, "zzzzzz"]))
        assert "".join(o.new_text for o in outs) == text[:cut]
        assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop
        await asyncio.sleep(0.1)
        stats = await llm.call_utility("stats")
        assert stats["kv_blocks_used"] == 0 and stats["slots_used"] == 0
    finally:
        await llm.shutdown()


async def test_stop_token_reported_not_rendered():
    llm = await make_llm()
    try:
        ids = expected_tokens([4], 10)
        outs = await collect(llm.generate([4], SamplingParams(max_tokens=10, stop_token_ids=(ids[2],)), "t"))
        got = [t for o in outs for t in o.new_token_ids]
        first = ids.index(ids[2])
        assert got == ids[: first + 1]
        assert outs[-1].stop_reason == ids[2]
        assert "".join(o.new_text for o in outs) == CharTokenizer().decode(ids[:first])
    finally:
        await llm.shutdown()


async def test_early_close_aborts_in_engine():
    llm = await make_llm()
    try:
        it = llm.generate([1] * 20, SamplingParams(max_tokens=400), "long")
        async for o in it:
            if o.num_output_tokens >= 3:
                break
        await it.aclose()
        assert llm.num_unfinished == 0
        await asyncio.sleep(0.1)
        stats = await llm.call_utility("stats")
        assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0
        assert await llm.call_utility("check") is True
    finally:
        await llm.shutdown()


async def test_unstarted_stream_closed_or_dropped_aborts():
    """A wave member nobody iterates (closed at once, or just dropped) must still free its resources."""
    import gc

    llm = await make_llm()
    try:
        a, b = llm.generate_wave(
            [
                PromptRequest("u1", [1, 2, 3], SamplingParams(max_tokens=400)),
                PromptRequest("u2", [4, 5], SamplingParams(max_tokens=400)),
            ]
        )
        await a.aclose()
        del b
        gc.collect()
        for _ in range(200):
            await asyncio.sleep(0.01)
            stats = await llm.call_utility("stats")
            if llm.num_unfinished == 0 and stats["kv_blocks_used"] == 0 and stats["slots_used"] == 0:
                break
        assert llm.num_unfinished == 0
        assert (stats["kv_blocks_used"], stats["slots_used"]) == (0, 0)
    finally:
        await llm.shutdown()


async def test_cancelled_consumer_aborts():
    llm = await make_llm(FakeRunner(512, 33, 4, max_model_len=4096, step_delay_s=0.005))
    try:
        task = asyncio.create_task(collect(llm.generate([2] * 5, SamplingParams(max_tokens=2000), "c")))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert llm.num_unfinished == 0
        await asyncio.sleep(0.1)
        assert (await llm.call_utility("stats"))["num_running"] == 0
    finally:
        await llm.shutdown()


async def test_queue_full_is_all_or_nothing():
    llm = await make_llm(max_num_seqs=2, max_waiting_requests=2)  # limit 4 unfinished
    try:
        p = SamplingParams(max_tokens=2)
        its = llm.generate_wave([PromptRequest(rid, [i + 1], p) for i, rid in enumerate("abc")])
        with pytest.raises(QueueFullError):
            llm.generate_wave([PromptRequest("d", [4], p), PromptRequest("e", [5], p)])
        assert llm.num_unfinished == 3
        await asyncio.gather(*(collect(it) for it in its))
        await collect(llm.generate_wave([PromptRequest("d", [4], p)])[0])  # recovered
    finally:
        await llm.shutdown()


async def test_validation_errors():
    llm = await make_llm()
    try:
        p = SamplingParams(max_tokens=4)
        with pytest.raises(InvalidRequestError) as e:
            llm.generate([], p, "x")
        assert e.value.param == "prompt"
        for bad in ([-1], [1000], [2**63]):
            with pytest.raises(InvalidRequestError):
                llm.generate(bad, p, "x")
        with pytest.raises(InvalidRequestError):
            llm.generate([1], SamplingParams(stop_token_ids=(5000,)), "x")
        with pytest.raises(ContextLengthError) as ce:
            llm.generate([1] * 500, SamplingParams(max_tokens=20), "x")
        assert (ce.value.prompt_len, ce.value.max_tokens, ce.value.max_model_len) == (500, 20, 512)
        assert isinstance(ce.value, ValueError)
        with pytest.raises(InvalidRequestError):  # duplicate id in one wave: none admitted
            llm.generate_wave([PromptRequest("d", [1], p), PromptRequest("d", [1], p)])
        assert llm.num_unfinished == 0
    finally:
        await llm.shutdown()


async def test_never_fits_fails_fast():
    runner = FakeRunner(num_kv_blocks=5, num_state_slots=5, block_size=4, max_model_len=512)
    llm = await make_llm(runner)
    try:
        with pytest.raises(RequestRejectedError, match="never fit"):
            await asyncio.wait_for(collect(llm.generate([1] * 10, SamplingParams(max_tokens=20), "big")), 2)
        await collect(llm.generate([1] * 4, SamplingParams(max_tokens=4), "ok"))
    finally:
        await llm.shutdown()


async def test_engine_failure_raises_dead_everywhere():
    llm = await make_llm(FakeRunner(512, 33, 4, max_model_len=512, fail_at_step=3))
    try:
        its = [llm.generate([i + 1], SamplingParams(max_tokens=50), f"f{i}") for i in range(3)]
        for it in its:
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(collect(it), 5)
        assert not llm.is_alive and not llm.is_ready()
        with pytest.raises(EngineDeadError):
            llm.generate([1], SamplingParams(), "late")
    finally:
        await llm.shutdown()


async def test_admission_window_groups_requests():
    cfg = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=16))
    runner = FakeRunner(512, 17, 4, max_model_len=512)
    llm = await AsyncLLM.create(
        cfg, ServerConfig(admission_window_ms=50), runner=runner, tokenizer=CharTokenizer()
    )
    try:
        its = [llm.generate([1, 2], SamplingParams(max_tokens=2), "a")]
        await asyncio.sleep(0.01)  # a later event-loop turn, still inside the window
        its.append(llm.generate([3, 4], SamplingParams(max_tokens=2), "b"))
        await asyncio.gather(*(collect(it) for it in its))
        assert list(llm.stats.recent_admitted) == [2]
        assert llm.is_ready()
    finally:
        await llm.shutdown()


async def test_stalled_engine_turns_not_ready_then_recovers():
    """RELIABILITY 9: requests in flight and no step finishing within the stall threshold -> not
    ready; once steps finish again, ready. The engine stays alive throughout."""
    runner = FakeRunner(
        num_kv_blocks=512, num_state_slots=33, block_size=4, max_model_len=512, step_delay_s=0.6
    )
    cfg = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=32, max_waiting_requests=8))
    llm = await AsyncLLM.create(
        cfg,
        ServerConfig(engine_stall_timeout_s=0.3),
        in_process=True,
        runner=runner,
        tokenizer=CharTokenizer(),
    )
    try:
        assert llm.is_ready()  # idle is ready
        it = llm.generate([1, 2, 3], SamplingParams(max_tokens=2), "slow")
        task = asyncio.create_task(collect(it))
        await asyncio.sleep(0.45)  # inside the first 0.6 s step: nothing finished for > 0.3 s
        assert llm.is_alive and not llm.is_ready()
        await task
        assert llm.is_ready()  # no requests in flight again
    finally:
        await llm.shutdown()

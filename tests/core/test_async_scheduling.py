"""Async scheduling: a decode step launched before the previous step's tokens are read back must give
every request exactly the tokens, finish reasons and stop tokens of one-step-at-a-time scheduling.

The fake runner runs at launch and feeds a row scheduled ahead the token its previous step sampled,
as the real runner does on the device; the real runner's path is checked on the tiny model below.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams
from tests.core.fake_runner import FakeRunner, expected_tokens


def _core(async_on: bool, blocks: int = 256, slots: int = 8, budget: int = 64) -> EngineCore:
    cfg = EngineConfig(
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget, max_num_seqs=slots, async_scheduling=async_on
        ),
    )
    return EngineCore(cfg, FakeRunner(blocks + 1, slots + 1, block_size=4))


def _drive(core: EngineCore, waves: dict[int, list[EngineRequest]], aborts: dict[int, list[str]]):
    """Step to the end, adding wave ``waves[k]`` / aborting ``aborts[k]`` before step k."""
    got: dict[str, list[int]] = {}
    finish: dict[str, tuple] = {}
    k = 0
    while core.has_work() or any(i >= k for i in waves):
        if k in waves:
            core.add_requests(AddRequests(waves[k]))
        if k in aborts:
            core.abort(aborts[k])
        for o in core.step().outputs:
            assert o.request_id not in finish, f"{o.request_id}: output after its last"
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finish_reason is not None:
                finish[o.request_id] = (o.finish_reason, o.stop_token, o.error)
        core.scheduler.check_invariants()
        k += 1
        assert k < 10_000, "no progress"
    assert core.kv.num_used_blocks == 0 and core.kv.num_used_slots == 0
    return got, finish


def _req(rid: str, prompt: list[int], **kw) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingParams(temperature=0.0, **kw))


def _want(r: EngineRequest) -> list[int]:
    """The fake runner's tokens for ``r``, up to its stop token."""
    want = expected_tokens(r.prompt_token_ids, r.params.max_tokens)
    stop = r.params.stop_token_ids
    return want[: want.index(stop[0]) + 1] if stop else want


def _mixed_wave(rng: random.Random, prefix: str, n: int) -> list[EngineRequest]:
    wave = []
    for i in range(n):
        prompt = [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 30))]
        max_tokens = rng.choice([1, 2, 3, 7, 20, 40])
        kind = rng.randrange(5)
        rid = f"{prefix}{i}"
        if kind == 0:  # stops on a token it generates mid-stream
            stop = expected_tokens(prompt, max_tokens)[max_tokens // 2]
            wave.append(_req(rid, prompt, max_tokens=max_tokens, stop_token_ids=(stop,)))
        elif kind == 1:  # min_tokens reads the output: never scheduled ahead
            wave.append(_req(rid, prompt, max_tokens=max_tokens, min_tokens=1))
        elif kind == 2:
            wave.append(_req(rid, prompt, max_tokens=max_tokens, logprobs=2))
        else:
            wave.append(_req(rid, prompt, max_tokens=max_tokens))
    return wave


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("blocks", [256, 24])  # 24 blocks of 4 tokens: preemptions
def test_same_outputs_as_one_step_at_a_time(seed: int, blocks: int):
    rng = random.Random(seed)
    waves = {0: _mixed_wave(rng, "a", 6), 3: _mixed_wave(rng, "b", 5), 11: _mixed_wave(rng, "c", 9)}
    results = []
    for async_on in (False, True):
        core = _core(async_on, blocks=blocks)
        results.append(_drive(core, waves, {}))
        if not async_on:
            assert core.runner.launched_ahead == 0  # type: ignore[attr-defined]
    assert results[0] == results[1]
    got, finish = results[1]
    for wave in waves.values():
        for r in wave:
            assert got[r.request_id] == _want(r), r.request_id


def test_steady_decode_runs_ahead_every_step():
    core = _core(True)
    wave = [_req(str(i), [5 + i, 6, 7], max_tokens=30) for i in range(4)]
    got, _ = _drive(core, {0: wave}, {})
    # the prefill step samples the first token; each of the 29 decodes is launched ahead of the
    # step before it
    assert core.runner.launched_ahead == 29  # type: ignore[attr-defined]
    assert all(got[r.request_id] == expected_tokens(r.prompt_token_ids, 30) for r in wave)


def test_prefill_chunks_and_admissions_run_ahead():
    """Mixed and prefill steps are scheduled ahead too: a long prompt's later chunks (known tokens)
    and the admission of waiting requests do not wait for the step before's tokens."""
    core = _core(True, slots=2, budget=16)
    long = _req("long", list(range(1, 41)), max_tokens=6)  # 40 tokens: chunks of 16, 16 (and 8 + 1 decode)
    wave = [long] + [_req(f"s{i}", [7, i + 1, 9], max_tokens=4) for i in range(5)]
    got, finish = _drive(core, {0: wave}, {})
    for r in wave:
        assert got[r.request_id] == _want(r), r.request_id
        assert finish[r.request_id][2] is None
    ahead = core.runner.ahead  # type: ignore[attr-defined]
    chunks = [s for seqs in ahead for s in seqs if s.request_id == "long" and len(s.token_ids) > 1]
    assert [(s.num_computed, len(s.token_ids)) for s in chunks] == [(16, 16), (32, 8)]
    admitted_ahead = {s.request_id for seqs in ahead for s in seqs if s.num_computed == 0}
    assert admitted_ahead, "no waiting request was admitted in a step scheduled ahead"
    # every step after the first was launched ahead of the one before it
    assert core.runner.launched_ahead == core.runner.steps - 1  # type: ignore[attr-defined]


def test_abort_while_a_step_is_ahead():
    core = _core(True)
    wave = [_req(str(i), [9, i + 1], max_tokens=25) for i in range(3)]
    got, finish = _drive(core, {0: wave}, {6: ["1"]})
    assert "1" not in finish  # an abort ends the request without an output (the frontend asked)
    assert got["1"] == expected_tokens([9, 2], 25)[: len(got["1"])] and len(got["1"]) < 25
    for rid, prompt in (("0", [9, 1]), ("2", [9, 3])):
        assert got[rid] == expected_tokens(prompt, 25)


def test_penalties_never_run_ahead():
    core = _core(True)
    params = SamplingParams(temperature=0.0, max_tokens=12, presence_penalty=0.5)
    got, _ = _drive(core, {0: [EngineRequest("p", [3, 4, 5], params)]}, {})
    assert core.runner.launched_ahead == 0  # type: ignore[attr-defined]
    assert len(got["p"]) == 12


# ---- the real runner (tiny model, CPU): the token fed on the device is the one sampled -----------


def _tiny_runner():
    from engine.config import ModelConfig
    from engine.worker.model_runner import ModelRunner
    from engine.worker.resolve import resolve_model

    mc = resolve_model(ModelConfig(device="cpu", max_model_len=256))
    return ModelRunner(EngineConfig(model=mc, scheduler=SchedulerConfig(max_num_seqs=12)))


def test_model_runner_async_equals_sync():
    # different lengths: requests finishing by length leave the batch, so rows shift (index feed)
    prompts = [[1, 2, 3, 4], [7, 8], [5] * 9, [11, 12, 13]]
    kinds = [
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=3),
    ]
    outs = []
    for async_on in (False, True):
        runner = _tiny_runner()
        launches = []
        real = runner.launch

        def counted(seqs, prev=None, real=real, launches=launches):
            launches.append(any(s.prev_row >= 0 for s in seqs))
            return real(seqs, prev)

        runner.launch = counted
        cfg = EngineConfig(
            model=runner.model_config,
            cache=CacheConfig(block_size=runner.block_size),
            scheduler=SchedulerConfig(max_num_seqs=runner.num_state_slots - 1, async_scheduling=async_on),
        )
        core = EngineCore(cfg, runner)
        waves = {
            0: [
                EngineRequest(f"{i}-{j}", p, msgspec.structs.replace(k, max_tokens=4 + 3 * i))
                for j, k in enumerate(kinds)
                for i, p in enumerate(prompts)
            ]
        }
        got, finish = _drive(core, waves, {})
        outs.append(got)
        assert any(launches) == async_on
    assert outs[0] == outs[1]


def test_debug_log_has_one_line_per_step_with_its_tokens(caplog):
    """--log-level debug: one line per step naming its prefill / decode tokens and the host split."""
    import logging
    import re

    core = _core(True, budget=16)
    caplog.set_level(logging.DEBUG, logger="deltaserve.engine")
    core.add_requests(AddRequests([_req("a", list(range(1, 21)), max_tokens=3)]))
    steps = []
    while core.has_work():
        out = core.step()
        steps.append(out.stats)
    pat = re.compile(
        r"step (\d+): (\d+) prefill \+ (\d+) decode tokens, \d+ running, \d+ waiting, [\d.]+ ms "
        r"\(launch [\d.]+, ahead [\d.]+, wait [\d.]+, update [\d.]+\)"
    )
    lines = [
        m for r in caplog.records if r.name == "deltaserve.engine" and (m := pat.fullmatch(r.getMessage()))
    ]
    assert [int(m[1]) for m in lines] == [s.step for s in steps]
    assert [(int(m[2]), int(m[3])) for m in lines] == [
        (s.num_prefill_tokens, s.num_decode_tokens) for s in steps
    ]
    assert sum(int(m[2]) for m in lines) == 20, "the 20-token prompt in 16 + 4 token chunks"
    caplog.clear()
    caplog.set_level(logging.INFO, logger="deltaserve.engine")
    core.add_requests(AddRequests([_req("b", [1, 2, 3], max_tokens=2)]))
    while core.has_work():
        core.step()
    assert not [r for r in caplog.records if r.getMessage().startswith("step ")], "silent at info"


class _SlotMappingRunner(FakeRunner):
    """A runner that, like the CUDA runner with --gdn-state-memory on-demand, has memory for state slots
    up to ``capacity`` only (EngineCore hands its ensure_state_slot to the KVManager)."""

    def __init__(self, capacity: int, **kw) -> None:
        super().__init__(**kw)
        self.capacity = capacity
        self.asked: list[int] = []

    def ensure_state_slot(self, slot: int) -> bool:
        self.asked.append(slot)
        return slot <= self.capacity

    def launch(self, seqs, prev=None):
        assert all(s.state_slot <= self.capacity for s in seqs), "a step used a slot without memory"
        return super().launch(seqs, prev)


@pytest.mark.parametrize("async_on", [False, True])
def test_requests_wait_for_a_state_slot_with_memory_and_lose_nothing(async_on: bool):
    rng = random.Random(5)
    waves = {0: _mixed_wave(rng, "a", 8), 4: _mixed_wave(rng, "b", 6)}
    cfg = EngineConfig(
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, async_scheduling=async_on),
    )
    runner = _SlotMappingRunner(3, num_kv_blocks=257, num_state_slots=9, block_size=4)
    core = EngineCore(cfg, runner)
    got, finish = _drive(core, waves, {})
    assert runner.asked and max(runner.asked) == 4  # slot 4 was asked for and refused, never used
    for wave in waves.values():
        for r in wave:
            assert got[r.request_id] == _want(r), r.request_id
            assert finish[r.request_id][2] is None  # no error

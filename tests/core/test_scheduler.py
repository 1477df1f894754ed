"""Scheduler + KV manager with the fake runner: budget, chunking, preemption, abort, stops, fuzz."""

from __future__ import annotations

import random
import time

import pytest

from engine.config import SchedulerConfig
from engine.core.kv_manager import KVManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.messages import EngineOutput
from engine.sampling_params import SamplingParams
from tests.core.fake_runner import FakeRunner, expected_tokens


class Harness:
    def __init__(self, blocks: int = 64, slots: int = 8, block_size: int = 4, budget: int = 64,
                 max_num_seqs: int = 8, max_model_len: int = 4096) -> None:  # fmt: skip
        self.runner = FakeRunner(blocks + 1, slots + 1, block_size, max_model_len=max_model_len)
        self.kv = KVManager(blocks + 1, slots + 1, block_size)
        cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)
        self.sched = Scheduler(cfg, self.kv, self.runner.eos_token_ids, max_model_len)
        self.out: dict[str, list[int]] = {}
        self.finish: dict[str, str | None] = {}
        self.errors: list[EngineOutput] = []
        self.preemptions = 0

    def add(self, *reqs: Request) -> list[EngineOutput]:
        rejected = self.sched.add_wave(reqs)
        self.errors += rejected
        self.sched.check_invariants()
        return rejected

    def step(self):
        s = self.sched.schedule()
        self.sched.check_invariants()
        self.preemptions += s.num_preemptions
        assert s.num_tokens <= self.sched.budget
        assert len(s.seqs) <= self.sched.max_num_seqs
        if s.seqs:
            for o in self.sched.update(s, self.runner.execute_model(s.seqs)):
                self.out.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason:
                    self.finish[o.request_id] = o.finish_reason
        self.sched.check_invariants()
        return s

    def run(self, max_steps: int = 100_000) -> int:
        n = 0
        while self.sched.has_work():
            self.step()
            n += 1
            assert n < max_steps, "no progress"
        return n

    def assert_empty(self) -> None:
        assert self.kv.num_used_blocks == 0 and self.kv.num_used_slots == 0
        assert not self.sched.requests and not self.sched.waiting and not self.sched.running


def req(rid: str, n_prompt: int, max_tokens: int = 8, seed: int | None = None, **kw) -> Request:
    rng = random.Random(rid)
    prompt = [rng.randrange(1, 1000) for _ in range(n_prompt)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, seed=seed, **kw))


def test_chunked_prefill_under_small_budget():
    h = Harness(budget=16)
    reqs = [req(f"r{i}", 50, max_tokens=5) for i in range(3)]
    h.add(*reqs)
    s = h.step()
    # One 16-token chunk of the first request; intermediate chunks do not sample.
    assert [(q.request_id, len(q.token_ids), q.sample) for q in s.seqs] == [("r0", 16, False)]
    s = h.step()
    assert s.seqs[0].num_computed == 16
    h.run()
    for r in reqs:
        assert h.out[r.request_id] == expected_tokens(r.token_ids[:50], 5)
        assert h.finish[r.request_id] == "length"
    h.assert_empty()


def test_decodes_first_and_last_chunk_samples():
    h = Harness(budget=20)
    h.add(req("a", 3, max_tokens=10))
    h.step()  # a prefilled, sampled
    h.add(req("b", 30, max_tokens=2))
    s = h.step()
    assert [q.request_id for q in s.seqs] == ["a", "b"]
    assert s.seqs[0].sample and len(s.seqs[0].token_ids) == 1
    assert len(s.seqs[1].token_ids) == 19 and not s.seqs[1].sample
    s = h.step()
    b = [q for q in s.seqs if q.request_id == "b"][0]
    assert b.num_computed == 19 and len(b.token_ids) == 11 and b.sample


def test_first_token_carries_its_engine_timings():
    """The output with a request's first token carries (queued, first scheduled, token read back), in
    that order, the schedule stamped at its first chunk; no other output carries timings. A preempted
    request keeps its first schedule time."""
    h = Harness(budget=16)
    a, b = req("a", 40, max_tokens=3), req("b", 4, max_tokens=3)
    a.queued_time = b.queued_time = time.monotonic()
    h.add(a, b)
    outs: list[EngineOutput] = []
    first_chunk = h.sched.schedule()  # a's first 16 tokens only: no token yet
    assert [q.request_id for q in first_chunk.seqs] == ["a"] and a.scheduled_time >= a.queued_time
    scheduled_a = a.scheduled_time
    outs += h.sched.update(first_chunk, h.runner.execute_model(first_chunk.seqs))
    assert outs == []
    while h.sched.has_work():
        s = h.sched.schedule()
        outs += h.sched.update(s, h.runner.execute_model(s.seqs))
    assert a.scheduled_time == scheduled_a and b.scheduled_time >= scheduled_a
    for r in (a, b):
        mine = [o for o in outs if o.request_id == r.request_id]
        assert len(mine) == 3 and all(o.timings is None for o in mine[1:])
        queued, scheduled, token = mine[0].timings
        assert (queued, scheduled) == (r.queued_time, r.scheduled_time) and queued <= scheduled <= token


def test_a_preempted_request_keeps_its_first_schedule_time():
    h = Harness(blocks=20, slots=8, block_size=4)  # 80 tokens for ~5 x 45: preemptions
    h.add(*[req(f"p{i}", 10 + 3 * i, max_tokens=24) for i in range(5)])
    first: dict[str, float] = {}
    timings: dict[str, list[float]] = {}
    preempted = 0
    while h.sched.has_work():
        s = h.sched.schedule()
        preempted += s.num_preemptions
        for r in s.requests:
            first.setdefault(r.request_id, r.scheduled_time)
        for o in h.sched.update(s, h.runner.execute_model(s.seqs)):
            if o.timings is not None:
                assert o.request_id not in timings
                timings[o.request_id] = o.timings
    assert preempted > 0 and set(timings) == set(first)
    assert all(timings[rid][1] == first[rid] for rid in first)


def test_wave_of_32_admitted_in_one_step():
    h = Harness(blocks=512, slots=32, budget=2048, max_num_seqs=32)
    h.add(*[req(f"w{i}", 20) for i in range(32)])
    s = h.step()
    assert s.num_admitted == 32 and len(s.seqs) == 32


def test_max_num_seqs_caps_a_step():
    h = Harness(blocks=512, slots=8, budget=2048, max_num_seqs=4)
    h.add(*[req(f"w{i}", 5) for i in range(10)])
    assert len(h.step().seqs) == 4
    h.run()
    h.assert_empty()


def test_preemption_resume_gives_identical_tokens():
    prompts = [req(f"p{i}", 10 + 3 * i, max_tokens=24, seed=i if i % 2 else None) for i in range(5)]
    free = Harness(blocks=256, slots=8)
    free.add(*[Request(r.request_id, list(r.token_ids), r.params) for r in prompts])
    free.run()
    assert free.preemptions == 0
    tight = Harness(blocks=20, slots=8, block_size=4)  # 80 tokens for ~5 x 45
    tight.add(*prompts)
    tight.run()
    assert tight.preemptions > 0
    assert tight.out == free.out
    tight.assert_empty()


def test_never_fits_rejected_at_admission():
    h = Harness(blocks=4, block_size=4)  # 16 tokens in the whole pool
    rejected = h.add(req("big", 10, max_tokens=10), req("ok", 4, max_tokens=4))
    assert [o.request_id for o in rejected] == ["big"]
    assert rejected[0].finish_reason == "error" and "never fit" in (rejected[0].error or "")
    h.run()
    assert h.finish == {"ok": "length"}
    h.assert_empty()


def _abort_now(h: Harness, rid: str) -> None:
    assert h.sched.abort([rid]) == [rid]
    h.sched.check_invariants()


def test_abort_in_every_state():
    h = Harness(blocks=16, slots=4, block_size=4, budget=8)
    h.add(req("running", 3, max_tokens=30), req("prefill", 20, max_tokens=30), req("waiting", 3))
    h.step()
    h.step()
    assert h.sched.requests["prefill"].num_computed not in (0, 20)  # mid-prefill
    _abort_now(h, "prefill")
    _abort_now(h, "waiting")
    h.add(req("victim", 8, max_tokens=30))
    for _ in range(30):  # grow "running" until the younger "victim" is preempted
        h.step()
        v = h.sched.requests.get("victim")
        if v is not None and v.num_preemptions and v in h.sched.waiting:
            break
    else:
        pytest.fail("no preemption happened")
    _abort_now(h, "victim")  # preempted
    _abort_now(h, "running")
    assert h.sched.abort(["running", "nope"]) == []
    h.assert_empty()


def test_stop_conditions():
    toks = expected_tokens([5, 6, 7], 10, seed=1)
    h = Harness()
    stop_tok = toks[3]
    h.add(
        Request("stop", [5, 6, 7], SamplingParams(max_tokens=10, seed=1, stop_token_ids=(stop_tok,))),
        Request(
            "min", [5, 6, 7], SamplingParams(max_tokens=10, seed=1, stop_token_ids=(toks[1],), min_tokens=2)
        ),
        Request("len", [5, 6, 7], SamplingParams(max_tokens=4, seed=1)),
    )
    h.run()
    assert h.out["stop"] == toks[:4] and h.finish["stop"] == "stop"
    # toks[1] is the second token: min_tokens=2 means it does not stop there.
    assert h.finish["min"] == ("stop" if toks[1] in toks[2:] else "length")
    assert h.out["len"] == toks[:4] and h.finish["len"] == "length"
    h.assert_empty()


def test_eos_and_ignore_eos():
    toks = expected_tokens([1, 2], 6, seed=3)
    h = Harness()
    h.sched.eos_token_ids = frozenset({toks[2]})
    h.add(Request("eos", [1, 2], SamplingParams(max_tokens=6, seed=3)),
          Request("ign", [1, 2], SamplingParams(max_tokens=6, seed=3, ignore_eos=True)))  # fmt: skip
    h.run()
    assert h.out["eos"] == toks[:3] and h.finish["eos"] == "stop"
    assert h.out["ign"] == toks and h.finish["ign"] == "length"


def test_random_operations_keep_invariants():
    rng = random.Random(1234)
    h = Harness(blocks=40, slots=6, block_size=4, budget=24, max_num_seqs=6, max_model_len=200)
    t0 = time.monotonic()
    next_id = 0
    live: list[str] = []
    prompts: dict[str, tuple[list[int], SamplingParams]] = {}
    for _ in range(10_000):
        op = rng.random()
        if op < 0.25 and len(h.sched.requests) < 24:  # bounded queue, as AsyncLLM keeps it
            wave = []
            for _ in range(rng.randint(1, 4)):
                rid = f"q{next_id}"
                next_id += 1
                wave.append(req(rid, rng.randint(1, 60), max_tokens=rng.randint(1, 120), seed=next_id))
            prompts.update({r.request_id: (r.token_ids[:], r.params) for r in wave})
            rejected = {o.request_id for o in h.add(*wave)}
            live += [r.request_id for r in wave if r.request_id not in rejected]
        elif op < 0.35 and live:
            rid = live.pop(rng.randrange(len(live)))
            h.sched.abort([rid])
            h.sched.check_invariants()
        else:
            h.step()
        live = [r for r in live if r in h.sched.requests]
    h.sched.abort(list(h.sched.requests))
    h.sched.check_invariants()
    h.assert_empty()
    assert h.preemptions > 0 and h.errors
    done = [rid for rid, why in h.finish.items() if why == "length"]
    assert len(done) > 100
    for rid in done:  # preempted or not, every completed request got exactly its own tokens
        prompt, params = prompts[rid]
        assert h.out[rid] == expected_tokens(prompt, params.max_tokens, params.seed)
    assert time.monotonic() - t0 < 20


def test_a_request_whose_state_slot_cannot_be_mapped_waits_holding_nothing():
    """The runner maps a slot's memory when it is first handed out (engine/model/vmm.py); when the
    device has none for another slot, the queue head waits, its blocks go back, and it runs once a
    mapped slot is free, with the tokens it would have had."""
    h = Harness(slots=8)
    h.kv = KVManager(65, 9, 4, slot_ready=lambda slot: slot <= 2)
    h.sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8), h.kv,
                        h.runner.eos_token_ids, 4096)  # fmt: skip
    reqs = [req(f"r{i}", 10, max_tokens=4) for i in range(4)]
    h.add(*reqs)
    s = h.step()
    assert [r.request_id for r in s.requests] == ["r0", "r1"]
    assert h.kv.block_table("r2") == [] and h.kv.slot("r2") == 0 and len(h.sched.waiting) == 2
    assert max(h.kv.slot(r) for r in ("r0", "r1")) == 2
    h.run()
    h.assert_empty()
    for r in reqs:
        assert h.out[r.request_id] == expected_tokens(r.token_ids[: r.num_prompt_tokens], 4)
        assert h.finish[r.request_id] == "length"

"""The piecewise step (engine/worker/piecewise.py) without a GPU: its pieces, run eagerly over padded
static buffers, compute the plain forward's step (logits and every pool), whatever the padded rows
hold, and a runner serving through them (async scheduling included) gives the plain runner's tokens.
The captured graphs are compared with these eager pieces bit for bit in
tests/model/test_piecewise_gpu.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from engine.config import EngineConfig, ModelConfig, SchedulerConfig
from engine.model.cache import ModelCache
from engine.model.forward_batch import ForwardBatch, SeqSpec
from engine.worker.model_runner import ModelRunner
from engine.worker.piecewise import MAX_TOKENS, PiecewiseGraphs, token_buckets
from engine.worker.resolve import resolve_model


@pytest.mark.parametrize("max_tokens", [1, 15, 16, 17, 256, 300, 2048, 2049, 8192])
def test_buckets_cover_every_token_count_up_to_the_budget(max_tokens):
    buckets = token_buckets(max_tokens)
    # up to the budget, or to 2,048 tokens: larger steps run eagerly (bucket() is None for them)
    assert list(buckets) == sorted(set(buckets)) and buckets[-1] == min(max_tokens, MAX_TOKENS)
    gaps = [b - a for a, b in zip((0, *buckets), buckets, strict=False)]
    assert max(gaps) <= 128  # no step pads more than 127 rows


def test_bad_budget_is_refused():
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        token_buckets(0)


def spy(monkeypatch, obj, name: str) -> list[tuple]:
    """Wrap ``obj.name`` so each call's arguments are recorded, then passed on; returns the record."""
    calls: list[tuple] = []
    real = getattr(obj, name)

    def recorded(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(obj, name, recorded)
    return calls


def _pools(cache: ModelCache) -> list[torch.Tensor]:
    """Every pool, the recurrent state as far as it has memory (an on-demand pool maps slots as used)."""
    rows = cache.grown.mapped_rows if cache.grown is not None else cache.num_slots
    return cache.k_cache + cache.v_cache + cache.conv_state + [t[:rows] for t in cache.ssm_state]


def _mixed_step(vocab: int, bs: int) -> tuple[list[SeqSpec], list[SeqSpec]]:
    """A prefill of four sequences, then a mixed step: three decodes, one continuing chunk, one new
    prompt (token ids from numpy's generator: the same on every CPU)."""
    rng = np.random.default_rng(7)
    lens = [5, 17, 9, 40]
    tables = [list(range(1 + 4 * i, 5 + 4 * i)) for i in range(5)]  # 4 blocks each, room for 64 tokens

    def ids(n: int) -> list[int]:
        return rng.integers(0, vocab, n).tolist()

    first = [SeqSpec(ids(n), 0, tables[i], i + 1, sample=i < 3) for i, n in enumerate(lens)]
    second = [SeqSpec(ids(1), lens[i], tables[i], i + 1) for i in range(3)]
    second += [SeqSpec(ids(11), lens[3], tables[3], 4), SeqSpec(ids(23), 0, tables[4], 5)]
    return first, second


def test_pieces_equal_the_plain_forward_whatever_the_padding_holds():
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    model, bs = runner.model, runner.block_size
    first, second = _mixed_step(runner.vocab_size, bs)
    cache = ModelCache.allocate(runner.cache_spec, 24, bs, 6, runner.dtype, runner.device)
    model(ForwardBatch.build(first, bs, runner.device), cache)
    fb = ForwardBatch.build(second, bs, runner.device)
    assert fb.num_decodes == 3 and fb.num_tokens == 37

    plain_cache = copy.deepcopy(cache)
    want = model(fb, plain_cache)

    pw = PiecewiseGraphs(model, 64, runner.device, capture=False)
    assert pw.bucket(fb.num_tokens) == 64  # 27 padded rows
    runs = []
    for fill in (0.0, float("nan")):  # the padded rows hold zeros, then NaN
        for buf in (pw.h, pw.x, pw.scratch):
            buf.fill_(fill)
        step_cache = copy.deepcopy(cache)
        runs.append((pw.run(fb, step_cache).clone(), step_cache))  # the next step overwrites them
    for logits, step_cache in runs:
        assert logits.shape == want.shape and torch.isfinite(logits).all()
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        for got, ref in zip(_pools(step_cache), _pools(plain_cache), strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # what the padded rows held changed nothing, bit for bit
    assert torch.equal(runs[0][0], runs[1][0])
    for a, b in zip(_pools(runs[0][1]), _pools(runs[1][1]), strict=True):
        assert torch.equal(a, b)


def test_a_step_beyond_the_largest_bucket_is_refused():
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    bs = runner.block_size
    cache = ModelCache.allocate(runner.cache_spec, 8, bs, 2, runner.dtype, runner.device)
    pw = PiecewiseGraphs(runner.model, 16, runner.device, capture=False)
    fb = ForwardBatch.build([SeqSpec([1] * 17, 0, [1, 2], 1)], bs, runner.device)
    with pytest.raises(ValueError, match="beyond the largest bucket, 16"):
        pw.run(fb, cache)


# Three kinds of sampling the serving tests cycle through: greedy with logprobs, seeded top-k, a
# greedy request whose prompt is scored.
def sampling_kinds() -> list:
    from engine.sampling_params import SamplingParams

    return [
        SamplingParams(temperature=0.0, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.8, top_k=20, seed=5, ignore_eos=True),
        SamplingParams(temperature=0.0, ignore_eos=True, prompt_logprobs=3),  # a scoring step
    ]


def engine_core(runner: ModelRunner, max_num_seqs: int):
    """The real EngineCore over ``runner``: async scheduling, a 48-token budget (chunked prefills)."""
    from engine.core.engine_core import EngineCore

    sched = SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=max_num_seqs, async_scheduling=True)
    return EngineCore(EngineConfig(model=runner.model_config, scheduler=sched), runner)


def drain(core, outs: dict[str, list]) -> None:
    """Step ``core`` until it has no work, appending (tokens, logprobs + prompt logprobs, finish reason)
    per output to its request's list."""
    while core.has_work():
        for o in core.step().outputs:
            outs[o.request_id].append(
                (o.new_token_ids, (o.logprobs or []) + (o.prompt_logprobs or []), o.finish_reason)
            )


def _serve(runner: ModelRunner) -> dict[str, list]:
    """Eight requests of mixed sampling through the real EngineCore with async scheduling: chunked
    prefills, mixed steps, decodes scheduled ahead (their input token read from the step before)."""
    import msgspec

    from engine.messages import AddRequests, EngineRequest

    core, kinds = engine_core(runner, 8), sampling_kinds()
    rng = np.random.default_rng(3)
    reqs = [
        EngineRequest(
            f"{i}",
            rng.integers(0, runner.vocab_size, 5 + 7 * i).tolist(),
            msgspec.structs.replace(kinds[i % 3], max_tokens=4 + 3 * i),
        )
        for i in range(8)
    ]
    core.add_requests(AddRequests(reqs))
    outs: dict[str, list] = {r.request_id: [] for r in reqs}
    drain(core, outs)
    return outs


def test_the_runner_serves_every_step_through_the_pieces(monkeypatch):
    """On the CPU the runner takes the same piecewise path as on a GPU, with the pieces run eagerly:
    every step (prefill, mixed, decode, prompt scoring) goes through them and never through the
    plain forward, and the tokens, logprobs and prompt logprobs equal the plain runner's."""
    plain = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    want = _serve(plain)
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    runner.piecewise = PiecewiseGraphs(runner.model, 48, runner.device, capture=False)
    steps = spy(monkeypatch, runner.piecewise, "run")
    scoring = spy(monkeypatch, runner.piecewise, "hidden_states")
    launches = spy(monkeypatch, runner, "launch")
    monkeypatch.setattr(runner, "execute", lambda fb: pytest.fail("a step ran the plain forward"))
    monkeypatch.setattr(runner.model, "hidden_states", lambda fb, c: pytest.fail("a plain scoring step"))
    got = _serve(runner)
    assert len(steps) >= 10 and len(scoring) >= 2
    # decodes scheduled ahead read their input token on the device
    assert sum(any(s.prev_row >= 0 for s in seqs) for seqs, *_ in launches) >= 3
    assert [[t for t, _, _ in v] for v in got.values()] == [[t for t, _, _ in v] for v in want.values()]
    compared = 0
    for a, b in zip(got.values(), want.values(), strict=True):
        for (_, lp_a, fin_a), (_, lp_b, fin_b) in zip(a, b, strict=True):
            assert fin_a == fin_b
            if lp_b:
                for x, y in zip(lp_a, lp_b, strict=True):
                    compared += 1
                    assert x.token_id == y.token_id and [t for t, _ in x.top] == [t for t, _ in y.top]
                    # fp32 GEMMs over the padded bucket block differently on the CPU: up to ~2e-4 apart
                    assert abs(x.logprob - y.logprob) <= 1e-3
                    np.testing.assert_allclose([v for _, v in x.top], [v for _, v in y.top], atol=1e-3)
    assert compared >= 40  # the greedy requests' logprobs and the prompts' were compared


def test_a_step_above_the_largest_bucket_runs_the_plain_forward(monkeypatch):
    """Buckets stop at MAX_TOKENS: a longer step (a budget above 2,048 tokens) runs eagerly, and the
    first bucket-sized step after it goes through the pieces again."""
    from engine.sampling_params import SamplingParams
    from engine.worker.step import ScheduledSeq

    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    runner.piecewise = PiecewiseGraphs(runner.model, 4096, runner.device, capture=False)
    assert runner.piecewise.buckets[-1] == MAX_TOKENS
    pieces, plain = spy(monkeypatch, runner.piecewise, "run"), spy(monkeypatch, runner, "execute")
    greedy = SamplingParams(temperature=0.0)
    bs = runner.block_size
    for n in (MAX_TOKENS + 1, MAX_TOKENS):
        blocks = list(range(1, 1 + -(-n // bs)))
        runner.execute_model(
            [ScheduledSeq(token_ids=[3] * n, num_computed=0, block_ids=blocks, state_slot=1, params=greedy)]
        )
        assert (len(plain), len(pieces)) == ((1, 0) if n > MAX_TOKENS else (1, 1))

"""Whole-step prefill graphs (arm graphs.prefill, engine/worker/prefill_graphs.py) without a GPU: the
step they capture, run eagerly over the bucket's padded static batch, computes the plain forward's
logits and pools whatever the padded rows hold, the steps they take are exactly the lone prompts, and
a runner serving through them gives the plain runner's tokens. The captured graphs are compared with
this eager step bit for bit in tests/model/test_prefill_graphs_gpu.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from engine.config import EngineConfig, ModelConfig
from engine.model.cache import ModelCache
from engine.model.forward_batch import ForwardBatch, SeqSpec, host_arrays
from engine.ops.arms import DEFAULT_ARMS, KernelShapes, usable_arms
from engine.ops.gdn.chunk_split import entry_bytes
from engine.worker.model_runner import ModelRunner
from engine.worker.piecewise import PiecewiseGraphs
from engine.worker.prefill_graphs import MAX_TOKENS, PrefillGraphs, padded_arrays
from engine.worker.resolve import resolve_model
from tests.worker.test_piecewise import _pools, drain, engine_core, sampling_kinds, spy

RNG = np.random.default_rng(11)


def _ids(n: int, vocab: int) -> list[int]:
    return RNG.integers(0, vocab, n).tolist()


def _live(cache: ModelCache) -> list[torch.Tensor]:
    """Every pool but the null KV block 0, which the padded rows write (nothing reads it)."""
    return [t[1:] for t in cache.k_cache + cache.v_cache] + _pools(cache)[2 * len(cache.k_cache) :]


def test_padded_arrays_are_the_batch_arrays_then_the_null_block():
    seq = SeqSpec([5, 6, 7], num_computed=14, block_ids=[3, 9], state_slot=2)
    want, ints = host_arrays([seq], 16)
    got, got_ints = padded_arrays(seq, 16, tokens=16, blocks=5)
    assert got_ints == ints and list(got) == list(want)
    for name in ("input_ids", "positions", "slot_mapping"):
        assert got[name].shape == (16,) and got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name][:3], want[name])
        assert not got[name][3:].any()  # padded rows: token 0 at position 0, KV slot 0 (null block)
    np.testing.assert_array_equal(got["positions"][:3], [14, 15, 16])
    np.testing.assert_array_equal(got["slot_mapping"][:3], [3 * 16 + 14, 3 * 16 + 15, 9 * 16])
    np.testing.assert_array_equal(got["block_table"], [[3, 9, 0, 0, 0]])
    np.testing.assert_array_equal(got["query_start_loc"], [0, 3])  # the real length, not the bucket
    np.testing.assert_array_equal(got["logits_indices"], [2])
    with pytest.raises(ValueError, match="exceeds the graph's 2 x 5"):
        padded_arrays(seq, 16, tokens=2, blocks=5)
    with pytest.raises(ValueError, match="exceeds the graph's 16 x 1"):
        padded_arrays(seq, 16, tokens=16, blocks=1)


def _setup(max_tokens: int = 64, max_blocks: int = 8):
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    cache = ModelCache.allocate(runner.cache_spec, 24, runner.block_size, 4, runner.dtype, runner.device)
    pw = PiecewiseGraphs(runner.model, max_tokens, runner.device, capture=False, spare_tokens=max_tokens)
    return runner, cache, pw, PrefillGraphs(pw, cache, max_blocks, pdl=False, capture=False)


def test_only_lone_sampled_prompts_within_the_buckets_take_the_graphs():
    runner, _, _, pg = _setup(max_tokens=64, max_blocks=4)
    v = runner.vocab_size
    prompt = SeqSpec(_ids(20, v), 0, [1, 2], 1)
    assert pg.bucket([prompt]) == 32
    assert pg.bucket([SeqSpec(_ids(16, v), 0, [1], 1)]) == 16
    assert pg.bucket([SeqSpec(_ids(64, v), 0, [1, 2, 3, 4], 1)]) == 64
    assert pg.bucket([SeqSpec(_ids(9, v), 30, [1, 2, 3], 1)]) == 16  # a continuing chunk
    assert pg.bucket([SeqSpec(_ids(65, v), 0, [1, 2, 3, 4, 5], 1)]) is None  # beyond the largest bucket
    assert pg.bucket([SeqSpec(_ids(5, v), 60, [1, 2, 3, 4, 5], 1)]) is None  # a longer table than graphed
    assert pg.bucket([SeqSpec(_ids(20, v), 0, [1, 2], 1, sample=False)]) is None  # a chunk not sampled
    assert pg.bucket([SeqSpec(_ids(1, v), 7, [1], 1)]) is None  # a decode
    assert pg.bucket([prompt, SeqSpec(_ids(3, v), 0, [3], 2)]) is None  # two sequences


def test_the_graphs_stop_at_max_tokens():
    _, _, pw, pg = _setup(max_tokens=2048, max_blocks=80)
    assert pg.buckets == tuple(b for b in pw.buckets if b <= MAX_TOKENS) and pg.buckets[-1] == MAX_TOKENS
    blocks = list(range(1, 1 + -(-(MAX_TOKENS + 1) // 16)))
    assert pg.bucket([SeqSpec([1] * MAX_TOKENS, 0, blocks, 1)]) == MAX_TOKENS
    assert pg.bucket([SeqSpec([1] * (MAX_TOKENS + 1), 0, blocks, 1)]) is None  # the pieces take it
    assert pw.bucket(MAX_TOKENS + 1) is not None


@pytest.mark.parametrize(("max_tokens", "spare"), [(64, 64), (300, 128), (2048, 1024)])
def test_core_spare_rows_are_dead_while_a_core_runs(max_tokens, spare):
    """The cores' static transients (a GDN core's conv output and workspace, an attention core's q)
    overlap no layer's projection or core buffer at their bucket, nor the workspace (the q and the
    conv output share a spot: no two cores run at once), are large enough, 256-byte aligned inside
    the scratch, and exist only up to ``spare_tokens``."""
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    pw = PiecewiseGraphs(runner.model, max_tokens, runner.device, capture=False, spare_tokens=spare)
    cfg, base = runner.model.cfg, pw.scratch.data_ptr()
    end = base + pw.scratch.numel() * pw.scratch.element_size()

    def span(t: torch.Tensor) -> tuple[int, int]:
        return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()

    for tb in pw.buckets:
        got, q = pw.core_spare(tb), pw.q_spare(tb)
        if tb > spare:
            assert got is None and q is None
            continue
        assert got is not None and q is not None
        conv, ws = got
        assert conv.shape == (tb, cfg.conv_dim) and conv.dtype == pw.scratch.dtype and ws.dtype == torch.uint8
        assert ws.numel() >= entry_bytes(tb, 1, cfg.linear_num_value_heads)
        assert q.shape == (tb, cfg.num_attention_heads, cfg.head_dim) and q.is_contiguous()
        mine = [span(conv), span(ws), span(q)]
        busy = [span(pw.proj(i, tb)) for i in range(pw.num_layers)]
        busy += [span(pw.core(i, tb)) for i in range(pw.num_layers)]
        for lo, hi in mine:
            assert (lo - base) % 256 == 0 and base <= lo < hi <= end
            assert all(hi <= b_lo or b_hi <= lo for b_lo, b_hi in busy)
        (w_lo, w_hi) = mine[1]
        for lo, hi in (mine[0], mine[2]):
            assert hi <= w_lo or w_hi <= lo


def test_graphs_prefill_is_dropped_without_the_piecewise_graphs_or_the_paged_attention():
    shapes = KernelShapes(conv_width=4, key_head_dim=128, value_head_dim=128, dtype="bfloat16")
    base = DEFAULT_ARMS | {"graphs.prefill"}
    assert usable_arms(base, shapes) == (base, [])
    for missing in ("graphs.piecewise", "attention.paged"):
        arms, notes = usable_arms(base - {missing}, shapes)
        assert arms == base - {missing, "graphs.prefill"}
        assert notes == [
            "kernel arm graphs.prefill builds on attention.paged and graphs.piecewise: running without it"
        ]
    tiny = KernelShapes(4, 128, 128, "bfloat16", attention_head_dim=32)  # no paged attention kernel
    arms, notes = usable_arms(base, tiny)
    assert "graphs.prefill" not in arms and "attention.paged" not in arms and len(notes) == 2


@pytest.mark.parametrize(("n", "computed"), [(20, 0), (32, 0), (1, 0), (9, 23), (16, 16)])
def test_the_whole_step_equals_the_plain_forward_whatever_the_padding_holds(n, computed):
    """A prompt (or a continuing chunk over a cached prefix ending mid-block or on a boundary) run as
    the graph's step over its bucket's padded batch: the logits and every pool equal the plain
    forward's; NaN in every padded row of the static buffers changes nothing, bit for bit."""
    runner, cache, pw, pg = _setup()
    model, bs, v = runner.model, runner.block_size, runner.vocab_size
    blocks = [5, 2, 7, 3][: -(-(computed + n) // bs)]
    if computed:  # the prefix: cached by an earlier plain step
        model(ForwardBatch.build([SeqSpec(_ids(computed, v), 0, blocks, 3)], bs, runner.device), cache)
    seq = SeqSpec(_ids(n, v), computed, blocks, 3)
    plain_cache = copy.deepcopy(cache)
    want = model(ForwardBatch.build([seq], bs, runner.device), plain_cache)
    tb = pg.bucket([seq])
    assert tb == pw.bucket(n)
    runs = []
    for fill in (0.0, float("nan")):
        for buf in (pw.h, pw.x, pw.scratch):
            buf.fill_(fill)
        pg.cache = step_cache = copy.deepcopy(cache)
        pg.graphs.clear()  # each run builds its static batch over its own cache
        runs.append((pg.run(seq, tb).clone(), step_cache))
    for logits, step_cache in runs:
        assert logits.shape == (1, v) and torch.isfinite(logits).all()
        # the fp32 CPU GEMMs over the bucket's rows block their sums differently from the plain
        # forward's (the host ints alone change nothing: checked bit for bit), up to ~2e-4 apart after
        # the dummy weights' layers; a wrong position, slot or length is off by O(1)
        torch.testing.assert_close(logits.float(), want, rtol=1e-3, atol=1e-3)
        for got, ref in zip(_live(step_cache), _live(plain_cache), strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
    assert torch.equal(runs[0][0], runs[1][0])
    for a, b in zip(_live(runs[0][1]), _live(runs[1][1]), strict=True):
        assert torch.equal(a, b)


def _serve_one_by_one(runner: ModelRunner) -> dict[str, list]:
    """Five requests through the real EngineCore (async scheduling), each admitted once the one before
    has finished, so every prompt's step holds it alone: prompts chunked by a 48-token budget, greedy
    with logprobs, seeded sampling, a prompt scored."""
    import msgspec

    from engine.messages import AddRequests, EngineRequest

    core, kinds = engine_core(runner, 4), sampling_kinds()
    rng = np.random.default_rng(5)
    outs: dict[str, list] = {}
    for i, n in enumerate((7, 30, 61, 16, 100)):
        ids = rng.integers(0, runner.vocab_size, n).tolist()
        params = msgspec.structs.replace(kinds[i % 3], max_tokens=3 + i)
        core.add_requests(AddRequests([EngineRequest(f"{i}", ids, params)]))
        outs[f"{i}"] = []
        drain(core, outs)
    return outs


def test_the_runner_serves_lone_prompts_through_the_whole_step(monkeypatch):
    """Served through EngineCore, every step of one sampled prompt (its last chunk) runs the whole-step
    path, the other prefill steps (earlier chunks, the scored prompt) the pieces, with the plain
    runner's tokens and logprobs."""
    want = _serve_one_by_one(ModelRunner(EngineConfig(model=resolve_model(ModelConfig()))))
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    runner.piecewise = pw = PiecewiseGraphs(runner.model, 48, runner.device, capture=False, spare_tokens=48)
    max_blocks = -(-runner.max_model_len // runner.block_size)
    runner.prefill_graphs = PrefillGraphs(pw, runner.cache, max_blocks, pdl=False, capture=False)
    whole = spy(monkeypatch, runner.prefill_graphs, "run")
    pieces = spy(monkeypatch, pw, "run")
    monkeypatch.setattr(runner, "execute", lambda fb: pytest.fail("a step ran the plain forward"))
    got = _serve_one_by_one(runner)
    # the last chunks of prompts 0, 1, 3, 4 (prompt 2 is scored); 61- and 100-token prompts' first chunks
    assert [len(seq.token_ids) for seq, _ in whole] == [7, 30, 16, 4]
    prefills = [fb.num_tokens for fb, _ in pieces if fb.num_decodes == 0]
    assert prefills == [48, 48]  # prompt 4's first two chunks (not sampled); the rest are decodes
    assert [[t for t, _, _ in x] for x in got.values()] == [[t for t, _, _ in x] for x in want.values()]
    compared = 0
    for a, b in zip(got.values(), want.values(), strict=True):
        for (_, lp_a, fin_a), (_, lp_b, fin_b) in zip(a, b, strict=True):
            assert fin_a == fin_b and len(lp_a) == len(lp_b)
            for x, y in zip(lp_a, lp_b, strict=True):
                compared += 1
                assert x.token_id == y.token_id and abs(x.logprob - y.logprob) <= 1e-3
    assert compared >= 10

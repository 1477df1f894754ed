"""Whole-step graphs (arms graphs.prefill and graphs.mixed, engine/worker/prefill_graphs.py) without a
GPU: the step they capture, run eagerly over the key's padded static batch, computes the plain
forward's logits and pools whatever the padded rows hold, the steps they take are exactly the lone
prompts (and with decodes bucketed, decodes + one prefill), and a runner serving through them gives
the plain runner's tokens. The captured graphs are compared with this eager step bit for bit in
tests/model/test_prefill_graphs_gpu.py."""

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
from engine.worker.prefill_graphs import MAX_TOKENS, MIXED_MAX_TOKENS, PrefillGraphs, padded_arrays
from engine.worker.resolve import resolve_model
from tests.worker.test_piecewise import _pools, drain, engine_core, sampling_kinds, spy

RNG = np.random.default_rng(11)


def _ids(n: int, vocab: int) -> list[int]:
    return RNG.integers(0, vocab, n).tolist()


def _live(cache: ModelCache) -> list[torch.Tensor]:
    """Every pool but the null KV block 0 and the padding state slot 0, which padded rows write (nothing
    reads them; the CUDA kernels leave slot 0 alone, the reference ops do not)."""
    return [t[1:] for t in _pools(cache)]


def test_padded_arrays_are_the_batch_arrays_then_the_null_block():
    seq = SeqSpec([5, 6, 7], num_computed=14, block_ids=[3, 9], state_slot=2)
    want, ints = host_arrays([seq], 16)
    got, got_ints = padded_arrays([seq], 16, 0, tokens=16, blocks=5)
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
    with pytest.raises(ValueError, match="exceeds the graph's 0 decodes \\+ 1 prefill, 2 x 5"):
        padded_arrays([seq], 16, 0, tokens=2, blocks=5)
    with pytest.raises(ValueError, match="exceeds the graph's 0 decodes \\+ 1 prefill, 16 x 1"):
        padded_arrays([seq], 16, 0, tokens=16, blocks=1)


def test_padded_arrays_put_padding_decodes_between_the_decodes_and_the_prefill():
    decodes = [SeqSpec([5], 14, [3, 9], 2), SeqSpec([6], 3, [4], 3)]
    for sample in (True, False):
        prefill = SeqSpec([7, 8, 9], 0, [5], 4, sample=sample)
        got, ints = padded_arrays([*decodes, prefill], 16, 4, tokens=16, blocks=3)
        assert ints["num_decodes"] == 2 and ints["query_start_loc_cpu"] == (0, 1, 2, 5)  # the step's own
        np.testing.assert_array_equal(got["input_ids"], [5, 6, 0, 0, 7, 8, 9] + [0] * 9)
        np.testing.assert_array_equal(got["positions"], [14, 3, 0, 0, 0, 1, 2] + [0] * 9)
        kv = [3 * 16 + 14, 4 * 16 + 3, 0, 0, 80, 81, 82]
        np.testing.assert_array_equal(got["slot_mapping"], kv + [0] * 9)
        np.testing.assert_array_equal(got["query_start_loc"], [0, 1, 2, 3, 4, 7])
        np.testing.assert_array_equal(got["seq_lens"], [15, 4, 1, 1, 3])  # a padding decode sees one key
        np.testing.assert_array_equal(got["num_computed"], [14, 3, 0, 0, 0])
        np.testing.assert_array_equal(got["state_slot"], [2, 3, 0, 0, 4])
        np.testing.assert_array_equal(got["has_initial_state"], [True, True, False, False, False])
        table = [[3, 9, 0], [4, 0, 0], [0, 0, 0], [0, 0, 0], [5, 0, 0]]
        np.testing.assert_array_equal(got["block_table"], table)
        # the sampled rows first, in the step's order: the decodes' and (when sampled) the prefill's last
        np.testing.assert_array_equal(got["logits_indices"], [0, 1, 6, 0, 0] if sample else [0, 1, 0, 0, 0])
    prefill = SeqSpec([7, 8, 9], 0, [5], 4)
    with pytest.raises(ValueError, match="2 decodes and 1 prefills over 5 tokens .* 1 decodes"):
        padded_arrays([*decodes, prefill], 16, 1, tokens=16, blocks=3)
    with pytest.raises(ValueError, match="exceeds the graph's 4 decodes \\+ 1 prefill, 6 x 3"):
        padded_arrays([*decodes, prefill], 16, 4, tokens=6, blocks=3)  # 5 tokens + 2 padding decodes
    with pytest.raises(ValueError, match="2 decodes and 2 prefills"):
        padded_arrays([*decodes, prefill, SeqSpec([1], 0, [6], 5)], 16, 4, tokens=16, blocks=3)


def _setup(max_tokens: int = 64, max_blocks: int = 8, max_decodes: int = 0):
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    cache = ModelCache.allocate(runner.cache_spec, 24, runner.block_size, 6, runner.dtype, runner.device)
    pw = PiecewiseGraphs(runner.model, max_tokens, runner.device, capture=False, spare_tokens=max_tokens)
    pg = PrefillGraphs(pw, cache, max_blocks, pdl=False, capture=False, max_decodes=max_decodes)
    return runner, cache, pw, pg


def test_only_lone_prompts_within_the_buckets_take_the_graphs():
    runner, _, _, pg = _setup(max_tokens=64, max_blocks=4)
    v = runner.vocab_size
    assert pg.keys == ((0, 16), (0, 32), (0, 64))  # no decode buckets without graphs.mixed
    prompt = SeqSpec(_ids(20, v), 0, [1, 2], 1)
    assert pg.bucket([prompt]) == (0, 32)
    assert pg.bucket([SeqSpec(_ids(16, v), 0, [1], 1)]) == (0, 16)
    assert pg.bucket([SeqSpec(_ids(64, v), 0, [1, 2, 3, 4], 1)]) == (0, 64)
    assert pg.bucket([SeqSpec(_ids(9, v), 30, [1, 2, 3], 1)]) == (0, 16)  # a continuing chunk
    assert pg.bucket([SeqSpec(_ids(65, v), 0, [1, 2, 3, 4, 5], 1)]) is None  # beyond the largest bucket
    assert pg.bucket([SeqSpec(_ids(5, v), 60, [1, 2, 3, 4, 5], 1)]) is None  # a longer table than graphed
    assert pg.bucket([SeqSpec(_ids(20, v), 0, [1, 2], 1, sample=False)]) == (0, 32)  # a chunk not sampled
    assert pg.bucket([SeqSpec(_ids(1, v), 7, [1], 1)]) is None  # a decode
    assert pg.bucket([prompt, SeqSpec(_ids(3, v), 0, [3], 2)]) is None  # two sequences
    assert pg.bucket([SeqSpec(_ids(1, v), 7, [3], 2), prompt]) is None  # a decode and a prompt


def test_with_decode_buckets_decodes_and_one_prefill_take_them():
    runner, _, _, pg = _setup(max_tokens=64, max_blocks=4, max_decodes=5)
    v = runner.vocab_size
    assert pg.decode_buckets == (5,)
    assert pg.keys == ((0, 16), (0, 32), (0, 64), (5, 16), (5, 32), (5, 64))

    def dec(i: int) -> SeqSpec:
        return SeqSpec(_ids(1, v), 7 + i, [1 + i], 1 + i)

    def pre(n: int, sample: bool = True) -> SeqSpec:
        return SeqSpec(_ids(n, v), 0, [5, 6], 9, sample=sample)

    assert pg.bucket([dec(0), dec(1), dec(2), pre(11)]) == (5, 16)  # 3 decodes padded to 5, + 11 rows
    assert pg.bucket([dec(0), dec(1), dec(2), pre(12)]) == (5, 32)
    assert pg.bucket([dec(0), pre(12, sample=False)]) == (5, 32)  # a chunk behind decodes need not sample
    assert pg.bucket([dec(i) for i in range(5)] + [pre(20)]) == (5, 32)
    assert pg.bucket([dec(i) for i in range(6)] + [pre(20)]) is None  # more decodes than graphed
    assert pg.bucket([dec(0), pre(60)]) is None  # 5 + 60 rows: beyond the largest bucket
    assert pg.bucket([dec(0), dec(1)]) is None  # decodes alone: the decode graphs' steps
    assert pg.bucket([dec(0), pre(3), pre(4)]) is None  # two prefills
    not_sampled = SeqSpec(_ids(1, v), 7, [1], 1, sample=False)
    assert pg.bucket([not_sampled, pre(3)]) is None


def test_the_graphs_stop_at_max_tokens():
    _, _, pw, pg = _setup(max_tokens=2048, max_blocks=80, max_decodes=31)
    assert pg.buckets == tuple(b for b in pw.buckets if b <= MAX_TOKENS) and pg.buckets[-1] == MAX_TOKENS
    blocks = list(range(1, 1 + -(-(MAX_TOKENS + 1) // 16)))
    assert pg.bucket([SeqSpec([1] * MAX_TOKENS, 0, blocks, 1)]) == (0, MAX_TOKENS)
    assert pg.bucket([SeqSpec([1] * (MAX_TOKENS + 1), 0, blocks, 1)]) is None  # the pieces take it
    assert pw.bucket(MAX_TOKENS + 1) is not None
    assert pg.decode_buckets == (8, 16, 31)
    assert max(tb for d, tb in pg.keys if d) == MIXED_MAX_TOKENS
    assert all(d < tb for d, tb in pg.keys if d)
    decodes = [SeqSpec([1], 5, [100 + i], 2 + i) for i in range(8)]
    n = MIXED_MAX_TOKENS - 8
    assert pg.bucket([*decodes, SeqSpec([1] * n, 0, blocks, 1)]) == (8, MIXED_MAX_TOKENS)
    assert pg.bucket([*decodes, SeqSpec([1] * (n + 1), 0, blocks, 1)]) is None  # the pieces take it


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
    """And graphs.mixed with it (it builds on graphs.prefill)."""
    shapes = KernelShapes(conv_width=4, key_head_dim=128, value_head_dim=128, dtype="bfloat16")
    base = DEFAULT_ARMS | {"graphs.prefill", "graphs.mixed"}
    assert usable_arms(base, shapes) == (base, [])
    for missing in ("graphs.piecewise", "attention.paged"):
        arms, notes = usable_arms(base - {missing}, shapes)
        assert arms == base - {missing, "graphs.prefill", "graphs.mixed"}
        assert notes == [
            "kernel arm graphs.prefill builds on attention.paged and graphs.piecewise: running without it",
            "kernel arm graphs.mixed builds on graphs.prefill: running without it",
        ]
    arms, notes = usable_arms(base - {"graphs.prefill"}, shapes)
    assert arms == base - {"graphs.prefill", "graphs.mixed"} and len(notes) == 1
    tiny = KernelShapes(4, 128, 128, "bfloat16", attention_head_dim=32)  # no paged attention kernel
    arms, notes = usable_arms(base, tiny)
    assert not arms & {"graphs.prefill", "graphs.mixed", "attention.paged"} and len(notes) == 3


@pytest.mark.parametrize(
    ("decodes", "n", "computed"),
    [(0, 20, 0), (0, 32, 0), (0, 1, 0), (0, 9, 23), (0, 16, 16)]
    + [(2, 20, 0), (2, 9, 23), (3, 1, 0), (1, 40, 16)],
)
def test_the_whole_step_equals_the_plain_forward_whatever_the_padding_holds(decodes, n, computed):
    """A prompt (or a continuing chunk over a cached prefix ending mid-block or on a boundary), alone
    or behind decodes (padded to the decode bucket, 3), run as the graph's step over its key's padded
    batch: the logits and every pool equal the plain forward's; NaN in every padded row of the static
    buffers changes nothing, bit for bit."""
    runner, cache, pw, pg = _setup(max_decodes=3)
    model, bs, v = runner.model, runner.block_size, runner.vocab_size
    blocks = [5, 2, 7, 3][: -(-(computed + n) // bs)]
    # decode i: a 12 + 5 i token prefix in blocks 10 + 2 i, 11 + 2 i and state slot 1, 2 or 4
    prefixes = [
        SeqSpec(_ids(12 + 5 * i, v), 0, [10 + 2 * i, 11 + 2 * i], (1, 2, 4)[i]) for i in range(decodes)
    ]
    if computed:  # the prefix: cached by an earlier plain step
        prefixes.append(SeqSpec(_ids(computed, v), 0, blocks, 3))
    if prefixes:
        model(ForwardBatch.build(prefixes, bs, runner.device), cache)
    seqs = [SeqSpec(_ids(1, v), len(p.token_ids), p.block_ids, p.state_slot) for p in prefixes[:decodes]]
    seqs.append(SeqSpec(_ids(n, v), computed, blocks, 3))
    plain_cache = copy.deepcopy(cache)
    want = model(ForwardBatch.build(seqs, bs, runner.device), plain_cache)
    key = pg.bucket(seqs)
    assert key == (3 if decodes else 0, pw.bucket(n + (3 if decodes else 0)))
    runs = []
    for fill in (0.0, float("nan")):
        for buf in (pw.h, pw.x, pw.scratch):
            buf.fill_(fill)
        pg.cache = step_cache = copy.deepcopy(cache)
        pg.graphs.clear()  # each run builds its static batch over its own cache
        runs.append((pg.run(seqs, key).clone(), step_cache))
    for logits, step_cache in runs:
        assert logits.shape == (decodes + 1, v) and torch.isfinite(logits).all()
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
    """Served through EngineCore, every prefill step of a lone prompt (each chunk, sampled or not, and
    the scored prompt's, whose prompt logprobs come from the graph's buffers) runs the whole-step
    path, with the plain runner's tokens, logprobs and prompt logprobs."""
    want = _serve_one_by_one(ModelRunner(EngineConfig(model=resolve_model(ModelConfig()))))
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    runner.piecewise = pw = PiecewiseGraphs(runner.model, 48, runner.device, capture=False, spare_tokens=48)
    max_blocks = -(-runner.max_model_len // runner.block_size)
    runner.prefill_graphs = PrefillGraphs(pw, runner.cache, max_blocks, pdl=False, capture=False)
    whole = spy(monkeypatch, runner.prefill_graphs, "run")
    pieces = spy(monkeypatch, pw, "run")
    monkeypatch.setattr(runner, "execute", lambda fb: pytest.fail("a step ran the plain forward"))
    got = _serve_one_by_one(runner)
    # prompts of 7, 30, 61 (scored), 16 and 100 tokens, in chunks of at most 48
    assert [len(seqs[-1].token_ids) for seqs, *_ in whole] == [7, 30, 48, 13, 16, 48, 48, 4]
    assert all(fb.num_decodes for fb, _ in pieces)  # the pieces ran the decode steps alone
    assert [[t for t, _, _ in x] for x in got.values()] == [[t for t, _, _ in x] for x in want.values()]
    compared = 0
    for a, b in zip(got.values(), want.values(), strict=True):
        for (_, lp_a, fin_a), (_, lp_b, fin_b) in zip(a, b, strict=True):
            assert fin_a == fin_b and len(lp_a) == len(lp_b)
            for x, y in zip(lp_a, lp_b, strict=True):
                compared += 1
                assert x.token_id == y.token_id and abs(x.logprob - y.logprob) <= 1e-3
    assert compared >= 10


def _serve_staggered(runner: ModelRunner) -> dict[str, list]:
    """Six requests through the real EngineCore (async scheduling, a 48-token budget), each arriving
    three steps after the one before, so most steps hold decodes and one prompt's chunk: greedy with
    logprobs and seeded sampling."""
    import msgspec

    from engine.messages import AddRequests, EngineRequest

    core, kinds = engine_core(runner, 8), sampling_kinds()
    rng = np.random.default_rng(9)
    outs: dict[str, list] = {}
    for i in range(6):
        ids = rng.integers(0, runner.vocab_size, 5 + 9 * i).tolist()
        params = msgspec.structs.replace(kinds[i % 2], max_tokens=12)
        core.add_requests(AddRequests([EngineRequest(f"{i}", ids, params)]))
        outs[f"{i}"] = []
        for _ in range(3):
            for o in core.step().outputs:
                outs[o.request_id].append((o.new_token_ids, o.logprobs or [], o.finish_reason))
    drain(core, outs)
    return outs


def test_the_runner_serves_mixed_steps_through_the_whole_step(monkeypatch):
    """With decode buckets (arm graphs.mixed), requests arriving while others decode: every step of
    decodes and one prefill chunk runs the whole-step path, its decodes scheduled ahead reading their
    tokens on the device, and the tokens and logprobs are the plain runner's."""
    want = _serve_staggered(ModelRunner(EngineConfig(model=resolve_model(ModelConfig()))))
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    runner.piecewise = pw = PiecewiseGraphs(runner.model, 48, runner.device, capture=False, spare_tokens=48)
    runner.prefill_graphs = PrefillGraphs(pw, runner.cache, 8, pdl=False, capture=False, max_decodes=7)
    whole = spy(monkeypatch, runner.prefill_graphs, "run")
    monkeypatch.setattr(runner, "execute", lambda fb: pytest.fail("a step ran the plain forward"))
    got = _serve_staggered(runner)
    mixed = [seqs for seqs, key, _ in whole if key[0]]
    assert len(mixed) >= 3 and all(key[0] >= len(seqs) - 1 for seqs, key, _ in whole)
    assert sum(any(s.prev_row >= 0 for s in seqs) for seqs in mixed) >= 2  # fed on the device
    assert [[t for t, _, _ in x] for x in got.values()] == [[t for t, _, _ in x] for x in want.values()]
    compared = 0
    for a, b in zip(got.values(), want.values(), strict=True):
        for (_, lp_a, fin_a), (_, lp_b, fin_b) in zip(a, b, strict=True):
            assert fin_a == fin_b and len(lp_a) == len(lp_b)
            for x, y in zip(lp_a, lp_b, strict=True):
                compared += 1
                assert x.token_id == y.token_id and abs(x.logprob - y.logprob) <= 1e-3
    assert compared == 36  # the three greedy requests' 12 tokens each

"""Whole-step graphs (arms graphs.prefill and graphs.mixed, engine/worker/prefill_graphs.py) on the
small model with 64-wide attention heads (the paged attention kernel's smallest): a replay equals the
same step run eagerly on the same static batch, bit for bit (logits and every live pool), twice, for
lone prompts and for decodes + one prefill; it stays close to the plain forward; and serving through
the runner replays them for every lone sampled prompt and every such mixed step."""

from __future__ import annotations

import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.model.forward_batch import ForwardBatch, SeqSpec  # noqa: E402
from engine.ops.arms import DEFAULT_ARMS  # noqa: E402
from engine.worker.prefill_graphs import PrefillGraphs  # noqa: E402
from tests.model.test_model_gpu import report  # noqa: E402
from tests.model.test_small_model_gpu import _small_ckpt, _small_runner  # noqa: E402
from tests.worker.test_piecewise import spy  # noqa: E402
from tests.worker.test_prefill_graphs import _ids, _live, _serve_one_by_one, _serve_staggered  # noqa: E402

pytestmark = pytest.mark.gpu
ARMS = tuple(sorted(DEFAULT_ARMS | {"graphs.piecewise", "graphs.prefill", "graphs.mixed"}))
WITHOUT = tuple(sorted(DEFAULT_ARMS - {"graphs.prefill", "graphs.mixed"}))


def _ckpt(tmp_path):
    d = _small_ckpt(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(head_dim=64)  # the tiny preset's 32 has no paged attention kernel
    (d / "config.json").write_text(json.dumps(cfg))
    return d


# (decodes, new tokens, cached prefix): lone prompts and continuing chunks (prefixes ending mid-block
# and on a boundary), then the same behind decodes (padded to the small runner's one decode bucket, 7)
CASES = [(0, 20, 0), (0, 64, 0), (0, 1, 0), (0, 37, 23), (0, 100, 16), (0, 700, 40)]
CASES += [(3, 20, 0), (7, 9, 23), (5, 300, 16), (1, 1, 0)]


def test_replay_bit_equal_to_the_eager_step_and_close_to_the_plain_forward(tmp_path):
    """NaN in every padded row of the static buffers: each replay (twice) equals the eager step bit
    for bit, logits and every live pool."""
    pytest.importorskip("cupy")
    r = _small_runner(_ckpt(tmp_path), "bfloat16", "cuda", eager=False, arms=ARMS, capture="startup")
    pg, pw = r.prefill_graphs, r.piecewise
    assert pg is not None and pw is not None and set(pg.graphs) == set(pg.keys)
    assert pg.buckets == tuple(b for b in pw.buckets if b <= 1024) and pg.decode_buckets == (7,)
    bs, v = r.block_size, r.vocab_size
    assert r.cache.ensure_slot(8)
    pools = _live(r.cache)
    for d, n, computed in CASES:
        blocks = list(range(3, 3 + -(-(computed + n) // bs)))
        # decode i: a 9 + i token prefix in block 50 + i, state slot 2 + i
        prefixes = [SeqSpec(_ids(9 + i, v), 0, [50 + i], 2 + i) for i in range(d)]
        if computed:  # the cached prefix, from a plain step
            prefixes.append(SeqSpec(_ids(computed, v), 0, blocks, 1))
        if prefixes:
            r.model(ForwardBatch.build(prefixes, bs, r.device), r.cache)
        seqs = [SeqSpec(_ids(1, v), len(p.token_ids), p.block_ids, p.state_slot) for p in prefixes[:d]]
        seqs.append(SeqSpec(_ids(n, v), computed, blocks, 1))
        key = pg.bucket(seqs)
        assert key == (7 if d else 0, pw.bucket(n + (7 if d else 0)))
        saved = [t.clone() for t in pools]

        def restore(saved=saved) -> None:
            for t, s in zip(pools, saved, strict=True):
                t.copy_(s)

        replays, after = [], []
        for _ in range(2):
            restore()
            for buf in (pw.h, pw.x, pw.scratch):
                buf.fill_(float("nan"))  # stale padded rows must not matter
            replays.append(pg.run(seqs, key).clone())
            after.append([t.clone() for t in pools])
        restore()
        oracle = PrefillGraphs(pw, r.cache, pg.max_blocks, pdl=False, capture=False, max_decodes=7)
        eager = oracle.run(seqs, key).clone()
        assert eager.shape == (d + 1, v) and torch.isfinite(eager).all()
        for got, state in zip(replays, after, strict=True):
            assert torch.equal(got, eager), (d, n, computed)
            for a, b in zip(state, pools, strict=True):
                assert torch.equal(a, b), (d, n, computed)
        restore()
        plain = r.model(ForwardBatch.build(seqs, bs, r.device), r.cache)
        rel = ((replays[0].float() - plain).norm() / plain.norm()).item()
        assert rel < 2e-2, (d, n, computed, rel)  # bf16 GEMMs over the bucket's rows, another attention plan
        report(test="prefill_graph_bit_equal", decodes=d, n=n, computed=computed, key=key, rel_to_plain=rel)
        restore()


def test_serving_replays_the_whole_step_for_lone_prompts(tmp_path, monkeypatch):
    """Through EngineCore (async scheduling): every chunk of a lone prompt replays its bucket's graph,
    the scored prompt's too, whose 60 prompt logprobs (read from the graph's buffers) stay within bf16
    noise of the runner without the arms; the greedy tokens stay close to it (bf16 paths may part at
    near-ties, so counted, not asserted)."""
    pytest.importorskip("cupy")
    d = _ckpt(tmp_path)
    r = _small_runner(d, "bfloat16", "cuda", eager=False, arms=ARMS)
    plain = _small_runner(d, "bfloat16", "cuda", eager=False, arms=WITHOUT)
    assert r.prefill_graphs is not None and plain.prefill_graphs is None
    whole = spy(monkeypatch, r.prefill_graphs, "run")
    monkeypatch.setattr(r, "execute", lambda fb: pytest.fail("an eager step ran"))
    a, b = _serve_one_by_one(r), _serve_one_by_one(plain)
    assert [len(seqs[-1].token_ids) for seqs, *_ in whole] == [7, 30, 48, 13, 16, 48, 48, 4]
    scored = [[lp for _, lps, _ in x["2"] for lp in lps] for x in (a, b)]  # request 2: prompt logprobs only
    assert len(scored[0]) == len(scored[1]) == 60
    assert [lp.token_id for lp in scored[0]] == [lp.token_id for lp in scored[1]]
    diff = max(abs(x.logprob - y.logprob) for x, y in zip(*scored, strict=True))
    assert diff < 0.1, diff  # a row off by one position would be off by O(1)
    pairs = zip(a.values(), b.values(), strict=True)
    same = sum([t for t, _, _ in x] == [t for t, _, _ in y] for x, y in pairs)
    report(
        test="prefill_graph_serving", whole_steps=len(whole), identical=same, of=len(a), prompt_lp_diff=diff
    )


def test_serving_replays_the_whole_step_for_decodes_and_one_prefill(tmp_path, monkeypatch):
    """Requests arriving while others decode (async scheduling): every step of decodes and one prefill
    chunk replays a mixed graph, its decodes fed on the device; the tokens stay close to the runner
    without the arms (counted, not asserted, as above)."""
    pytest.importorskip("cupy")
    d = _ckpt(tmp_path)
    r = _small_runner(d, "bfloat16", "cuda", eager=False, arms=ARMS)
    plain = _small_runner(d, "bfloat16", "cuda", eager=False, arms=WITHOUT)
    whole = spy(monkeypatch, r.prefill_graphs, "run")
    monkeypatch.setattr(r, "execute", lambda fb: pytest.fail("an eager step ran"))
    a, b = _serve_staggered(r), _serve_staggered(plain)
    mixed = [seqs for seqs, key, _ in whole if key[0]]
    assert len(mixed) >= 3 and sum(any(s.prev_row >= 0 for s in seqs) for seqs in mixed) >= 2
    pairs = zip(a.values(), b.values(), strict=True)
    same = sum([t for t, _, _ in x] == [t for t, _, _ in y] for x, y in pairs)
    report(test="mixed_graph_serving", mixed_steps=len(mixed), identical=same, of=len(a))

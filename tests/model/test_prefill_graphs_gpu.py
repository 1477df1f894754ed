"""Whole-step prefill graphs (arm graphs.prefill, engine/worker/prefill_graphs.py) on the small model
with 64-wide attention heads (the paged attention kernel's smallest): a replay equals the same step
run eagerly on the same static batch, bit for bit (logits and every live pool), twice; it stays close
to the plain forward; and serving through the runner replays them for every lone sampled prompt."""

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
from tests.worker.test_prefill_graphs import _ids, _live, _serve_one_by_one  # noqa: E402

pytestmark = pytest.mark.gpu
ARMS = tuple(sorted(DEFAULT_ARMS | {"graphs.piecewise", "graphs.prefill"}))
WITHOUT = tuple(sorted(DEFAULT_ARMS - {"graphs.prefill"}))


def _ckpt(tmp_path):
    d = _small_ckpt(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(head_dim=64)  # the tiny preset's 32 has no paged attention kernel
    (d / "config.json").write_text(json.dumps(cfg))
    return d


CASES = [(20, 0), (64, 0), (1, 0), (37, 23), (100, 16), (700, 40)]  # (new tokens, cached prefix)


def test_replay_bit_equal_to_the_eager_step_and_close_to_the_plain_forward(tmp_path):
    """Prompts and continuing chunks (prefixes ending mid-block and on a boundary), NaN in every
    padded row of the static buffers: each replay (twice) equals the eager step bit for bit."""
    pytest.importorskip("cupy")
    r = _small_runner(_ckpt(tmp_path), "bfloat16", "cuda", eager=False, arms=ARMS, capture="startup")
    pg, pw = r.prefill_graphs, r.piecewise
    assert pg is not None and pw is not None and set(pg.graphs) == set(pg.buckets)
    assert pg.buckets == tuple(b for b in pw.buckets if b <= 1024)
    bs, v = r.block_size, r.vocab_size
    assert r.cache.ensure_slot(2)
    pools = _live(r.cache)
    for n, computed in CASES:
        blocks = list(range(3, 3 + -(-(computed + n) // bs)))
        if computed:  # the cached prefix, from a plain step
            r.model(ForwardBatch.build([SeqSpec(_ids(computed, v), 0, blocks, 2)], bs, r.device), r.cache)
        seq = SeqSpec(_ids(n, v), computed, blocks, 2)
        tb = pg.bucket([seq])
        assert tb == pw.bucket(n)
        saved = [t.clone() for t in pools]

        def restore(saved=saved) -> None:
            for t, s in zip(pools, saved, strict=True):
                t.copy_(s)

        replays, after = [], []
        for _ in range(2):
            restore()
            for buf in (pw.h, pw.x, pw.scratch):
                buf.fill_(float("nan"))  # stale padded rows must not matter
            replays.append(pg.run(seq, tb).clone())
            after.append([t.clone() for t in pools])
        restore()
        eager = PrefillGraphs(pw, r.cache, pg.max_blocks, pdl=False, capture=False).run(seq, tb).clone()
        assert torch.isfinite(eager).all()
        for got, state in zip(replays, after, strict=True):
            assert torch.equal(got, eager), (n, computed)
            for a, b in zip(state, pools, strict=True):
                assert torch.equal(a, b), (n, computed)
        restore()
        plain = r.model(ForwardBatch.build([seq], bs, r.device), r.cache)
        rel = ((replays[0].float() - plain).norm() / plain.norm()).item()
        assert rel < 2e-2, (n, computed, rel)  # bf16 GEMMs over the bucket's rows, another attention plan
        report(test="prefill_graph_bit_equal", n=n, computed=computed, bucket=tb, rel_to_plain=rel)
        restore()


def test_serving_replays_the_whole_step_for_lone_prompts(tmp_path, monkeypatch):
    """Through EngineCore (async scheduling): the last chunk of every lone sampled prompt replays its
    bucket's graph, and the greedy tokens stay close to the runner without the arm (bf16 paths may
    part at near-ties, so counted, not asserted)."""
    pytest.importorskip("cupy")
    d = _ckpt(tmp_path)
    r = _small_runner(d, "bfloat16", "cuda", eager=False, arms=ARMS)
    plain = _small_runner(d, "bfloat16", "cuda", eager=False, arms=WITHOUT)
    assert r.prefill_graphs is not None and plain.prefill_graphs is None
    whole = spy(monkeypatch, r.prefill_graphs, "run")
    monkeypatch.setattr(r, "execute", lambda fb: pytest.fail("an eager step ran"))
    a, b = _serve_one_by_one(r), _serve_one_by_one(plain)
    assert [len(seq.token_ids) for seq, _ in whole] == [7, 30, 16, 4]
    pairs = zip(a.values(), b.values(), strict=True)
    same = sum([t for t, _, _ in x] == [t for t, _, _ in y] for x, y in pairs)
    report(test="prefill_graph_serving", whole_steps=len(whole), identical=same, of=len(a))

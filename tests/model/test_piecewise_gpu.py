"""Piecewise CUDA graphs for mixed and prefill steps (arm graphs.piecewise, engine/worker/piecewise.py)
on the small model: a replay equals the same pieces run eagerly, bit for bit (logits and every pool),
stays close to the plain forward (its GEMMs run over the padded bucket), and serving through the
runner takes the piecewise path for every step that is not a decode-only graph step."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.generate import generate  # noqa: E402
from engine.model.forward_batch import ForwardBatch  # noqa: E402
from engine.ops.arms import DEFAULT_ARMS  # noqa: E402
from engine.worker.piecewise import PiecewiseGraphs  # noqa: E402
from tests.model.test_model_gpu import report  # noqa: E402
from tests.model.test_small_model_gpu import _small_ckpt, _small_runner  # noqa: E402
from tests.worker.test_piecewise import _mixed_step, _pools, _serve, spy  # noqa: E402

pytestmark = pytest.mark.gpu
ARMS = tuple(sorted(DEFAULT_ARMS | {"graphs.piecewise"}))
WITHOUT = tuple(sorted(DEFAULT_ARMS - {"graphs.piecewise"}))


def test_replay_bit_equal_to_eager_pieces_and_close_to_the_plain_forward(tmp_path):
    pytest.importorskip("cupy")
    r = _small_runner(_small_ckpt(tmp_path), "bfloat16", "cuda", eager=False, arms=ARMS, capture="startup")
    pw = r.piecewise
    assert pw is not None and set(pw.graphs) == set(pw.buckets)  # every bucket captured at start-up
    assert all(len(g) == len(r.model.layers) + 1 for g in pw.graphs.values())
    first, second = _mixed_step(r.vocab_size, r.block_size)
    assert r.cache.ensure_slot(max(s.state_slot for s in first + second))  # the model is called directly
    r.model(ForwardBatch.build(first, r.block_size, r.device), r.cache)
    fb = ForwardBatch.build(second, r.block_size, r.device)
    pools = _pools(r.cache)
    saved = [t.clone() for t in pools]

    def restore() -> None:
        for t, s in zip(pools, saved, strict=True):
            t.copy_(s)

    replays, after = [], []
    for _ in range(3):
        restore()
        replays.append(pw.run(fb, r.cache).clone())
        after.append([t.clone() for t in pools])
    restore()
    eager = PiecewiseGraphs(r.model, pw.buckets[-1], r.device, capture=False).run(fb, r.cache)
    for got, state in zip(replays, after, strict=True):
        assert torch.equal(got, eager)
        for a, b in zip(state, pools, strict=True):
            assert torch.equal(a, b)
    restore()
    plain = r.model(fb, r.cache)
    rel = ((replays[0] - plain).norm() / plain.norm()).item()
    assert rel < 2e-2, rel  # bf16 GEMMs over 64 rows instead of 37
    report(test="piecewise_replay_bit_equal", bucket=pw.bucket(fb.num_tokens), rel_to_plain=rel)


def test_serving_steps_take_the_piecewise_path(tmp_path, monkeypatch):
    """generate() through the runner: prefill and mixed steps run piecewise (the runner's eager
    forward is never called), decode-only steps replay decode graphs, and the greedy tokens stay
    close to the runner without the arm (bf16 paths may part at near-ties, so counted, not asserted)."""
    pytest.importorskip("cupy")
    d = _small_ckpt(tmp_path)
    r = _small_runner(d, "bfloat16", "cuda", eager=False, arms=ARMS, capture="startup")
    plain = _small_runner(d, "bfloat16", "cuda", eager=False, arms=WITHOUT)
    assert r.piecewise is not None and plain.piecewise is None
    calls = spy(monkeypatch, r.piecewise, "run")
    monkeypatch.setattr(r, "execute", lambda fb: pytest.fail("an eager step ran"))
    prompts = [[(7 * i + j * 13) % 400 for j in range(20 + 9 * i)] for i in range(6)]
    a = generate(r, prompts, 16, token_budget=64)  # chunked prefills, mixed steps, decodes
    b = generate(plain, prompts, 16, token_budget=64)
    assert len(calls) >= 3
    same = sum(x == y for x, y in zip(a, b, strict=True))
    report(test="piecewise_serving", piecewise_steps=len(calls), identical=same, of=len(prompts))


def test_prompt_scoring_through_the_pieces_matches_the_plain_forward(tmp_path, monkeypatch):
    """Prompt-scoring steps read every row's hidden state from the pieces' static buffers
    (PiecewiseGraphs.hidden_states): the prompt logprobs of requests served through EngineCore equal
    those of a runner without the arm within bf16's reach, and the plain scoring path never runs."""
    pytest.importorskip("cupy")
    d = _small_ckpt(tmp_path)
    r = _small_runner(d, "bfloat16", "cuda", eager=False, arms=ARMS, capture="startup")
    plain = _small_runner(d, "bfloat16", "cuda", eager=False, arms=WITHOUT)
    assert r.piecewise is not None
    scored = spy(monkeypatch, r.piecewise, "hidden_states")
    monkeypatch.setattr(r.model, "hidden_states", lambda fb, c: pytest.fail("a plain scoring step"))
    got, want = _serve(r), _serve(plain)
    assert len(scored) >= 2
    worst, compared = 0.0, 0
    for rid in ("2", "5"):  # the requests that ask for prompt logprobs (every third)
        first_a, first_b = got[rid][0][1], want[rid][0][1]  # the first output carries the prompt's
        assert first_a and len(first_a) == len(first_b)
        for x, y in zip(first_a, first_b, strict=True):
            compared += 1
            worst = max(worst, abs(x.logprob - y.logprob))
    assert compared >= 10 and worst < 0.1, worst  # bf16 GEMMs over the padded bucket
    report(test="piecewise_prompt_scoring", compared=compared, worst_abs_logprob=worst)

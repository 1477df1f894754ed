"""The start-up warm-up batches (engine/worker/warmup.py): valid steps within the budget and the
profile pool, covering every batch-dependent launch choice, and runnable by the real model."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, ModelConfig
from engine.model.cache import ModelCache
from engine.model.forward_batch import ForwardBatch
from engine.worker.model_runner import ModelRunner
from engine.worker.resolve import resolve_model
from engine.worker.warmup import MAX_DECODES, SHORT_PROMPT, prefill_counts, probe_pool_size, warmup_batches

GRID = [(2048, 32, 32), (2048, 64, 16), (8192, 256, 64), (512, 3, 16), (64, 1, 16), (17, 128, 16)]


def _kinds(specs) -> tuple[int, int]:
    decodes = sum(1 for s in specs if s.is_decode)
    return decodes, len(specs) - decodes


@pytest.mark.parametrize("tokens,max_seqs,bs", GRID)
def test_batches_fit_the_budget_and_the_profile_pool(tokens, max_seqs, bs):
    blocks, slots = probe_pool_size(tokens, max_seqs, bs)
    batches = warmup_batches(tokens, max_seqs, bs, slots - 1)
    for specs in batches:
        assert 1 <= len(specs) <= max_seqs
        assert sum(len(s.token_ids) for s in specs) <= tokens
        ids = [b for s in specs for b in s.block_ids]
        assert len(ids) == len(set(ids)), "sequences of one batch never share a KV block"
        assert all(1 <= b < blocks for b in ids)
        assert all(1 <= s.state_slot < slots for s in specs)
        fb = ForwardBatch.build(specs, bs, "cpu")  # decodes first, tables cover every token
        assert fb.num_decodes == _kinds(specs)[0]
    kinds = [_kinds(specs) for specs in batches]
    assert batches[0][0].token_ids == [0] * tokens, "the full-budget prefill comes first"
    prefills = {p for d, p in kinds if d == 0}
    cap = min(max_seqs, 64, tokens)
    assert prefills == {n for n in (1, 2, 4, 8, 16, 32) if n < cap} | {cap}
    # every count also runs with prompts of one chunk (the one-pass chunk kernel's variants)
    short = {len(b) for b in batches if all(not s.is_decode and len(s.token_ids) <= SHORT_PROMPT for s in b)}
    assert short == prefills
    assert {d for d, p in kinds if p == 0} == set(range(1, min(max_seqs, MAX_DECODES) + 1))
    mixed = [(d, p) for d, p in kinds if d and p]
    assert mixed == ([(min(max_seqs - 1, MAX_DECODES, tokens - 1), 1)] if max_seqs > 1 else [])
    if mixed:
        assert sum(len(s.token_ids) for s in batches[-1]) == tokens


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="warm-up needs"):
        warmup_batches(0, 8, 16, 4)


def test_every_batch_runs_through_the_model_on_its_pool():
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    tokens, max_seqs, bs = 96, 12, runner.block_size
    blocks, slots = probe_pool_size(tokens, max_seqs, bs)
    cache = ModelCache.allocate(runner.cache_spec, blocks, bs, slots, runner.dtype, runner.device)
    for specs in warmup_batches(tokens, max_seqs, bs, slots - 1):
        logits = runner.model(ForwardBatch.build(specs, bs, runner.device), cache)
        assert logits.shape == (len(specs), runner.vocab_size)
        assert torch.isfinite(logits).all()


@pytest.mark.parametrize("cc", [90, 120])
@pytest.mark.parametrize("sms,nv", [(132, 32), (70, 32), (300, 32), (132, 4), (24, 16)])
@pytest.mark.parametrize("cap", [1, 3, 6, 8, 32, 64])
def test_prefill_counts_reach_every_chunk_dv_block(monkeypatch, cc, sms, nv, cap):
    """Every dv block the chunk kernel can pick for 1..cap prefill sequences is picked at one of the
    warm-up's counts (engine/ops/gdn/chunk.py's rule and tuning rows, without a GPU)."""
    from engine.ops.gdn import chunk

    row = chunk.chunk_params(cc)
    monkeypatch.setattr(chunk, "chunk_params", lambda: row)
    picks = {b: chunk.pick_dvb(b * nv, sms, frozenset()) for b in range(1, cap + 1)}
    assert {picks[b] for b in prefill_counts(cap)} == set(picks.values())


@pytest.mark.parametrize("cc", [90, 120])
@pytest.mark.parametrize("sms", [132, 70])
@pytest.mark.parametrize("tokens,cap", [(2048, 32), (2048, 64), (8192, 256), (512, 3)])
def test_warmup_reaches_every_chunk_path(monkeypatch, cc, sms, tokens, cap):
    """Every launch choice of the chunked delta rule (split path with either state pass, or the
    one-pass kernel and its dv block) that a prefill of 1..cap uniform sequences can take is taken by
    one of the warm-up batches (engine/ops/gdn/chunk.py's dispatch, without a GPU; Nv 32)."""
    from engine.ops.arms import DEFAULT_ARMS
    from engine.ops.gdn import chunk, chunk_split

    row = chunk.chunk_params(cc)
    monkeypatch.setattr(chunk, "chunk_params", lambda: row)
    nv = 32

    def choice(lens):
        n, t = len(lens), sum(lens)
        if chunk_split.use_split(n, nv, t, max(lens), sms, DEFAULT_ARMS, cc):
            dk2 = chunk_split.use_dk2(n, nv, sms, DEFAULT_ARMS)
            return ("split", "dk2" if dk2 else chunk_split.pick_dvb(DEFAULT_ARMS, cc))
        return ("one-pass", chunk.pick_dvb(n * nv, sms, DEFAULT_ARMS))

    blocks, slots = probe_pool_size(tokens, cap, 16)
    warm = {
        choice([len(s.token_ids) for s in b])
        for b in warmup_batches(tokens, cap, 16, slots - 1)
        if not any(s.is_decode for s in b)
    }
    top = min(cap, 64, tokens)
    lengths = lambda n: {1, SHORT_PROMPT, tokens // n}  # noqa: E731
    serving = {choice([L] * n) for n in range(1, top + 1) for L in lengths(n) if L * n <= tokens}
    assert serving <= warm, serving - warm

"""ForwardBatch.build (numpy per-token arrays) against a token-by-token construction written out in
Python, on random mixed batches (numpy's generator: the same batches on every CPU), and the errors
it raises for batches the model must not see."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.forward_batch import ForwardBatch, SeqSpec

BS = 16


def _random_batch(rng: np.random.Generator) -> list[SeqSpec]:
    """Decodes first, then prefill chunks (some continuing a cached prefix), random block ids."""
    seqs = []
    decodes = int(rng.integers(0, 6))
    prefills = int(rng.integers(0 if decodes else 1, 4))  # never an empty batch
    for i in range(decodes + prefills):
        new = 1 if i < decodes else int(rng.integers(1, 90))
        if i < decodes:
            computed = int(rng.integers(1, 200))
        else:  # a new prompt or a chunk continuing a cached prefix
            computed = int(rng.integers(1, 120)) if rng.integers(0, 2) else 0
        blocks = -(-(computed + new) // BS) + int(rng.integers(0, 3))  # sometimes more than needed
        seqs.append(
            SeqSpec(
                token_ids=rng.integers(0, 1000, new).tolist(),
                num_computed=computed,
                block_ids=rng.permutation(400)[:blocks].tolist(),
                state_slot=i + 1,
                sample=bool(rng.integers(0, 4)),
            )
        )
    return seqs


def _by_hand(seqs: list[SeqSpec], all_logits: bool) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in ("ids", "pos", "slots", "qsl", "logits")}
    out["qsl"].append(0)
    for s in seqs:
        start = out["qsl"][-1]
        for j, tok in enumerate(s.token_ids):
            p = s.num_computed + j
            out["ids"].append(tok)
            out["pos"].append(p)
            out["slots"].append(s.block_ids[p // BS] * BS + p % BS)
            if all_logits or (s.sample and j == len(s.token_ids) - 1):
                out["logits"].append(start + j)
        out["qsl"].append(start + len(s.token_ids))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_build_matches_the_token_by_token_construction(seed):
    rng = np.random.default_rng(seed)
    seqs = _random_batch(rng)
    all_logits = seed % 5 == 0
    fb = ForwardBatch.build(seqs, BS, "cpu", all_logits=all_logits)
    want = _by_hand(seqs, all_logits)
    assert fb.input_ids.tolist() == want["ids"] and fb.input_ids.dtype == torch.int64
    assert fb.positions.tolist() == want["pos"] and fb.positions.dtype == torch.int64
    assert fb.slot_mapping.tolist() == want["slots"] and fb.slot_mapping.dtype == torch.int64
    assert fb.query_start_loc.tolist() == want["qsl"] == list(fb.query_start_loc_cpu)
    assert fb.query_start_loc.dtype == torch.int32
    assert fb.logits_indices.tolist() == want["logits"]
    width = max(len(s.block_ids) for s in seqs)
    assert fb.block_table.dtype == torch.int32 and fb.block_table.shape == (len(seqs), width)
    assert fb.block_table.tolist() == [list(s.block_ids) + [0] * (width - len(s.block_ids)) for s in seqs]
    assert fb.seq_lens.tolist() == [s.num_computed + len(s.token_ids) for s in seqs] == list(fb.seq_lens_cpu)
    assert fb.num_computed.tolist() == [s.num_computed for s in seqs] == list(fb.num_computed_cpu)
    assert fb.state_slot.tolist() == [s.state_slot for s in seqs]
    assert fb.has_initial_state.tolist() == [s.num_computed > 0 for s in seqs]
    assert fb.num_decodes == sum(s.is_decode for s in seqs)
    assert fb.max_query_len == max(len(s.token_ids) for s in seqs)
    assert fb.max_seq_len == max(fb.seq_lens_cpu) and fb.num_tokens == len(want["ids"])


@pytest.mark.parametrize(
    "seqs,match",
    [
        ([], "at least one sequence"),
        ([SeqSpec([], 0, [1], 1)], "no new tokens"),
        ([SeqSpec([5], 0, [1], 0)], "state slot 0 is reserved"),
        ([SeqSpec([5] * 17, 0, [1], 1)], "covers 16 tokens, need 17"),
        ([SeqSpec([5, 6], 0, [1], 1), SeqSpec([7], 4, [2], 2)], "decodes must come before prefills"),
    ],
)
def test_bad_batches_are_refused(seqs, match):
    with pytest.raises(ValueError, match=match):
        ForwardBatch.build(seqs, BS, "cpu")

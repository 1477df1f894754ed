"""CUDA-graph bucketing is pure host logic: which decode steps replay a graph, and of which size."""

from __future__ import annotations

import numpy as np
import pytest

from engine.worker.cuda_graphs import (
    MAX_GRAPH_KV_TOKENS,
    batch_buckets,
    block_buckets,
    decode_arrays,
    graph_bucket,
)
from engine.worker.step import ScheduledSeq


def decode(n_blocks: int, computed: int = 5, sample: bool = True) -> ScheduledSeq:
    return ScheduledSeq(
        token_ids=[1],
        num_computed=computed,
        block_ids=list(range(1, n_blocks + 1)),
        state_slot=1,
        sample=sample,
    )


def test_buckets():
    assert batch_buckets(64)[:5] == (1, 2, 4, 8, 16) and batch_buckets(64)[-1] == 64
    assert batch_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert block_buckets(1024) == (8, 16, 32, 64, 128, 256, 512, 1024)
    assert block_buckets(36) == (8, 16, 32, 36)
    assert block_buckets(5) == (5,)


def test_graph_bucket_picks_smallest_fitting_sizes():
    b, n = batch_buckets(64), block_buckets(1024)
    assert graph_bucket([decode(3)] * 5, b, n, 32) == (8, 8)
    assert graph_bucket([decode(3)] * 32 + [decode(36)], b, n, 32) == (40, 64)


def test_graph_bucket_refuses_what_must_run_eagerly():
    b, n = batch_buckets(64), block_buckets(1024)
    prefill = ScheduledSeq(token_ids=[1, 2], num_computed=0, block_ids=[1], state_slot=2)
    assert graph_bucket([decode(2), prefill], b, n, 32) is None
    assert graph_bucket([decode(2, computed=0)], b, n, 32) is None  # first token: no state yet
    assert graph_bucket([decode(2, sample=False)], b, n, 32) is None
    assert graph_bucket([], b, n, 32) is None
    assert graph_bucket([decode(2)] * 65, b, n, 32) is None  # beyond max_num_seqs
    # 64 sequences x 1,024 blocks x 32 tokens exceeds the graphs' KV budget.
    assert 64 * 1024 * 32 > MAX_GRAPH_KV_TOKENS
    assert graph_bucket([decode(1000)] * 64, b, n, 32) is None


def test_no_gc_collects_once_for_nested_captures(monkeypatch):
    """A capture collects garbage and keeps the collector off; inside an outer no_gc (a whole
    capture_all) the inner captures collect nothing more, and the collector is back on after."""
    import gc

    from engine.worker.cuda_graphs import no_gc

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    assert gc.isenabled()
    with no_gc():
        assert not gc.isenabled() and len(calls) == 1
        for _ in range(3):
            with no_gc():
                assert not gc.isenabled()
        assert not gc.isenabled() and len(calls) == 1
    assert gc.isenabled()
    with no_gc():
        pass
    assert len(calls) == 2 and gc.isenabled()


def test_block_buckets_grow_8x_for_the_paged_attention():
    assert block_buckets(1024, 8) == (8, 64, 512, 1024)
    assert block_buckets(4096, 8) == (8, 64, 512, 4096)
    assert block_buckets(36, 8) == (8, 36)
    assert block_buckets(8, 8) == (8,)
    assert block_buckets(5, 8) == (5,)
    with pytest.raises(ValueError, match="ratio"):
        block_buckets(1024, 4)


def test_decode_arrays_pad_rows_and_columns_as_the_graph_was_captured():
    """The per-step inputs of a decode graph: real rows first, then padding rows on token 0, position
    0, seq_len 1, the null block and state slot 0; table columns past a sequence's blocks are 0."""
    seqs = [
        ScheduledSeq(token_ids=[11], num_computed=5, block_ids=[3], state_slot=2),
        ScheduledSeq(token_ids=[12], num_computed=40, block_ids=[7, 9, 4], state_slot=5),
        ScheduledSeq(token_ids=[13], num_computed=16, block_ids=[6, 8], state_slot=1),
    ]
    arrays = decode_arrays(seqs, 4, 8, 16)
    assert list(arrays) == [
        "input_ids", "positions", "seq_lens", "num_computed", "slot_mapping", "state_slot", "block_table",
    ]  # fmt: skip
    ids, pos, lens, computed, slots, state, table = arrays.values()
    assert ids.tolist() == [11, 12, 13, 0] and ids.dtype == np.int64
    assert pos.tolist() == [5, 40, 16, 0] and pos.dtype == np.int64
    assert lens.tolist() == [6, 41, 17, 1] and lens.dtype == np.int32
    assert computed.tolist() == [5, 40, 16, 0] and computed.dtype == np.int32
    # position p lives in block block_ids[p // 16] at offset p % 16
    assert slots.tolist() == [3 * 16 + 5, 4 * 16 + 8, 8 * 16 + 0, 0] and slots.dtype == np.int64
    assert state.tolist() == [2, 5, 1, 0] and state.dtype == np.int32
    assert table.shape == (4, 8) and table.dtype == np.int32
    assert table.tolist() == [
        [3, 0, 0, 0, 0, 0, 0, 0],
        [7, 9, 4, 0, 0, 0, 0, 0],
        [6, 8, 0, 0, 0, 0, 0, 0],
        [0] * 8,
    ]
    # the capture's inputs: every row padding
    empty = list(decode_arrays([], 2, 8, 16).values())
    assert [a.tolist() for a in empty[:6]] == [[0, 0], [0, 0], [1, 1], [0, 0], [0, 0], [0, 0]]
    assert empty[6].shape == (2, 8) and not empty[6].any()
    with pytest.raises(ValueError, match="do not fit"):
        decode_arrays(seqs, 2, 8, 16)
    short = ScheduledSeq(token_ids=[1], num_computed=16, block_ids=[3], state_slot=1)
    with pytest.raises(ValueError, match="does not cover"):
        decode_arrays([short], 1, 8, 16)

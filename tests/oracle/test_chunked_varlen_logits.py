"""Chunked prefill at arbitrary split points, in a varlen batch with other sequences, gives the same
fp32 logits as each sequence alone in one shot (tight tolerance). The batches mix decode rows (1-token
continuations) with prefill chunks, so the run with a fused ``gdn_decode`` op in the table checks the
model's split of a mixed batch between the fused decode path and the unfused prefill path."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.model.forward_batch import ForwardBatch, SeqSpec
from engine.ops import reference
from tests.oracle import harness
from tests.oracle.cases import CASES, PROMPTS, write_case

SPLITS = [1, 7, 1, 64, 1, 13]  # then the rest; a 1-token continuation is a decode row


def _plan(n: int) -> list[int]:
    out, left = [], n
    for s in SPLITS:
        if left <= 0:
            break
        out.append(min(s, left))
        left -= out[-1]
    return out + ([left] if left > 0 else [])


@pytest.mark.parametrize("fused_decode", [False, True], ids=["unfused", "fused-decode"])
@pytest.mark.parametrize("name", list(CASES))
def test_chunked_varlen_prefill_logits_equal_one_shot(name, fused_decode, tmp_path):
    _, ds_dir, _ = write_case(name, tmp_path)
    runner = harness.ds_runner(ds_dir)
    alone = [harness.ds_prefill_logits(runner, p) for p in PROMPTS]
    if fused_decode:
        runner.model.ops = replace(runner.model.ops, gdn_decode=reference.gdn_decode)
    decode_rows = 0
    bs = runner.block_size
    tables, nxt = [], 1
    for p in PROMPTS:
        n = -(-len(p) // bs)
        tables.append(list(range(nxt, nxt + n)))
        nxt += n
    plans = [_plan(len(p)) for p in PROMPTS]
    done = [0] * len(PROMPTS)
    got: list[list[torch.Tensor]] = [[] for _ in PROMPTS]
    for k in range(max(len(pl) for pl in plans)):
        specs, owners = [], []
        for i, p in enumerate(PROMPTS):
            if k < len(plans[i]):
                n = plans[i][k]
                specs.append(SeqSpec(p[done[i] : done[i] + n], done[i], tables[i], state_slot=i + 1))
                owners.append(i)
                done[i] += n
        order = sorted(
            range(len(specs)), key=lambda j: not (len(specs[j].token_ids) == 1 and specs[j].num_computed)
        )
        specs, owners = [specs[j] for j in order], [owners[j] for j in order]
        fb = ForwardBatch.build(specs, bs, runner.device, all_logits=True)
        decode_rows += fb.num_decodes
        logits = runner.execute(fb).cpu()
        for j, i in enumerate(owners):
            got[i].append(logits[fb.query_start_loc_cpu[j] : fb.query_start_loc_cpu[j + 1]])
    assert decode_rows > 0, "the split plan must produce mixed decode + prefill steps"
    for i, ref in enumerate(alone):
        ours = torch.cat(got[i])
        ok, diff, bound = harness.close(ours, ref, rel=1e-4)  # the oracle gate's bound
        assert ok, f"{name}, prompt {i}: chunked+batched logits differ by {diff:.3g} (bound {bound:.3g})"
        harness.STATS["assertions"] += 1

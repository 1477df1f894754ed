"""Session 34, run 4: a decode graph's input fill, old (one pinned tensor per input, nested lists for
the block table) against new (decode_arrays + one pinned buffer, one copy), alternated, at the
buckets the new 8x KV buckets pick; each time is run() + synchronize (host build + copy + replay)."""
import math, statistics, sys, time
import numpy as np
import torch
from engine.bench.kernels import time_eager
from engine.bench.steps import step_runner
from engine.sampling_params import SamplingParams
from engine.worker.step import ScheduledSeq

r = step_runner(sys.argv[1], "dummy", [], "lazy")
dg = r.graphs
bs = r.block_size
assert all(r.ensure_state_slot(i + 1) for i in range(64))
greedy = SamplingParams(temperature=0.0)
rng = np.random.default_rng(0)
NB = r.num_kv_blocks


def seqs(b, ctx):
    need = math.ceil((ctx + 1) / bs)
    assert b * need < NB
    return [
        ScheduledSeq(token_ids=[int(rng.integers(0, 200000))], num_computed=ctx,
                     block_ids=list(range(1 + i * need, 1 + (i + 1) * need)), state_slot=i + 1,
                     request_id=str(i), params=greedy, num_output=1)
        for i in range(b)
    ]


def old_run(seqs, key):  # the fill of cuda_graphs.py before session 34
    g = dg.graphs[key]
    fb, b = g.batch, len(seqs)
    pad = key[0] - b
    pos = [s.num_computed for s in seqs]
    rows = {
        fb.input_ids: [s.token_ids[0] for s in seqs],
        fb.positions: pos,
        fb.seq_lens: [p + 1 for p in pos] + [1] * pad,
        fb.num_computed: pos,
        fb.slot_mapping: [s.block_ids[p // bs] * bs + p % bs for s, p in zip(seqs, pos, strict=True)],
        fb.state_slot: [s.state_slot for s in seqs],
    }
    for dst, vals in rows.items():
        vals = vals + [0] * (key[0] - len(vals))
        dst.copy_(torch.tensor(vals, dtype=dst.dtype).pin_memory(), non_blocking=True)
    width = key[1]
    table = [list(s.block_ids) + [0] * (width - len(s.block_ids)) for s in seqs] + [[0] * width] * pad
    fb.block_table.copy_(torch.tensor(table, dtype=torch.int32).pin_memory(), non_blocking=True)
    g.graph.replay()
    return g.logits[:b]


def timed(fn, ss, key, n=7):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(ss, key)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


print("buckets", dg.batch_buckets, dg.block_buckets, flush=True)
print("b    ctx    key          replay ms  old run ms  new run ms  (old, new, old, new)")
for b, ctxs in ((1, (200, 1100, 8000, 30000)), (8, (200, 1100, 8000)), (32, (200, 1100, 2000)), (64, (200, 1100))):
    for ctx in ctxs:
        ss = seqs(b, ctx)
        key = dg.bucket(ss)
        new = dg.run(ss, key)
        torch.cuda.synchronize()
        got_new = new.clone()
        old = old_run(ss, key)
        torch.cuda.synchronize()
        # both fills drive the same graph from the same host state; logits differ only through the
        # state the previous replay advanced, so compare the static inputs instead
        fb = dg.graphs[key].batch
        snap_old = [t.clone() for t in (fb.input_ids, fb.positions, fb.seq_lens, fb.num_computed, fb.slot_mapping, fb.state_slot, fb.block_table)]
        dg.run(ss, key)
        torch.cuda.synchronize()
        snap_new = [t.clone() for t in (fb.input_ids, fb.positions, fb.seq_lens, fb.num_computed, fb.slot_mapping, fb.state_slot, fb.block_table)]
        same = all(torch.equal(x, y) for x, y in zip(snap_old, snap_new))
        t = [timed(old_run, ss, key), timed(dg.run, ss, key), timed(old_run, ss, key), timed(dg.run, ss, key)]
        rep = time_eager(dg.graphs[key].graph.replay, 20) / 1e3
        print(f"{b:<4} {ctx:<6} {str(key):<12} {rep:9.3f}  {statistics.mean(t[0::2]):10.3f}  {statistics.mean(t[1::2]):10.3f}  "
              f"({', '.join(f'{x:.2f}' for x in t)}) inputs equal: {same}", flush=True)
print("decode graphs captured:", len(dg.graphs))

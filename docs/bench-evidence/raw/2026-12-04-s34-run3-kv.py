"""Session 34 experiment: what a decode graph's KV-blocks bucket costs and buys.
For decode batches b and contexts ctx, replay the step's graph at its own KV bucket and at every larger
one (the attention's split plan and the block table's width are the only things the bucket sets), and
read the device's free memory around each capture (the driver's memory for the executable graph)."""
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
greedy = SamplingParams(temperature=0.0)
rng = np.random.default_rng(0)
PER = 63  # blocks per sequence: ctx <= 2,000


def seqs(b, ctx):
    need = math.ceil((ctx + 1) / bs)
    return [
        ScheduledSeq(token_ids=[int(rng.integers(0, 200000))], num_computed=ctx,
                     block_ids=list(range(1 + i * PER, 1 + i * PER + need)), state_slot=i + 1,
                     request_id=str(i), params=greedy, num_output=1)
        for i in range(b)
    ]


def free():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


assert all(r.ensure_state_slot(i + 1) for i in range(64))  # mapped as the scheduler would
print("buckets", dg.batch_buckets, dg.block_buckets, flush=True)
mem = []
rows = []
for b in (1, 8, 32, 64):
    for ctx in (200, 1100, 2000):
        ss = seqs(b, ctx)
        key0 = dg.bucket(ss)
        for n in [x for x in dg.block_buckets if x >= key0[1]]:
            key = (key0[0], n)
            if key not in dg.graphs:
                f0, r0 = free(), torch.cuda.memory_reserved()
                dg.capture(key)
                f1, r1 = free(), torch.cuda.memory_reserved()
                mem.append((key, (f0 - f1) / 2**20, (r1 - r0) / 2**20))
            dg.run(ss, key)
            torch.cuda.synchronize()
            host = []
            for _ in range(5):
                t0 = time.perf_counter()
                dg.run(ss, key)
                torch.cuda.synchronize()
                host.append((time.perf_counter() - t0) * 1e3)
            g = dg.graphs[key].graph
            rep = time_eager(g.replay, 20) / 1e3
            rows.append((b, ctx, key, rep, statistics.median(host)))
            print(f"b{b:<3} ctx {ctx:<5} key {key}  replay {rep:.3f} ms  run+sync {statistics.median(host):.3f} ms", flush=True)

print("\nper-capture device memory (MiB): free drop, torch reserved growth")
for key, d, rr in mem:
    print(f"  {key}: {d:.2f} {rr:.2f}")
drops = [d for _, d, rr in mem[1:] if rr == 0]
if drops:
    print(f"median free drop per decode graph (no pool growth): {statistics.median(drops):.2f} MiB over {len(drops)}")
print("\nb    ctx   own bucket replay   replay at the largest bucket (1024)   ratio")
for b in (1, 8, 32, 64):
    for ctx in (200, 1100, 2000):
        sel = [x for x in rows if x[0] == b and x[1] == ctx]
        own, big = sel[0], sel[-1]
        print(f"{b:<4} {ctx:<5} {own[2][1]:>4} {own[3]:.3f}   {big[2][1]:>4} {big[3]:.3f}   {big[3] / own[3]:.3f}  host {own[4]:.2f}/{big[4]:.2f}")

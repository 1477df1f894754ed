"""Session 20 probe: where W1's serving-time growth above start-up goes. The real EngineCore (W1
flags, 32 slots) serves 64 W1 prompts (1,024 in / 128 out) at concurrency 32; torch's allocator
stats and segment sizes are printed at start-up and after, with device-wide use."""
import argparse
import collections
import json
import sys
import time

import msgspec
import torch

from engine.cli import add_config_flags, configs_from_args
from engine.core.engine_core import EngineCore
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams

MiB = 2**20
p = argparse.ArgumentParser()
add_config_flags(p)
ns = p.parse_args(sys.argv[1:])
cfg, _ = configs_from_args(ns)
core = EngineCore(cfg)


def report(tag):
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    st = torch.cuda.memory_stats()
    segs = collections.Counter()
    pools = collections.Counter()
    for s in torch.cuda.memory_snapshot():
        segs[(s["total_size"] // MiB, s["stream"] != 0)] += 1
        pools[str(s.get("segment_pool_id", "?"))] += s["total_size"] // MiB
    print(f"== {tag}: device {(total - free) / MiB:.0f} MiB; torch reserved {st['reserved_bytes.all.current'] / MiB:.0f} "
          f"(peak {st['reserved_bytes.all.peak'] / MiB:.0f}), allocated {st['allocated_bytes.all.current'] / MiB:.0f} "
          f"(peak {st['allocated_bytes.all.peak'] / MiB:.0f}), inactive split {st['inactive_split_bytes.all.current'] / MiB:.0f}")
    print("   segments (MiB, non-default stream): count", sorted(segs.items(), reverse=True)[:25])
    print("   per pool MiB", dict(pools))


report("start-up")
torch.cuda.reset_peak_memory_stats()
rows = [json.loads(line) for line in open(sys.stdin.fileno())][:64]
params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=128)
reqs = [EngineRequest(f"{i}", r["prompt_token_ids"] if "prompt_token_ids" in r else r["prompt"], params) for i, r in enumerate(rows)]
pending = list(reqs)
running = 0
t0 = time.time()
done = 0
peak_dev = 0
while pending or core.has_work():
    if pending and running < 32:
        n = min(32 - running, len(pending))
        core.add_requests(AddRequests(pending[:n]))
        pending = pending[n:]
        running += n
    out = core.step()
    for o in out.outputs:
        if o.finish_reason is not None:
            running -= 1
            done += 1
    free, total = torch.cuda.mem_get_info()
    peak_dev = max(peak_dev, total - free)
print(f"served {done} in {time.time() - t0:.1f} s; device peak at step ends {peak_dev / MiB:.0f} MiB")
report("after serving")

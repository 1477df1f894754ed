"""Session 32: device-wide memory of the lone-prompt graphs, per bucket, on a W1-shaped runner built
without them (arm graphs.prefill off): torch's reservation and the device-wide use around each capture."""
import sys, time
import torch
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.worker.model_runner import ModelRunner
from engine.worker.prefill_graphs import PrefillGraphs
import math

arms = sys.argv[2].split()
mc = ModelConfig(model=sys.argv[1], load_format="dummy", kernel_arms=tuple(arms))
cfg = EngineConfig(model=mc, cache=CacheConfig(num_gpu_blocks_override=1280),
                   scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=2048))
r = ModelRunner(cfg)
dev = r.device
def used():
    torch.cuda.synchronize(dev); torch.cuda.empty_cache()
    f, t = torch.cuda.mem_get_info(dev)
    return t - f, torch.cuda.memory_reserved(dev)
max_blocks = math.ceil(r.max_model_len / r.block_size)
u0, r0 = used()
pg = PrefillGraphs(r.piecewise, r.cache, max_blocks, pdl=True)
print(f"{'bucket':>7} {'device MiB':>11} {'torch MiB':>10} {'nodes':>6}")
for tb in reversed(pg.buckets):
    pg.capture(tb)
    u, rr = used()
    n = -1
    print(f"{tb:>7} {(u-u0)/2**20:>11.1f} {(rr-r0)/2**20:>10.1f} {n:>6}")
del pg
u, rr = used()
print(f"released: device {(u-u0)/2**20:.1f} MiB, torch {(rr-r0)/2**20:.1f} MiB")
# the same bucket set again, then a coarser one
for name, buckets in (("all", None), ("16-256,512,768,1024", (16, 32, 64, 128, 256, 512, 768, 1024)), ("16-256,1024", (16, 32, 64, 128, 256, 512, 1024))):
    u0, r0 = used()
    pg = PrefillGraphs(r.piecewise, r.cache, max_blocks, pdl=True)
    if buckets:
        pg.buckets = buckets
    for tb in reversed(pg.buckets):
        pg.capture(tb)
    u, rr = used()
    print(f"set {name}: {len(pg.buckets)} graphs, device {(u-u0)/2**20:.1f} MiB, torch {(rr-r0)/2**20:.1f} MiB")
    del pg

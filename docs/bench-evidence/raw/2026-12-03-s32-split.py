"""Session 32: the lone-prompt graphs' attention planned for the longest block table (splits over
32,768 keys: 61 at 16 tokens, mostly empty) vs for the bucket's own length (a fresh prompt), by
whole-step replay time at the small buckets. Alternating rounds, medians of per-replay event times."""
import math, statistics, sys
import torch
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.model.forward_batch import SeqSpec
from engine.worker.model_runner import ModelRunner
from engine.worker.prefill_graphs import PrefillGraphs

arms = sys.argv[2].split()
mc = ModelConfig(model=sys.argv[1], load_format="dummy", kernel_arms=tuple(arms))
cfg = EngineConfig(model=mc, cache=CacheConfig(num_gpu_blocks_override=1280),
                   scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=2048))
r = ModelRunner(cfg)
bs = r.block_size
assert r.ensure_state_slot(1)
full = math.ceil(r.max_model_len / bs)
rng = torch.Generator().manual_seed(0)
print(f"{'tokens':>6} {'long plan us':>13} {'own plan us':>12} {'ratio':>6}")
for tb in (16, 32, 64, 128, 256):
    a = PrefillGraphs(r.piecewise, r.cache, full, pdl=True)
    b = PrefillGraphs(r.piecewise, r.cache, -(-tb // bs), pdl=True)
    a.capture(tb); b.capture(tb)
    ids = torch.randint(0, r.vocab_size, (tb,), generator=rng).tolist()
    seq = SeqSpec(token_ids=ids, num_computed=0, block_ids=list(range(1, 1 + -(-tb // bs))), state_slot=1)
    la, lb = a.run(seq, tb).clone(), b.run(seq, tb).clone()
    times = {"a": [], "b": []}
    for rnd in range(9):
        for name, pg in ((("a", a), ("b", b)) if rnd % 2 == 0 else (("b", b), ("a", a))):
            g = pg.graphs[tb].graph
            for _ in range(3):
                g.replay()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20):
                g.replay()
            e1.record(); torch.cuda.synchronize()
            times[name].append(e0.elapsed_time(e1) * 1e3 / 20)
    ta, tb_ = statistics.median(times["a"]), statistics.median(times["b"])
    diff = (la.float() - lb.float()).abs().max().item()
    print(f"{tb:>6} {ta:>13.1f} {tb_:>12.1f} {tb_/ta:>6.3f}   max |logit diff| {diff:.3g}")
    del a, b

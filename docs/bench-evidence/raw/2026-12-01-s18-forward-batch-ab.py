"""Host time of ForwardBatch.build, old (token loop, HEAD) vs new (numpy), on W1 step shapes, device
cpu (the build alone, no copy to a GPU). Order A B B A repeated; A/A from the two A slots of a round."""
import importlib.util, statistics, sys, time
import numpy as np
sys.path.insert(0, "/work/main")
from engine.model.forward_batch import ForwardBatch as New, SeqSpec
spec = importlib.util.spec_from_file_location("old_fb", "/tmp/fbab/old_fb.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_fb"] = old; spec.loader.exec_module(old)
Old = old.ForwardBatch
BS = 32
rng = np.random.default_rng(0)
def seq(i, new, computed):
    n = -(-(computed + new) // BS)
    return SeqSpec(rng.integers(0, 248000, new).tolist(), computed, list(range(1 + 70 * i, 1 + 70 * i + n)), i + 1)
shapes = {
    "mixed 32 dec + 2016": [seq(i, 1, 1100) for i in range(32)] + [seq(32, 1024, 0), seq(33, 992, 32)],
    "prefill 2 x 1024": [seq(0, 1024, 0), seq(1, 1024, 0)],
    "decode b32": [seq(i, 1, 1100) for i in range(32)],
}
def t(cls, seqs, reps=200):
    t0 = time.perf_counter()
    for _ in range(reps):
        cls.build(seqs, BS, "cpu")
    return (time.perf_counter() - t0) / reps * 1e6
for name, seqs in shapes.items():
    a1, a2, b = [], [], []
    for _ in range(5):  # rounds of A B B A
        a1.append(t(Old, seqs)); b.append(t(New, seqs)); b.append(t(New, seqs)); a2.append(t(Old, seqs))
    a = a1 + a2
    print(f"{name:<22} old {statistics.median(a):8.1f} us  new {statistics.median(b):8.1f} us  "
          f"new/old {statistics.median(b) / statistics.median(a):.3f}  A/A {statistics.median(a2) / statistics.median(a1):.3f}")

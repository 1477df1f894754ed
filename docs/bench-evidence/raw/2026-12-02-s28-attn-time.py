"""Session 28: the paged attention kernel's time per call on the bench's shapes, one tree per process
(run it from each tree's root, in alternated order). CUDA-graph replays as engine.bench.attention
times them: decode over rotated input sets (the KV not left in L2), prefill / mixed x 4 calls. With
``lazy`` (the tree after only) each shape again with rescale_slack = LAZY_RESCALE_SLACK."""

import sys

from engine.bench import attention as A
from engine.ops.attention import cuda as attn
from engine.ops.attention.batches import make_batch


def timed(batches, **kw):
    calls = [lambda b=b: attn.paged_attention(*b.args(), gate=b.gate, **kw) for b in batches]
    return A.graph_us(calls)


def main():
    lazy = "lazy" in sys.argv[1:]
    g = A.H // A.HKV
    for bsz in (1, 8, 32, 64):
        specs = [(A.CTX, 1)] * bsz
        one = make_batch(specs, A.BS, A.HKV, g, A.D, seed=1)
        batches = A.sets(specs, A.kv_bytes(one), seed=100)
        line = f"decode b{bsz:<3} {timed(batches):8.1f} us"
        if lazy:
            line += f"  lazy {timed(batches, rescale_slack=attn.LAZY_RESCALE_SLACK):8.1f} us"
        print(line, flush=True)
        del batches
    shapes = {
        "prefill 32x1024": [(0, 1024)] * 32,
        "mixed 2x1024+32": [(A.CTX, 1)] * 32 + [(0, 1024)] * 2,
        "prefill 2x1024": [(0, 1024)] * 2,
        "prefill 1x1024": [(0, 1024)],
    }
    for label, specs in shapes.items():
        b = make_batch(specs, A.BS, A.HKV, g, A.D, seed=7)
        line = f"{label:<16} {timed([b] * 4):8.1f} us"
        if lazy:
            line += f"  lazy {timed([b] * 4, rescale_slack=attn.LAZY_RESCALE_SLACK):8.1f} us"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Session 28: are two trees' paged-attention and GDN split-path kernels bit-identical? Run from
each tree's root: ``python3 THIS save FILE`` in the tree before, ``python3 THIS compare FILE`` in
the tree after.

Every batch of tests/ops/test_attention_cuda.py's mixed cases (D 64/128/256, GQA 1/4, block 16/32/64),
decode batches with automatic and forced splits, a long-prefix prefill with splits, the 4B step shapes
(prefill 2 x 1,024, 32 x 1,024, mixed 2 x 1,024 + 32 decodes); gate on, default tiles. Then the
chunked delta rule's split path (arm prefill.split: the prep pass, then the state pass) on the
few-sequence shapes it runs for: output and final states."""

import sys

import torch

from engine.ops.attention import cuda as attn
from engine.ops.attention.batches import make_batch


def mixed_specs(bs):
    return [
        (2 * bs, 1),
        (3 * bs - 1, 1),
        (37, 1),
        (1, 1),
        (0, 1000),
        (bs + 5, 63),
        (2 * bs, 64),
        (7, 65),
        (0, 2),
        (0, 1),
    ]


def cases():
    for d in (64, 128, 256):
        for g in (1, 4):
            for bs in (16, 32, 64):
                yield (
                    f"mixed d{d} g{g} bs{bs}",
                    make_batch(mixed_specs(bs), bs, 2, g, d, seed=d + g + bs),
                    None,
                )
    dec = [(0, 1), (30, 1), (31, 1), (32, 1), (700, 1), (1100, 1)]
    for d in (64, 128, 256):
        for sp in (None, 1, 3, 9):
            yield f"decode d{d} s{sp}", make_batch(dec, 32, 4, 4, d, seed=11 * d), sp
    for sp in (None, 2, 5):
        yield f"long prefix s{sp}", make_batch([(3000, 65), (5, 40)], 64, 4, 4, 256, seed=5), sp
    yield "prefill 2x1024", make_batch([(0, 1024)] * 2, 32, 4, 4, 256, seed=7), None
    yield "prefill 32x1024", make_batch([(0, 1024)] * 32, 32, 4, 4, 256, seed=7), None
    yield "mixed 2x1024+32", make_batch([(1100, 1)] * 32 + [(0, 1024)] * 2, 32, 4, 4, 256, seed=7), None
    yield "decode b32 x 1101", make_batch([(1100, 1)] * 32, 32, 4, 4, 256, seed=1), None


def main():
    mode, path = sys.argv[1], sys.argv[2]
    outs = {}
    for name, b, sp in cases():
        outs[name] = attn.paged_attention(*b.args(), gate=b.gate, splits=sp).cpu()
    from engine.bench.chunk import inputs
    from engine.ops.gdn import chunk

    for nseq, L in ((1, 1024), (2, 1024), (1, 2048), (4, 512), (8, 256)):
        q, k, v, g, beta, st, qsl, slots, hinit = inputs(nseq, L, seed=3)
        arms = frozenset({"prefill.split"})
        o = chunk.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, L, arms=arms)
        outs[f"gdn split {nseq}x{L} out"] = o.cpu()
        outs[f"gdn split {nseq}x{L} state"] = st.cpu()
    if mode == "save":
        torch.save(outs, path)
        print(f"saved {len(outs)} outputs")
        return 0
    before = torch.load(path)
    bad = [n for n in outs if not torch.equal(outs[n], before[n])]
    for n in outs:
        print(f"{n:<24} {'bit-equal' if n not in bad else 'DIFFERS'}")
    print(f"{len(outs) - len(bad)} of {len(outs)} outputs bit-equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

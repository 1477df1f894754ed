"""The fused elementwise arms end to end: the Qwen3.5-4B dummy model's forward with the default arms
and with ``norm.fused`` + ``attention.qk_fused`` added (``python -m engine.bench.fused --model-step``).

Model, cache and batches are built directly (no ModelRunner, so none of the engine process's
dependencies); the dummy weights are seeded, so both arms run the same model. Timed with CUDA events
around one forward, 3 warm-ups, the arms interleaved A B B A in 4 rounds, median of all: a W1 prefill
step (2 x 1,024 new tokens) eager and, where it captures, replayed from a CUDA graph; a decode step at
batch 32 (context 1,024) eager and replayed. Accuracy: the prefill's logits at all 2,048 positions,
both arms against the same weights upcast to fp32 (torch reference ops), on the served dummy weights
and with every output projection scaled by 2^-3 (where bf16 itself moves the logits by a few percent
rather than ~9%, see tests/model/test_model_gpu.py).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

DEV = "cuda"
FUSED_ARMS = frozenset({"norm.fused", "attention.qk_fused"})


def _times(fn: Callable[[], object], reps: int) -> list[float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        out.append(e0.elapsed_time(e1))
    return out


def _ab(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median ms per arm, the arms interleaved A B B A over 4 rounds of ``reps`` each."""
    names = list(calls)
    got: dict[str, list[float]] = {n: [] for n in names}
    for r in range(4):
        for n in names if r % 2 == 0 else names[::-1]:
            got[n] += _times(calls[n], reps)
    return {n: statistics.median(t) for n, t in got.items()}


def _graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    fn()  # compile every kernel outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _tame(model: torch.nn.Module, factor: float) -> None:
    """Scale the output projections in place (a power of two: bf16 weights stay exact)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("out_proj", "o_proj", "down"):
                p.mul_(factor)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _row(label: str, t: dict[str, float]) -> None:
    a, b = t["default"], t["+fused"]
    print(f"| {label} | {a:.2f} | {b:.2f} | {a - b:.2f} ms = {(a - b) / a:.0%} |", flush=True)


def model_steps(tmp: Path, reps: int = 5) -> None:
    from engine.checkpoints.presets import qwen35_4b_config
    from engine.model.cache import ModelCache
    from engine.model.forward_batch import ForwardBatch, SeqSpec
    from engine.model.loader import build_model
    from engine.ops import make_ops
    from engine.ops.arms import DEFAULT_ARMS

    (tmp / "config.json").write_text(json.dumps(qwen35_4b_config()))
    bs, batch, plen = 32, 32, 1024
    per_seq = plen // bs + 2
    nblocks = batch * per_seq + 1
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 248000, plen).tolist() for _ in range(2)]
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    fb_p = ForwardBatch.build([SeqSpec(prompts[i], 0, tables[i], i + 1) for i in range(2)], bs, DEV)
    fb_d = ForwardBatch.build([SeqSpec([7 + i], plen, tables[i], i + 1) for i in range(batch)], bs, DEV)
    arms = {"default": DEFAULT_ARMS, "+fused": DEFAULT_ARMS | FUSED_ARMS}
    models = {
        n: build_model(tmp, make_ops("cuda", a), torch.bfloat16, DEV, "dummy", 0) for n, a in arms.items()
    }
    caches = {
        n: ModelCache.allocate(m.cache_spec(), nblocks, bs, batch + 1, torch.bfloat16, DEV)
        for n, m in models.items()
    }

    def fwd(name: str, fb: ForwardBatch) -> Callable[[], torch.Tensor]:
        return lambda: models[name](fb, caches[name])

    rows = []
    for label, fb in (("prefill 2x1024 eager", fb_p), ("decode B=32 eager", fb_d)):
        rows.append((label, _ab({n: fwd(n, fb) for n in models}, reps)))
    graphs = {n: _graph(fwd(n, fb_d)) for n in models}
    rows.append(("decode B=32 graph", _ab({n: g.replay for n, g in graphs.items()}, reps)))
    del graphs
    print("\n| 4B forward | default ms | +fused ms | saved |\n|---|---|---|---|")
    for label, t in rows:
        _row(label, t)
    truth = build_model(tmp, make_ops("torch"), torch.float32, DEV, "dummy", 0)
    with torch.no_grad():
        weights = dict(models["default"].named_parameters())
        for name, p in truth.named_parameters():
            p.copy_(weights[name].float())
    fb_all = ForwardBatch.build(
        [SeqSpec(prompts[i], 0, tables[i], i + 1) for i in range(2)], bs, DEV, all_logits=True
    )
    tcache = ModelCache.allocate(truth.cache_spec(), nblocks, bs, batch + 1, torch.float32, DEV)
    for wname in ("dummy", "tamed 2^-3"):
        if wname != "dummy":
            for m in (*models.values(), truth):
                _tame(m, 2**-3)
        want = truth(fb_all, tcache)  # [2048, vocab]
        top = want.argmax(-1)
        got = {n: models[n](fb_all, caches[n]) for n in models}
        errs = ", ".join(
            f"{n} {_rel(g, want):.2e} (argmax = fp32 at {(g.argmax(-1) == top).float().mean().item():.1%})"
            for n, g in got.items()
        )
        print(
            f"prefill logits of all 2048 positions vs fp32 ({wname} weights): rel err {errs}; "
            f"+fused vs default {_rel(got['+fused'], got['default']):.2e}",
            flush=True,
        )
        del want, got
    try:  # last: prefill through a graph, the device time without the host's launch overhead
        pgraphs = {n: _graph(fwd(n, fb_p)) for n in models}
        _row("prefill 2x1024 graph", _ab({n: g.replay for n, g in pgraphs.items()}, reps))
    except Exception as e:  # noqa: BLE001 - report why; every other number is out already
        print(f"prefill graph capture failed: {type(e).__name__}: {e}", flush=True)

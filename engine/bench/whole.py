"""What a whole-step CUDA graph would give a prefill or mixed step: the forward of one fixed batch run
eagerly, piecewise (the serving path) and captured whole at its exact shape, timed side by side.

    python -m engine.bench.whole --model DIR --load-format dummy [--kernel-arms ...] [--reps 20]

A graph captured at one exact batch is not something serving can use (every step's layout differs);
it is the bound on what graphs can still win for that step: its replay is the step's kernels plus
the device's own boundaries between them, with no host launch in between. Each variant's time is
CUDA events around the forward alone (no batch build, no sampling), medians over ``--reps``, the
variants' order rotated each round. For prefill-only batches (no state read, so a rerun computes the
same values) the graph's logits are compared with the eager forward's bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import get_args

import numpy as np
import torch

from engine.bench.steps import Steps, step_runner
from engine.config import LoadFormat
from engine.model.forward_batch import ForwardBatch
from engine.worker.cuda_graphs import capture_stream, no_gc
from engine.worker.model_runner import ModelRunner
from engine.worker.step_timeline import gaps_between


def timed(stream: torch.cuda.Stream, call) -> float:
    """ms of device time from before ``call`` is queued to after its last kernel."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(stream)
    call()
    e.record(stream)
    e.synchronize()
    return s.elapsed_time(e)


@no_gc()
def capture_whole(runner: ModelRunner, fb: ForwardBatch) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """The eager forward of ``fb`` captured as one graph (its own pool) and its static logits."""
    side = capture_stream(runner.device)
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        for _ in range(2):
            runner.model(fb, runner.cache)
        with torch.cuda.graph(graph, stream=side):
            logits = runner.model(fb, runner.cache)
    torch.cuda.current_stream().wait_stream(side)
    return graph, logits


def measure(runner: ModelRunner, name: str, seqs: list, reps: int) -> tuple[str, dict[str, float], str]:
    """(name, median ms per variant, whether the graph's logits equal the eager forward's)."""
    stream = runner.stream
    assert stream is not None  # main() checked: a CUDA runner
    with torch.cuda.stream(stream), torch.inference_mode():
        fb = ForwardBatch.build(seqs, runner.block_size, runner.device)
        # execute() maps the batch's state slots first (an on-demand state pool)
        variants: dict[str, Callable[[], object]] = {"eager": lambda: runner.execute(fb)}
        pw = runner.piecewise
        if pw is not None and pw.bucket(fb.num_tokens) is not None:
            variants["piecewise"] = lambda: pw.run(fb, runner.cache)
        runner.execute(fb)
        t0 = time.perf_counter()
        graph, logits = capture_whole(runner, fb)
        print(f"{name}: captured whole in {time.perf_counter() - t0:.3f} s (two eager passes included)")
        variants["whole graph"] = graph.replay
        same = "-"
        if fb.num_decodes == 0 and all(c == 0 for c in fb.num_computed_cpu):
            ref = runner.execute(fb).clone()
            graph.replay()
            torch.cuda.synchronize()
            same = "yes" if torch.equal(ref, logits) else f"NO ({(ref - logits).abs().max().item():.3g})"
        for call in variants.values():
            for _ in range(3):
                call()
        times: dict[str, list[float]] = {k: [] for k in variants}
        keys = list(variants)
        for r in range(reps):
            for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
                times[k].append(timed(stream, variants[k]))
        for k in keys:  # the same call after half a second of an idle device
            rested = []
            for _ in range(5):
                time.sleep(0.5)
                rested.append(timed(stream, variants[k]))
            times[f"{k}, rested"] = rested
        for k in ("whole graph", "eager"):
            kern, gaps = profiled(variants[k], 3)
            print(f"{name}: {k}, 3 calls back to back, profiled: kernel {kern:.2f}, gaps {gaps:.2f} ms/call")
        del graph, logits
        torch.cuda.synchronize()
    return name, {k: statistics.median(v) for k, v in times.items()}, same


def profiled(call: Callable[[], object], n: int) -> tuple[float, float]:
    """(kernel ms, ms of gaps between kernels) per call, over ``n`` calls queued back to back."""
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    kernels = [
        (ev.time_range.start, ev.time_range.end, ev.name)
        for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA
    ]
    if not kernels:
        return 0.0, 0.0
    gaps = sum(g for g, _, _ in gaps_between(kernels))
    span = max(e for _, e, _ in kernels) - min(s for s, _, _ in kernels)
    return (span - gaps) / n / 1e3, gaps / n / 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto", choices=get_args(LoadFormat))
    ap.add_argument("--kernel-arms", nargs="*", default=[])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    runner = step_runner(a.model, a.load_format, a.kernel_arms, "lazy")
    if runner.stream is None:
        raise SystemExit("engine.bench.whole needs a CUDA device")
    steps = Steps(runner, np.random.default_rng(0))
    rows = [
        measure(runner, name, seqs, a.reps)
        for name, seqs in steps.kinds().items()
        if not name.startswith("decode")
    ]
    arms = " ".join(a.kernel_arms) or "defaults"
    print(f"arms: {arms}; device {runner.device_name}; ms, median of {a.reps}")
    cols = ("eager", "piecewise", "whole graph")
    head = "".join(f"{c:>13}{c + ', rested':>21}" for c in cols)
    print(f"{'step':<22}{head}{'graph bit-equal':>17}")
    for name, t, same in rows:
        cells = [f"{t[c]:>13.2f}{t[c + ', rested']:>21.2f}" if c in t else f"{'':>13}{'-':>21}" for c in cols]
        print(f"{name:<22}" + "".join(cells) + f"{same:>17}")


if __name__ == "__main__":
    main()

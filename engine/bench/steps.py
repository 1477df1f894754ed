"""The three step kinds at W1 shapes, timed and attributed by op family (issue 10's step targets).

    python -m engine.bench.steps --model DIR --load-format dummy [--kernel-arms ...]

Steps, each through ``ModelRunner.execute_model`` (host batch build, forward, sampling), so decode-only
steps replay their CUDA graph as in serving:
- prefill: 2 sequences x 1,024 new tokens (and one, W2's prompt);
- mixed: 32 decodes at ~1,100 tokens of context + 2,016 prefill tokens (one 1,024 prompt + a 992 chunk),
  and one new prompt behind 4 decodes (200 or 1,000 tokens) or 63 (256 tokens: W3's arrivals);
- score: one 200-token prompt whose every prompt token is scored (echo + logprobs: lm-eval);
- decode at batch 1, 8, 32 and 64, ~1,100 tokens of context.
Reported per kind: wall time (median over repetitions, the sampler's host copy synchronises), launch
(the host's time to build and queue the step, before it waits for the tokens: a step whose launch
is close to its wall time is bound by the host, not the device), device
time (the sum of kernel durations in one profiled repetition), host time = wall - device, for decode
steps ``replay`` (the graph replayed alone, timed by CUDA events: kernels plus the gaps between them),
and device time by op family (GEMMs, attention, GDN, norms and elementwise, sampling/other); then the
span, CUDA events from the call's start to the end of its last device work (no profiler), whose excess
over the device time is the device's idle time during the step; and, from one profiled step's
timeline, where the device sat idle: before the step's first kernel (batch build,
sampler inputs, first launches), between kernels (the host launching slower than the device ran) and
after the last one (the tokens' trip to the host). KV and
state contents are whatever the pools hold (zeros): the shapes, not the values, decide the time.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import math
import pstats
import statistics
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import get_args

import numpy as np
import torch

from engine.bench.kernels import time_eager
from engine.config import CacheConfig, EngineConfig, GraphCapture, LoadFormat, ModelConfig, SchedulerConfig
from engine.model.forward_batch import ForwardBatch
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner
from engine.worker.step import ScheduledSeq
from engine.worker.step_timeline import FAMILIES, family, gaps_between

CTX = 1100


class Steps:
    def __init__(self, runner: ModelRunner, rng: np.random.Generator):
        self.r, self.rng = runner, rng
        self.bs = runner.block_size
        self.per_seq = math.ceil((CTX + 1100) / self.bs)
        self.greedy = SamplingParams(temperature=0.0)

    def seq(self, i: int, new: int, computed: int) -> ScheduledSeq:
        toks = self.rng.integers(0, self.r.vocab_size - 1, size=new).tolist()
        table = list(range(1 + i * self.per_seq, 1 + (i + 1) * self.per_seq))
        return ScheduledSeq(
            token_ids=toks, num_computed=computed, block_ids=table, state_slot=i + 1, request_id=str(i),
            params=self.greedy, num_output=1,
        )  # fmt: skip

    def kinds(self) -> dict[str, list[ScheduledSeq]]:
        out = {
            "prefill 2 x 1024": [self.seq(i, 1024, 0) for i in range(2)],
            "prefill 1 x 1024": [self.seq(0, 1024, 0)],  # W2's prompt
            "mixed 32 dec + 2016": [self.seq(i, 1, CTX) for i in range(32)]
            + [self.seq(32, 1024, 0), self.seq(33, 992, 32)],
        }
        # a prompt arriving while others decode: a few interactive users, and W3's 64 at 256 tokens
        for nd, n in ((4, 200), (4, 1000), (63, 256)):
            if nd < self.r.num_state_slots - 1:
                out[f"mixed {nd} dec + {n}"] = [self.seq(i, 1, CTX) for i in range(nd)] + [self.seq(nd, n, 0)]
        # a lone prompt scored (echo + logprobs, lm-eval's loglikelihood requests): every row's logprob
        score = self.seq(0, 200, 0)
        scoring = SamplingParams(temperature=0.0, prompt_logprobs=1)
        out["score 1 x 200"] = [
            dataclasses.replace(score, params=scoring, history=score.token_ids, num_prompt=200)
        ]
        for b in (1, 8, 32, 64):
            if b < self.r.num_state_slots:
                out[f"decode b{b}"] = [self.seq(i, 1, CTX) for i in range(b)]
        return out


def profile_once(
    runner: ModelRunner,
    seqs: list[ScheduledSeq],
    kernels: dict[str, list[float]] | None = None,
    gaps: list[tuple[float, str, str]] | None = None,
) -> tuple[dict[str, float], tuple[float, float, float]]:
    """Device microseconds by op family for one step (``kernels`` collects [count, us] by kernel name),
    and where the device sat idle during it, in ms: before its first kernel, between kernels, after its
    last one (the profiler's CPU range of the call and its device activities share one clock; the
    profiler's own host overhead is in these too). ``gaps`` collects every idle gap between two
    kernels as (us, the kernel before, the kernel after)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        with torch.profiler.record_function(STEP_RANGE):
            runner.execute_model(seqs)
        torch.cuda.synchronize()
    fam: dict[str, float] = defaultdict(float)
    named: list[tuple[float, float, str]] = []
    step = None
    for ev in prof.events():
        if ev.name == STEP_RANGE:  # the call's CPU range (its GPU annotation twin spans the kernels)
            if ev.device_type == torch.autograd.DeviceType.CPU:
                step = (ev.time_range.start, ev.time_range.end)
        elif ev.device_type == torch.autograd.DeviceType.CUDA:
            fam[family(ev.name)] += ev.device_time
            named.append((ev.time_range.start, ev.time_range.end, ev.name))
            if kernels is not None:
                row = kernels.setdefault(ev.name, [0, 0.0])
                row[0] += 1
                row[1] += ev.device_time
    if gaps is not None:
        gaps.extend(gaps_between(named))
    return dict(fam), idle_split(step, [(s, e) for s, e, _ in named])


def print_gaps(name: str, gaps: list[tuple[float, str, str]], top: int) -> None:
    """How a step's idle time between kernels is spread: a histogram of the gaps and the longest."""
    edges = (1, 2, 3, 5, 10, 20, 50, math.inf)
    counts = [0] * len(edges)
    sums = [0.0] * len(edges)
    for us, _, _ in gaps:
        i = next(i for i, e in enumerate(edges) if us < e)
        counts[i] += 1
        sums[i] += us
    print(f"{name}: {len(gaps)} gaps between kernels, {sum(sums) / 1e3:.2f} ms (below us: count, ms)")
    print("  " + "  ".join(f"<{e}: {c}, {t / 1e3:.2f}" for e, c, t in zip(edges, counts, sums, strict=True)))
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for us, before, after in gaps:
        row = by_pair[(family(before), family(after))]
        row[0] += 1
        row[1] += us
    print("  by family pair (before -> after: count, ms, mean us)")
    for (f0, f1), (c, us) in sorted(by_pair.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"    {f0} -> {f1}: {int(c)}, {us / 1e3:.2f}, {us / c:.1f}")
    for us, before, after in sorted(gaps, reverse=True)[:top]:
        print(f"    {us:>8.1f} us  {before[:50]}  ->  {after[:50]}")


STEP_RANGE = "deltaserve.bench.step"


def idle_split(
    step: tuple[float, float] | None, spans: list[tuple[float, float]]
) -> tuple[float, float, float]:
    """(before the first device activity, the gaps between activities, after the last one) in ms of a
    step whose host call spans ``step`` (us); zeros without a step range or activities."""
    if step is None or not spans:
        return 0.0, 0.0, 0.0
    between = sum(g for g, _, _ in gaps_between([(s, e, "") for s, e in spans]))
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    return max(0.0, first - step[0]) / 1e3, between / 1e3, max(0.0, step[1] - last) / 1e3


def replay_ms(runner: ModelRunner, seqs: list[ScheduledSeq], reps: int) -> float:
    """Median device time of the step's CUDA graph (a decode graph, or with arms graphs.prefill /
    graphs.mixed a whole step's) replayed alone (kernels plus the gaps between them, no host work); 0
    when it has none."""
    graph = None
    if runner.graphs is not None and (key := runner.graphs.bucket(seqs)) in runner.graphs.graphs:
        graph = runner.graphs.graphs[key].graph
    elif (whole := runner.prefill_graphs) is not None and (k := whole.bucket(seqs)) in whole.graphs:
        graph = whole.graphs[k].graph  # None in the eager oracle mode
    return 0.0 if graph is None else time_eager(graph.replay, reps) / 1e3  # us -> ms


def print_host_profile(name: str, runner: ModelRunner, seqs: list[ScheduledSeq], reps: int, top: int) -> None:
    """The host functions that cost the most while the step is built and queued (``reps`` launches)."""
    prof = cProfile.Profile()
    for _ in range(reps):
        prof.enable()
        pending = runner.launch(seqs)
        prof.disable()
        pending.result()
    # torch ops that synchronise with the device while the step is queued (CuPy launches never do)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pending = runner.launch(seqs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        pending.result()
    syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
    print(f"{name}: {len(syncs)} synchronising torch calls in one launch {syncs[:3]}")
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(top)
        print(f"{name}: host profile of {reps} launches ({order} order)")
        print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])


class Marks:
    """Where a step's device time waits for the host, without the profiler's overhead: at marks on
    the host path (the call's start, the batch built, before and after each layer core) the host's
    clock is read and a CUDA event recorded. The device reaches a mark ``slack`` ms after the host
    queued it; where the device waited for the host, the device's time between two marks exceeds the
    kernels it ran there, and the host's time between them is what the device saw."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.host: list[tuple[str, float, torch.cuda.Event]] = []

    def mark(self, name: str) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.runner.stream)
        self.host.append((name, time.perf_counter(), ev))

    def wrap(self, obj: object, attr: str, name: str) -> Callable[[], None]:
        """Mark before and after every call of ``obj.attr`` (a class's static method or an instance's
        method); returns what undoes it."""
        fn, static = getattr(obj, attr), isinstance(obj, type)
        saved = vars(obj)[attr] if static else None

        def marked(*args, **kwargs):
            label = f"{name} {args[0]}" if name == "core" else name
            self.mark(f"{label} <")
            out = fn(*args, **kwargs)
            self.mark(f"{label} >")
            return out

        setattr(obj, attr, marked)
        return (lambda: setattr(obj, attr, saved)) if static else (lambda: delattr(obj, attr))

    def step(self, seqs: list[ScheduledSeq]) -> list[tuple[str, float, float]]:
        """(mark, host ms, device ms) from the call's start, for one launch of ``seqs``."""
        self.host.clear()
        self.mark("start")
        pending = self.runner.launch(seqs)
        self.mark("queued")
        pending.result()
        t0, e0 = self.host[0][1], self.host[0][2]
        return [(n, (t - t0) * 1e3, e0.elapsed_time(ev)) for n, t, ev in self.host]


def print_marks(name: str, runner: ModelRunner, seqs: list[ScheduledSeq]) -> None:
    """The host and device clocks at each mark of one step (after the same step ran once marked)."""
    m = Marks(runner)
    undo = [m.wrap(runner.model, "layer_core", "core"), m.wrap(ForwardBatch, "build", "build")]
    try:
        m.step(seqs)
        rows = m.step(seqs)
    finally:
        for u in undo:
            u()
    print(f"{name}: marks (host ms, device ms, device - host: how far the host runs ahead)")
    for label, h, d in rows:
        print(f"  {label:<12}{h:>9.3f}{d:>9.3f}{d - h:>9.3f}")


def step_runner(
    model: str, load_format: LoadFormat, arms: list[str], graph_capture: GraphCapture
) -> ModelRunner:
    """The runner the step benches time: KV for 65 sequences of CTX + 1,100 tokens, up to 64 sequences
    and 2,048 tokens a step (W1's budget)."""
    mc = ModelConfig(
        model=model, load_format=load_format, kernel_arms=tuple(arms), cuda_graph_capture=graph_capture
    )
    per_seq = math.ceil((CTX + 1100) / 32)
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(num_gpu_blocks_override=65 * per_seq),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048),
    )
    return ModelRunner(cfg)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto", choices=get_args(LoadFormat))
    ap.add_argument("--kernel-arms", nargs="*", default=[])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--top", type=int, default=0, help="list the N costliest kernels of each step")
    ap.add_argument(
        "--host-profile", type=int, default=0, help="cProfile the launches: the N costliest host functions"
    )
    ap.add_argument(
        "--graph-capture",
        default="startup",
        choices=get_args(GraphCapture),
        help="startup, or lazy: each graph on first use (quicker start)",
    )
    ap.add_argument("--marks", action="store_true", help="host and device clocks at each layer core")
    ap.add_argument("--gaps", type=int, default=-1, help="gaps between kernels: histogram, the N longest")
    ap.add_argument("--steps", nargs="*", default=[], help="only the step kinds starting with these words")
    a = ap.parse_args(argv)
    runner = step_runner(a.model, a.load_format, a.kernel_arms, a.graph_capture)
    steps = Steps(runner, np.random.default_rng(0))
    rows = []
    for name, seqs in steps.kinds().items():
        if a.steps and not any(name.startswith(w) for w in a.steps):
            continue
        for _ in range(3):
            runner.execute_model(seqs)
        walls = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            runner.execute_model(seqs)
            walls.append((time.perf_counter() - t0) * 1e3)
        spans = []  # the device's time from the call's start to its last kernel, by CUDA events
        for _ in range(a.reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(runner.stream)
            pending = runner.launch(seqs)  # returns once queued: e1 follows the step's last device work
            e1.record(runner.stream)
            pending.result()
            spans.append(e0.elapsed_time(e1))
        launches = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            pending = runner.launch(seqs)
            launches.append((time.perf_counter() - t0) * 1e3)
            pending.result()
        if a.host_profile:
            print_host_profile(name, runner, seqs, a.reps, a.host_profile)
        if a.marks:
            print_marks(name, runner, seqs)
        replay = replay_ms(runner, seqs, a.reps)
        kernels: dict[str, list[float]] = {}
        gaps: list[tuple[float, str, str]] = []
        fam, idle = profile_once(runner, seqs, kernels, gaps)
        if a.gaps >= 0:
            print_gaps(name, gaps, a.gaps)
        device = sum(fam.values()) / 1e3
        wall = statistics.median(walls)
        rows.append(
            (name, wall, statistics.median(launches), device, replay, fam, (statistics.median(spans), *idle))
        )
        if a.top:
            n = int(sum(c for c, _ in kernels.values()))
            print(f"{name}: {n} kernels, the {a.top} costliest (count, total us, name)")
            for k, (c, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[: a.top]:
                print(f"  {int(c):>5} {us:>9.1f}  {k[:110]}")
    print(f"arms: {' '.join(a.kernel_arms) or 'defaults'}; device {runner.device_name}")
    names = [f for f, _ in FAMILIES] + ["sampling/other"]
    head = f"{'step':<22}{'wall ms':>9}{'launch':>8}{'device':>9}{'host':>8}{'replay':>8}"
    print(head + "".join(f"{n[:10]:>12}" for n in names))
    for name, wall, launch, device, replay, fam, _ in rows:
        cols = "".join(f"{fam.get(n, 0.0) / 1e3:>12.2f}" for n in names)
        rep = f"{replay:>8.2f}" if replay else f"{'-':>8}"
        print(f"{name:<22}{wall:>9.2f}{launch:>8.2f}{device:>9.2f}{wall - device:>8.2f}{rep}{cols}")
    print(
        "device idle, ms: span (CUDA events from the call's start to its last kernel) - device = idle "
        "before and between kernels; then one profiled step's before / between / after (the profiler's "
        "host overhead included)"
    )
    print(f"{'step':<22}{'span':>9}{'idle':>9}{'before':>9}{'between':>9}{'after':>9}")
    for name, _, _, device, *_, (span, before, between, after) in rows:
        print(f"{name:<22}{span:>9.2f}{span - device:>9.2f}{before:>9.2f}{between:>9.2f}{after:>9.2f}")


if __name__ == "__main__":
    main()

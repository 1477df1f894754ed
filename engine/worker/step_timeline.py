"""The analysis behind ``--profile-steps`` (engine/worker/step_profile.py), pure and device-free:
the window flag, what a step held, each step's span split into kernel time and idle (lead, inner,
tail) from the profiler's device timeline, device time by op family per step, and the summary by
step kind. The step bench (``engine.bench.steps``) shares the op families."""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.model.forward_batch import SeqSpec

MARK = "step_mark_kernel"  # the marker kernel's name (cuda/common/step_mark.cu)
Event = tuple[float, float, str]  # a device activity: start, end (us), name
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # device activities in torch's Chrome trace
# Kernel name substrings by op family (first match wins; what matches none is sampling/other).
FAMILIES = (
    ("attention", ("paged_attn",)),
    ("gdn", ("gdn_", "conv_prefill", "conv_decode", "conv_state", "chunk")),
    ("norm/elementwise", ("rms_norm", "silu_mul", "qk_norm", "elementwise", "vectorized", "reduce", "cat")),
    ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "sm90", "sm80")),
)


def family(kernel: str) -> str:
    k = kernel.lower()
    for name, keys in FAMILIES:
        if any(key in k for key in keys):
            return name
    return "sampling/other"


@dataclass(frozen=True)
class Window:
    """Serving steps ``start`` .. ``start + count - 1`` (the first serving step is 0)."""

    start: int
    count: int

    @classmethod
    def parse(cls, spec: str) -> Window:
        head, sep, tail = spec.partition(":")
        try:
            start, count = int(head), int(tail)
        except ValueError:
            start = count = -1
        if not sep or start < 0 or count < 1:
            raise ValueError(f"--profile-steps: expected START:COUNT (START >= 0, COUNT >= 1), got {spec!r}")
        return cls(start, count)


@dataclass(frozen=True)
class StepKind:
    """What a step held and how the runner would route it (without prompt scoring)."""

    kind: str  # decode, prefill or mixed
    path: str  # decode graph, whole-step graph, piecewise or eager
    decodes: int
    prompts: int  # prefill sequences (whole prompts or chunks)
    tokens: int

    @property
    def label(self) -> str:
        many = " (2+ prompts)" if self.prompts > 1 else ""
        return f"{self.kind}{many} / {self.path}"


@dataclass(frozen=True)
class StepTiming:
    """One step on the device, in microseconds (see the module docstring)."""

    span: float
    busy: float
    lead: float
    inner: float
    tail: float

    @property
    def idle(self) -> float:
        return self.lead + self.inner + self.tail


def step_kind(seqs: Sequence[SeqSpec], path: str) -> StepKind:
    decodes = sum(s.is_decode for s in seqs)
    prompts = len(seqs) - decodes
    kind = "decode" if not prompts else "prefill" if not decodes else "mixed"
    return StepKind(kind, path, decodes, prompts, sum(len(s.token_ids) for s in seqs))


def gaps_between(kernels: Sequence[Event]) -> list[tuple[float, str, str]]:
    """The device's idle gaps among ``kernels`` (start, end, name): (length, the kernel whose end
    opens it, the kernel whose start closes it), each gap once however kernels overlap (a kernel
    inside a longer one, or two launched to overlap, leave no gap)."""
    out: list[tuple[float, str, str]] = []
    ordered = sorted(kernels)
    if not ordered:
        return out
    end, last = ordered[0][1], ordered[0][2]
    for start, e, name in ordered[1:]:
        if start > end:
            out.append((start - end, last, name))
        if e > end:
            end, last = e, name
    return out


def by_step(marks: Sequence[float], events: Sequence[Event]) -> list[list[Event]]:
    """The events (start, end, name) of each step, between consecutive mark starts, each in the step
    it starts in; events before the first mark (earlier steps' work) or after the last are left out."""
    out: list[list[Event]] = [[] for _ in range(max(0, len(marks) - 1))]
    for ev in events:
        i = bisect.bisect_right(marks, ev[0]) - 1
        if 0 <= i < len(out):
            out[i].append(ev)
    return out


def step_timings(marks: Sequence[float], events: Sequence[Event]) -> list[StepTiming]:
    """One timing per pair of consecutive mark starts (us), from the device ``events`` (marks
    excluded), each cut at the next mark; lead + busy + inner + tail = span for every step."""
    out: list[StepTiming] = []
    for a, b, evs in zip(marks, marks[1:], by_step(marks, events), strict=False):
        if not evs:
            out.append(StepTiming(b - a, 0.0, b - a, 0.0, 0.0))
            continue
        cut = [(s, min(e, b), name) for s, e, name in evs]
        inner = sum(g for g, _, _ in gaps_between(cut))
        first, end = min(s for s, _, _ in cut), max(e for _, e, _ in cut)
        out.append(StepTiming(b - a, end - first - inner, first - a, inner, b - end))
    return out


def device_events(trace: dict[str, Any]) -> tuple[list[float], list[Event]]:
    """(mark starts, other device activities as (start, end, name)) in us from a torch Chrome trace."""
    marks: list[float] = []
    events: list[Event] = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") not in DEVICE_CATS:
            continue
        ts, dur, name = float(ev["ts"]), float(ev.get("dur", 0.0)), str(ev.get("name", ""))
        if MARK in name:
            marks.append(ts)
        else:
            events.append((ts, ts + dur, name))
    marks.sort()
    return marks, events


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "mean": statistics.fmean(xs) / 1e3,
        "p50": xs[len(xs) // 2] / 1e3,
        "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))] / 1e3,
        "max": xs[-1] / 1e3,
    }


def step_families(marks: Sequence[float], events: Sequence[Event]) -> list[dict[str, float]]:
    """Device microseconds by op family of each step (:func:`by_step`'s events, uncut)."""
    out: list[dict[str, float]] = []
    for evs in by_step(marks, events):
        fams: dict[str, float] = defaultdict(float)
        for s, e, name in evs:
            fams[family(name)] += e - s
        out.append(dict(fams))
    return out


def summarize(
    kinds: Sequence[StepKind], timings: Sequence[StepTiming], families: Sequence[dict[str, float]]
) -> dict[str, Any]:
    """The window's totals, per-step idle and, by step label, means in ms (device time by op family
    among them); ``families`` is :func:`step_families` of the same steps."""
    n = min(len(kinds), len(timings), len(families))
    if n == 0:
        return {"steps": 0}
    span = sum(t.span for t in timings[:n])
    busy = sum(t.busy for t in timings[:n])
    groups: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        groups[kinds[i].label].append(i)

    def by_family(idx: Sequence[int], scale: float) -> dict[str, float]:
        tot: dict[str, float] = defaultdict(float)
        for i in idx:
            for f, us in families[i].items():
                tot[f] += us * scale / 1e3
        return dict(sorted(tot.items(), key=lambda kv: -kv[1]))

    by_kind: dict[str, dict[str, Any]] = {}
    for label, idx in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        row = by_kind[label] = {
            "steps": len(idx),
            "tokens": statistics.fmean(kinds[i].tokens for i in idx),
            "decodes": statistics.fmean(kinds[i].decodes for i in idx),
        }
        for f in ("span", "busy", "idle", "lead", "inner", "tail"):
            row[f"{f}_ms"] = statistics.fmean(getattr(timings[i], f) for i in idx) / 1e3
        row["families_ms"] = by_family(idx, 1 / len(idx))  # per step
    return {
        "steps": n,
        "span_ms": span / 1e3,
        "busy_ms": busy / 1e3,
        "busy_fraction": busy / span if span else 0.0,
        "idle_per_step_ms": _stats([t.idle for t in timings[:n]]),
        "by_kind": by_kind,
        "families_ms": by_family(range(n), 1.0),  # the whole window
    }

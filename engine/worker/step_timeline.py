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


def step_timings(marks: Sequence[float], events: Sequence[tuple[float, float]]) -> list[StepTiming]:
    """One timing per pair of consecutive mark starts (us), from the device ``events`` (start, end),
    marks excluded; events before the first mark (earlier steps' work) or after the last are ignored.
    lead + busy + inner + tail = span for every step."""
    out: list[StepTiming] = []
    ordered = sorted(events)
    i, n = 0, len(ordered)
    for a, b in zip(marks, marks[1:], strict=False):
        while i < n and ordered[i][0] < a:
            i += 1
        first, end, busy, inner = None, a, 0.0, 0.0
        while i < n and ordered[i][0] < b:
            s, e = ordered[i][0], min(ordered[i][1], b)
            i += 1
            if first is None:
                first = end = s
            if s > end:
                inner += s - end
            if e > end:
                busy += e - max(s, end)
                end = e
        if first is None:
            out.append(StepTiming(b - a, 0.0, b - a, 0.0, 0.0))
        else:
            out.append(StepTiming(b - a, busy, first - a, inner, b - end))
    return out


def device_events(trace: dict[str, Any]) -> tuple[list[float], list[tuple[float, float, str]]]:
    """(mark starts, other device activities as (start, end, name)) in us from a torch Chrome trace."""
    marks: list[float] = []
    events: list[tuple[float, float, str]] = []
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


def step_families(
    marks: Sequence[float], events: Sequence[tuple[float, float, str]]
) -> list[dict[str, float]]:
    """Device microseconds by op family of each step (between consecutive mark starts), the events
    assigned to the step they start in; events outside the marks are left out."""
    out: list[dict[str, float]] = [defaultdict(float) for _ in range(max(0, len(marks) - 1))]
    for s, e, name in events:
        i = bisect.bisect_right(marks, s) - 1
        if 0 <= i < len(out):
            out[i][family(name)] += e - s
    return [dict(f) for f in out]


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

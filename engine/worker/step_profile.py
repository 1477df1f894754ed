"""Where the device's time goes while serving: ``--profile-steps START:COUNT`` (CUDA only).

The step bench (``engine.bench.steps``) times one step shape at a time, each launched onto an idle
device, so its "host time" (wall - kernels) includes the batch build that serving overlaps with the
previous step (async scheduling) and the device slowing down under sustained load. This measures the
real thing: from serving step START on, for COUNT steps, the torch profiler (CUPTI, device activity
only: no host-side op tracing, so the host runs as it does unprofiled but for CUPTI's per-launch
cost) records every kernel, and the runner launches an empty marker kernel
(``cuda/common/step_mark.cu``) on its stream at the start of each step. One step is everything from
its mark to the next one, in stream order:

- ``busy``: the union of its kernels' (and copies') intervals;
- ``lead``: the device idle from the mark to the step's first kernel (the host building and queueing
  the step's first work after the device caught up with it);
- ``inner``: idle between its kernels (the host launching slower than the device runs them: eager
  layer cores between piecewise graphs);
- ``tail``: idle from its last kernel to the next step's mark (the next step not queued yet: the
  engine waiting for tokens, scheduling, or no work at all).

``span - busy`` = lead + inner + tail is the host's share of the step as the device saw it: the
"wall minus device time" of issue 10, measured in serving instead of on an idle device. The mark
itself (~1-2 us) counts as idle. When the window's last step has run (its end is step START + COUNT's
mark), the runner synchronises once, stops the profiler, logs a summary by step kind and writes
``step-profile.json`` (and the trace, ``trace.json``, viewable in Perfetto) to ``--profile-dir``,
with the interpreter's garbage-collection pauses in the window (``gc.callbacks``) by generation;
serving pauses for that (a few seconds for a few hundred steps). Steps are counted from the first
serving step (warm-up and graph capture run before), warm-up requests a client sends included.
The trace's analysis is engine/worker/step_timeline.py; a profile that fails is logged and dropped.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from engine.model.forward_batch import SeqSpec
from engine.ops.compile import i32, kernel, launch
from engine.worker.step_timeline import (
    MARK,
    StepKind,
    Window,
    device_events,
    step_families,
    step_kind,
    step_timings,
    summarize,
)

log = logging.getLogger(__name__)

MARK_SRC = "common/step_mark.cu"


class GcPauses:
    """The interpreter's garbage collections while registered (``gc.callbacks``): count, total and
    longest pause by generation. A collection holds the GIL, so it stalls whichever thread launches
    the step as well as the one that triggered it."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t0))

    def start(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def stop(self) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for g in sorted({g for g, _ in self.pauses}):
            ts = [t for gen, t in self.pauses if gen == g]
            out[f"gen{g}"] = {"count": len(ts), "total_ms": sum(ts) * 1e3, "max_ms": max(ts) * 1e3}
        return out


class StepProfiler:
    """Profiles the runner's steps in ``window`` (see the module docstring). ``on_launch`` is called
    on the runner's stream at the start of every step, before anything of the step is queued."""

    def __init__(self, window: Window, out_dir: str, path_of: Callable[[Sequence[SeqSpec]], str]):
        self.window, self.out_dir, self.path_of = window, out_dir, path_of
        if out_dir:  # at start-up: a directory that cannot be made is refused before serving
            try:
                Path(out_dir).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"--profile-dir {out_dir!r}: {e}") from None
        self.index = 0  # serving steps launched so far
        self.kinds: list[StepKind] = []
        self.summary: dict[str, Any] | None = None  # set when the window has been written
        self._mark = kernel(MARK_SRC, MARK)  # built now, not inside the window
        self._prof: Any = None
        self._gc: GcPauses | None = None

    def on_launch(self, seqs: Sequence[SeqSpec]) -> None:
        i, w = self.index, self.window
        self.index += 1
        if i < w.start or self.summary is not None:
            return
        try:
            self._step(i, seqs)
        except Exception as e:  # a profile that fails (no CUPTI, a full disk) must not stop serving
            log.exception("step profile failed at step %d; profiling stops, serving goes on", i)
            self.summary = {"steps": 0, "error": f"{type(e).__name__}: {e}"}
            self._close()

    def _close(self) -> None:
        """Unregister the collection timer and stop the profiler, whatever state they are in."""
        gcp, self._gc = self._gc, None
        if gcp is not None:
            gcp.stop()
        prof, self._prof = self._prof, None
        if prof is not None:
            with contextlib.suppress(Exception):
                prof.stop()

    def _step(self, i: int, seqs: Sequence[SeqSpec]) -> None:
        w = self.window
        if i == w.start:
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self._prof.start()
            self._gc = GcPauses().start()
            log.info("step profile: steps %d-%d under the profiler", w.start, w.start + w.count - 1)
        self._launch_mark(i)
        if i == w.start + w.count:  # this mark ends the window's last step
            self._finish()
            return
        self.kinds.append(step_kind(seqs, self.path_of(seqs)))

    def _launch_mark(self, i: int) -> None:
        launch(self._mark, (1,), (32,), (i32(i),))

    def _finish(self) -> None:
        gcp, prof = self._gc, self._prof
        torch.cuda.synchronize()
        self._close()
        out = Path(self.out_dir) if self.out_dir else None
        with tempfile.TemporaryDirectory() as tmp:
            trace_path = (out or Path(tmp)) / "trace.json"
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace_path))
            trace = json.loads(trace_path.read_text())
        marks, events = device_events(trace)
        timings = step_timings(marks, events)
        summary = summarize(self.kinds, timings, step_families(marks, events))
        summary["window"] = asdict(self.window)
        summary["marks"] = len(marks)
        summary["gc_pauses"] = gcp.summary() if gcp is not None else {}
        self.summary = summary
        log_summary(summary)
        if out is not None:
            (out / "step-profile.json").write_text(json.dumps(summary, indent=1))


def log_summary(s: dict[str, Any]) -> None:
    if not s.get("steps"):
        log.warning("step profile: no step timed (%s marks in the trace)", s.get("marks"))
        return
    idle = s["idle_per_step_ms"]
    log.info(
        "step profile: %d steps over %.1f ms, device busy %.1f%%, idle per step mean %.3f / p50 %.3f / "
        "p90 %.3f ms",
        s["steps"],
        s["span_ms"],
        100 * s["busy_fraction"],
        idle["mean"],
        idle["p50"],
        idle["p90"],
    )
    fams = ", ".join(f"{f} {ms:.1f}" for f, ms in s["families_ms"].items())
    log.info("step profile: device time by op family (ms): %s", fams)
    for gen, g in s.get("gc_pauses", {}).items():
        log.info(
            "step profile: garbage collections (%s) in the window: %d, %.2f ms in all, longest %.2f ms",
            gen,
            g["count"],
            g["total_ms"],
            g["max_ms"],
        )
    for label, k in s["by_kind"].items():
        log.info(
            "step profile: %s: %d steps, %.0f tokens, span %.3f ms = busy %.3f + idle %.3f (lead %.3f, "
            "inner %.3f, tail %.3f)",
            label,
            k["steps"],
            k["tokens"],
            k["span_ms"],
            k["busy_ms"],
            k["idle_ms"],
            k["lead_ms"],
            k["inner_ms"],
            k["tail_ms"],
        )


def make_profiler(window: str, out_dir: str, runner: Any) -> StepProfiler | None:
    """The runner's profiler for ``--profile-steps`` (None when off). Steps are labelled with the path
    the runner takes for them (decode graph, whole-step graph, piecewise graphs or eager)."""
    if not window:
        return None
    w = Window.parse(window)
    if runner.device.type != "cuda":
        raise ValueError("--profile-steps profiles the device's kernels: it needs a CUDA device")

    def path_of(seqs: Sequence[SeqSpec]) -> str:
        if runner.graphs is not None and runner.graphs.bucket(seqs) is not None:
            return "decode graph"
        if runner.prefill_graphs is not None and runner.prefill_graphs.bucket(seqs) is not None:
            return "whole-step graph"
        pw = runner.piecewise
        if pw is not None and pw.bucket(sum(len(s.token_ids) for s in seqs)) is not None:
            return "piecewise"
        return "eager"

    return StepProfiler(w, out_dir, path_of)

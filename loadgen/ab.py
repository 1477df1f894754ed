"""Order-alternated A/B runs with an A/A pair for noise (docs/BENCHMARKS.md, "Method")."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx

from .report import ab_table, format_run_table
from .runner import RunConfig, run_benchmark

# Metrics compared; for each the B/A ratio is reported (higher is better for throughputs only).
AB_METRICS = (
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "server_peak_memory_bytes",
)


PER_RUN_METRICS = (
    "duration",
    "completed",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_itl_ms",
    "server_peak_memory_bytes",
)


def run_order(pairs: int) -> list[str]:
    """A B, B A, A B ... then one A/A pair: alternation cancels drift (thermal, caches) to first
    order, and the A/A pair measures the run-to-run noise at that time on that machine."""
    order: list[str] = []
    for i in range(pairs):
        order += ["A", "B"] if i % 2 == 0 else ["B", "A"]
    return order + ["A", "A"]


def wait_for_health(base_url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    url = base_url.rstrip("/") + "/health"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f} s")


@contextmanager
def server_process(cmd: str, base_url: str, log_path: Path, startup_timeout: float):
    """Start one server command in its own process group, wait for /health, stop it after."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(shlex.split(cmd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_health(base_url, startup_timeout, proc)
        yield proc
    finally:
        stop_process(proc)
        log.close()


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the group we started (the server may fork an engine process), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


# A server's peak memory only grows while it lives: with --a-url/--b-url the same two servers serve
# every run, so per-run ratios of it compare histories, not arms (and a device-wide gauge counts both
# servers when they share a GPU). It is compared only when each run gets a fresh server (--a-cmd).
CUMULATIVE_METRICS = ("server_peak_memory_bytes",)


MIN_PAIRS_FOR_VERDICT = 3
"""Below this many A/B pairs no verdict is given: one or two pairs cannot tell a change from noise."""


def aa_band(a_values: list[float]) -> tuple[float, float] | None:
    """The noise band from every run of arm A, in order: the widest ratio between consecutive A runs,
    symmetric in log space (an A/A ratio of 1.03 means anything in 1/1.03..1.03)."""
    ratios = [b / a for a, b in zip(a_values, a_values[1:], strict=False) if a]
    if not ratios or any(r <= 0 for r in ratios):
        return None
    half = max(abs(math.log(r)) for r in ratios)
    return math.exp(-half), math.exp(half)


def ratio_stats(runs: list[tuple[str, dict]], fresh_servers: bool = True) -> dict[str, dict]:
    """Per metric: B/A ratio of each alternated pair (median, min, max), the noise band built from all
    the A runs (the alternated ones and the closing A/A pair), and a verdict from 3 pairs on.
    Without ``fresh_servers`` the cumulative metrics are left out."""
    main, aa = runs[:-2], runs[-2:]
    pairs = len(main) // 2
    out: dict[str, dict] = {}
    for m in AB_METRICS:
        if not fresh_servers and m in CUMULATIVE_METRICS:
            continue
        ratios = []
        for i in range(0, len(main), 2):
            pair = dict(main[i : i + 2])
            a, b = pair["A"].get(m), pair["B"].get(m)
            if a and b is not None:
                ratios.append(b / a)
        a1, a2 = aa[0][1].get(m), aa[1][1].get(m)
        aa_ratio = a2 / a1 if a1 and a2 is not None else None
        a_values = [r.get(m) for arm, r in runs if arm == "A"]
        known = [float(v) for v in a_values if v is not None]
        band = aa_band(known) if len(known) == len(a_values) else None
        entry: dict = {"ratios": ratios, "aa_ratio": aa_ratio, "pairs": pairs}
        if ratios:
            entry.update(median=statistics.median(ratios), min=min(ratios), max=max(ratios))
        else:
            entry.update(median=None, min=None, max=None)
        entry.update(noise_lo=band[0] if band else None, noise_hi=band[1] if band else None)
        if band is None or entry["median"] is None or pairs < MIN_PAIRS_FOR_VERDICT:
            entry["within_noise"] = None  # no verdict
        else:
            entry["within_noise"] = band[0] <= entry["median"] <= band[1]
        out[m] = entry
    return out


def run_ab(
    cfg: RunConfig,
    records: list[dict],
    out_dir: Path,
    pairs: int = 3,
    a_url: str | None = None,
    b_url: str | None = None,
    a_cmd: str | None = None,
    b_cmd: str | None = None,
    startup_timeout: float = 600.0,
) -> dict:
    """Run the sequence; with commands, each run gets a fresh server on cfg.base_url."""
    if pairs < 1:
        raise ValueError("--pairs must be at least 1")
    if pairs < MIN_PAIRS_FOR_VERDICT:
        print(
            f"loadgen ab: {pairs} pair(s) cannot separate a change from noise; ratios are reported "
            f"without a verdict (use --pairs {MIN_PAIRS_FOR_VERDICT} or more)",
            file=sys.stderr,
        )
    if bool(a_cmd) != bool(b_cmd) or bool(a_url) != bool(b_url) or bool(a_cmd) == bool(a_url):
        raise ValueError("give either --a-url and --b-url, or --a-cmd and --b-cmd")
    out_dir.mkdir(parents=True, exist_ok=True)
    order = run_order(pairs)
    runs: list[tuple[str, dict]] = []
    for n, arm in enumerate(order):
        print(f"== run {n + 1}/{len(order)}: arm {arm}", file=sys.stderr)
        if a_cmd:
            cmd = a_cmd if arm == "A" else b_cmd
            assert cmd is not None
            with server_process(cmd, cfg.base_url, out_dir / f"server-{n:02d}-{arm}.log", startup_timeout):
                result = asyncio.run(run_benchmark(cfg, records))
            result["server_cmd"] = cmd
        else:
            url = a_url if arm == "A" else b_url
            assert url is not None
            result = asyncio.run(run_benchmark(replace(cfg, base_url=url), records))
        result["arm"] = arm
        with open(out_dir / f"run-{n:02d}-{arm}.json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(format_run_table(result), file=sys.stderr)
        runs.append((arm, result))
    ratios = ratio_stats(runs, fresh_servers=bool(a_cmd))
    summary = {
        "pairs": pairs,
        "order": order,
        "a": a_cmd or a_url,
        "b": b_cmd or b_url,
        "git_commit": runs[0][1].get("git_commit"),
        "gpu_name": runs[0][1].get("gpu_name"),
        "runs": [f"run-{i:02d}-{arm}.json" for i, (arm, _) in enumerate(runs)],
        "failed": {f"run-{i:02d}-{arm}": r["failed"] for i, (arm, r) in enumerate(runs)},
        # each run's own figures, so ab.json alone carries the absolute values behind the ratios
        "per_run": {
            f"run-{i:02d}-{arm}": {m: r.get(m) for m in PER_RUN_METRICS} for i, (arm, r) in enumerate(runs)
        },
        "ratios": ratios,
        "not_compared": {} if a_cmd else {m: "servers persist across runs" for m in CUMULATIVE_METRICS},
    }
    with open(out_dir / "ab.json", "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(ab_table(ratios))
    return summary

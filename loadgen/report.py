"""Tables and plots from result JSONs. Plotting needs matplotlib (the optional `plot` extra);
everything else works without it."""

from __future__ import annotations

import json
from pathlib import Path

from .metrics import DEFAULT_PERCENTILES, pct_word

METRICS = ("ttft", "tpot", "itl", "e2el")
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


def _fmt_bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def format_run_table(r: dict) -> str:
    """The printed summary of one run, laid out like vLLM's bench serve output."""
    pcts = r.get("percentiles", DEFAULT_PERCENTILES)
    rows: list[tuple[str, str]] = [
        ("Successful requests:", str(r["completed"])),
        ("Failed requests:", str(r["failed"])),
    ]
    if r.get("max_concurrency"):
        rows.append(("Maximum request concurrency:", str(r["max_concurrency"])))
    if r.get("request_rate") not in (None, "inf"):
        rows.append(("Request rate configured (RPS):", f"{float(r['request_rate']):.2f}"))
    rows += [
        ("Benchmark duration (s):", f"{r['duration']:.2f}"),
        ("Total input tokens:", str(r["total_input_tokens"])),
        ("Total generated tokens:", str(r["total_output_tokens"])),
        ("Request throughput (req/s):", f"{r['request_throughput']:.2f}"),
        ("Output token throughput (tok/s):", f"{r['output_throughput']:.2f}"),
        ("Total token throughput (tok/s):", f"{r['total_token_throughput']:.2f}"),
        ("Server peak device memory:", _fmt_bytes(r.get("server_peak_memory_bytes"))),
        ("GPU:", str(r.get("gpu_name") or "n/a")),
    ]
    lines = ["{:=^56}".format(" Serving Benchmark Result ")]
    lines += [f"{k:<40} {v:<15}" for k, v in rows]
    for m in METRICS:
        lines.append("{:-^56}".format(f" {NAMES[m]} "))
        for stat in ("mean", "median", "std") + tuple(f"p{pct_word(p)}" for p in pcts):
            key = f"{stat}_{m}_ms"
            if key in r:
                lines.append(f"{f'{stat.capitalize()} {NAMES[m]} (ms):':<40} {r[key]:<15.2f}")
    stages = r.get("server_first_token_stages_ms")
    if stages:
        lines.append("{:-^56}".format(" Server TTFT by stage (mean) "))
        for key, ms in stages.items():
            label = "Server TTFT (ms):" if key == "ttft" else f"  {key} (ms):"
            lines.append(f"{label:<40} {ms:<15.2f}")
    errors = [e for e in r.get("errors", []) if e]
    if errors:
        lines.append("{:-^56}".format(" Errors (first 10) "))
        lines += [f"  {e}" for e in errors[:10]]
    for key, what in (
        ("usage_chunk_mismatches", "usage != chunk count"),
        ("output_len_mismatches", "output len != max_tokens"),
    ):
        if r.get(key):
            lines.append(f"warning: {r[key]} requests with {what}")
    lines.append("=" * 56)
    return "\n".join(lines)


def markdown_summary(results: dict[str, dict]) -> str:
    """One column per result file; an ab summary renders as its ratio table."""
    out: list[str] = []
    runs = {k: v for k, v in results.items() if "ratios" not in v}
    if runs:
        names = list(runs)
        out.append("| metric | " + " | ".join(names) + " |")
        out.append("| --- |" + " --- |" * len(names))
        keys = [
            "completed",
            "failed",
            "duration",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
        ]
        keys += [f"{s}_{m}_ms" for m in METRICS for s in ("mean", "median", "p99")]
        for k in keys + ["server_peak_memory_bytes", "gpu_name", "git_commit"]:
            cells = [_cell(runs[n].get(k)) for n in names]
            out.append(f"| {k} | " + " | ".join(cells) + " |")
    for name, ab in results.items():
        if "ratios" in ab:
            out.append("")
            out.append(f"### A/B `{name}`: B/A ratio over {ab.get('pairs')} pairs")
            out.append("")
            out.append(ab_table(ab["ratios"]))
    return "\n".join(out) + "\n"


def ab_table(ratios: dict) -> str:
    lines = [
        "| metric | B/A median | min | max | A/A noise band | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for metric, r in ratios.items():
        if r.get("median") is None:
            continue
        band = f"{r['noise_lo']:.3f}-{r['noise_hi']:.3f}" if r.get("noise_lo") is not None else "n/a"
        within = r.get("within_noise")
        verdict = "n/a (< 3 pairs)" if within is None else "noise" if within else "difference"
        lines.append(
            f"| {metric} | {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} | {band} | {verdict} |"
        )
    return "\n".join(lines)


def _cell(v: object) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def token_times(r: dict) -> list[float]:
    """Every output token's arrival, seconds after the first send, rebuilt from the trace keys."""
    out: list[float] = []
    for st, ttft, itl, err in zip(r["start_times"], r["ttfts"], r["itls"], r["errors"], strict=False):
        if st is None or err:
            continue
        t = st + ttft
        out.append(t)
        for g in itl:
            t += g
            out.append(t)
    return out


def throughput_series(r: dict, bucket_s: float = 1.0) -> tuple[list[float], list[float]]:
    """(bucket start, output tokens/s) over the run."""
    times = token_times(r)
    if not times:
        return [], []
    n = int(max(times) / bucket_s) + 1
    counts = [0] * n
    for t in times:
        counts[int(t / bucket_s)] += 1
    return [i * bucket_s for i in range(n)], [c / bucket_s for c in counts]


def plot(results: dict[str, dict], out_dir: Path) -> list[Path]:
    """PNG plots, or an empty list when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    runs = {k: v for k, v in results.items() if "ttfts" in v}
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for key in ("ttft", "itl"):
        title = NAMES[key]
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, r in runs.items():
            ok = [e == "" or e is None for e in r["errors"]]
            if key == "ttft":
                vals = [v * 1000 for v, good in zip(r["ttfts"], ok, strict=False) if good]
            else:
                vals = [g * 1000 for gs, good in zip(r["itls"], ok, strict=False) if good for g in gs]
            vals.sort()
            if vals:
                ax.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))], label=name)
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("fraction of samples")
        ax.set_title(f"{title} distribution (CDF)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        path = out_dir / f"{key}_cdf.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        files.append(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in runs.items():
        xs, ys = throughput_series(r)
        if xs:  # close the last bucket so it is drawn as wide as the others
            ax.step(xs + [xs[-1] + 1.0], ys + [ys[-1]], where="post", label=name)
    ax.set_xlabel("seconds since first request")
    ax.set_ylabel("output tokens/s (1 s buckets)")
    ax.set_title("Output throughput over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path = out_dir / "throughput.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    files.append(path)
    return files


def load_results(paths: list[Path]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for p in paths:
        with open(p, encoding="utf-8") as f:
            try:
                out[Path(p).stem] = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: not a result JSON: {e}") from None
    return out

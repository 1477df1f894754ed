"""Benchmark metrics as pure functions over request traces.

Definitions follow vLLM ``bench serve`` (and docs/BENCHMARKS.md) so figures compare directly:
TTFT = first token chunk - send; TPOT = (E2E - TTFT) / (output tokens - 1) over requests with more
than one output token; ITL = every gap between consecutive token chunks, pooled over requests;
E2E = last token chunk - send. Throughputs divide by the true wall window: first send to last
receive over every measured request. Failed requests are counted and excluded from the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

DEFAULT_PERCENTILES: tuple[float, ...] = (90.0, 99.0)


@dataclass
class RequestTrace:
    """What the client saw for one request; all times are time.perf_counter() seconds."""

    prompt_len: int
    expected_output_len: int
    start: float = 0.0  # when the request was sent
    chunk_times: list[float] = field(default_factory=list)  # arrival of each token-bearing chunk
    end: float = 0.0  # last byte received (usage chunk / [DONE] / error)
    usage_output_tokens: int | None = None  # completion_tokens from the final usage chunk
    usage_prompt_tokens: int | None = None
    success: bool = False
    error: str = ""
    generated_text: str = ""

    @property
    def output_tokens(self) -> int:
        # The usage chunk is authoritative: one SSE chunk may carry several tokens.
        return self.usage_output_tokens if self.usage_output_tokens is not None else len(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start if self.chunk_times else 0.0

    @property
    def latency(self) -> float:
        return self.chunk_times[-1] - self.start if self.chunk_times else 0.0

    @property
    def itl(self) -> list[float]:
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]


def percentile(values: Sequence[float], p: float) -> float:
    """numpy's linear percentile (vLLM's too); 0 for an empty list."""
    return float(np.percentile(values, p)) if len(values) else 0.0


def summarize(values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """mean, median, population std and percentiles; 0 for an empty list (as vLLM's ``x or 0``)."""
    if not len(values):
        return {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{pct_word(p)}": 0.0 for p in percentiles}}
    arr = np.asarray(values, dtype=np.float64)
    out = {"mean": float(arr.mean()), "median": float(np.median(arr)), "std": float(arr.std())}
    for p, v in zip(percentiles, np.percentile(arr, list(percentiles)) if percentiles else [], strict=True):
        out[f"p{pct_word(p)}"] = float(v)
    return out


def pct_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def wall_window(traces: Sequence[RequestTrace]) -> tuple[float, float]:
    """(first send, last receive) over every request that was sent, failed ones included:
    the run occupied the server for that whole window."""
    sent = [t for t in traces if t.start > 0.0]
    if not sent:
        return 0.0, 0.0
    first = min(t.start for t in sent)
    last = max(max(t.end, t.chunk_times[-1] if t.chunk_times else 0.0, t.start) for t in sent)
    return first, last


def peak_rates(ok: Sequence[RequestTrace]) -> tuple[float, int]:
    """vLLM's extras: most output tokens in any one-second bucket, and peak concurrency."""
    if not ok:
        return 0.0, 0
    t0 = min(t.start for t in ok)
    buckets: dict[int, int] = {}
    for t in ok:
        for ct in t.chunk_times:
            b = int(ct - t0)
            buckets[b] = buckets.get(b, 0) + 1
    events = sorted([(t.start, 1) for t in ok] + [(t.start + t.latency, -1) for t in ok])
    cur = peak = 0
    for _, d in events:  # departures sort before arrivals at equal times: half-open intervals
        cur += d
        peak = max(peak, cur)
    return float(max(buckets.values(), default=0)), peak


def compute_metrics(
    traces: Sequence[RequestTrace], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict:
    """The result dictionary with vLLM's keys (durations in seconds, latencies in ms)."""
    ok = [t for t in traces if t.success]
    first, last = wall_window(traces)
    duration = last - first
    total_input = sum(t.prompt_len for t in ok)
    output_lens = [t.output_tokens if t.success else 0 for t in traces]
    total_output = sum(output_lens)
    ttfts = [t.ttft for t in ok]
    tpots = [(t.latency - t.ttft) / (t.output_tokens - 1) for t in ok if t.output_tokens > 1]
    itls = [g for t in ok for g in t.itl]
    e2els = [t.latency for t in ok]

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    max_tok_s, max_conc = peak_rates(ok)
    result: dict = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(traces) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(ok)),
        "request_goodput": None,
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
        "max_output_tokens_per_s": max_tok_s,
        "max_concurrent_requests": max_conc,
    }
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        for stat, v in summarize(vals, percentiles).items():
            result[f"{stat}_{name}_ms"] = v * 1000.0
    result.update(
        {
            "input_lens": [t.prompt_len for t in traces],
            "output_lens": output_lens,
            "ttfts": [t.ttft for t in traces],
            "itls": [t.itl for t in traces],
            "latencies": [t.latency for t in traces],
            # Relative to the first send: absolute perf_counter values mean nothing elsewhere.
            "start_times": [t.start - first if t.start > 0 else None for t in traces],
            "generated_texts": [t.generated_text for t in traces],
            "errors": [t.error for t in traces],
            # The server's own counts from the usage chunk (None where it sent none), for cross-checks.
            "usage_input_lens": [t.usage_prompt_tokens for t in traces],
            "usage_chunk_mismatches": sum(
                1
                for t in ok
                if t.usage_output_tokens is not None and t.usage_output_tokens != len(t.chunk_times)
            ),
            "output_len_mismatches": sum(1 for t in ok if t.output_tokens != t.expected_output_len),
        }
    )
    return result


STAGE_FAMILY = "deltaserve_first_token_stage_seconds"
TTFT_FAMILY = "deltaserve_time_to_first_token_seconds"


def first_token_sums(text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the server's TTFT histogram (key ``"ttft"``) and of each stage of its
    first-token stage histogram, from /metrics text; empty for a server without them (vLLM)."""
    sums: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for fam, key in ((STAGE_FAMILY, sample.labels.get("stage")), (TTFT_FAMILY, "ttft")):
                if key is None or not sample.name.startswith(fam + "_"):
                    continue
                slot = sums.setdefault(key, [0.0, 0.0])
                if sample.name == fam + "_sum":
                    slot[0] += sample.value
                elif sample.name == fam + "_count":
                    slot[1] += sample.value
    return {k: (v[0], v[1]) for k, v in sums.items()}


def first_token_stages_ms(before: str | None, after: str | None) -> dict[str, float] | None:
    """Mean server-side TTFT and mean of each first-token stage, in ms, over the requests that got
    their first token between two /metrics scrapes; None when either scrape or the histograms are
    missing or no first token came in between."""
    if before is None or after is None:
        return None
    a, b = first_token_sums(before), first_token_sums(after)
    out: dict[str, float] = {}
    for key, (s1, n1) in b.items():
        s0, n0 = a.get(key, (0.0, 0.0))
        if n1 > n0:
            out[key] = 1000.0 * (s1 - s0) / (n1 - n0)
    return out if "ttft" in out and len(out) > 1 else None


def parse_prometheus(text: str) -> tuple[int | None, str | None]:
    """(deltaserve_peak_device_memory_bytes, deltaserve_device_info name) from /metrics text, through
    prometheus_client's own parser. The peak gauge may carry labels (one per device): the largest
    value is reported."""
    peak: float | None = None
    name: str | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "deltaserve_peak_device_memory_bytes":
                peak = sample.value if peak is None else max(peak, sample.value)
            elif sample.name == "deltaserve_device_info" and name is None and "name" in sample.labels:
                name = sample.labels["name"]
    return (int(peak) if peak is not None else None), name

"""The HTTP + SSE client: replays pretokenized requests against POST /v1/completions."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import httpx

from . import __version__
from .metrics import (
    DEFAULT_PERCENTILES,
    RequestTrace,
    compute_metrics,
    first_token_stages_ms,
    parse_prometheus,
)
from .progress import ProgressBar


class SSEParser:
    """Incremental Server-Sent Events parser: feed bytes, get complete events' data payloads.

    Handles \\n, \\r\\n and \\r line ends, comment lines, multi-line ``data:`` fields and events
    split across network reads."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        events: list[str] = []
        while True:
            cut = _line_end(self._buf)
            if cut is None:
                return events
            line, self._buf = self._buf[: cut[0]], self._buf[cut[1] :]
            if not line:  # blank line: dispatch the event
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            text = line.decode("utf-8")
            if text.startswith(":"):
                continue
            name, _, value = text.partition(":")
            if name == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)

    def flush(self) -> list[str]:
        """Events left when the stream closes without a final blank line."""
        return self.feed(b"\n\n") if self._buf or self._data else []


def _line_end(buf: bytes) -> tuple[int, int] | None:
    for i, b in enumerate(buf):
        if b == 0x0A:
            return i, i + 1
        if b == 0x0D:
            if i + 1 == len(buf):
                return None  # might be the first half of \r\n: wait for more bytes
            return (i, i + 2) if buf[i + 1] == 0x0A else (i, i + 1)
    return None


@dataclass
class RunConfig:
    base_url: str
    model: str | None = None
    concurrency: int | None = None  # closed loop when set (and rate is inf)
    request_rate: float = float("inf")
    burstiness: float = 1.0
    seed: int = 0
    num_warmups: int = 0
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    ignore_eos: bool = True
    api_key: str | None = None
    request_timeout: float = 600.0
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    progress: bool = True
    extra_body: dict = field(default_factory=dict)


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Send offsets in seconds: gamma intervals (Poisson when burstiness is 1), seeded, then scaled
    so the last arrival lands at n / rate, as vLLM does to steady throughput across seeds."""
    if rate == float("inf"):
        return [0.0] * n
    if burstiness <= 0:
        raise ValueError("--burstiness must be positive")
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(burstiness, theta)
        out.append(t)
    if out and out[-1] > 0:
        scale = (n / rate) / out[-1]
        out = [x * scale for x in out]
    return out


def build_body(cfg: RunConfig, model: str, rec: dict) -> dict:
    body: dict = {
        "model": model,
        "prompt": rec["prompt_token_ids"],
        "max_tokens": rec["output_len"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": cfg.ignore_eos,
        "temperature": cfg.temperature,
    }
    if cfg.top_p is not None:
        body["top_p"] = cfg.top_p
    if cfg.top_k is not None:
        body["top_k"] = cfg.top_k
    body.update(cfg.extra_body)
    return body


def _headers(cfg: RunConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


async def send_one(client: httpx.AsyncClient, cfg: RunConfig, model: str, rec: dict) -> RequestTrace:
    """One streamed completion, timed with perf_counter at every network read."""
    trace = RequestTrace(prompt_len=len(rec["prompt_token_ids"]), expected_output_len=rec["output_len"])
    url = cfg.base_url.rstrip("/") + "/v1/completions"
    parser, done = SSEParser(), False
    text: list[str] = []
    trace.start = time.perf_counter()
    try:
        async with client.stream("POST", url, json=build_body(cfg, model, rec), headers=_headers(cfg)) as r:
            if r.status_code != 200:
                body = (await r.aread()).decode("utf-8", "replace")
                trace.end = time.perf_counter()
                trace.error = f"HTTP {r.status_code}: {body[:500]}"
                return trace
            async for chunk in r.aiter_raw():
                now = time.perf_counter()
                trace.end = now
                for data in parser.feed(chunk):
                    done = _handle_event(trace, data, now, text) or done
                if trace.error:
                    return trace
            for data in parser.flush():
                done = _handle_event(trace, data, time.perf_counter(), text) or done
    except (httpx.HTTPError, OSError, UnicodeDecodeError) as e:
        trace.end = time.perf_counter()
        trace.error = f"{type(e).__name__}: {e}"
        return trace
    trace.generated_text = "".join(text)
    if trace.error:
        return trace
    if not trace.chunk_times:
        trace.error = "stream ended without any token chunk"
    elif not done:
        trace.error = "stream ended before data: [DONE]"
    else:
        trace.success = True
    return trace


def _handle_event(trace: RequestTrace, data: str, now: float, text: list[str]) -> bool:
    """Apply one SSE event to the trace; True when it is the [DONE] sentinel."""
    if data.strip() == "[DONE]":
        return True
    try:
        msg = json.loads(data)
    except json.JSONDecodeError:
        trace.error = f"invalid JSON in stream: {data[:200]!r}"
        return False
    if isinstance(msg, dict) and "error" in msg:
        err = msg["error"]
        trace.error = "server error: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
        return False
    if msg.get("choices"):
        # Every chunk that carries a choice is one token arrival, as vLLM counts it.
        trace.chunk_times.append(now)
        text.append(msg["choices"][0].get("text") or "")
    usage = msg.get("usage")
    if usage:
        trace.usage_output_tokens = usage.get("completion_tokens")
        trace.usage_prompt_tokens = usage.get("prompt_tokens")
    return False


async def fetch_model(client: httpx.AsyncClient, cfg: RunConfig) -> str:
    """--model, else the first id from /v1/models, as vLLM's client does."""
    if cfg.model:
        return cfg.model
    r = await client.get(cfg.base_url.rstrip("/") + "/v1/models", headers=_headers(cfg))
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise RuntimeError(f"{cfg.base_url}/v1/models lists no model: pass --model")
    return data[0]["id"]


async def fetch_metrics_text(client: httpx.AsyncClient, cfg: RunConfig) -> str | None:
    """The server's /metrics text, or None (no such route, an error, unreachable)."""
    try:
        r = await client.get(cfg.base_url.rstrip("/") + "/metrics", headers=_headers(cfg))
        return r.text if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


async def _replay(client, cfg: RunConfig, model: str, records: list[dict], label: str) -> list[RequestTrace]:
    """Closed loop when concurrency is set and the rate is inf (the first N go out as one wave,
    then one starts as one finishes); open loop at the seeded arrival times otherwise."""
    sem = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency else None
    bar = ProgressBar(len(records), label=label, enabled=cfg.progress)
    offsets = arrival_offsets(len(records), cfg.request_rate, cfg.burstiness, cfg.seed)

    async def one(rec: dict) -> RequestTrace:
        if sem is None:
            trace = await send_one(client, cfg, model, rec)
        else:
            async with sem:
                trace = await send_one(client, cfg, model, rec)
        bar.update(failed=not trace.success)
        return trace

    tasks: list[asyncio.Task] = []
    t0 = time.perf_counter()
    for rec, off in zip(records, offsets, strict=True):
        delay = t0 + off - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(rec)))
    traces = list(await asyncio.gather(*tasks))
    bar.close()
    return traces


async def run_benchmark(cfg: RunConfig, records: list[dict]) -> dict:
    """Warm up, run, and return vLLM-keyed metrics plus server memory, GPU, commit and flags."""
    n_conn = cfg.concurrency or len(records)
    limits = httpx.Limits(max_connections=n_conn, max_keepalive_connections=n_conn)
    # The read timeout bounds the gap between chunks; pool waits are unbounded because in an open
    # loop requests may queue for a connection by design.
    timeout = httpx.Timeout(cfg.request_timeout, connect=30.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model = await fetch_model(client, cfg)
        if cfg.num_warmups > 0:
            warm = [records[i % len(records)] for i in range(cfg.num_warmups)]
            wcfg = replace(cfg, request_rate=float("inf"))
            await _replay(client, wcfg, model, warm, label="warmup")
        before = await fetch_metrics_text(client, cfg)
        traces = await _replay(client, cfg, model, records, label="bench")
        after = await fetch_metrics_text(client, cfg)
    peak_mem, gpu = parse_prometheus(after) if after is not None else (None, None)
    result = compute_metrics(traces, cfg.percentiles)
    result.update(
        {
            "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
            "backend": "openai",
            "base_url": cfg.base_url,
            "model_id": model,
            "num_prompts": len(records),
            "request_rate": cfg.request_rate if cfg.request_rate != float("inf") else "inf",
            "burstiness": cfg.burstiness,
            "max_concurrency": cfg.concurrency,
            "num_warmups": cfg.num_warmups,
            "server_peak_memory_bytes": peak_mem,
            # the server's own TTFT and its stages (deltaserve /metrics), mean ms over this run
            "server_first_token_stages_ms": first_token_stages_ms(before, after),
            "gpu_name": gpu,
            "git_commit": git_commit(),
            "loadgen_version": __version__,
            "percentiles": list(cfg.percentiles),
        }
    )
    return result


def git_commit() -> str | None:
    """The commit of the checkout loadgen runs from (read-only); $DELTASERVE_GIT_COMMIT where the tree
    travels without .git (offline GPU hosts); else None."""
    if os.environ.get("DELTASERVE_GIT_COMMIT"):
        return os.environ["DELTASERVE_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None

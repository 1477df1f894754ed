"""Prometheus metrics on a per-app registry (two apps in one test process must not share counters).

Request-level metrics (TTFT, ITL, E2E, tokens) are observed by the routes; engine-level metrics are
read from ``llm.stats`` (the latest StepStats) by a poller and on every output a route receives, and
de-duplicated by step number, so per-step metrics such as the admitted-requests histogram see nearly
every step even though AsyncLLM only keeps the latest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_ADMIT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_STAGE_BUCKETS = (1e-4, 3e-4, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5.0, 30.0)
# Where a first token's time goes, in order (deltaserve_first_token_stage_seconds); the stages add
# up to deltaserve_time_to_first_token_seconds.
FIRST_TOKEN_STAGES = (
    "parse",  # the request's arrival at the app -> the route's start (body, validation, tokenization)
    "submit",  # -> the request registered in AsyncLLM
    "to_engine",  # -> its wave decoded by the engine's input thread (event-loop turn, msgpack, ZMQ)
    "queue",  # -> first scheduled (waiting for the engine loop, KV, slots, the batch budget)
    "prefill",  # -> the first token read back on the engine (every prefill chunk, the sampler)
    "from_engine",  # -> the outputs handled in the API process (output thread, ZMQ, decode, detokenize)
    "to_route",  # -> the route's stream sees the token (the event loop hands it over)
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self, model_name: str, device_name: str = "unknown") -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        label = ["model_name"]
        self.model_name = model_name
        self.ttft = Histogram(
            "deltaserve_time_to_first_token_seconds", "Time to first token.", label,
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "deltaserve_inter_token_latency_seconds", "Time between output chunks of one request.", label,
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "deltaserve_e2e_request_latency_seconds", "Request latency, arrival to last token.", label,
            buckets=_E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.stage = Histogram(
            "deltaserve_first_token_stage_seconds", "Time to first token by stage (they add up to it).",
            [*label, "stage"], buckets=_STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.running = Gauge("deltaserve_num_requests_running", "Requests running in the engine.", registry=r)
        self.waiting = Gauge("deltaserve_num_requests_waiting", "Requests waiting in the engine.", registry=r)
        self.kv_used = Gauge("deltaserve_kv_blocks_used", "Paged-KV blocks in use.", registry=r)
        self.kv_total = Gauge("deltaserve_kv_blocks_total", "Paged-KV blocks in the pool.", registry=r)
        self.slots_used = Gauge("deltaserve_state_slots_used", "GDN state slots in use.", registry=r)
        self.slots_total = Gauge("deltaserve_state_slots_total", "GDN state slots in the pool.", registry=r)
        self.mem_used = Gauge("deltaserve_device_memory_used_bytes", "Device memory in use.", registry=r)
        self.mem_peak = Gauge("deltaserve_peak_device_memory_bytes", "Peak device memory.", registry=r)
        self.state_pool = Gauge(
            "deltaserve_state_pool_bytes",
            "Device memory the GDN state pools hold now (on demand: grows with the most requests at once).",
            registry=r,
        )
        self.device_info = Gauge("deltaserve_device_info", "Device the engine runs on.", ["name"], registry=r)
        self.device_info.labels(name=device_name).set(1)
        self.memory_split = Gauge(
            "deltaserve_device_memory_split_bytes",
            "Device memory at start-up by part (weights, kv_cache, state_pool, cuda_graphs, workspace, "
            "non_torch, free, total, activation_peak, state_pool_full); the first six add up to what is "
            "in use.",
            ["part"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("deltaserve_prompt_tokens", "Prompt tokens processed.", registry=r)
        self.gen_tokens = Counter("deltaserve_generation_tokens", "Tokens generated.", registry=r)
        self.requests = Counter(
            "deltaserve_requests", "Finished requests by finish reason.", ["finish_reason"], registry=r
        )
        self.steps = Counter("deltaserve_engine_steps", "Engine steps completed.", registry=r)
        self.preempted = Gauge(
            "deltaserve_num_preempted", "Preemptions reported by the last step.", registry=r
        )
        self.step_admitted = Histogram(
            "deltaserve_step_admitted_requests", "Requests first scheduled per engine step.",
            buckets=_ADMIT_BUCKETS, registry=r,
        )  # fmt: skip
        self.max_wave = Gauge(
            "deltaserve_max_wave_admitted",
            "Largest number of requests first scheduled in one step.",
            registry=r,
        )
        self.throughput = Gauge(
            "deltaserve_generation_tokens_per_second", "Generated tokens per second over the last 10 s.",
            registry=r,
        )  # fmt: skip
        self._last_step = -1
        self._steps_counted = 0
        self._max_wave = 0
        self._gen_window: deque[tuple[float, float]] = deque()
        self._gen_total = 0.0

    # Engine-level --------------------------------------------------------------------------------

    def sample(self, llm: Any) -> None:
        """Fold the engine's latest StepStats in; cheap, and a no-op when the step was already seen.

        ``llm.stats`` is AsyncLLM's EngineStats (``latest`` StepStats, ``total_steps``,
        ``recent_admitted``: admitted counts of the recent steps that admitted any); a bare StepStats
        is accepted too.
        """
        engine = getattr(llm, "stats", None)
        stats = getattr(engine, "latest", engine)
        step = getattr(stats, "step", None)
        total = getattr(engine, "total_steps", None)
        recent = getattr(engine, "recent_admitted", None)
        if recent:
            # Every admitting step the poller missed is still in this window.
            self._max_wave = max(self._max_wave, max(recent))
            self.max_wave.set(self._max_wave)
        if stats is None or not isinstance(step, int) or step == self._last_step:
            return
        done = total if isinstance(total, int) else step
        if done > self._steps_counted:
            self.steps.inc(done - self._steps_counted)
            self._steps_counted = done
        self._last_step = step
        admitted = int(getattr(stats, "admitted", 0) or 0)
        self.step_admitted.observe(admitted)
        self._max_wave = max(self._max_wave, admitted)
        self.max_wave.set(self._max_wave)
        self.set_gauges(stats)

    def set_memory_split(self, split: dict[str, int]) -> None:
        for part, value in split.items():
            self.memory_split.labels(part=part).set(value)

    def set_gauges(self, stats: Any) -> None:
        """Pool and queue gauges from a StepStats, or the dict the engine's "stats" utility returns."""
        for gauge, name in (
            (self.running, "num_running"),
            (self.waiting, "num_waiting"),
            (self.kv_used, "kv_blocks_used"),
            (self.kv_total, "kv_blocks_total"),
            (self.slots_used, "slots_used"),
            (self.slots_total, "slots_total"),
            (self.mem_used, "device_memory_used"),
            (self.mem_peak, "device_memory_peak"),
            (self.state_pool, "state_pool_bytes"),
            (self.preempted, "num_preemptions"),
        ):
            value = stats.get(name) if isinstance(stats, dict) else getattr(stats, name, None)
            if isinstance(value, int | float):
                gauge.set(value)

    async def poll(self, llm: Any, interval_s: float = 0.005) -> None:
        """Background task for the app's lifetime."""
        while True:
            with contextlib.suppress(Exception):
                self.sample(llm)
            await asyncio.sleep(interval_s)

    # Request-level -------------------------------------------------------------------------------

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model_name).observe(seconds)

    def observe_stages(self, marks: tuple[float, ...]) -> None:
        """The hops of one first token, consecutive differences of ``marks`` (see FIRST_TOKEN_STAGES);
        they add up to the TTFT observed with them. Clamped at 0: the marks come from two processes."""
        for stage, a, b in zip(FIRST_TOKEN_STAGES, marks[:-1], marks[1:], strict=True):
            self.stage.labels(self.model_name, stage).observe(max(0.0, b - a))

    def observe_itl(self, seconds: float) -> None:
        self.itl.labels(self.model_name).observe(seconds)

    def observe_finished(self, finish_reason: str | None, prompt_tokens: int, output_tokens: int, e2e: float):
        self.requests.labels(finish_reason=finish_reason or "abort").inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.gen_tokens.inc(output_tokens)
        self.e2e.labels(self.model_name).observe(e2e)
        now = time.monotonic()
        self._gen_total += output_tokens
        self._gen_window.append((now, self._gen_total))
        self._update_throughput(now)

    def _update_throughput(self, now: float) -> None:
        while self._gen_window and now - self._gen_window[0][0] > 10.0:
            self._gen_window.popleft()
        if len(self._gen_window) >= 2:
            (t0, g0), (t1, g1) = self._gen_window[0], self._gen_window[-1]
            self.throughput.set((g1 - g0) / max(t1 - t0, 1e-3))
        elif not self._gen_window:
            self.throughput.set(0.0)

    async def render(self, llm: Any) -> bytes:
        self.sample(llm)
        # The latest step's stats go stale once the engine idles (an abort after the last step is not
        # in them), so a scrape asks the engine for its current pools when it can.
        call = getattr(llm, "call_utility", None)
        if call is not None:
            with contextlib.suppress(Exception):
                self.set_gauges(await call("stats", timeout_s=1.0))
        self._update_throughput(time.monotonic())
        return generate_latest(self.registry)


class RequestTimer:
    """Per-request latency bookkeeping for one choice stream (TTFT once, ITL between outputs)."""

    __slots__ = ("metrics", "start", "route_start", "last", "first_seen")

    def __init__(self, metrics: Metrics, start: float, route_start: float | None = None) -> None:
        """``start``: the request's arrival at the app, where TTFT and E2E count from; ``route_start``:
        where the route began its work (after the body was parsed and the prompts tokenized)."""
        self.metrics = metrics
        self.start = start
        self.route_start = start if route_start is None else route_start
        self.last = start
        self.first_seen = False

    def on_output(self, num_new_tokens: int, out: Any = None) -> None:
        """``out`` (a RequestOutput) lends the first token's hops to the stage histogram."""
        if num_new_tokens <= 0:
            return
        now = time.monotonic()
        if not self.first_seen:
            self.first_seen = True
            self.metrics.observe_first_token(now - self.start)
            timings = getattr(out, "engine_timings", None)
            if timings is not None and len(timings) == 3 and out.first_token_time is not None:
                self.metrics.observe_stages(
                    (self.start, self.route_start, out.arrival_time, *timings, out.first_token_time, now)
                )
        else:
            self.metrics.observe_itl(now - self.last)
        self.last = now

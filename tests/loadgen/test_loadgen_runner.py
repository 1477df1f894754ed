"""The HTTP + SSE client against a real local HTTP server streaming OpenAI-format chunks.

The peer is a small Starlette app under uvicorn on 127.0.0.1: a stand-in for deltaserve (built in
parallel) that exercises parsing and timing over real sockets; test_e2e_server.py uses the real one.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from loadgen.__main__ import main
from loadgen.runner import RunConfig, SSEParser, build_body, run_benchmark
from tests.procs import free_port

FIRST_DELAY = 0.05  # server-side sleep before the first token
TOKEN_DELAY = 0.02  # and between tokens
METRICS = (
    "# TYPE deltaserve_peak_device_memory_bytes gauge\n"
    "deltaserve_peak_device_memory_bytes 123456789\n"
    'deltaserve_device_info{name="Fake GPU 9000"} 1\n'
)


class FakeServer:
    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.bodies: list[dict] = []
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.usage: list[int] = []
        self.app = Starlette(
            routes=[
                Route("/health", lambda r: PlainTextResponse("ok")),
                Route("/metrics", lambda r: PlainTextResponse(METRICS)),
                Route("/v1/models", lambda r: JSONResponse({"data": [{"id": "fake-model", "root": "x"}]})),
                Route("/v1/completions", self.completions, methods=["POST"]),
            ]
        )

    async def completions(self, request: Request):
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse(
                {"error": {"message": "bad key", "type": "auth", "code": 401}}, status_code=401
            )
        body = await request.json()
        self.arrivals.append(time.perf_counter())
        self.bodies.append(body)
        prompt, n = body["prompt"], body["max_tokens"]
        if prompt[0] == 999:
            return JSONResponse({"error": {"message": "prompt rejected", "type": "invalid"}}, status_code=400)

        async def gen() -> Iterator[bytes]:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(FIRST_DELAY)
                for i in range(n):
                    if prompt[0] == 998 and i == 2:
                        yield b'data: {"error": {"message": "engine died"}}\n\n'
                        return
                    chunk = {"id": "c", "object": "text_completion", "model": body["model"]}
                    chunk["choices"] = [
                        {"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n - 1 else None}
                    ]
                    end = b"\r\n\r\n" if i % 2 else b"\n\n"  # both line-end styles must parse
                    yield b"data: " + json.dumps(chunk).encode() + end
                    if i < n - 1:
                        await asyncio.sleep(TOKEN_DELAY)
                usage = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": n,
                    "total_tokens": len(prompt) + n,
                }
                self.usage.append(n)
                yield b": keep-alive comment\n\n"
                yield b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                self.in_flight -= 1

        return StreamingResponse(gen(), media_type="text/event-stream")


@pytest.fixture
def fake_server(request: pytest.FixtureRequest):
    fake = FakeServer(api_key=getattr(request, "param", None))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(fake.app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    fake.base_url = f"http://127.0.0.1:{port}"
    yield fake
    server.should_exit = True
    th.join(timeout=10)


def _records(n: int, out: int = 6, first: int = 5) -> list[dict]:
    return [{"id": str(i), "prompt_token_ids": [first, 1, 2, 3], "output_len": out} for i in range(n)]


def test_sse_parser_byte_by_byte() -> None:
    raw = b": c\r\ndata: a\r\n\r\ndata: b1\ndata:b2\n\nevent: x\rdata: c\r\r"
    p = SSEParser()
    got = [e for i in range(len(raw)) for e in p.feed(raw[i : i + 1])] + p.flush()
    assert got == ["a", "b1\nb2", "c"]
    p2 = SSEParser()
    assert p2.feed(b"data: tail") == [] and p2.flush() == ["tail"]


async def test_closed_loop_timing_and_counts(fake_server: FakeServer) -> None:
    cfg = RunConfig(base_url=fake_server.base_url, concurrency=4, num_warmups=2, progress=False)
    r = await run_benchmark(cfg, _records(12))
    assert (r["completed"], r["failed"]) == (12, 0)
    assert len(fake_server.bodies) == 14  # warm-ups reached the server but are not counted
    assert fake_server.max_in_flight == 4
    assert r["total_output_tokens"] == 72 and r["output_lens"] == [6] * 12
    assert r["usage_chunk_mismatches"] == 0 and r["output_len_mismatches"] == 0
    body = fake_server.bodies[-1]
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0 and body["max_tokens"] == 6
    # The first wave goes out together: 4 requests (after warm-up) within a few ms of each other.
    wave = fake_server.arrivals[2:6]
    assert max(wave) - min(wave) < 0.05
    # Client timing reflects the server's pacing (loopback adds little).
    assert FIRST_DELAY <= r["median_ttft_ms"] / 1000 < FIRST_DELAY + 0.1
    assert TOKEN_DELAY <= r["median_itl_ms"] / 1000 < TOKEN_DELAY + 0.03
    assert TOKEN_DELAY <= r["median_tpot_ms"] / 1000 < TOKEN_DELAY + 0.03
    assert all(len(x) == 5 for x in r["itls"])
    # 3 waves of ~0.15 s each: the window is the wall time, not the sum of latencies.
    assert 3 * (FIRST_DELAY + 5 * TOKEN_DELAY) <= r["duration"] < 3 * (FIRST_DELAY + 5 * TOKEN_DELAY) + 0.4
    assert r["server_peak_memory_bytes"] == 123456789 and r["gpu_name"] == "Fake GPU 9000"
    assert r["generated_texts"][0] == "".join(f" t{i}" for i in range(6))


async def test_failures_counted_and_excluded(fake_server: FakeServer) -> None:
    recs = _records(4) + _records(1, first=999) + _records(1, first=998)
    r = await run_benchmark(RunConfig(base_url=fake_server.base_url, concurrency=3, progress=False), recs)
    assert (r["completed"], r["failed"]) == (4, 2)
    assert r["errors"][4].startswith("HTTP 400") and "prompt rejected" in r["errors"][4]
    assert r["errors"][5] == "server error: engine died"
    assert r["total_input_tokens"] == 16 and r["total_output_tokens"] == 24


async def test_open_loop_rate(fake_server: FakeServer) -> None:
    cfg = RunConfig(base_url=fake_server.base_url, request_rate=20.0, seed=1, progress=False)
    r = await run_benchmark(cfg, _records(8, out=2))
    assert r["completed"] == 8
    sends = fake_server.arrivals
    assert sends[-1] - sends[0] > 0.2  # spread over ~0.4 s, not one burst


@pytest.mark.parametrize("fake_server", ["s3cret"], indirect=True)
async def test_api_key(fake_server: FakeServer) -> None:
    bad = await run_benchmark(
        RunConfig(base_url=fake_server.base_url, model="m", progress=False), _records(2)
    )
    assert bad["failed"] == 2 and bad["errors"][0].startswith("HTTP 401")
    cfg = RunConfig(base_url=fake_server.base_url, model="m", api_key="s3cret", progress=False)
    good = await run_benchmark(cfg, _records(2))
    assert good["completed"] == 2


def test_cli_run_writes_result_json(fake_server: FakeServer, tmp_path: Path) -> None:
    data = tmp_path / "req.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in _records(5)))
    out = tmp_path / "res.json"
    rc = main(
        ["run", "--base-url", fake_server.base_url, "--dataset", str(data), "--concurrency", "2"]
        + ["--result-file", str(out), "--no-progress", "--api-key", "k"]
    )
    assert rc == 0
    r = json.loads(out.read_text())
    for key in (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p90_itl_ms",
        "p99_e2el_ms",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "errors",
        "duration",
        "server_peak_memory_bytes",
        "git_commit",
        "flags",
        "gpu_name",
    ):
        assert key in r, key
    assert r["flags"]["api_key"] == "<redacted>" and r["flags"]["concurrency"] == 2
    md = tmp_path / "rep.md"
    assert main(["report", str(out), "-o", str(md)]) == 0
    assert "request_throughput" in md.read_text()


def test_ab_with_urls(fake_server: FakeServer, tmp_path: Path) -> None:
    from loadgen.ab import run_ab

    cfg = RunConfig(base_url=fake_server.base_url, concurrency=2, progress=False)
    s = run_ab(
        cfg, _records(4, out=3), tmp_path, pairs=1, a_url=fake_server.base_url, b_url=fake_server.base_url
    )
    assert s["order"] == ["A", "B", "A", "A"]
    assert sorted(p.name for p in tmp_path.glob("run-*.json")) == [
        "run-00-A.json",
        "run-01-B.json",
        "run-02-A.json",
        "run-03-A.json",
    ]
    assert s["ratios"]["output_throughput"]["median"] > 0
    # persistent servers: their peak memory only grows, so it is not compared
    assert "server_peak_memory_bytes" not in s["ratios"]
    assert s["not_compared"] == {"server_peak_memory_bytes": "servers persist across runs"}
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert saved["pairs"] == 1
    # each run's absolute figures are in ab.json too, equal to its own result file
    assert list(saved["per_run"]) == [p.removesuffix(".json") for p in saved["runs"]]
    for name, figures in saved["per_run"].items():
        run = json.loads((tmp_path / f"{name}.json").read_text())
        assert figures["duration"] == run["duration"] > 0
        assert figures["mean_ttft_ms"] == run["mean_ttft_ms"] and figures["completed"] == 4


FAKE_SERVER_SCRIPT = """
import json, sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

ARM = sys.argv[2]

async def completions(request):
    body = await request.json()
    n = body["max_tokens"]
    async def gen():
        for i in range(n):
            yield ("data: " + json.dumps({"choices": [{"index": 0, "text": ARM}]}) + "\\n\\n").encode()
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
        yield ("data: " + json.dumps({"choices": [], "usage": usage}) + "\\n\\ndata: [DONE]\\n\\n").encode()
    return StreamingResponse(gen(), media_type="text/event-stream")

app = Starlette(routes=[
    Route("/health", lambda r: PlainTextResponse("ok")),
    Route("/v1/models", lambda r: JSONResponse({"data": [{"id": "m"}]})),
    Route("/v1/completions", completions, methods=["POST"]),
])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def test_ab_starts_and_stops_server_commands(tmp_path: Path) -> None:
    """--a-cmd/--b-cmd: each run gets a fresh server on the same port, started and stopped by loadgen."""
    import sys

    from loadgen.ab import run_ab

    script = tmp_path / "srv.py"
    script.write_text(FAKE_SERVER_SCRIPT)
    port = free_port()
    cmd = f"{sys.executable} {script} {port}"
    cfg = RunConfig(base_url=f"http://127.0.0.1:{port}", concurrency=2, progress=False)
    out = tmp_path / "ab"
    run_ab(cfg, _records(3, out=2), out, pairs=1, a_cmd=cmd + " A", b_cmd=cmd + " B", startup_timeout=60)
    texts = {p.name: json.loads(p.read_text())["generated_texts"][0] for p in out.glob("run-*.json")}
    assert texts == {
        "run-00-A.json": "AA",
        "run-01-B.json": "BB",
        "run-02-A.json": "AA",
        "run-03-A.json": "AA",
    }
    assert len(list(out.glob("server-*.log"))) == 4
    with socket.socket() as s:  # the last server is gone: its port is free to listen on again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not a listener
        s.bind(("127.0.0.1", port))


def test_extra_body_flag_reaches_every_request() -> None:
    from loadgen.__main__ import _client_config, build_parser

    argv = ["run", "--dataset-name", "random", "--extra-body", '{"echo": true, "logprobs": 1}']
    cfg = _client_config(build_parser().parse_args(argv), "http://127.0.0.1:1")
    body = build_body(cfg, "m", {"prompt_token_ids": [1, 2], "output_len": 1})
    assert body["echo"] is True and body["logprobs"] == 1 and body["max_tokens"] == 1
    for bad in ("[1]", "{echo"):
        args = build_parser().parse_args([*argv[:-1], bad])
        with pytest.raises(SystemExit, match="--extra-body"):
            _client_config(args, "http://127.0.0.1:1")

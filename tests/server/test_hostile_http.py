"""Issue 13 through the real HTTP server (small pool): hostile input gets a 400 naming the field (or a
correct 200), never a 500; the keep-alive connection survives so a request pipelined behind the bad
one is answered; a concurrent greedy request is unaffected and the pools are empty afterwards. Plus
the HTTP framing cases: CL+TE smuggling, an oversized head, no redirect built from Host."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.realserver import SMALL_POOL, RawConn, Server, request_bytes

pytestmark = pytest.mark.slow
GREEDY = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
LONE = "\ud800"


def _chat(content: Any, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, **kw}


_TOOL = {"type": "function", "function": {"name": "f", "description": "x" + LONE, "parameters": {}}}
_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "' + LONE + '"}'}}

# (path, body, status, the field the error must name)
BAD: list[tuple[str, Any, int, str | None]] = [
    ("/v1/completions", {"prompt": LONE, "max_tokens": 2}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["ok", "a\udfffb"], "max_tokens": 2}, 400, "prompt[1]"),
    ("/v1/completions", {"prompt": "ok", "stop": ["\udc00"], "max_tokens": 2}, 400, "stop"),
    ("/v1/chat/completions", _chat("hi " + LONE), 400, "messages[0].content"),
    ("/v1/chat/completions", _chat([{"type": "text", "text": LONE}]), 400, "messages[0].content[0].text"),
    ("/v1/chat/completions", _chat("hi", tools=[_TOOL]), 400, "tools[0].function.description"),
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "assistant", "content": None, "tool_calls": [_CALL]},
                {"role": "user", "content": "x"},
            ]
        },
        400,
        "messages[0].tool_calls[0].function.arguments",
    ),
    ("/tokenize", {"prompt": LONE}, 400, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": LONE}]}, 400, "messages[0].content"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "logit_bias": {"\u00b2": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "logit_bias": {"\u0663": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": "3"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "n": True}, 400, "n"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "seed": True}, 400, "seed"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "logprobs": True}, 400, "logprobs"),
    ("/v1/completions", {"prompt": [1, True, 2], "max_tokens": 2}, 400, "prompt"),
    ("/v1/chat/completions", _chat("hi", max_completion_tokens=True), 400, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "temperature": True}, 400, "temperature"),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "stream": "true"}, 400, "stream"),
    # 16 prompts x n=16 can never be admitted by a pool of 4 running + 8 waiting: 400, not 503.
    ("/v1/completions", {"prompt": ["p"] * 16, "n": 16, "max_tokens": 1}, 400, "n"),
]
GOOD: list[tuple[str, Any]] = [
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "max_tokens": 2,
        },
    ),
    (
        "/v1/completions",
        {
            "prompt": "ok",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True, "include_obfuscation": False},
        },
    ),
    ("/v1/completions", {"prompt": "ok", "max_tokens": 2, "temperature": 0}),  # an int where a float goes
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("hostile"), *SMALL_POOL)
    yield srv
    srv.stop()


def _pipelined(server: Server, first: bytes) -> tuple[Any, Any]:
    """Send ``first`` and a good request in one write; both must be answered on the one connection."""
    with RawConn(server.url) as conn:
        conn.send(first + request_bytes("GET", "/v1/models"))
        return conn.read_response(), conn.read_response()


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD, ids=[f"{p}:{f}" for p, _, _, f in BAD])
def test_bad_input_400_and_connection_kept(
    server: Server, path: str, body: Any, status: int, param: str
) -> None:
    bad, after = _pipelined(server, request_bytes("POST", path, body))
    assert bad is not None and bad.status == status, (bad and bad.status, bad and bad.body[:300])
    err = bad.json()["error"]
    assert err["param"] == param or param in err["message"], err
    assert after is not None and after.status == 200, "the pipelined request behind it was not answered"


@pytest.mark.parametrize(("path", "body"), GOOD, ids=[p for p, _ in GOOD])
def test_accepted_variants(server: Server, path: str, body: Any) -> None:
    good, after = _pipelined(server, request_bytes("POST", path, body))
    assert good is not None and good.status == 200, (good and good.status, good and good.body[:300])
    assert after is not None and after.status == 200


def test_never_admissible_batch_says_why(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": ["p"] * 16, "n": 16, "max_tokens": 1})
    assert r.status_code == 400 and "Retry-After" not in r.headers
    assert "256" in r.json()["error"]["message"] and "12" in r.json()["error"]["message"]


def test_bad_inputs_do_not_disturb_a_greedy_request(server: Server) -> None:
    async def run() -> tuple[str, str, list[int]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            idle = (await http.post("/v1/completions", json=GREEDY)).json()["choices"][0]["text"]
            good = asyncio.create_task(http.post("/v1/completions", json=GREEDY))
            bad = [
                http.post(
                    p,
                    content=request_bytes("POST", p, b).split(b"\r\n\r\n", 1)[1],
                    headers={"content-type": "application/json"},
                )
                for p, b, _, _ in BAD * 2
            ]
            statuses = [r.status_code for r in await asyncio.gather(*bad)]
            return idle, (await good).json()["choices"][0]["text"], statuses

    idle, busy, statuses = asyncio.run(run())
    assert busy == idle
    assert all(s == 400 for s in statuses), statuses
    server.wait_pools_empty()


def test_content_length_with_transfer_encoding_refused(server: Server) -> None:
    smuggle = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    with RawConn(server.url) as conn:
        conn.send(smuggle + request_bytes("GET", "/health"))
        first = conn.read_response()
        assert first is not None and first.status == 400, first and first.status
        assert first.headers.get("connection") == "close"
        assert conn.closed_by_peer(), "the connection kept serving after an ambiguous framing"


def test_request_head_over_64k_gets_431(server: Server) -> None:
    with RawConn(server.url) as conn:
        conn.send(request_bytes("GET", "/health", headers={"X-Big": "a" * 100_000}))
        resp = conn.read_response()
        assert resp is not None and resp.status == 431, resp and resp.status
        assert conn.closed_by_peer()
    # Just under the limit still works.
    with RawConn(server.url) as conn:
        conn.send(request_bytes("GET", "/health", headers={"X-Big": "a" * 60_000}))
        resp = conn.read_response()
        assert resp is not None and resp.status == 200


def test_no_redirect_to_client_chosen_host(server: Server) -> None:
    for path in ("/health/", "/v1/models/"):
        r = httpx.get(f"{server.url}{path}", headers={"Host": "evil.example"}, follow_redirects=False)
        assert not 300 <= r.status_code < 400 and "location" not in r.headers, (path, r.status_code)


def test_one_json_log_format_and_an_access_line_per_request(server: Server) -> None:
    ok = {"prompt": "log me", "max_tokens": 2, "temperature": 0}
    assert httpx.post(f"{server.url}/v1/completions", json=ok).status_code == 200
    lone = json.dumps({"prompt": LONE})  # ASCII JSON with the \ud800 escape
    bad = httpx.post(
        f"{server.url}/v1/completions", content=lone, headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400
    assert httpx.get(f"{server.url}/nope").status_code == 404
    time.sleep(0.3)
    text = server.log()
    assert "\x1b" not in text, "ANSI escapes in the log"
    records = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    assert len({r["pid"] for r in records}) >= 2, "the engine process does not log in the same format"
    assert any(r["logger"] == "deltaserve.engine" for r in records)
    access = [r for r in records if r["logger"] == "deltaserve.access"]
    by_route = {(r["route"], r["status"]): r for r in access}
    assert ("/nope", 404) in by_route and ("/v1/completions", 400) in by_route
    done = [r for r in access if r["route"] == "/v1/completions" and r["status"] == 200]
    last = done[-1]
    assert last["request_id"].startswith("cmpl-") and last["completion_tokens"] == 2
    assert last["prompt_tokens"] > 0 and last["latency_ms"] > 0 and last["method"] == "POST"

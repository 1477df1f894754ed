"""RELIABILITY 6 and 13: API key on every route but /health (path tricks included), body-size limits."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.conftest import API_KEY, assert_openai_error

pytestmark = pytest.mark.asyncio(loop_scope="module")
GOOD = {"Authorization": f"Bearer {API_KEY}"}


async def _raw(app: Any, path: str, headers: list[tuple[bytes, bytes]] = (), method: str = "GET") -> int:
    """Call the ASGI app with an exact path, bypassing httpx's URL normalisation."""
    status = 0
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"testserver"), *headers], "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
    }  # fmt: skip
    await app(scope, receive, send)
    return status


async def test_health_needs_no_key(auth_client: httpx.AsyncClient) -> None:
    assert (await auth_client.get("/health")).status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models"),
        ("GET", "/ready"),
        ("GET", "/metrics"),
        ("GET", "/version"),
        ("GET", "/openapi.json"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/does-not-exist"),
    ],
)
async def test_routes_need_key(auth_client: httpx.AsyncClient, method: str, path: str) -> None:
    body = {"prompt": "x", "max_tokens": 1} if method == "POST" else None
    assert_openai_error(await auth_client.request(method, path, json=body), 401)
    bad = {"Authorization": f"Bearer {API_KEY}x"}
    assert_openai_error(await auth_client.request(method, path, json=body, headers=bad), 401)
    assert_openai_error(
        await auth_client.request(method, path, json=body, headers={"Authorization": API_KEY}), 401
    )


async def test_right_key_works(auth_client: httpx.AsyncClient) -> None:
    assert (await auth_client.get("/v1/models", headers=GOOD)).status_code == 200
    lower = {"authorization": f"bearer {API_KEY}"}
    assert (await auth_client.get("/metrics", headers=lower)).status_code == 200
    req = {"prompt": "hi", "max_tokens": 2}
    assert (await auth_client.post("/v1/completions", json=req, headers=GOOD)).status_code == 200


@pytest.mark.parametrize(
    "path",
    ["//v1/models", "/v1//models", "/v1/models/", "/health/", "//health", "/health/../v1/models", "/HEALTH",
     "/./health", "/health%2F..%2Fv1%2Fmodels", "/v1/models?", "/health/..%2Fmetrics"],
)  # fmt: skip
async def test_path_tricks_still_401(auth_client: httpx.AsyncClient, path: str) -> None:
    assert await _raw(auth_client.app, path) == 401  # type: ignore[attr-defined]


async def test_host_header_and_duplicate_auth(auth_client: httpx.AsyncClient) -> None:
    app = auth_client.app  # type: ignore[attr-defined]
    assert await _raw(app, "/v1/models", [(b"host", b"localhost/health")]) == 401
    assert await _raw(app, "/v1/models", [(b"x-forwarded-prefix", b"/health")]) == 401
    twice = [(b"authorization", f"Bearer {API_KEY}".encode()), (b"authorization", b"Bearer nope")]
    assert await _raw(app, "/v1/models", twice) == 401
    assert await _raw(app, "/v1/models", twice[:1]) == 200


async def test_body_too_large_by_content_length(client: httpx.AsyncClient) -> None:
    big = b'{"prompt": "' + b"a" * (300 * 1024) + b'"}'
    resp = await client.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert_openai_error(resp, 413)


async def test_body_too_large_chunked(client: httpx.AsyncClient) -> None:
    async def chunks():
        yield b'{"prompt": "'
        for _ in range(40):
            yield b"a" * 16384
        yield b'"}'

    resp = await client.post(
        "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_openai_error(resp, 413)
    assert (await client.get("/health")).status_code == 200


async def test_bad_content_length(client: httpx.AsyncClient) -> None:
    app = client.app  # type: ignore[attr-defined]
    assert await _raw(app, "/v1/completions", [(b"content-length", b"abc")], method="POST") == 400

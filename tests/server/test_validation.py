"""RELIABILITY 1-5: bad input answers fast in the OpenAI error shape and never hurts other requests."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from tests.server.conftest import assert_openai_error

pytestmark = pytest.mark.asyncio(loop_scope="module")
MARKER = "ECHO-ME-NOT-7f3a"
GREEDY = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}


def _comp(**kw: Any) -> dict[str, Any]:
    return {"prompt": MARKER, "max_tokens": 4, **kw}


def _chat(**kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": MARKER}], "max_tokens": 4, **kw}


# (path, body, field the error must name)
RANGE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", _comp(n=0), "n"),
    ("/v1/completions", _comp(n=17), "n"),
    ("/v1/completions", _comp(n=10**9), "n"),
    ("/v1/completions", _comp(best_of=3), "best_of"),
    ("/v1/completions", _comp(best_of=10**6, n=1), "best_of"),
    ("/v1/completions", _comp(logprobs=21), "logprobs"),
    ("/v1/completions", _comp(logprobs=-1), "logprobs"),
    ("/v1/chat/completions", _chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/v1/completions", _comp(stop=[f"s{i}" for i in range(17)]), "stop"),
    ("/v1/completions", _comp(stop=["x" * 257]), "stop"),
    ("/v1/completions", _comp(max_tokens=10**12), "max_tokens"),
    ("/v1/completions", _comp(max_tokens=2**40), "max_tokens"),
    ("/v1/completions", _comp(max_tokens=-1), "max_tokens"),
    ("/v1/completions", _comp(max_tokens=0), "max_tokens"),
    ("/v1/chat/completions", _chat(max_completion_tokens=10**12), "max_completion_tokens"),
    ("/v1/completions", _comp(temperature=-0.1), "temperature"),
    ("/v1/completions", _comp(temperature=2.5), "temperature"),
    ("/v1/completions", _comp(top_p=0), "top_p"),
    ("/v1/completions", _comp(top_p=1.5), "top_p"),
    ("/v1/completions", _comp(top_k=-2), "top_k"),
    ("/v1/completions", _comp(min_p=1.5), "min_p"),
    ("/v1/completions", _comp(seed=2**64), "seed"),
    ("/v1/completions", _comp(stop_token_ids=list(range(65))), "stop_token_ids"),
    ("/v1/completions", _comp(min_tokens=10**12), "min_tokens"),
    ("/v1/completions", _comp(stream=False, stream_options={"include_usage": True}), "stream_options"),
]


async def _timed(client: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
    t0 = time.monotonic()
    resp = await client.request(method, path, **kw)
    assert time.monotonic() - t0 < 1.0, f"{path} took too long"
    assert MARKER not in resp.text, "the error echoed the input back"
    return resp


@pytest.mark.parametrize(("path", "body", "param"), RANGE_CASES)
async def test_out_of_range_numbers(client: httpx.AsyncClient, path: str, body: dict, param: str) -> None:
    err = assert_openai_error(await _timed(client, "POST", path, json=body), 400)
    assert param in (err["param"] or "") or param in err["message"], err


async def test_nan_and_inf_rejected(client: httpx.AsyncClient) -> None:
    for raw in ('{"prompt": "a", "temperature": NaN}', '{"prompt": "a", "top_p": Infinity}'):
        resp = await _timed(
            client, "POST", "/v1/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert_openai_error(resp, 400)


async def test_context_length_exceeded(client: httpx.AsyncClient, llm: Any) -> None:
    limit = llm.max_model_len
    prompt = [1] * (limit - 5)
    resp = await _timed(client, "POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 10})
    err = assert_openai_error(resp, 400)
    assert err["code"] == "context_length_exceeded"
    assert str(limit) in err["message"] and str(limit + 5) in err["message"]
    # Without max_tokens the default is what is left, at least 1: a prompt filling the context fails.
    resp = await _timed(client, "POST", "/v1/completions", json={"prompt": [1] * limit})
    assert assert_openai_error(resp, 400)["code"] == "context_length_exceeded"
    big = {"messages": [{"role": "user", "content": "a" * (limit * 2)}], "max_tokens": 1}
    resp = await _timed(client, "POST", "/v1/chat/completions", json=big)
    assert assert_openai_error(resp, 400)["code"] == "context_length_exceeded"


async def test_default_max_tokens_fills_context(client: httpx.AsyncClient, llm: Any) -> None:
    prompt = [1] * (llm.max_model_len - 3)
    resp = await client.post("/v1/completions", json={"prompt": prompt, "temperature": 0, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 3


def _bad_id_cases(vocab: int) -> list[tuple[str, dict[str, Any], str]]:
    cases = []
    for bad in (-1, vocab, 2**63):
        cases += [
            ("/v1/completions", {"prompt": [1, bad, 2], "max_tokens": 2}, "prompt"),
            ("/v1/completions", {"prompt": [[1, 2], [bad]], "max_tokens": 2}, "prompt"),
            ("/v1/completions", _comp(stop_token_ids=[bad]), "stop_token_ids"),
            ("/v1/chat/completions", _chat(stop_token_ids=[bad]), "stop_token_ids"),
            ("/v1/completions", _comp(logit_bias={str(bad): 1}), "logit_bias"),
            ("/detokenize", {"tokens": [1, bad]}, "tokens"),
        ]
    return cases


async def test_bad_token_ids(client: httpx.AsyncClient, llm: Any) -> None:
    for path, body, param in _bad_id_cases(llm.vocab_size):
        err = assert_openai_error(await _timed(client, "POST", path, json=body), 400)
        assert param in (err["param"] or "") or param in err["message"], (path, body, err)


EMPTY_AND_MALFORMED: list[tuple[str, dict[str, Any], int]] = [
    ("/v1/completions", {"json": {"prompt": ""}}, 400),
    ("/v1/completions", {"json": {"prompt": []}}, 400),
    ("/v1/completions", {"json": {"prompt": [[]]}}, 400),
    ("/v1/completions", {"json": {"prompt": ["a", ""]}}, 400),
    ("/v1/completions", {"json": {"max_tokens": 3}}, 400),
    ("/v1/chat/completions", {"json": {"messages": []}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "wizard", "content": "x"}]}}, 400),
    (
        "/v1/chat/completions",
        {"json": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}},
        400,
    ),
    (
        "/v1/completions",
        {"content": b'{"prompt": "' + MARKER.encode(), "headers": {"content-type": "application/json"}},
        400,
    ),
    ("/v1/completions", {"content": b"[1, 2, 3]", "headers": {"content-type": "application/json"}}, 400),
    (
        "/v1/completions",
        {"content": b'"just a string"', "headers": {"content-type": "application/json"}},
        400,
    ),
    (
        "/v1/completions",
        {"content": b"\xff\xfe\x00garbage", "headers": {"content-type": "application/json"}},
        400,
    ),
    (
        "/v1/completions",
        {"content": json.dumps(_comp()).encode(), "headers": {"content-type": "text/plain"}},
        400,
    ),
    ("/v1/completions", {"content": b"", "headers": {"content-type": "application/json"}}, 400),
    ("/v1/completions", {"json": _comp(model="no-such-model")}, 404),
    ("/v1/chat/completions", {"json": _chat(model="no-such-model")}, 404),
    ("/v1/chat/completions", {"json": _chat(chat_template="{{ 7 * 7 }}")}, 400),
    ("/v1/chat/completions", {"json": _chat(chat_template_kwargs={"messages": 1})}, 400),
    ("/v1/chat/completions", {"json": _chat(chat_template_kwargs={"x": {"nested": 1}})}, 400),
]


@pytest.mark.parametrize(("path", "kwargs", "status"), EMPTY_AND_MALFORMED)
async def test_empty_and_malformed(client: httpx.AsyncClient, path: str, kwargs: dict, status: int) -> None:
    resp = await _timed(client, "POST", path, **kwargs)
    err = assert_openai_error(resp, status)
    if status == 404:
        assert err["code"] == "model_not_found"


async def test_jinja_in_content_is_text(client: httpx.AsyncClient) -> None:
    evil = "{{ 7 * 7 }}{% for x in range(10**9) %}{% endfor %}{{ ''.__class__.__mro__ }}"
    resp = await _timed(client, "POST", "/tokenize", json={"messages": [{"role": "user", "content": evil}]})
    assert resp.status_code == 200, resp.text
    text = (await client.post("/detokenize", json={"tokens": resp.json()["tokens"]})).json()["prompt"]
    assert evil in text and "49" not in text.replace(evil, "")


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/v1/nope"), 404)
    assert_openai_error(await client.get("/v1/completions"), 405)


async def test_bad_requests_do_not_disturb_others(client: httpx.AsyncClient, llm: Any) -> None:
    idle = await client.post("/v1/completions", json=GREEDY)
    assert idle.status_code == 200, idle.text
    bad: list[tuple[str, dict[str, Any]]] = [(p, {"json": b}) for p, b, _ in RANGE_CASES]
    bad += [(p, {"json": b}) for p, b, _ in _bad_id_cases(llm.vocab_size)]
    bad += [(p, kw) for p, kw, _ in EMPTY_AND_MALFORMED]
    good = asyncio.create_task(client.post("/v1/completions", json=GREEDY))
    results = await asyncio.gather(*(client.post(p, **kw) for p, kw in bad * 3))
    assert all(400 <= r.status_code < 500 for r in results)
    busy = await good
    assert busy.json()["choices"][0]["text"] == idle.json()["choices"][0]["text"]
    assert (await client.get("/health")).status_code == 200

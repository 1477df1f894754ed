"""Completions and chat over the real in-process engine: shapes, streaming equals non-streaming, waves."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.asyncio(loop_scope="module")
PROMPT = "Once upon a time"


def _events(resp: httpx.Response) -> list[Any]:
    """SSE frames: every one is `data: ...` and the stream ends with [DONE]."""
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in resp.text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames), frames[:3]
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f[len("data: ") :]) for f in frames[:-1]]


async def test_completion_shape(client: httpx.AsyncClient, llm: Any) -> None:
    resp = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == llm.model_name and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert (
        choice["index"] == 0 and choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    )
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(llm.tokenizer.encode(PROMPT))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 8


async def test_stream_equals_non_stream(client: httpx.AsyncClient) -> None:
    req = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    full = (await client.post("/v1/completions", json=req)).json()
    resp = await client.post(
        "/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}}
    )
    events = _events(resp)
    *chunks, last = events
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"] == "length"
    assert last["choices"] == [] and last["usage"] == full["usage"]


async def test_token_prompt_equals_text_prompt(client: httpx.AsyncClient, llm: Any) -> None:
    ids = llm.tokenizer.encode(PROMPT)
    a = (
        await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    ).json()
    b = (await client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0})).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


async def test_list_prompt_and_n_are_one_wave(client: httpx.AsyncClient) -> None:
    prompts = ["alpha", "beta gamma"]
    alone = []
    for p in prompts:
        r = await client.post("/v1/completions", json={"prompt": p, "max_tokens": 6, "temperature": 0})
        alone.append(r.json()["choices"][0]["text"])
    req = {"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2}
    body = (await client.post("/v1/completions", json=req)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    texts = [c["text"] for c in body["choices"]]
    assert texts == [alone[0], alone[0], alone[1], alone[1]]  # prompt-major, then n


async def test_seeded_sampling_reproducible(client: httpx.AsyncClient) -> None:
    req = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 1234, "n": 3, "ignore_eos": True}
    a = (await client.post("/v1/completions", json=req)).json()
    b = (await client.post("/v1/completions", json=req)).json()
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]
    # Sample i uses seed + i, so sample 1 equals a lone request with seed 1235.
    one = (await client.post("/v1/completions", json={**req, "n": 1, "seed": 1235})).json()
    assert one["choices"][0]["text"] == a["choices"][1]["text"]


async def test_echo_and_logprobs(client: httpx.AsyncClient, llm: Any) -> None:
    req = {
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 0,
        "echo": True,
        "logprobs": 2,
        "ignore_eos": True,
    }
    choice = (await client.post("/v1/completions", json=req)).json()["choices"][0]
    assert choice["text"].startswith(PROMPT)
    lp = choice["logprobs"]
    n_prompt = len(llm.tokenizer.encode(PROMPT))
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert len(lp["tokens"]) == n_prompt + 4
    # Every prompt token but the first is scored, as OpenAI and vLLM do (lm-eval relies on it).
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:])
    assert all(isinstance(d, dict) and 1 <= len(d) <= 3 for d in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"])


async def test_chat(client: httpx.AsyncClient) -> None:
    req = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
        "max_tokens": 100,
        "max_completion_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
    }
    body = (await client.post("/v1/chat/completions", json=req)).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert body["usage"]["completion_tokens"] == 10  # max_completion_tokens wins over max_tokens
    events = _events(await client.post("/v1/chat/completions", json={**req, "stream": True}))
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == choice["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_chat_logprobs(client: httpx.AsyncClient) -> None:
    req = {
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 3,
        "logprobs": True,
        "top_logprobs": 2,
    }
    choice = (await client.post("/v1/chat/completions", json={**req, "ignore_eos": True})).json()["choices"][
        0
    ]
    content = choice["logprobs"]["content"]
    assert len(content) == 3
    assert all(
        {"token", "logprob", "bytes", "top_logprobs"} <= set(c) and len(c["top_logprobs"]) <= 2
        for c in content
    )


async def test_tokenize_round_trip(client: httpx.AsyncClient, llm: Any) -> None:
    text = "Hello, wörld! 你好"
    tok = (await client.post("/tokenize", json={"prompt": text})).json()
    assert tok["tokens"] == llm.tokenizer.encode(text) and tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == llm.max_model_len
    detok = (await client.post("/detokenize", json={"tokens": tok["tokens"]})).json()
    assert detok["prompt"] == text


async def test_models_version_health_ready(client: httpx.AsyncClient, llm: Any) -> None:
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == llm.model_name
    assert (await client.get(f"/v1/models/{llm.model_name}")).status_code == 200
    assert (await client.get("/v1/models/other")).status_code == 404
    assert "version" in (await client.get("/version")).json()
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/ready")).status_code == 200


async def test_metrics(client: httpx.AsyncClient) -> None:
    await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
    resp = await client.get("/metrics")
    assert resp.status_code == 200
    names = {s.name for fam in text_string_to_metric_families(resp.text) for s in fam.samples}
    for name in (
        "deltaserve_time_to_first_token_seconds_bucket",
        "deltaserve_inter_token_latency_seconds_bucket",
        "deltaserve_e2e_request_latency_seconds_count",
        "deltaserve_num_requests_running",
        "deltaserve_num_requests_waiting",
        "deltaserve_kv_blocks_used",
        "deltaserve_kv_blocks_total",
        "deltaserve_state_slots_used",
        "deltaserve_state_slots_total",
        "deltaserve_device_memory_used_bytes",
        "deltaserve_peak_device_memory_bytes",
        "deltaserve_device_info",
        "deltaserve_prompt_tokens_total",
        "deltaserve_generation_tokens_total",
        "deltaserve_requests_total",
        "deltaserve_engine_steps_total",
        "deltaserve_step_admitted_requests_bucket",
        "deltaserve_max_wave_admitted",
        "deltaserve_generation_tokens_per_second",
        "deltaserve_first_token_stage_seconds_bucket",
    ):
        assert name in names, name


async def test_first_token_stages_add_up_to_ttft(client: httpx.AsyncClient) -> None:
    """Every stage is observed once per first token, none is negative, prefill is not empty, and
    together they make up the TTFT observed with them."""
    from server.metrics import FIRST_TOKEN_STAGES

    def scrape(text: str) -> tuple[dict[str, float], dict[str, float], float, float]:
        sums, counts, ttft, n = {}, {}, 0.0, 0.0
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name == "deltaserve_first_token_stage_seconds_sum":
                    sums[smp.labels["stage"]] = smp.value
                elif smp.name == "deltaserve_first_token_stage_seconds_count":
                    counts[smp.labels["stage"]] = smp.value
                elif smp.name == "deltaserve_time_to_first_token_seconds_sum":
                    ttft = smp.value
                elif smp.name == "deltaserve_time_to_first_token_seconds_count":
                    n = smp.value
        return sums, counts, ttft, n

    s0, c0, t0, n0 = scrape((await client.get("/metrics")).text)
    for stream in (False, True):
        req = {"prompt": PROMPT, "max_tokens": 3, "n": 2, "stream": stream}
        assert (await client.post("/v1/completions", json=req)).status_code == 200
    s1, c1, t1, n1 = scrape((await client.get("/metrics")).text)
    assert n1 - n0 == 4 and set(c1) == set(FIRST_TOKEN_STAGES)
    delta = {k: s1[k] - s0.get(k, 0.0) for k in FIRST_TOKEN_STAGES}
    assert all(c1[k] - c0.get(k, 0.0) == 4 for k in FIRST_TOKEN_STAGES)
    assert all(v >= 0 for v in delta.values()) and delta["prefill"] > 0
    assert sum(delta.values()) == pytest.approx(t1 - t0, abs=1e-6)


async def test_openapi_has_request_schemas(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert "CompletionRequest" in spec["components"]["schemas"]
    assert "ChatCompletionRequest" in spec["components"]["schemas"]

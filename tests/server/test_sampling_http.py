"""Sampling fields and prompt scoring over HTTP on the real tiny model: logit_bias, bad_words,
penalties, echo with max_tokens 0, vLLM's prompt_logprobs, checkpoint defaults and /v1/models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.generation_defaults import load_defaults
from tests.server.conftest import assert_openai_error

pytestmark = pytest.mark.asyncio(loop_scope="module")
PROMPT = "Once upon a time"
GREEDY = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}


async def _comp(client: httpx.AsyncClient, **kw: Any) -> dict[str, Any]:
    resp = await client.post("/v1/completions", json={**GREEDY, **kw})
    assert resp.status_code == 200, resp.text
    return resp.json()


async def _clean_greedy_token(llm: Any, prompt: str = PROMPT, n: int = 12) -> tuple[int, str]:
    """A token of the engine's greedy continuation whose text is its own (decoding it and encoding the
    text gives the id back), so it can be recognised in the HTTP output's token texts (the tiny model
    also emits partial UTF-8 byte tokens, all shown as the same replacement character)."""
    from engine.sampling_params import SamplingParams

    tok = llm.tokenizer
    ids: list[int] = []
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    async for out in llm.generate(tok.encode(prompt), params, f"probe-{len(prompt)}-{n}"):
        ids.extend(out.new_token_ids)
    for i in ids:
        text = tok.decode([i])
        if text and "\ufffd" not in text and tok.encode(text) == [i]:
            return i, text
    pytest.fail(f"no self-contained token in the greedy continuation {ids}")


async def test_logit_bias_forces_and_forbids_tokens(client: httpx.AsyncClient, llm: Any) -> None:
    tok = llm.tokenizer
    target = tok.encode(" dragon")[0]
    forced = await _comp(client, logit_bias={str(target): 100})
    assert forced["choices"][0]["text"] == tok.decode([target] * 6)
    tid, text = await _clean_greedy_token(llm, n=6)
    plain = (await _comp(client, logprobs=0))["choices"][0]["logprobs"]["tokens"]
    assert text in plain
    banned = await _comp(client, logprobs=0, logit_bias={str(tid): -100})
    assert text not in banned["choices"][0]["logprobs"]["tokens"]


async def test_bad_words_are_never_generated(client: httpx.AsyncClient, llm: Any) -> None:
    _, word = await _clean_greedy_token(llm)
    plain = (await _comp(client, max_tokens=12, logprobs=0))["choices"][0]["logprobs"]["tokens"]
    assert word in plain
    out = (await _comp(client, max_tokens=12, logprobs=0, bad_words=[word]))["choices"][0]["logprobs"][
        "tokens"
    ]
    assert word not in out and out != plain


async def test_penalties_change_greedy_output_and_seeded_runs_repeat(client: httpx.AsyncClient) -> None:
    plain = (await _comp(client, max_tokens=24))["choices"][0]["text"]
    pen = {"max_tokens": 24, "frequency_penalty": 2.0, "presence_penalty": 2.0, "repetition_penalty": 1.8}
    penalised = (await _comp(client, **pen))["choices"][0]["text"]
    assert penalised != plain
    seeded = {**pen, "temperature": 0.9, "seed": 77}
    a = (await _comp(client, **seeded))["choices"][0]["text"]
    b = (await _comp(client, **seeded))["choices"][0]["text"]
    assert a == b


async def test_echo_with_max_tokens_zero_scores_the_prompt(client: httpx.AsyncClient, llm: Any) -> None:
    n_prompt = len(llm.tokenizer.encode(PROMPT))
    body = await _comp(client, max_tokens=0, echo=True, logprobs=2)
    (choice,) = body["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == n_prompt and lp["token_logprobs"][0] is None
    assert all(isinstance(x, float) and x < 0 for x in lp["token_logprobs"][1:])
    assert body["usage"]["completion_tokens"] == 0
    # Same scores with a generated continuation, and streamed.
    more = (await _comp(client, max_tokens=3, echo=True, logprobs=2))["choices"][0]["logprobs"]
    assert more["token_logprobs"][:n_prompt] == lp["token_logprobs"]
    resp = await client.post("/v1/completions", json={**GREEDY, "max_tokens": 0, "echo": True, "logprobs": 2,
                                                      "stream": True})  # fmt: skip
    chunks = [json.loads(f[6:]) for f in resp.text.split("\n\n") if f.startswith("data: {")]
    streamed = [x for c in chunks for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == lp["token_logprobs"]
    # Echo alone (no logprobs) with nothing generated is just the prompt.
    assert (await _comp(client, max_tokens=0, echo=True))["choices"][0]["text"] == PROMPT
    assert_openai_error(
        await client.post("/v1/completions", json={**GREEDY, "max_tokens": 0}), 400, "max_tokens"
    )


async def test_vllm_prompt_logprobs_on_both_endpoints(client: httpx.AsyncClient, llm: Any) -> None:
    tok = llm.tokenizer
    ids = tok.encode(PROMPT)
    echo = (await _comp(client, max_tokens=0, echo=True, logprobs=0))["choices"][0]["logprobs"]
    choice = (await _comp(client, max_tokens=1, prompt_logprobs=3))["choices"][0]
    plp = choice["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for pos, entry in enumerate(plp[1:], 1):
        mine = entry[str(ids[pos])]
        assert mine["logprob"] == echo["token_logprobs"][pos]
        assert mine["decoded_token"] == tok.decode([ids[pos]]) and mine["rank"] >= 1
        # The prompt token plus the top 3 (3 entries when it is one of them).
        assert {v["rank"] for v in entry.values()} >= {1, 2, 3} and len(entry) in (3, 4)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "prompt_logprobs": 0}
    body = (await client.post("/v1/chat/completions", json=chat)).json()
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) > 5
    assert all(len(e) == 1 for e in body["prompt_logprobs"][1:])


async def test_models_carry_root_parent_and_max_model_len(client: httpx.AsyncClient, llm: Any) -> None:
    (card,) = (await client.get("/v1/models")).json()["data"]
    assert card["root"] == llm.config.model.model and card["parent"] is None
    assert card["max_model_len"] == llm.max_model_len == 4096


async def test_generation_config_defaults(client: httpx.AsyncClient, tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.0, "top_k": 20, "max_new_tokens": 3, "do_sample": True})
    )
    defaults = load_defaults(str(tmp_path), "unused")
    assert defaults == {"temperature": 0.0, "top_k": 20, "max_tokens": 3}
    assert load_defaults("vllm", str(tmp_path)) == {}
    state = client.app.state.ds  # type: ignore[attr-defined]
    old, state.defaults = state.defaults, defaults
    try:
        body = {"prompt": PROMPT, "ignore_eos": True}
        a = (await client.post("/v1/completions", json=body)).json()
        b = (await client.post("/v1/completions", json=body)).json()
        assert a["usage"]["completion_tokens"] == 3 and a["choices"][0]["text"] == b["choices"][0]["text"]
        explicit = (await client.post("/v1/completions", json={**body, "max_tokens": 5})).json()
        assert explicit["usage"]["completion_tokens"] == 5  # the request wins over the default
        greedy = (
            await client.post("/v1/completions", json={**body, "temperature": 0, "max_tokens": 3})
        ).json()
        assert greedy["choices"][0]["text"] == a["choices"][0]["text"]
    finally:
        state.defaults = old

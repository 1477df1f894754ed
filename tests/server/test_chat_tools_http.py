"""Reasoning and tool calls end to end: the openai SDK -> HTTP (ASGI) -> server -> real AsyncLLM and
engine -> a runner that writes a canned Qwen3.5 answer; streamed and non-streamed must agree."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio

from engine.config import EngineConfig, ModelConfig, ServerConfig
from engine.frontend.tokenizer import Tokenizer
from engine.worker.resolve import resolve_model
from server.app import build_app
from tests.server.canned_runner import CannedRunner
from tests.server.conftest import assert_openai_error

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
ANSWER = (
    "The user asks about Paris; I should call get_weather.\n</think>\n\nChecking the forecast.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
)
MSGS = [{"role": "user", "content": "Weather in Paris for 2 days?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup() -> AsyncIterator[tuple[openai.AsyncOpenAI, CannedRunner, Tokenizer]]:
    from engine.frontend.async_llm import AsyncLLM

    cfg = EngineConfig(model=resolve_model(ModelConfig()))
    tok = Tokenizer.from_dir(cfg.model.model)
    runner = CannedRunner(tok.vocab_size, tok.token_to_id("<|im_end|>") or 0)
    server_cfg = ServerConfig(
        reasoning_parser="qwen3", enable_auto_tool_choice=True, tool_call_parser="qwen3_coder"
    )
    llm = await AsyncLLM.create(cfg, server_cfg, runner=runner, tokenizer=tok)
    app = build_app(llm, server_cfg)
    try:
        async with app.router.lifespan_context(app):
            http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
            oai = openai.AsyncOpenAI(
                base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0
            )
            yield oai, runner, tok
            await http.aclose()
    finally:
        await llm.shutdown()


async def _both(oai: openai.AsyncOpenAI, **kw: Any) -> tuple[Any, dict[str, Any], str | None]:
    """The non-streamed choice, and the streamed deltas concatenated as a client does."""
    whole = (await oai.chat.completions.create(model="qwen3.5-tiny", messages=MSGS, **kw)).choices[0]
    acc: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": {}}
    finish = None
    stream = await oai.chat.completions.create(model="qwen3.5-tiny", messages=MSGS, stream=True, **kw)
    async for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        d = ch.delta
        acc["content"] += d.content or ""
        acc["reasoning_content"] += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            slot = acc["tool_calls"].setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                slot["id"], slot["name"] = tc.id, tc.function.name
            slot["arguments"] += tc.function.arguments or ""
        finish = ch.finish_reason or finish
    return whole, acc, finish


async def test_tool_call_with_reasoning_streamed_and_not(setup: Any) -> None:
    oai, runner, tok = setup
    runner.script = tok.encode(ANSWER)
    whole, streamed, finish = await _both(oai, tools=TOOLS, temperature=0)
    msg = whole.message
    assert whole.finish_reason == "tool_calls" and finish == "tool_calls"
    assert msg.model_extra["reasoning_content"] == "The user asks about Paris; I should call get_weather.\n"
    assert msg.content == "Checking the forecast.\n\n"
    (call,) = msg.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert streamed["content"] == msg.content
    assert streamed["reasoning_content"] == msg.model_extra["reasoning_content"]
    (s_call,) = streamed["tool_calls"].values()
    assert s_call["name"] == "get_weather" and s_call["id"].startswith("call_")
    assert json.loads(s_call["arguments"]) == {"city": "Paris", "days": 2}


async def test_tool_choice_none_and_tool_results_through_the_template(setup: Any) -> None:
    oai, runner, tok = setup
    runner.script = tok.encode(ANSWER)
    whole, streamed, finish = await _both(oai, tools=TOOLS, tool_choice="none", temperature=0)
    assert (
        whole.finish_reason == "stop"
        and not whole.message.tool_calls
        and "<tool_call>" in whole.message.content
    )
    assert streamed["content"] == whole.message.content and finish == "stop"
    # The tool's answer goes back as a role "tool" message and is rendered by the chat template.
    fn = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    history = [
        *MSGS,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_1", "type": "function", "function": fn}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]
    runner.script = tok.encode("done\n</think>\n\nIt is sunny.")
    out = await oai.chat.completions.create(
        model="qwen3.5-tiny", messages=history, tools=TOOLS, temperature=0
    )
    assert out.choices[0].message.content == "It is sunny." and out.choices[0].finish_reason == "stop"
    prompt = tok.decode(runner.prompts[-1])
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in prompt
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt


async def test_reasoning_cut_off_and_thinking_disabled(setup: Any) -> None:
    oai, runner, tok = setup
    runner.script = tok.encode("thinking and thinking and")
    whole, streamed, _ = await _both(oai, temperature=0, max_tokens=4)
    assert whole.finish_reason == "length" and whole.message.content is None
    assert whole.message.model_extra["reasoning_content"] == streamed["reasoning_content"] != ""
    runner.script = tok.encode("Plain answer.")
    kw = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    whole, streamed, _ = await _both(oai, temperature=0, **kw)
    assert whole.message.content == "Plain answer." == streamed["content"]
    assert whole.message.model_extra["reasoning_content"] is None and streamed["reasoning_content"] == ""


async def test_forced_tool_choice_is_refused(setup: Any) -> None:
    oai, _, _ = setup
    http: httpx.AsyncClient = oai._client
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        body = {"messages": MSGS, "tools": TOOLS, "tool_choice": choice}
        err = assert_openai_error(await http.post("/v1/chat/completions", json=body), 400, "tool_choice")
        assert "structured output" in err["message"]

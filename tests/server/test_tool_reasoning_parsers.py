"""Reasoning and tool-call parsers on Qwen3.5-format outputs, whole and streamed in random pieces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.chat_output import ChatOutput
from server.reasoning import Qwen3ReasoningParser, make_reasoning_parser, prompt_opens_thinking
from server.tool_parsers import make_tool_stream
from server.tool_parsers.qwen3_coder import convert, parse_qwen3_coder_block

THINKING_PROMPT = "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n"
NO_THINK_PROMPT = "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "where": {"type": "object"},
                    "zip": {"type": "string"},
                    "ratio": {"type": "number"},
                },
            },
        },
    }
]
CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
FULL = "The user wants the weather; call the tool.\n</think>\n\nLet me check.\n\n" + CALL


def _run(text: str, prompt: str, tools: bool = True, pieces: list[str] | None = None, **kw) -> ChatOutput:
    co = ChatOutput(
        make_reasoning_parser("qwen3", prompt),
        make_tool_stream("qwen3_coder", TOOLS, **kw) if tools else None,
    )
    pieces = pieces if pieces is not None else [text]
    for p in pieces[:-1]:
        co.feed(p)
    co.finish(pieces[-1])
    return co


def _random_pieces(text: str, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    cuts = sorted(set(rng.integers(0, len(text), size=max(1, len(text) // 4)).tolist()))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _streamed_message(text: str, prompt: str, seed: int, **kw) -> dict:
    """Concatenate streamed deltas the way a client does."""
    co = ChatOutput(make_reasoning_parser("qwen3", prompt), make_tool_stream("qwen3_coder", TOOLS, **kw))
    pieces = _random_pieces(text, seed)
    deltas = [co.feed(p) for p in pieces[:-1]] + [co.finish(pieces[-1])]
    msg: dict = {"reasoning_content": "", "content": "", "tool_calls": []}
    for d in deltas:
        msg["reasoning_content"] += d.get("reasoning_content", "")
        msg["content"] += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                msg["tool_calls"].append(
                    {"id": tc["id"], "type": tc["type"], "function": dict(tc["function"])}
                )
            else:
                msg["tool_calls"][tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    return msg


def test_reasoning_then_content_then_a_tool_call() -> None:
    co = _run(FULL, THINKING_PROMPT)
    msg = co.message()
    assert msg["reasoning_content"] == "The user wants the weather; call the tool.\n"
    assert msg["content"] == "Let me check.\n\n"
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}
    assert co.finish_reason("stop") == "tool_calls" and co.finish_reason("length") == "length"


@pytest.mark.parametrize("seed", range(12))
def test_streamed_deltas_concatenate_to_the_message(seed: int) -> None:
    for text in (FULL, FULL + "\n" + CALL.replace("Paris", "Rome"), "still thinking <tool", "a</thi"):
        whole = _run(text, THINKING_PROMPT).message()
        streamed = _streamed_message(text, THINKING_PROMPT, seed)
        assert streamed["reasoning_content"] == (whole["reasoning_content"] or "")
        assert streamed["content"] == (whole["content"] or "")
        got = [(c["function"]["name"], c["function"]["arguments"]) for c in streamed["tool_calls"]]
        want = [(c["function"]["name"], c["function"]["arguments"]) for c in whole.get("tool_calls", [])]
        assert got == want


def test_stop_inside_thinking_is_all_reasoning() -> None:
    msg = _run("I am still weighing whether to call <too", THINKING_PROMPT).message()
    assert msg["reasoning_content"] == "I am still weighing whether to call <too"
    assert msg["content"] is None and "tool_calls" not in msg


def test_thinking_disabled_gives_plain_content() -> None:
    assert not prompt_opens_thinking(NO_THINK_PROMPT) and prompt_opens_thinking(THINKING_PROMPT)
    msg = _run("Sunny, 21 degrees.", NO_THINK_PROMPT, tools=False).message()
    assert msg == {"role": "assistant", "content": "Sunny, 21 degrees.", "reasoning_content": None}


def test_model_that_opens_think_itself() -> None:
    p = Qwen3ReasoningParser(in_reasoning=False)
    parts = [p.feed(x) for x in ("<th", "ink>plan", " it</think>\n\nanswer")] + [p.finish()]
    assert "".join(r for r, _ in parts) == "plan it"
    assert "".join(c for _, c in parts) == "answer"


def test_malformed_and_unclosed_calls_stay_content() -> None:
    bad = "<tool_call>\n<function=get_weather>\nno parameters here\n</function>\n</tool_call>"
    msg = _run("ok\n</think>\n\n" + bad, THINKING_PROMPT).message()
    assert msg["content"] == bad and "tool_calls" not in msg
    partial = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    msg = _run("ok\n</think>\n\n" + partial, THINKING_PROMPT).message()
    assert msg["content"] == partial and "tool_calls" not in msg
    co = _run("ok\n</think>\n\n<tool_call>\n<function=>\n</function>\n</tool_call>", THINKING_PROMPT)
    assert not co.calls and co.finish_reason("stop") == "stop"


def test_parallel_tool_calls_false_keeps_the_first() -> None:
    text = "x\n</think>\n\n" + CALL + "\n" + CALL.replace("Paris", "Rome")
    assert len(_run(text, THINKING_PROMPT).message()["tool_calls"]) == 2
    (only,) = _run(text, THINKING_PROMPT, max_calls=1).message()["tool_calls"]
    assert json.loads(only["function"]["arguments"])["city"] == "Paris"


def test_call_without_the_tool_call_wrapper_and_last_parameter_unclosed() -> None:
    text = "x</think><function=get_weather>\n<parameter=city>\nOslo\n</function>"
    (call,) = _run(text, THINKING_PROMPT).message()["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}


def test_parameter_types_follow_the_schema() -> None:
    block = (
        "<tool_call>\n<function=get_weather>\n<parameter=zip>\n007\n</parameter>\n<parameter=days>\n-2\n"
        "</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
        '<parameter=where>\n{"lat": 1.5}\n</parameter>\n'
        "<parameter=ratio>\n0.25\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    name, args = parse_qwen3_coder_block(block, TOOLS)  # type: ignore[misc]
    assert name == "get_weather"
    assert args == {"zip": "007", "days": -2, "metric": True, "where": {"lat": 1.5}, "ratio": 0.25,
                    "note": "line one\nline two"}  # fmt: skip
    assert convert("abc", {"type": "integer"}) == "abc"  # a value that does not fit its type is kept
    assert convert("[1, 2]", None) == [1, 2]


def test_hermes_json_calls() -> None:
    hermes = make_tool_stream("hermes", TOOLS)
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
    content, calls = hermes.feed(text[:20])
    c2, calls2 = hermes.feed(text[20:])
    assert content + c2 + hermes.finish() == "Checking.\n"
    (call,) = calls + calls2
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Lima"}
    broken = make_tool_stream("hermes", TOOLS)
    assert broken.feed("<tool_call>{not json}</tool_call>") == ("<tool_call>{not json}</tool_call>", [])

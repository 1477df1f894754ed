"""One chat choice's output text -> reasoning_content, content and tool_calls, incrementally.

The reasoning parser (if any) runs first; its content goes through the tool-call parser (if any),
so a tool call written inside the reasoning is not a call. Streaming sends each :meth:`feed`'s delta;
the non-streamed message is built from the same deltas, so both always agree.
"""

from __future__ import annotations

from typing import Any

from server.reasoning import Qwen3ReasoningParser
from server.tool_parsers import ToolCall, ToolCallStream


class ChatOutput:
    def __init__(self, reasoning: Qwen3ReasoningParser | None, tools: ToolCallStream | None) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self.reasoning_parts: list[str] = []
        self.content_parts: list[str] = []
        self.calls: list[ToolCall] = []

    def _content(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        if self._tools is None:
            return text, []
        content, calls = self._tools.feed(text)
        if final:
            content += self._tools.finish()
        return content, calls

    def _step(self, text: str, final: bool) -> dict[str, Any]:
        if self._reasoning is not None:
            reasoning, content = self._reasoning.feed(text)
            if final:
                r2, c2 = self._reasoning.finish()
                reasoning, content = reasoning + r2, content + c2
        else:
            reasoning, content = "", text
        content, calls = self._content(content, final)
        delta: dict[str, Any] = {}
        if reasoning:
            self.reasoning_parts.append(reasoning)
            delta["reasoning_content"] = reasoning
        if content:
            self.content_parts.append(content)
            delta["content"] = content
        if calls:
            first = len(self.calls)
            self.calls.extend(calls)
            delta["tool_calls"] = [d for i, c in enumerate(calls, first) for d in c.as_deltas(i)]
        return delta

    def feed(self, text: str) -> dict[str, Any]:
        """The delta for the next piece of output text (keys: reasoning_content, content, tool_calls)."""
        return self._step(text, final=False)

    def finish(self, text: str = "") -> dict[str, Any]:
        """The last piece of text, plus whatever the parsers still held."""
        return self._step(text, final=True)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        # OpenAI reports a turn that ends in tool calls as "tool_calls" (a length cut-off stays "length").
        return "tool_calls" if self.calls and engine_reason == "stop" else engine_reason

    def message(self) -> dict[str, Any]:
        content = "".join(self.content_parts)
        msg: dict[str, Any] = {"role": "assistant"}
        reasoning = "".join(self.reasoning_parts)
        msg["content"] = content if content or not (self.calls or reasoning) else None
        if self._reasoning is not None:
            msg["reasoning_content"] = reasoning or None
        if self.calls:
            msg["tool_calls"] = [c.as_message() for c in self.calls]
        return msg

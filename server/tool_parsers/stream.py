"""Finding tool-call blocks in streamed text, whatever the block format.

Text outside blocks is content. A tail that could still be the start of a block tag is held back;
once a start tag is seen everything is held until its end tag, then the block is parsed. A block that
does not parse, or one still open when generation ends, is given back as content: nothing the model
wrote is lost, and a half-written call is never reported as a call.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from server.reasoning import held_prefix


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """A JSON object, as OpenAI sends it."""
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def as_deltas(self, index: int) -> list[dict[str, Any]]:
        """OpenAI's streamed form: the id, type and name first with empty arguments, then the arguments."""
        head = {
            "index": index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": ""},
        }
        return [head, {"index": index, "function": {"arguments": self.arguments}}]


# (block text including its tags, the request's tools) -> (name, arguments object) or None if malformed
BlockParser = Callable[[str, list[dict[str, Any]]], tuple[str, dict[str, Any]] | None]


class ToolCallStream:
    def __init__(
        self,
        tags: tuple[tuple[str, str], ...],
        parse: BlockParser,
        tools: list[dict[str, Any]],
        max_calls: int | None = None,
    ) -> None:
        self._tags = tags
        self._parse = parse
        self._tools = tools
        self._max_calls = max_calls
        self._buf = ""
        self._end: str | None = None  # the end tag of the open block, None outside blocks
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content delta, calls completed by this text)."""
        self._buf += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while self._buf:
            if self._end is None:
                hits = [(self._buf.find(s), s, e) for s, e in self._tags if s in self._buf]
                if not hits:
                    keep = held_prefix(self._buf, tuple(s for s, _ in self._tags))
                    content.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                i, _, end = min(hits)
                content.append(self._buf[:i])
                self._buf, self._end = self._buf[i:], end
            j = self._buf.find(self._end)
            if j < 0:
                break
            block, self._buf = self._buf[: j + len(self._end)], self._buf[j + len(self._end) :]
            self._end = None
            call = self._call(block)
            if call is None:
                content.append(block)
            elif call != "dropped":
                calls.append(call)
        return "".join(content), calls

    def _call(self, block: str) -> ToolCall | Literal["dropped"] | None:
        parsed = self._parse(block, self._tools)
        if parsed is None:
            return None
        if self._max_calls is not None and len(self.calls) >= self._max_calls:
            return "dropped"  # parallel_tool_calls=false: later calls are dropped, not shown as text
        call = ToolCall(parsed[0], json.dumps(parsed[1], ensure_ascii=False))
        self.calls.append(call)
        return call

    def finish(self) -> str:
        """Content still held at the end (an unclosed block, or a partial tag)."""
        rest, self._buf, self._end = self._buf, "", None
        return rest

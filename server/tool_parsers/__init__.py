"""Tool-call parsers: model output text -> OpenAI ``tool_calls``.

``qwen3_coder``: Qwen3.5's XML format (``<tool_call><function=NAME><parameter=P>value</parameter>
</function></tool_call>``). ``hermes``: a JSON object inside ``<tool_call>...</tool_call>``.
Both run through :class:`~server.tool_parsers.stream.ToolCallStream`, which finds complete blocks
in streamed text.
"""

from __future__ import annotations

from typing import Any

from server.tool_parsers.hermes import parse_hermes_block
from server.tool_parsers.qwen3_coder import parse_qwen3_coder_block
from server.tool_parsers.stream import BlockParser, ToolCall, ToolCallStream

__all__ = ["PARSERS", "ToolCall", "ToolCallStream", "make_tool_stream"]

# name -> (block start tags, their end tags, block parser)
PARSERS: dict[str, tuple[tuple[tuple[str, str], ...], BlockParser]] = {
    # Qwen3-Coder-style models sometimes drop the <tool_call> wrapper and open with <function= directly.
    "qwen3_coder": (
        (("<tool_call>", "</tool_call>"), ("<function=", "</function>")),
        parse_qwen3_coder_block,
    ),
    "hermes": ((("<tool_call>", "</tool_call>"),), parse_hermes_block),
}


def make_tool_stream(
    name: str, tools: list[dict[str, Any]] | None, max_calls: int | None = None
) -> ToolCallStream:
    if name not in PARSERS:
        raise ValueError(f"unknown tool call parser {name!r}; known: {', '.join(PARSERS)}")
    tags, parse = PARSERS[name]
    return ToolCallStream(tags, parse, tools or [], max_calls)

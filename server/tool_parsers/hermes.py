"""Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
from typing import Any


def parse_hermes_block(block: str, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    inner = block.removeprefix("<tool_call>").removesuffix("</tool_call>").strip()
    try:
        obj = json.loads(inner)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some fine-tunes double-encode the arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], args

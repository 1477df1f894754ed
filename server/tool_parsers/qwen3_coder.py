"""Qwen3.5 / Qwen3-Coder XML tool calls.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are text; each is converted by the type its tool's JSON schema declares (a string
stays as written, integers / numbers / booleans / objects / arrays are parsed), and values of unknown
parameters are parsed as JSON when they are JSON, else kept as strings.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _schema(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            return props if isinstance(props, dict) else {}
    return {}


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def convert(raw: str, schema: Any) -> Any:
    """A parameter's text as the value its schema asks for (the text itself when it does not fit)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = kind if isinstance(kind, list) else [kind]
    if "string" in kinds:
        return raw
    if raw.lower() in ("null", "none") and "null" in kinds:
        return None
    if "integer" in kinds and re.fullmatch(r"[-+]?\d+", raw):
        return int(raw)
    if "number" in kinds:
        try:
            f = float(raw)
            return int(f) if f.is_integer() and re.fullmatch(r"[-+]?\d+", raw) else f
        except ValueError:
            return raw
    if "boolean" in kinds and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if kinds == [None] or {"object", "array"} & set(kinds):
        return _json_or_text(raw)
    return raw


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def parse_qwen3_coder_block(block: str, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    m = _FUNCTION.search(block)
    if m is None:
        return None
    name = m.group(1).strip()
    if not name:
        return None
    body = m.group(2)
    props = _schema(tools, name)
    args: dict[str, Any] = {}
    for pm in _PARAM.finditer(body):
        key = pm.group(1).strip()
        args[key] = convert(_strip_one_newline(pm.group(2)), props.get(key))
    # Anything but whitespace outside <parameter> blocks means the call is not in this format.
    leftover = _PARAM.sub("", body).strip()
    if leftover:
        return None
    return name, args

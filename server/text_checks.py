"""Request-wide checks on decoded JSON that pydantic's per-field types cannot express.

JSON may carry ``"\\ud800"``: a lone UTF-16 surrogate decodes to a Python ``str`` that no UTF-8
encoder (the tokenizer's included) accepts, so every string in a request, keys included, is checked
once up front and the first offender is named in a 400.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_core import PydanticCustomError

_SURROGATE = re.compile("[\ud800-\udfff]")
LONE_SURROGATE = "lone_surrogate"
MAX_DEPTH = 64


def _has_surrogate(s: str) -> bool:
    # isascii() is a C-speed scan; only non-ASCII text pays for the regex.
    return not s.isascii() and _SURROGATE.search(s) is not None


_CONTAINERS = (dict, list, tuple)
_TEXT_OR_CONTAINERS = (str, dict, list, tuple)
_SCALARS = frozenset({int, float, bool, type(None)})


def find_surrogate(value: Any, path: str = "", depth: int = 0) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate, or None. Paths are built
    only for strings and containers, and a list of numbers is passed in one C-speed type scan: checking
    a 1,024-token prompt's ids took ~0.7 ms when every id got its own path (2026-12-02-s25.md)."""
    if isinstance(value, str):
        return path or "body" if _has_surrogate(value) else None
    if depth > MAX_DEPTH:
        return None  # pydantic's own depth limits refuse such bodies anyway
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _has_surrogate(key):
                return path or "body"
            if isinstance(item, _TEXT_OR_CONTAINERS):
                found = find_surrogate(item, f"{path}.{key}" if path else str(key), depth + 1)
                if found is not None:
                    return found
    elif isinstance(value, list | tuple):
        if _SCALARS.issuperset(map(type, value)):  # token ids: one C-speed pass
            return None
        for i, item in enumerate(value):
            if isinstance(item, str):
                if _has_surrogate(item):
                    return f"{path}[{i}]"
            elif isinstance(item, _CONTAINERS):
                found = find_surrogate(item, f"{path}[{i}]", depth + 1)
                if found is not None:
                    return found
    return None


def reject_surrogates(data: Any) -> Any:
    """A ``model_validator(mode="before")`` body: raise a 400-bound error naming the field."""
    where = find_surrogate(data)
    if where is not None:
        raise PydanticCustomError(
            LONE_SURROGATE,
            "{field} contains a lone UTF-16 surrogate, which is not valid Unicode text",
            {"field": where},
        )
    return data

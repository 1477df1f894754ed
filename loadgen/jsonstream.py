"""A streaming reader for a top-level JSON array, so a 600 MB ShareGPT dump is never held whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and the entry."""


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array without reading the whole file at once."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8-sig") as f:
        buf = f.read(chunk_chars)
        eof = len(buf) < chunk_chars
        consumed = 0  # characters dropped from the front of buf, for error offsets
        pos = 0

        def more(min_chars: int) -> bool:
            nonlocal buf, eof, pos, consumed
            if eof:
                return False
            if pos > len(buf) // 2:  # drop the parsed prefix so memory stays one chunk or two
                consumed += pos
                buf, pos = buf[pos:], 0
            new = f.read(max(chunk_chars, min_chars))
            eof = len(new) < max(chunk_chars, min_chars)
            buf += new
            return bool(new)

        def skip_ws() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not more(0):
                    return ""

        if not buf.strip():
            raise DatasetError(f"{path}: file is empty")
        c = skip_ws()
        if c != "[":
            raise DatasetError(
                f"{path}: expected a JSON array of conversations at the top level, found {c!r}"
            )
        pos += 1
        index = 0
        while True:
            c = skip_ws()
            if c == "]" and index == 0:
                return
            if c == "":
                raise DatasetError(f"{path}: entry {index}: file ends inside the top-level array")
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    # A value cut by the chunk boundary fails too: read more (growing the read so
                    # a long bad tail costs O(n log n), not O(n^2)) and retry before giving up.
                    if not more(len(buf) - pos):
                        raise DatasetError(
                            f"{path}: entry {index}: invalid JSON at character {consumed + e.pos}: {e.msg}"
                        ) from None
            pos = end
            yield obj
            index += 1
            c = skip_ws()
            if c == "]":
                return
            if c != ",":
                where = consumed + pos
                found = repr(c) if c else "end of file"
                raise DatasetError(
                    f"{path}: after entry {index - 1}: expected ',' or ']' at {where}, found {found}"
                )
            pos += 1

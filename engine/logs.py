"""One log format for both processes (API server and EngineCore): one JSON object per line on stderr.

The level comes from ``--log-level`` in the API process and from ``DELTASERVE_LOG_LEVEL`` in the
engine child, which inherits it from the parent's environment.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

LEVELS = ("debug", "info", "warning", "error", "critical")
LEVEL_ENV = "DELTASERVE_LOG_LEVEL"
# uvicorn attaches an ANSI-coloured copy of its messages; in JSON it is only noise.
_DROPPED = {"color_message"}


class JsonFormatter(logging.Formatter):
    """``extra={"request_id": ...}`` fields travel along as top-level keys."""

    _STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._STD and k not in _DROPPED})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str | int | None = None) -> None:
    """JSON on stderr for every logger; without a level, the inherited environment's or INFO."""
    if level is None:
        level = os.environ.get(LEVEL_ENV, "info")
    if isinstance(level, str):
        level = getattr(logging, level.upper(), logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []  # propagate to the root's JSON handler only

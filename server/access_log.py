"""One access-log line per HTTP request, whatever answered it (route, auth, limits, errors): request
id, method, route, status, latency, and the prompt/completion token counts when a route filled them.

Pure ASGI so that client disconnects still reach the routes (BaseHTTPMiddleware would hide them).
Routes record their own id and usage in ``scope["state"]["access"]`` (see :func:`record`).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("deltaserve.access")
_KEY = "access"
_ARRIVAL = "arrival"


def arrival(scope: Scope) -> float | None:
    """time.monotonic() when this request reached the app (the outermost middleware), or None."""
    state = scope.get("state")
    value = state.get(_ARRIVAL) if isinstance(state, dict) else None
    return value if isinstance(value, float) else None


def record(scope: Scope, **fields: Any) -> None:
    """Add fields (request_id, prompt_tokens, completion_tokens) to this request's access line."""
    state = scope.get("state")
    if isinstance(state, dict) and isinstance(state.get(_KEY), dict):
        state[_KEY].update(fields)


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        fields: dict[str, Any] = {"request_id": f"req-{uuid.uuid4().hex[:16]}"}
        state = scope.setdefault("state", {})
        state[_KEY] = fields
        state[_ARRIVAL] = t0  # where a route's TTFT starts (server.metrics.RequestTimer)
        status = 0

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            logger.info(
                "request",
                extra={
                    **fields,
                    "method": scope.get("method"),
                    "route": scope.get("path"),
                    # 499: the client left before any response started (nginx's convention).
                    "status": status or 499,
                    "latency_ms": round((time.monotonic() - t0) * 1000, 1),
                },
            )

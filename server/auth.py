"""API-key check as a pure ASGI middleware, so it covers every route, including ones added later and
404s (an unauthenticated client cannot probe which paths exist).

The only exemption is the exact path ``/health`` after the server's own normalisation; tricks such as
``//health``, ``/health/``, ``/health?x`` on another route, or a forged Host header change nothing,
because the decision uses ``scope["path"]`` only, which is what routing uses too.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError, send_error

PUBLIC_PATHS = frozenset({"/health"})


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str = "") -> None:
        self.app = app
        self._key = api_key.encode() if api_key else b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._key or scope["type"] not in ("http", "websocket") or self._public(scope):
            await self.app(scope, receive, send)
            return
        if not self._authorized(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            err = APIError(
                401,
                "Invalid or missing API key",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await send_error(send, err)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _public(scope: Scope) -> bool:
        # root_path would let a proxy prefix shift the route; we serve at the root only.
        return scope.get("path") in PUBLIC_PATHS and not scope.get("root_path")

    def _authorized(self, scope: Scope) -> bool:
        values = [v for k, v in scope.get("headers", []) if k == b"authorization"]
        if len(values) != 1:
            # Zero or several Authorization headers: refuse rather than guess which one counts.
            return False
        scheme, _, token = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        # compare_digest runs in time independent of where the first difference is.
        return hmac.compare_digest(token.strip(), self._key)

"""OpenAI-shaped errors: one JSON shape for every failure, and the body-size limit that raises 413.

Error messages are short and name the offending field; they never echo the request back (a 10 MB
prompt must not come back in a 400) and never carry paths, addresses or tracebacks.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.frontend.errors import EngineDeadError, InvalidRequestError, QueueFullError
from engine.frontend.tokenizer import ChatTemplateError
from server.text_checks import LONE_SURROGATE

logger = logging.getLogger("deltaserve.server")

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}
# Pydantic's union members show up in error locations ("prompt", "list[int]", 0); they are not fields.
CLOSE = {"Connection": "close"}
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "StrictInt"}


class APIError(Exception):
    """An error a route raises on purpose; rendered as the OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _STATUS_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class PayloadTooLarge(HTTPException):
    """Raised while the body is read; an HTTPException so that FastAPI's body parser re-raises it as is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"Request body exceeds the limit of {limit} bytes")


def from_exception(exc: BaseException) -> APIError:
    """Map engine-side exceptions (raised by AsyncLLM) and our own to an APIError."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):  # ContextLengthError and RequestRejectedError too
        return APIError(400, exc.message[:500], param=exc.param, code=exc.code)
    if isinstance(exc, ChatTemplateError):
        return APIError(400, f"Chat template could not be rendered: {str(exc)[:300]}", param="messages")
    if isinstance(exc, QueueFullError):
        return APIError(
            503, "Server is overloaded, retry later", code="queue_full", headers={"Retry-After": "1"}
        )
    if isinstance(exc, EngineDeadError):
        return APIError(503, "Engine is not running", code="engine_dead")
    if isinstance(exc, TimeoutError):
        return APIError(504, "Request timed out", code="timeout")
    if isinstance(exc, ClientDisconnect):
        # The client left (or was cut off) while its body was read: nobody reads this answer.
        return APIError(400, "Client disconnected before the request body was complete")
    logger.exception("unhandled error", exc_info=exc)
    # Starlette re-raises after a 500 and uvicorn then drops the connection: say so, so that a client
    # with requests pipelined behind this one resends them instead of waiting forever.
    return APIError(500, "Internal server error", type="server_error", code="internal_error", headers=CLOSE)


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif isinstance(item, str) and (item in _TYPE_TAGS or "[" in item):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or None


def validation_message(request: Request, errors: list[dict[str, Any]]) -> APIError:
    """One short 400 from pydantic's errors: the first error, its field, never its input."""
    if not errors:
        return APIError(400, "Invalid request")
    first = errors[0]
    kind = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if kind == "json_invalid":
        return APIError(400, "Request body is not valid JSON")
    if kind == LONE_SURROGATE:
        field = str((first.get("ctx") or {}).get("field", "body"))
        return APIError(400, str(first.get("msg", "invalid text"))[:300], param=field)
    if loc == ("body",):
        if kind == "missing":
            return APIError(400, "Request body is required")
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type and content_type != "application/json" and not content_type.endswith("+json"):
            return APIError(400, "Content-Type must be application/json")
        if kind in ("model_attributes_type", "model_type", "dict_type"):
            return APIError(400, "Request body must be a JSON object")
    param = _loc_to_param(loc)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")[:300]
    return APIError(400, f"{param}: {msg}" if param else msg, param=param)


def install_error_handlers(app: FastAPI) -> None:
    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_message(request, list(exc.errors())).response()

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else "Request failed"
        if exc.status_code == 400 and "parsing the body" in detail:
            detail = "Request body could not be parsed"
        headers = dict(exc.headers) if exc.headers else None
        return APIError(exc.status_code, detail, headers=headers).response()

    async def on_known(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    for cls in (APIError, InvalidRequestError, ChatTemplateError, QueueFullError):
        app.add_exception_handler(cls, on_known)
    app.add_exception_handler(EngineDeadError, on_known)
    app.add_exception_handler(TimeoutError, on_known)
    app.add_exception_handler(Exception, on_known)


async def send_error(send: Send, err: APIError, close: bool = False) -> None:
    """Write an error response straight to ASGI ``send`` (for pure ASGI middlewares)."""
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (err.headers or {}).items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """413 for bodies over the limit: up front from Content-Length, and again while the body streams in
    (chunked uploads have no Content-Length). Pure ASGI so that disconnects still reach the routes."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self._too_large = APIError(413, f"Request body exceeds {max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await send_error(send, APIError(400, "Invalid Content-Length header"), close=True)
                    return
                if declared > self.max_bytes:
                    await send_error(send, self._too_large, close=True)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise PayloadTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except PayloadTooLarge:
            if not started:
                await send_error(send, self._too_large, close=True)

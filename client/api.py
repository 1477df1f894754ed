"""One async client for a deltaserve (or any OpenAI-compatible) server: completions and chat, whole or
streamed, with typed results and typed errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx


class APIError(Exception):
    """An error the server answered in the OpenAI shape (or a transport-level failure, status 0)."""

    def __init__(
        self, status: int, type: str, message: str, param: str | None = None, code: Any = None
    ) -> None:
        super().__init__(f"{status} {type}: {message}")
        self.status = status
        self.type = type
        self.message = message
        self.param = param
        self.code = code

    @classmethod
    def from_body(cls, status: int, body: Any) -> APIError:
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            return cls(status, "unknown_error", str(body)[:200])
        return cls(
            int(err.get("status", status)),
            str(err.get("type", "unknown_error")),
            str(err.get("message", "")),
            err.get("param"),
            err.get("code"),
        )


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def parse(cls, obj: dict[str, Any] | None) -> Usage | None:
        if not obj:
            return None
        return cls(obj.get("prompt_tokens", 0), obj.get("completion_tokens", 0), obj.get("total_tokens", 0))


@dataclass(frozen=True)
class CompletionChoice:
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


@dataclass(frozen=True)
class Completion:
    id: str
    model: str
    created: int
    choices: list[CompletionChoice]
    usage: Usage | None

    @property
    def text(self) -> str:
        return self.choices[0].text


@dataclass(frozen=True)
class ChatChoice:
    index: int
    role: str
    content: str
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChatCompletion:
    id: str
    model: str
    created: int
    choices: list[ChatChoice]
    usage: Usage | None

    @property
    def content(self) -> str:
        return self.choices[0].content


@dataclass(frozen=True)
class ChunkChoice:
    """One choice's piece of a stream: ``text`` for completions, ``content`` (and ``role``) for chat."""

    index: int
    text: str = ""
    role: str | None = None
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


@dataclass(frozen=True)
class StreamChunk:
    id: str
    model: str
    choices: list[ChunkChoice] = field(default_factory=list)
    usage: Usage | None = None


class DeltaClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> DeltaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # Whole responses ------------------------------------------------------------------------------

    async def complete(
        self, prompt: str | Sequence[int] | Sequence[str], *, max_tokens: int | None = 16, **params: Any
    ) -> Completion:
        body = await self._post("/v1/completions", _body(prompt=prompt, max_tokens=max_tokens, **params))
        choices = [
            CompletionChoice(c["index"], c.get("text", ""), c.get("finish_reason"), c.get("logprobs"))
            for c in body["choices"]
        ]
        return Completion(body["id"], body["model"], body["created"], choices, Usage.parse(body.get("usage")))

    async def chat(
        self, messages: Sequence[dict[str, Any]], *, max_tokens: int | None = None, **params: Any
    ) -> ChatCompletion:
        body = await self._post(
            "/v1/chat/completions", _body(messages=list(messages), max_tokens=max_tokens, **params)
        )
        choices = [
            ChatChoice(
                c["index"],
                c["message"].get("role", "assistant"),
                c["message"].get("content") or "",
                c.get("finish_reason"),
                c.get("logprobs"),
            )
            for c in body["choices"]
        ]
        return ChatCompletion(
            body["id"], body["model"], body["created"], choices, Usage.parse(body.get("usage"))
        )

    # Streams --------------------------------------------------------------------------------------

    async def stream_complete(
        self, prompt: str | Sequence[int] | Sequence[str], *, max_tokens: int | None = 16, **params: Any
    ) -> AsyncIterator[StreamChunk]:
        body = _body(prompt=prompt, max_tokens=max_tokens, stream=True, **params)
        async for obj in self._stream("/v1/completions", body):
            yield _chunk(obj, chat=False)

    async def stream_chat(
        self, messages: Sequence[dict[str, Any]], *, max_tokens: int | None = None, **params: Any
    ) -> AsyncIterator[StreamChunk]:
        body = _body(messages=list(messages), max_tokens=max_tokens, stream=True, **params)
        async for obj in self._stream("/v1/chat/completions", body):
            yield _chunk(obj, chat=True)

    # Small utilities ------------------------------------------------------------------------------

    async def models(self) -> list[str]:
        return [m["id"] for m in (await self._get("/v1/models"))["data"]]

    async def tokenize(self, prompt: str) -> list[int]:
        return (await self._post("/tokenize", {"prompt": prompt}))["tokens"]

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return (await self._post("/detokenize", {"tokens": list(tokens)}))["prompt"]

    async def health(self) -> bool:
        try:
            return (await self._http.get("/health")).status_code == 200
        except httpx.HTTPError:
            return False

    # Plumbing -------------------------------------------------------------------------------------

    async def _get(self, path: str) -> Any:
        return _json_or_raise(await self._send("GET", path))

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return _json_or_raise(await self._send("POST", path, json=body))

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise APIError(0, "connection_error", f"{type(exc).__name__}: {exc}") from exc

    async def _stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            async with self._http.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    _json_or_raise(resp)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    obj = json.loads(data)
                    if "error" in obj:
                        raise APIError.from_body(500, obj)
                    yield obj
        except httpx.HTTPError as exc:
            raise APIError(0, "connection_error", f"{type(exc).__name__}: {exc}") from exc
        raise APIError(0, "connection_error", "stream ended without [DONE]")


def _body(**fields: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items() if v is not None}


def _json_or_raise(resp: httpx.Response) -> Any:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code >= 400:
        if body is None:
            raise APIError(resp.status_code, "http_error", resp.text[:200])
        raise APIError.from_body(resp.status_code, body)
    if body is None:
        raise APIError(resp.status_code, "invalid_response", "response is not JSON")
    return body


def _chunk(obj: dict[str, Any], chat: bool) -> StreamChunk:
    choices = []
    for c in obj.get("choices", []):
        if chat:
            delta = c.get("delta") or {}
            text, role = delta.get("content") or "", delta.get("role")
        else:
            text, role = c.get("text", ""), None
        choices.append(ChunkChoice(c.get("index", 0), text, role, c.get("finish_reason"), c.get("logprobs")))
    return StreamChunk(obj.get("id", ""), obj.get("model", ""), choices, Usage.parse(obj.get("usage")))

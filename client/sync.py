"""A thin blocking wrapper over DeltaClient for scripts and notebooks (one private event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from client.api import ChatCompletion, Completion, DeltaClient, StreamChunk


class SyncDeltaClient:
    def __init__(
        self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 600.0
    ):
        # One loop for the client's whole life: httpx's connection pool is bound to the loop that used it.
        self._runner = asyncio.Runner()
        self._client = DeltaClient(base_url, api_key=api_key, timeout=timeout)

    def __enter__(self) -> SyncDeltaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._runner.run(self._client.aclose())
        self._runner.close()

    def complete(self, prompt: str | Sequence[int] | Sequence[str], **params: Any) -> Completion:
        return self._runner.run(self._client.complete(prompt, **params))

    def chat(self, messages: Sequence[dict[str, Any]], **params: Any) -> ChatCompletion:
        return self._runner.run(self._client.chat(messages, **params))

    def stream_complete(
        self, prompt: str | Sequence[int] | Sequence[str], **params: Any
    ) -> Iterator[StreamChunk]:
        return self._iterate(self._client.stream_complete(prompt, **params))

    def stream_chat(self, messages: Sequence[dict[str, Any]], **params: Any) -> Iterator[StreamChunk]:
        return self._iterate(self._client.stream_chat(messages, **params))

    def models(self) -> list[str]:
        return self._runner.run(self._client.models())

    def _iterate(self, agen: AsyncIterator[StreamChunk]) -> Iterator[StreamChunk]:
        try:
            while True:
                try:
                    yield self._runner.run(agen.__anext__())  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
        finally:
            # Closing the stream early closes the HTTP response, which aborts the request server-side.
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                self._runner.run(aclose())

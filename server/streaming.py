"""Consuming engine output streams: merging the choices of one request, watching for the client going
away, deadlines, and SSE framing.

Every path that stops reading (disconnect, timeout, error, normal end) goes through
``MergedOutputs.aclose``, which cancels the per-choice readers; cancelling an AsyncLLM iterator aborts
its request in the engine, which is what frees KV blocks and state slots.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request

if TYPE_CHECKING:
    from engine.frontend.async_llm import RequestOutput

T = TypeVar("T")
# Background closers must be referenced until done: the loop only keeps weak references to tasks.
_CLOSERS: set[asyncio.Task[None]] = set()
SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was complete."""


class MergedOutputs:
    """One stream of (choice index, output) from the iterators of one HTTP request, in arrival order.

    Each iterator is read by its own task so that a slow choice never holds back another; errors are
    forwarded in order and raised by ``next``.
    """

    def __init__(self, iterators: Sequence[AsyncIterator[RequestOutput]]) -> None:
        self._iterators = list(iterators)
        self._queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()
        self._open = len(self._iterators)
        self._tasks = [asyncio.create_task(self._pump(i, it)) for i, it in enumerate(self._iterators)]
        self._closed = False

    async def _pump(self, index: int, it: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in it:
                self._queue.put_nowait((index, out))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # forwarded to the reader, who decides what the client sees
            self._queue.put_nowait((index, exc))
            return
        self._queue.put_nowait((index, None))

    async def next(self, timeout: float | None = None) -> tuple[int, RequestOutput] | None:
        """The next output, or None when every choice has finished. Raises TimeoutError past ``timeout``."""
        while self._open:
            if timeout is not None and timeout <= 0:
                raise TimeoutError
            # Not asyncio.wait_for: on Python 3.11 it returns an item that arrived in the same loop turn
            # as a cancellation and swallows the cancellation, so a hung-up request generated on.
            async with asyncio.timeout(timeout):
                index, item = await self._queue.get()
            if item is None:
                self._open -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            return index, item
        return None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Let readers that were created but never ran start first: a wave iterator that was submitted
        # but never iterated must still see its cancellation to abort its request.
        await asyncio.sleep(0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for it in self._iterators:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # the request is being torn down; nothing useful to report
                    pass

    async def close_shielded(self) -> None:
        """Close from a ``finally`` that may itself be cancelled (anyio re-cancels every await in a
        cancelled scope): the close runs in its own task and finishes even if this await is cut short."""
        task = asyncio.ensure_future(self.aclose())
        _CLOSERS.add(task)
        task.add_done_callback(_CLOSERS.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                raise


class Deadline:
    """The per-request timeout as an absolute monotonic time."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds if seconds > 0 else None

    def remaining(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()


async def wait_disconnect(request: Request) -> None:
    """Returns when the client disconnects. Only call once the body has been read."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run ``work`` but cancel it (aborting its engine requests) as soon as the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected  # the finally below cancels the work
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def error_event(status: int, message: str, type_: str, code: str | None = None) -> bytes:
    return sse({"error": {"message": message, "type": type_, "param": None, "code": code, "status": status}})

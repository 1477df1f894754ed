"""How the API process talks to EngineCore: over ZeroMQ to a child process, or in-process on a thread.

Both clients have one interface (:class:`EngineCoreClient`): fire-and-forget inputs, and one async
output stream that raises :class:`EngineDeadError` once the engine is gone (never hangs).

Nothing here blocks the event loop: MPClient's sends go through a bounded backlog that an I/O thread
drains into the socket, so a paused engine (SIGSTOP, a stuck GPU, a debugger) fills the backlog and
new requests get :class:`QueueFullError` (503) while /health keeps answering. Aborts are never
refused (each frees what an admitted request holds): they join the same ordered backlog, merged with
an abort already waiting at its end, so an abort never overtakes the wave that added its request.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Sequence
from typing import Protocol

import zmq

from engine.config import EngineConfig
from engine.core.engine_core import EngineCore, run_busy_loop, run_engine_core
from engine.frontend.errors import EngineDeadError, QueueFullError
from engine.messages import (
    AbortRequests,
    AddRequests,
    EngineInput,
    EngineOutputMsg,
    ReadyInfo,
    Shutdown,
    UtilityRequest,
    decode_output,
    decode_ready,
    encode,
)
from engine.worker.step import Runner

logger = logging.getLogger("deltaserve.client")

INPUT_BACKLOG = 1024
"""Requests (in waves) plus utility calls waiting for the engine's socket beyond which more are refused."""
ZMQ_SEND_HWM = 64
"""ZeroMQ's own queue on the input socket is kept short: the backlog above is the bound that counts."""


class EngineCoreClient(Protocol):
    ready_info: ReadyInfo

    def add_requests(self, wave: AddRequests) -> None: ...
    def abort(self, request_ids: Sequence[str]) -> None: ...
    def utility(self, call: UtilityRequest) -> None: ...
    def input_full(self) -> bool: ...
    async def get_output(self) -> EngineOutputMsg: ...
    @property
    def is_alive(self) -> bool: ...
    def shutdown(self) -> None: ...


class _OutputStream:
    """Thread -> event loop bridge; a dead marker stays at the end so every later reader sees it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._q: asyncio.Queue[EngineOutputMsg | EngineDeadError] = asyncio.Queue()

    def put_threadsafe(self, item: EngineOutputMsg | EngineDeadError) -> None:
        try:
            self._loop.call_soon_threadsafe(self._q.put_nowait, item)
        except RuntimeError:  # loop already closed: nobody is listening any more
            pass

    async def get(self) -> EngineOutputMsg:
        item = await self._q.get()
        if isinstance(item, EngineDeadError):
            self._q.put_nowait(item)
            raise item
        return item


class InprocClient:
    """EngineCore on a background thread of this process: same interface, no sockets (tests, offline)."""

    def __init__(
        self, config: EngineConfig, loop: asyncio.AbstractEventLoop, runner: Runner | None = None
    ) -> None:
        self.core = EngineCore(config, runner)
        self.ready_info = self.core.ready_info()
        self._stream = _OutputStream(loop)
        self._inbox: queue.Queue[EngineInput] = queue.Queue()
        self._stop = threading.Event()
        self._alive = True
        self._thread = threading.Thread(target=self._run, name="engine-core", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rc: int | str
        try:
            rc = run_busy_loop(self.core, self._inbox, self._stream.put_threadsafe, self._stop.is_set, 0.05)
        except BaseException as e:  # a bug in the loop itself must still wake every waiter
            logger.exception("in-process engine loop crashed")
            rc = f"{type(e).__name__}: {e}"
        self._alive = False
        if not self._stop.is_set():
            self._stream.put_threadsafe(EngineDeadError(f"engine loop exited ({rc})"))

    @property
    def is_alive(self) -> bool:
        return self._alive

    def _send(self, msg: EngineInput) -> None:
        if not self._alive:
            raise EngineDeadError("engine is not running")
        self._inbox.put(msg)

    def add_requests(self, wave: AddRequests) -> None:
        self._send(wave)

    def abort(self, request_ids: Sequence[str]) -> None:
        if self._alive:
            self._inbox.put(AbortRequests(list(request_ids)))

    def utility(self, call: UtilityRequest) -> None:
        self._send(call)

    def input_full(self) -> bool:
        return False  # an in-process queue.Queue: put() never blocks

    async def get_output(self) -> EngineOutputMsg:
        return await self._stream.get()

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(Shutdown())
        self._thread.join(timeout=10)
        self._alive = False


class MPClient:
    """EngineCore in a spawned child process; ZeroMQ ipc:// sockets in a private 0700 directory."""

    def __init__(
        self,
        config: EngineConfig,
        loop: asyncio.AbstractEventLoop,
        runner_factory: str | None = None,
        ready_timeout_s: float = 600.0,
    ) -> None:
        self._dir = tempfile.mkdtemp(prefix="deltaserve-")  # mkdtemp: owner-only (0700)
        os.chmod(self._dir, 0o700)
        addr = {k: f"ipc://{self._dir}/{k}" for k in ("to_engine", "from_engine", "ready")}
        self._ctx = zmq.Context()
        self._to_engine = self._ctx.socket(zmq.PUSH)
        self._to_engine.setsockopt(zmq.LINGER, 0)
        self._to_engine.setsockopt(zmq.SNDHWM, ZMQ_SEND_HWM)
        self._to_engine.bind(addr["to_engine"])
        self._from_engine = self._ctx.socket(zmq.PULL)
        self._from_engine.setsockopt(zmq.LINGER, 0)
        self._from_engine.bind(addr["from_engine"])
        # In order: encoded waves/utility calls, and lists of request ids to abort (encoded when sent).
        self._backlog: collections.deque[tuple[bytes, int] | list[str]] = collections.deque()
        self._refusable = 0  # requests and calls in the backlog (aborts excluded): what INPUT_BACKLOG bounds
        self._backlog_lock = threading.Lock()
        # Held by whoever sends on the input socket (zmq sockets are not thread-safe); the event loop
        # only ever tries it without waiting.
        self._socket_lock = threading.Lock()
        self._wake = threading.Event()
        self._stream = _OutputStream(loop)
        self._closing = threading.Event()
        self._dead: str | None = None
        self._threads: list[threading.Thread] = []

        ready = self._ctx.socket(zmq.PULL)
        ready.setsockopt(zmq.LINGER, 0)
        ready.bind(addr["ready"])
        self.proc = multiprocessing.get_context("spawn").Process(
            target=run_engine_core,
            args=(config, addr["to_engine"], addr["from_engine"], addr["ready"]),
            kwargs={"runner_factory": runner_factory, "parent_pid": os.getpid()},
            name="deltaserve-engine",
            daemon=True,
        )
        try:
            self.proc.start()
            self.ready_info = self._wait_ready(ready, ready_timeout_s)
        except BaseException:
            ready.close()
            self.shutdown()
            raise
        ready.close()
        loops = (
            (self._recv_loop, "engine-output"),
            (self._watch, "engine-watch"),
            (self._send_loop, "engine-input"),
        )
        for target, name in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _wait_ready(self, sock: zmq.Socket, timeout_s: float) -> ReadyInfo:
        waited = 0.0
        while not sock.poll(100):
            waited += 0.1
            if not self.proc.is_alive():
                raise EngineDeadError(f"engine exited during start-up (exit code {self.proc.exitcode})")
            if waited >= timeout_s:
                raise EngineDeadError(f"engine not ready after {timeout_s:.0f} s")
        info = decode_ready(sock.recv())
        if info.error:
            raise EngineDeadError(f"engine failed to start: {info.error}")
        return info

    def _watch(self) -> None:
        self.proc.join()  # the process sentinel: returns the moment the child is gone
        if not self._closing.is_set():
            self._dead = f"engine process died (exit code {self.proc.exitcode})"
            logger.error(self._dead)

    def _recv_loop(self) -> None:
        # Deliver every frame the engine sent before dying (its error outputs) before the dead marker.
        while not self._closing.is_set():
            if self._from_engine.poll(100):
                frame = self._from_engine.recv()
                try:
                    self._stream.put_threadsafe(decode_output(frame))
                except Exception as e:
                    logger.warning("dropped a malformed frame from the engine: %s", e)
            elif self._dead is not None:
                self._stream.put_threadsafe(EngineDeadError(self._dead))
                return

    @property
    def is_alive(self) -> bool:
        return self._dead is None and not self._closing.is_set() and self.proc.is_alive()

    def _send_loop(self) -> None:
        """The only user of the input socket while running: the backlog, in order."""
        while not self._closing.is_set():
            self._wake.wait(0.1)
            self._wake.clear()
            while not self._closing.is_set():
                with self._socket_lock:
                    with self._backlog_lock:
                        if not self._backlog:
                            break
                        item = self._backlog.popleft()
                        if not isinstance(item, list):
                            self._refusable -= item[1]
                    frame = encode(AbortRequests(item)) if isinstance(item, list) else item[0]
                    if not self._push(frame):
                        return

    def _try_direct(self, frame: bytes) -> bool:
        """The event loop's fast path, which never waits: when nothing is queued ahead and the I/O
        thread is not sending, one non-blocking send (a thread hand-off per message cost the soak
        test a third of its requests). False: the caller queues the frame instead."""
        if not self._socket_lock.acquire(blocking=False):
            return False
        try:
            with self._backlog_lock:
                if self._backlog:
                    return False  # order: never overtake what waits
            self._to_engine.send(frame, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False
        finally:
            self._socket_lock.release()

    def _push(self, frame: bytes) -> bool:
        """Send one frame, waiting (on this thread) while the engine does not read; False once closing."""
        while True:
            try:
                self._to_engine.send(frame, zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                if self._closing.is_set() or self._dead is not None:
                    return False
                self._to_engine.poll(100, zmq.POLLOUT)

    def _send(self, msg: EngineInput) -> None:
        if not self.is_alive:
            raise EngineDeadError(self._dead or "engine is not running")
        frame = encode(msg)
        if not self._try_direct(frame):
            self._enqueue(frame, len(msg.requests) if isinstance(msg, AddRequests) else 1)

    def _enqueue(self, frame: bytes, weight: int) -> None:
        with self._backlog_lock:
            if self._refusable >= INPUT_BACKLOG:
                raise QueueFullError(
                    f"the engine is not reading its input ({self._refusable} requests waiting); retry later"
                )
            self._backlog.append((frame, weight))
            self._refusable += weight
        self._wake.set()

    def input_full(self) -> bool:
        return self._refusable >= INPUT_BACKLOG

    def add_requests(self, wave: AddRequests) -> None:
        self._send(wave)

    def abort(self, request_ids: Sequence[str]) -> None:
        if self.is_alive and not self._try_direct(encode(AbortRequests(list(request_ids)))):
            with self._backlog_lock:
                if self._backlog and isinstance(self._backlog[-1], list):
                    self._backlog[-1].extend(request_ids)
                else:
                    self._backlog.append(list(request_ids))
            self._wake.set()

    def utility(self, call: UtilityRequest) -> None:
        self._send(call)

    async def get_output(self) -> EngineOutputMsg:
        return await self._stream.get()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Ask politely, then terminate, then kill; reap the child and remove the socket directory."""
        if self._closing.is_set():
            return
        alive = self.is_alive
        self._closing.set()
        self._wake.set()
        for t in self._threads:
            if t.name == "engine-input":
                t.join(timeout=2.0)  # after this, the input socket is ours alone
        if alive:
            try:
                self._to_engine.send(encode(Shutdown()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        if self.proc.pid is not None:
            self.proc.join(timeout_s)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(2.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        for t in self._threads:
            t.join(timeout=2.0)
        self._to_engine.close()
        self._from_engine.close()
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

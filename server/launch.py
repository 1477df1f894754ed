"""Running the server: the EngineCore process via AsyncLLM, uvicorn with bounded connections, JSON logs,
and a graceful SIGTERM (stop admitting, drain, shut the engine down, exit 0)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.config import EngineConfig, ServerConfig
from server.app import build_app
from server.state import ServerState

logger = logging.getLogger("deltaserve.server")

DRAIN_TIMEOUT_S = 30.0
"""How long SIGTERM waits for in-flight requests before closing anyway."""
HEADER_TIMEOUT_S = 10.0
"""A client must deliver a complete request head within this long (slow-loris guard)."""
MAX_HEADER_BYTES = 64 * 1024
"""Largest request head; beyond it h11 rejects the request and the connection is closed."""
MAX_CONNECTIONS = 2048
"""Open connections plus running requests beyond which uvicorn answers 503."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra={"request_id": ...}`` fields travel along."""

    _STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._STD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline on the request head: uvicorn itself only times out idle
    keep-alive connections, so a client trickling header bytes could hold a connection forever."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._head_timeout)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            if self.conn.trailing_data[0]:
                self._arm_head_timer()  # part of a head is buffered: the clock runs until it completes
        else:
            self._disarm_head_timer()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)


class DrainingServer(uvicorn.Server):
    """First SIGTERM/SIGINT: answer new requests 503, wait for in-flight ones (up to the drain timeout),
    then let uvicorn close. A second signal forces exit. Signals are not re-raised afterwards (uvicorn
    does that by default), so a drained shutdown exits 0."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.state.draining or self._loop is None:
            self.should_exit = True
            self.force_exit = True
            return
        self.state.draining = True
        self._loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        self._drain_task = asyncio.ensure_future(self._drain(sig))

    async def _drain(self, sig: int) -> None:
        logger.info("draining", extra={"signal": sig, "in_flight": self.state.in_flight})
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self.state.idle.wait(), self.drain_timeout_s)
        except TimeoutError:
            logger.warning(
                "drain timeout, closing with requests in flight", extra={"left": self.state.in_flight}
            )
        logger.info("drained", extra={"seconds": round(time.monotonic() - t0, 3)})
        self.should_exit = True


async def serve(
    engine_config: EngineConfig, server_config: ServerConfig, drain_timeout_s: float = DRAIN_TIMEOUT_S
) -> None:
    from engine.frontend.async_llm import AsyncLLM

    llm = await AsyncLLM.create(engine_config, server_config, in_process=False)
    try:
        app = build_app(llm, server_config)
        config = uvicorn.Config(
            app,
            host=server_config.host,
            port=server_config.port,
            http=GuardedH11Protocol,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            timeout_keep_alive=5,
            limit_concurrency=MAX_CONNECTIONS,
            backlog=1024,
            timeout_graceful_shutdown=int(drain_timeout_s) + 5,
            log_config=None,
            access_log=False,
            server_header=False,
            lifespan="on",
        )
        server = DrainingServer(config, app.state.ds, drain_timeout_s)
        logger.info(
            "serving",
            extra={"host": server_config.host, "port": server_config.port, "model": llm.model_name},
        )
        await server.serve()
    finally:
        await llm.shutdown()
        logger.info("engine shut down")


def run_server(engine_config: EngineConfig, server_config: ServerConfig) -> int:
    """Blocking entry point for the CLI; returns the process exit code."""
    configure_logging()
    # A SIGTERM that lands before uvicorn installs its handlers must not kill us without cleanup.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        asyncio.run(serve(engine_config, server_config))
    except KeyboardInterrupt:
        return 0
    return 0

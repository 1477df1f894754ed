"""Running the server: the EngineCore process via AsyncLLM, uvicorn with bounded connections, JSON logs,
a graceful SIGTERM (stop admitting, drain, shut the engine down, exit 0), and an exit with status 1
once the engine has died (after the in-flight requests got their errors), so a supervisor restarts
the whole server: the engine is not restarted in place, as in vLLM."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType
from typing import Any

import uvicorn

from engine.config import EngineConfig, ServerConfig
from engine.logs import configure_logging
from server.app import build_app
from server.http_limits import H11_BACKSTOP_BYTES, cut_unadmitted, guarded_protocol
from server.listen import PortInUseError, bind_socket
from server.state import ServerState

logger = logging.getLogger("deltaserve.server")

DRAIN_TIMEOUT_S = 30.0
"""How long SIGTERM waits for in-flight requests before closing anyway."""
ENGINE_DEAD_GRACE_S = 5.0
"""After the engine dies, how long failed requests get to deliver their errors before the exit."""
ENGINE_DEAD_MIN_S = 1.0
"""...and the least time the dead server keeps answering /ready (503) first, so a readiness probe
or load balancer polling about once a second sees it go unready rather than only a refused connection."""
EXIT_ENGINE_DEAD = 1
"""Exit status once the engine died: non-zero so that a supervisor (docker, systemd, k8s) restarts us."""
EXIT_PORT_BUSY = 2


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
        self.engine_died = False

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
        # Clients still sending their request were never admitted: cut them now instead of waiting
        # out their body timeout inside the drain.
        cut = cut_unadmitted(self.server_state.connections)
        logger.info("draining", extra={"signal": sig, "in_flight": self.state.in_flight, "cut": cut})
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self.state.idle.wait(), self.drain_timeout_s)
        except TimeoutError:
            logger.warning(
                "drain timeout, closing with requests in flight", extra={"left": self.state.in_flight}
            )
        logger.info("drained", extra={"seconds": round(time.monotonic() - t0, 3)})
        self.should_exit = True

    async def exit_when_engine_dies(self, llm: Any, poll_s: float = 0.2) -> None:
        """Engine gone: stop admitting, give in-flight requests a moment to deliver their errors (the
        AsyncLLM fails them at once), then exit non-zero."""
        while llm.is_alive or self.state.draining:
            await asyncio.sleep(poll_s)
        self.engine_died = True
        self.state.draining = True
        died = time.monotonic()
        logger.error("engine died; exiting so that a supervisor restarts the server")
        try:
            await asyncio.wait_for(self.state.idle.wait(), ENGINE_DEAD_GRACE_S)
        except TimeoutError:
            pass
        await asyncio.sleep(max(0.0, died + ENGINE_DEAD_MIN_S - time.monotonic()))
        self.should_exit = True


async def serve(
    engine_config: EngineConfig,
    server_config: ServerConfig,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
    sock: socket.socket | None = None,
) -> int:
    """Serve until SIGTERM (returns 0) or the engine's death (returns EXIT_ENGINE_DEAD)."""
    from engine.frontend.async_llm import AsyncLLM

    sock = sock or bind_socket(server_config.host, server_config.port)
    llm = await AsyncLLM.create(engine_config, server_config, in_process=False)
    try:
        app = build_app(llm, server_config)
        cap = server_config.max_connections
        config = uvicorn.Config(
            app,
            host=server_config.host,
            port=server_config.port,
            http=guarded_protocol(server_config.body_read_timeout_s, cap),
            h11_max_incomplete_event_size=H11_BACKSTOP_BYTES,
            timeout_keep_alive=5,
            # Our protocol sheds stalled connections at ``cap``; uvicorn's 503 is the last resort for
            # when every connection is a running request.
            limit_concurrency=cap + 64,
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
        watcher = asyncio.create_task(server.exit_when_engine_dies(llm))
        try:
            await server.serve(sockets=[sock])
        finally:
            watcher.cancel()
        return EXIT_ENGINE_DEAD if server.engine_died else 0
    finally:
        await llm.shutdown()
        sock.close()
        logger.info("engine shut down")


def run_server(
    engine_config: EngineConfig,
    server_config: ServerConfig,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> int:
    """Blocking entry point for the CLI; returns the process exit code."""
    configure_logging(log_level)
    if sock is None:
        try:
            sock = bind_socket(server_config.host, server_config.port)
        except PortInUseError as e:
            logger.error(str(e))
            return EXIT_PORT_BUSY
    # A SIGTERM that lands before uvicorn installs its handlers must not kill us without cleanup.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return asyncio.run(serve(engine_config, server_config, sock=sock))
    except KeyboardInterrupt:
        return 0

"""What every route reads: ServerState (hung on ``app.state.ds``) and the EngineClient protocol it holds.

Routes import from here, never from ``server.app``: the app factory imports the routes, not the reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request

from engine.config import ServerConfig
from engine.frontend.input_processor import InputProcessor, PromptRequest
from server.errors import APIError
from server.metrics import Metrics


class EngineClient(Protocol):
    """The part of ``engine.frontend.async_llm.AsyncLLM`` the HTTP layer uses."""

    model_name: str
    max_model_len: int
    vocab_size: int
    tokenizer: Any
    input_processor: InputProcessor

    @property
    def is_alive(self) -> bool: ...
    @property
    def num_unfinished(self) -> int: ...
    @property
    def stats(self) -> Any: ...
    def is_ready(self) -> bool: ...
    def generate_wave(self, requests: Sequence[PromptRequest]) -> list[Any]: ...
    async def call_utility(self, method: str, *args: Any, timeout_s: float = 30.0) -> Any: ...


@dataclass
class ServerState:
    """Everything a route needs, hung on ``app.state.ds``."""

    llm: EngineClient
    config: ServerConfig
    metrics: Metrics
    model_name: str
    draining: bool = False
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    defaults: dict[str, Any] = field(default_factory=dict)
    """Request-field defaults from generation_config.json (server/generation_defaults.py)."""
    model_root: str | None = None
    """The checkpoint directory (``root`` in /v1/models)."""

    def check_model(self, name: str | None) -> None:
        # An absent model means the only one we serve (vLLM does the same).
        if name is not None and name != self.model_name:
            raise APIError(404, "The model does not exist", param="model", code="model_not_found")

    def engine_dead(self) -> bool:
        """True once the engine is gone for good (AsyncLLM.is_alive is False)."""
        alive = getattr(self.llm, "is_alive", True)
        return not (alive() if callable(alive) else alive)


def get_state(request: Request) -> ServerState:
    return request.app.state.ds


def package_version() -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version as dist_version

        return dist_version("deltaserve")
    return "0.1.0"

"""Python client for deltaserve: ``DeltaClient`` (async) and ``SyncDeltaClient``."""

from client.api import (
    APIError,
    ChatChoice,
    ChatCompletion,
    ChunkChoice,
    Completion,
    CompletionChoice,
    DeltaClient,
    StreamChunk,
    Usage,
)
from client.sync import SyncDeltaClient

__all__ = [
    "APIError",
    "ChatChoice",
    "ChatCompletion",
    "ChunkChoice",
    "Completion",
    "CompletionChoice",
    "DeltaClient",
    "StreamChunk",
    "SyncDeltaClient",
    "Usage",
]

"""The errors the front end raises to its caller (the HTTP layer maps each to one status code)."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine must not run (HTTP 400); ``param`` names the offending field."""

    code: str | None = None

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested output is longer than the model's context (the one message for it)."""

    code = "context_length_exceeded"

    def __init__(self, prompt_len: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            "max_tokens",
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the "
            "completion).",
        )
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


class RequestRejectedError(InvalidRequestError):
    """The engine refused the request at admission (e.g. it can never fit in the KV cache)."""

    def __init__(self, message: str) -> None:
        super().__init__("max_tokens", message)


class QueueFullError(RuntimeError):
    """Too many unfinished requests (HTTP 503 with Retry-After); nothing of the wave was admitted."""

    retry_after_s = 1


class EngineDeadError(RuntimeError):
    """The engine process died or its loop stopped; in-flight and new requests cannot complete."""

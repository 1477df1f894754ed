"""Every struct that crosses the API process <-> EngineCore boundary (msgspec msgpack, never pickle).

Channels are named by direction: ``to_engine`` carries :data:`EngineInput` (tagged union, so one
decoder rejects anything else), ``from_engine`` carries :data:`EngineOutputMsg`, and the one-shot
``ready`` channel carries :class:`ReadyInfo`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from engine.sampling_params import FinishReason, SamplingParams, TokenLogprobs


class _Wire(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    pass


class EngineRequest(_Wire):
    """One request inside a wave."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = 0.0


class AddRequests(_Wire, tag="add"):
    """One wave: admitted whole, at one step boundary, in this order."""

    requests: list[EngineRequest]
    received_time: float = 0.0
    """time.monotonic() when the engine's input thread decoded the wave; set there, not by the sender."""


class AbortRequests(_Wire, tag="abort"):
    request_ids: list[str]


class Shutdown(_Wire, tag="shutdown"):
    pass


class UtilityRequest(_Wire, tag="utility"):
    """A generic call into the engine (``stats``, ``reset``, ``check``) instead of a message per feature."""

    call_id: int
    method: str
    args: list[Any] = []


class UtilityResponse(_Wire, tag="utility_result"):
    call_id: int
    result: Any = None
    error: str | None = None


class StepStats(_Wire):
    step: int = 0
    admitted: int = 0
    """Waiting requests scheduled for the first time this step."""
    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    slots_used: int = 0
    slots_total: int = 0
    num_preemptions: int = 0
    """Preemptions this step."""
    device_memory_used: int = 0
    device_memory_peak: int = 0
    state_pool_bytes: int = 0
    """Device memory the GDN state pools hold now (grows as state slots are first used)."""
    step_time_s: float = 0.0


class EngineOutput(_Wire):
    """New tokens of one request this step; a final one has finish_reason set."""

    request_id: str
    new_token_ids: list[int] = []
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: FinishReason | None = None
    stop_token: int | None = None
    error: str | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None
    """Every prompt token but the first, scored; on a request's first output only."""
    timings: list[float] | None = None
    """On the output that carries a request's first token: time.monotonic() in the engine process when
    its wave reached the engine, when it was first scheduled and when its first token was read back
    (on Linux the API process's monotonic clock is the same one)."""


class EngineOutputs(_Wire, tag="outputs"):
    """Everything one engine step produced."""

    outputs: list[EngineOutput] = []
    stats: StepStats | None = None
    engine_error: str | None = None
    """Set on the last message of an engine that failed and is exiting."""


class ReadyInfo(_Wire):
    num_kv_blocks: int
    num_state_slots: int
    block_size: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int] = []
    device_name: str = ""
    memory: dict[str, int] = {}
    """The start-up device-memory split (engine/worker/memory.py ``MemorySplit``); empty on CPU."""
    error: str | None = None
    """Set instead of the rest being meaningful when the engine failed to start."""


EngineInput = AddRequests | AbortRequests | Shutdown | UtilityRequest
EngineOutputMsg = EngineOutputs | UtilityResponse

_encoder = msgspec.msgpack.Encoder()
_input_decoder = msgspec.msgpack.Decoder(EngineInput)  # type: ignore[arg-type]
_output_decoder = msgspec.msgpack.Decoder(EngineOutputMsg)  # type: ignore[arg-type]
_ready_decoder = msgspec.msgpack.Decoder(ReadyInfo)


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_input(frame: bytes) -> EngineInput:
    """Raise msgspec.DecodeError / ValidationError for anything but a well-formed input struct."""
    return _input_decoder.decode(frame)


def decode_output(frame: bytes) -> EngineOutputMsg:
    return _output_decoder.decode(frame)


def decode_ready(frame: bytes) -> ReadyInfo:
    return _ready_decoder.decode(frame)

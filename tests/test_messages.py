"""Wire structs: every message round-trips; anything else (garbage, pickle, wrong shape) is refused."""

from __future__ import annotations

import contextlib
import pickle
import queue
import tempfile
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from engine.core import engine_core as core
from engine.messages import (
    AbortRequests,
    AddRequests,
    EngineOutput,
    EngineOutputs,
    EngineRequest,
    ReadyInfo,
    Shutdown,
    StepStats,
    UtilityRequest,
    UtilityResponse,
    decode_input,
    decode_output,
    decode_ready,
    encode,
)
from engine.sampling_params import SamplingParams, TokenLogprobs

PARAMS = SamplingParams(max_tokens=7, temperature=0.0, seed=3, stop_token_ids=(5, 6), logprobs=2)
INPUTS = [
    AddRequests([EngineRequest("a", [1, 2, 3], PARAMS, 1.5), EngineRequest("b", [4], SamplingParams())]),
    AbortRequests(["a", "b"]),
    Shutdown(),
    UtilityRequest(3, "stats", [1, "x"]),
]
OUTPUTS = [
    EngineOutputs(
        [
            EngineOutput("a", [7], [TokenLogprobs(7, -0.1, [(7, -0.1), (8, -2.0)])]),
            EngineOutput("b", [9], None, finish_reason="stop", stop_token=9),
            EngineOutput("c", finish_reason="error", error="too long"),
        ],
        StepStats(step=4, admitted=2, num_scheduled_tokens=10, step_time_s=0.01),
    ),
    EngineOutputs([], engine_error="boom"),
    UtilityResponse(3, {"k": 1}),
    UtilityResponse(4, error="nope"),
]


@pytest.mark.parametrize("msg", INPUTS, ids=lambda m: type(m).__name__)
def test_input_round_trip(msg):
    assert decode_input(encode(msg)) == msg


@pytest.mark.parametrize("msg", OUTPUTS, ids=lambda m: type(m).__name__)
def test_output_round_trip(msg):
    assert decode_output(encode(msg)) == msg


def test_ready_round_trip():
    info = ReadyInfo(10, 5, 32, 4096, 1000, [0, 1], "cpu")
    assert decode_ready(encode(info)) == info


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00garbage",
        pickle.dumps(AbortRequests),  # a pickle is just bytes that do not decode
        encode(EngineOutputs([])),  # an output struct on the input channel
        msgspec.msgpack.encode(["add", [["a", [1, -1.5], []]]]),  # wrong field types
        msgspec.msgpack.encode(["exec", "rm -rf /"]),  # unknown tag
    ],
)
def test_malformed_input_is_refused(frame):
    with pytest.raises(msgspec.MsgspecError):
        decode_input(frame)


@contextlib.contextmanager
def input_thread() -> Iterator[tuple[zmq.Socket, queue.Queue]]:
    """The engine's input thread on a real ipc socket: (the sending socket, its inbox)."""
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as d:
        addr = f"ipc://{d}/in"
        push = ctx.socket(zmq.PUSH)
        push.bind(addr)
        inbox: queue.Queue = queue.Queue()
        stop = threading.Event()
        t = threading.Thread(target=core._input_thread, args=(ctx, addr, inbox, stop), daemon=True)
        t.start()
        try:
            yield push, inbox
        finally:
            stop.set()
            t.join(5)
            push.close(0)
    ctx.term()


def test_input_thread_drops_malformed_frames(caplog):
    with input_thread() as (push, inbox):
        push.send(pickle.dumps({"evil": True}))
        push.send(b"\xc1")
        push.send(encode(AbortRequests(["x"])))
        assert inbox.get(timeout=5) == AbortRequests(["x"])
        time.sleep(0.05)
        assert inbox.empty()
    assert sum("malformed" in r.getMessage() for r in caplog.records) == 2


def test_input_thread_stamps_waves_on_receipt():
    with input_thread() as (push, inbox):
        before = time.monotonic()
        push.send(encode(AddRequests([EngineRequest("a", [1, 2], SamplingParams(max_tokens=2))])))
        wave = inbox.get(timeout=5)
        assert isinstance(wave, AddRequests) and before <= wave.received_time <= time.monotonic()

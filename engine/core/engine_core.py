"""EngineCore: scheduler + model runner, and the busy loop that drives it in its own process.

The loop is short on purpose: drain every pending input message (a wave is admitted whole, at a step
boundary), ``step()`` = schedule -> execute -> update, emit one EngineOutputs per step. Socket I/O and
msgpack (de)serialisation run on background threads so they overlap with the forward pass.
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from engine.config import EngineConfig
from engine.core.kv_manager import KVManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.messages import (
    AbortRequests,
    AddRequests,
    EngineInput,
    EngineOutput,
    EngineOutputs,
    ReadyInfo,
    Shutdown,
    StepStats,
    UtilityRequest,
    UtilityResponse,
    decode_input,
    encode,
)
from engine.sampling_params import FinishReason
from engine.worker.step import DoneStep, PendingStep, Runner, ScheduledSeq

logger = logging.getLogger("deltaserve.engine")

RunnerFactory = Callable[[EngineConfig], Runner]


class EngineCore:
    def __init__(self, config: EngineConfig, runner: Runner | None = None) -> None:
        if runner is None:
            from engine.worker.model_runner import (
                ModelRunner,  # heavy (torch model); only the real engine needs it
            )

            runner = ModelRunner(config)
        self.config = config
        self.runner = runner
        r: Any = runner
        self.block_size: int = getattr(r, "block_size", config.cache.block_size)
        # a runner that maps each state slot's memory when it is first handed out says so here
        self.kv = KVManager(
            r.num_kv_blocks, r.num_state_slots, self.block_size, getattr(r, "ensure_state_slot", None)
        )
        self.eos_token_ids: list[int] = list(getattr(r, "eos_token_ids", ()))
        self.max_model_len: int = getattr(r, "max_model_len", 0) or config.model.max_model_len
        self.scheduler = Scheduler(config.scheduler, self.kv, self.eos_token_ids, self.max_model_len)
        self.step_index = 0
        self._pending: list[EngineOutput] = []  # admission rejections, sent with the next step
        # Async scheduling needs a runner that launches without waiting (ModelRunner.launch).
        self._launch = getattr(runner, "launch", None)
        self.async_scheduling = config.scheduler.async_scheduling and self._launch is not None
        self._ahead: tuple[SchedulerOutput, PendingStep] | None = None
        """The next step, already launched on the device (async scheduling)."""

    def ready_info(self) -> ReadyInfo:
        r: Any = self.runner
        return ReadyInfo(
            num_kv_blocks=r.num_kv_blocks,
            num_state_slots=r.num_state_slots,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            vocab_size=getattr(r, "vocab_size", 0),
            eos_token_ids=self.eos_token_ids,
            device_name=str(getattr(r, "device_name", "")),
            memory=r.memory.as_dict() if getattr(r, "memory", None) is not None else {},
        )

    # ---- inputs --------------------------------------------------------------------------------
    def add_requests(self, wave: AddRequests) -> None:
        reqs = [Request(e.request_id, e.prompt_token_ids, e.params, e.arrival_time) for e in wave.requests]
        received = wave.received_time or time.monotonic()
        for r in reqs:
            r.queued_time = received
        self._pending.extend(self.scheduler.add_wave(reqs))

    def abort(self, request_ids: list[str]) -> None:
        self.scheduler.abort(request_ids)

    def utility(self, call: UtilityRequest) -> UtilityResponse:
        try:
            if call.method == "stats":
                result: Any = {
                    **msgspec.structs.asdict(self._stats(0.0, None)),
                    "total_preemptions": self.scheduler.total_preemptions,
                }
            elif call.method == "check":
                self.scheduler.check_invariants()
                result = True
            elif call.method == "reset":
                result = len(self.scheduler.abort(list(self.scheduler.requests)))
            elif call.method == "ping":
                result = "pong"
            else:
                raise ValueError(f"unknown utility method {call.method!r}")
        except Exception as e:  # a failed utility call reports back; it must not kill the engine
            return UtilityResponse(call.call_id, error=f"{type(e).__name__}: {e}")
        return UtilityResponse(call.call_id, result=result)

    def handle(self, msg: EngineInput) -> UtilityResponse | None:
        if isinstance(msg, AddRequests):
            self.add_requests(msg)
        elif isinstance(msg, AbortRequests):
            self.abort(msg.request_ids)
        elif isinstance(msg, UtilityRequest):
            return self.utility(msg)
        return None

    # ---- one step ------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending) or self._ahead is not None

    def step(self) -> EngineOutputs:
        """One step's outputs. With async scheduling the step after it is launched before this
        one's tokens are read back, so the device works through it while the host updates the
        requests, emits this step and takes in new messages."""
        t0 = time.perf_counter()
        outputs, self._pending = self._pending, []
        pending: PendingStep | None
        if self._ahead is not None:
            sched, pending = self._ahead
            self._ahead = None
        else:
            sched = self.scheduler.schedule()
            pending = self._run(sched.seqs, None) if sched.seqs else None
        t_launched = t_ahead = t_read = time.perf_counter()
        if pending is not None:
            if self.async_scheduling:
                nxt = self.scheduler.schedule_ahead(sched)
                if nxt is not None:
                    self._ahead = (nxt, self._run(nxt.seqs, pending))
            t_ahead = time.perf_counter()
            result = pending.result()
            t_read = time.perf_counter()
            outputs.extend(self.scheduler.update(sched, result))
        self.step_index += 1
        stats = self._stats(time.perf_counter() - t0, sched)
        if logger.isEnabledFor(logging.DEBUG):
            # --log-level debug: one line per step. "launch" is the host building and queueing this
            # step (0 when it was launched ahead), "ahead" the next one, "wait" blocking on the device
            # for this step's tokens, "update" the scheduler's bookkeeping after them.
            logger.debug(
                "step %d: %d prefill + %d decode tokens, %d running, %d waiting, %.3f ms "
                "(launch %.3f, ahead %.3f, wait %.3f, update %.3f)",
                stats.step,
                stats.num_prefill_tokens,
                stats.num_decode_tokens,
                stats.num_running,
                stats.num_waiting,
                stats.step_time_s * 1e3,
                (t_launched - t0) * 1e3,
                (t_ahead - t_launched) * 1e3,
                (t_read - t_ahead) * 1e3,
                (t0 + stats.step_time_s - t_read) * 1e3,
            )
        return EngineOutputs(outputs, stats)

    def _run(self, seqs: list[ScheduledSeq], prev: PendingStep | None) -> PendingStep:
        if self._launch is not None:
            launched: PendingStep = self._launch(seqs, prev)
            return launched
        return DoneStep(self.runner.execute_model(seqs))

    def _stats(self, dt: float, sched: Any) -> StepStats:
        r: Any = self.runner
        used, peak = r.device_memory() if hasattr(r, "device_memory") else (0, 0)
        s = self.scheduler
        return StepStats(
            step=self.step_index,
            admitted=sched.num_admitted if sched else 0,
            num_scheduled_tokens=sched.num_tokens if sched else 0,
            num_prefill_tokens=sched.num_prefill_tokens if sched else 0,
            num_decode_tokens=sched.num_decode_tokens if sched else 0,
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_total=self.kv.num_blocks,
            slots_used=self.kv.num_used_slots,
            slots_total=self.kv.num_slots,
            num_preemptions=sched.num_preemptions if sched else 0,
            device_memory_used=int(used),
            device_memory_peak=int(peak),
            state_pool_bytes=int(getattr(r, "state_pool_bytes", 0)),
            step_time_s=dt,
        )

    def fail_all(self, error: str) -> EngineOutputs:
        """The engine's last words: an error output for every request it still holds."""
        outs, self._pending = self._pending, []
        dead = FinishReason.ERROR
        outs += [EngineOutput(rid, finish_reason=dead, error=error) for rid in self.scheduler.requests]
        return EngineOutputs(outs, engine_error=error)


def run_busy_loop(
    core: EngineCore,
    inbox: queue.Queue[EngineInput],
    emit: Callable[[EngineOutputs | UtilityResponse], None],
    should_stop: Callable[[], bool],
    idle_poll_s: float = 0.5,
) -> int:
    """Drive the core until Shutdown (0), a stop request (0), or an exception in step (1)."""
    while True:
        msgs: list[EngineInput] = []
        try:
            # Block only when idle; with work in flight, just take what is already there.
            if not core.has_work():
                msgs.append(inbox.get(timeout=idle_poll_s))
            while True:
                msgs.append(inbox.get_nowait())
        except queue.Empty:
            pass
        for msg in msgs:
            if isinstance(msg, Shutdown):
                return 0
            reply = core.handle(msg)
            if reply is not None:
                emit(reply)
        if should_stop():
            return 0
        if not core.has_work():
            continue
        try:
            out = core.step()
        except Exception as e:
            logger.exception("engine step failed; failing all in-flight requests")
            emit(core.fail_all(f"engine error: {type(e).__name__}: {e}"))
            return 1
        emit(out)


def load_runner_factory(spec: str) -> RunnerFactory:
    """``"package.module:callable"``; the callable takes the EngineConfig and returns a Runner."""
    module, _, attr = spec.partition(":")
    factory: RunnerFactory = getattr(importlib.import_module(module), attr)
    return factory


def run_engine_core(
    config: EngineConfig,
    input_addr: str,
    output_addr: str,
    ready_addr: str,
    runner_factory: str | None = None,
    parent_pid: int | None = None,
) -> None:
    """Process entry point (spawned by MPClient). Exits non-zero when the engine failed."""
    from engine.logs import configure_logging

    configure_logging()  # the same JSON lines as the API process, at its level (inherited env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API process decides when we stop
    parent = parent_pid if parent_pid is not None else os.getppid()
    ctx = zmq.Context()
    ready = ctx.socket(zmq.PUSH)
    ready.setsockopt(zmq.LINGER, 2000)
    ready.connect(ready_addr)
    try:
        runner = load_runner_factory(runner_factory)(config) if runner_factory else None
        core = EngineCore(config, runner)
    except Exception as e:
        logger.exception("engine failed to start")
        ready.send(encode(ReadyInfo(0, 0, 0, 0, 0, error=f"{type(e).__name__}: {e}")))
        ready.close()
        ctx.term()
        raise SystemExit(1) from e

    inbox: queue.Queue[EngineInput] = queue.Queue()
    outbox: queue.Queue[EngineOutputs | UtilityResponse | None] = queue.Queue()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_input_thread, args=(ctx, input_addr, inbox, stop), daemon=True),
        threading.Thread(target=_output_thread, args=(ctx, output_addr, outbox), daemon=True),
    ]
    for t in threads:
        t.start()
    info = core.ready_info()
    ready.send(encode(info))
    ready.close()
    logger.info("engine ready: %s", info)

    rc = run_busy_loop(core, inbox, outbox.put, lambda: os.getppid() != parent)
    stop.set()
    outbox.put(None)
    for t in threads:
        t.join(timeout=5)
    ctx.term()
    if rc:
        raise SystemExit(rc)


def _input_thread(ctx: zmq.Context, addr: str, inbox: queue.Queue, stop: threading.Event) -> None:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    try:
        while not stop.is_set():
            if not sock.poll(200):
                continue
            frame = sock.recv(copy=True)
            try:
                msg = decode_input(frame)
                if isinstance(msg, AddRequests):
                    msg.received_time = time.monotonic()  # the start of its queue time
                inbox.put(msg)
            except Exception as e:  # never executed, never unpickled: typed decode or drop
                logger.warning("dropped a malformed frame (%d bytes): %s", len(frame), e)
    finally:
        sock.close()


def _output_thread(ctx: zmq.Context, addr: str, outbox: queue.Queue) -> None:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)  # let the last words (error outputs) reach the client
    sock.connect(addr)
    try:
        while (msg := outbox.get()) is not None:
            sock.send(encode(msg), copy=False)
    finally:
        sock.close()

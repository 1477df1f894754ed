"""Token-budget scheduler: no phases, chunked prefill and decode fall out of ``num_computed``.

Each step spends ``max_num_batched_tokens`` over requests in order: running requests first (a decode
costs 1 token, a running prefill continues with the next chunk), then waiting requests in arrival
order. When KV blocks run out, the youngest running request is preempted by recompute: its blocks and
slot are freed and it goes back to the head of the waiting queue with ``num_computed = 0``.
Block and slot bookkeeping lives in :class:`~engine.core.kv_manager.KVManager`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.config import SchedulerConfig
from engine.core.kv_manager import KVManager
from engine.core.request import Request, RequestStatus
from engine.messages import EngineOutput
from engine.sampling_params import FinishReason
from engine.worker.step import SamplerOutput, ScheduledSeq


@dataclass(frozen=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    """Decodes first, then prefill chunks (the runner requires that order)."""
    requests: list[Request]
    """Parallel to ``seqs``."""
    num_admitted: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preemptions: int

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, kv: KVManager, eos_token_ids: Sequence[int], max_model_len: int
    ) -> None:
        self.budget = config.max_num_batched_tokens
        # A running request holds a state slot, so the slot pool also caps the batch.
        self.max_num_seqs = min(config.max_num_seqs, kv.num_slots)
        self.kv = kv
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        """Oldest first: the youngest (last) is the one preempted."""
        self.requests: dict[str, Request] = {}
        self.total_preemptions = 0

    # ---- queue changes -------------------------------------------------------------------------
    def add_wave(self, requests: Iterable[Request]) -> list[EngineOutput]:
        """Queue a whole wave in order; returns error outputs for requests that can never run."""
        rejected: list[EngineOutput] = []
        for req in requests:
            error = self._admission_error(req)
            if error is not None:
                rejected.append(EngineOutput(req.request_id, finish_reason=FinishReason.ERROR, error=error))
                continue
            self.requests[req.request_id] = req
            self.waiting.append(req)
        return rejected

    def _admission_error(self, req: Request) -> str | None:
        if req.request_id in self.requests:
            return f"duplicate request id {req.request_id!r}"
        if req.num_prompt_tokens == 0:
            return "empty prompt"
        if req.params.max_tokens < (0 if req.params.prompt_logprobs is not None else 1):
            return "max_tokens must be >= 1"
        if req.max_num_tokens > self.max_model_len:
            return (
                f"prompt ({req.num_prompt_tokens} tokens) + max_tokens ({req.params.max_tokens}) "
                f"exceeds max_model_len {self.max_model_len}"
            )
        if not self.kv.can_ever_fit(req.max_num_tokens):
            cap = self.kv.num_blocks * self.kv.block_size
            return (
                f"prompt ({req.num_prompt_tokens} tokens) + max_tokens ({req.params.max_tokens}) "
                f"can never fit in the KV cache ({cap} tokens)"
            )
        return None

    def abort(self, request_ids: Iterable[str]) -> list[str]:
        """Drop requests in any state and free their memory now; unknown ids are ignored."""
        aborted = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            if req.status is RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._finish(req, FinishReason.ABORT)
            aborted.append(rid)
        return aborted

    def _finish(self, req: Request, reason: FinishReason) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.kv.free(req.request_id)
        del self.requests[req.request_id]

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        req.status = RequestStatus.WAITING
        req.num_computed = 0
        req.num_preemptions += 1
        self.total_preemptions += 1
        self.waiting.appendleft(req)

    # ---- one step ------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.budget
        chosen: list[tuple[Request, int]] = []
        preempted = 0

        i = 0
        while i < len(self.running) and budget > 0 and len(chosen) < self.max_num_seqs:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            while not self.kv.grow(req.request_id, req.num_computed + n):
                victim = self.running.pop()  # youngest; never one already chosen (those are older)
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    break
            else:
                chosen.append((req, n))
                budget -= n
                i += 1

        admitted = 0
        if not preempted:
            admits, admitted = self._admit(budget)
            chosen += admits
        return self._output([(r, r.num_computed, n, -1) for r, n in chosen], admitted, preempted)

    def _output(
        self, rows: list[tuple[Request, int, int, int]], admitted: int, preempted: int
    ) -> SchedulerOutput:
        """The step of ``rows`` (request, first position, tokens, prev row), decode-shaped rows (one
        token on top of state; a pending token's decode is one) first, as the runner requires."""
        decodes = [c for c in rows if c[2] == 1 and c[1] > 0]
        prefills = [c for c in rows if not (c[2] == 1 and c[1] > 0)]
        ordered = decodes + prefills
        return SchedulerOutput(
            seqs=[self._seq(r, n, prev_row=row, start=start) for r, start, n, row in ordered],
            requests=[r for r, *_ in ordered],
            num_admitted=admitted,
            num_prefill_tokens=sum(n for _, _, n, _ in prefills),
            num_decode_tokens=len(decodes),
            num_preemptions=preempted,
        )

    def _admit(self, budget: int, stop_at_scoring: bool = False) -> tuple[list[tuple[Request, int]], int]:
        """Waiting requests moved to running in arrival order while the budget, the batch size, the
        state slots and the KV pool allow, each with its first chunk's token count, and how many of
        them are scheduled for the first time (not after a preemption). Strict FIFO: a head that does
        not fit blocks the queue rather than being overtaken. ``stop_at_scoring`` (a step scheduled
        ahead) also stops at a head that scores its prompt or whose sampling reads its tokens."""
        out: list[tuple[Request, int]] = []
        first = 0
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            p = req.params
            if stop_at_scoring and (p.adjusts_logits or p.prompt_logprobs is not None):
                break
            n = min(req.num_tokens - req.num_computed, budget)
            if self.kv.num_free_slots == 0 or not self.kv.grow(req.request_id, req.num_computed + n):
                break
            if not self.kv.allocate_slot(req.request_id):
                self.kv.free(req.request_id)  # no memory for the slot now: a waiting request holds nothing
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if not req.ever_scheduled:
                first += 1
                req.scheduled_time = time.monotonic()
            req.ever_scheduled = True
            out.append((req, n))
            budget -= n
        return out, first

    def schedule_ahead(self, out: SchedulerOutput) -> SchedulerOutput | None:
        """The step after ``out``, scheduled before ``out``'s tokens are known (async scheduling), or
        None when it must wait for them. It is what :meth:`schedule` would give after ``out`` if no
        request stopped on a token: each request that samples in ``out`` decodes its pending token
        (fed on the device from ``out``'s row), a prefill continues with its next chunk of known
        prompt tokens, and waiting requests are admitted; so the host prepares mixed and prefill steps,
        as well as decodes, while the device runs the step before. A request that finishes by length
        with its pending token is left out. It waits for the tokens (None) when a running
        request's sampling reads its tokens (penalties, bad words, min_tokens) or scores the prompt,
        or when a request would not fit in the KV pool without a preemption. One that stops on a
        token in ``out`` computes one token too many, which :meth:`update` drops with the rest of a
        finished request's outputs."""
        done: dict[str, int] = {}
        rows: dict[str, int] = {}
        for seq, req in zip(out.seqs, out.requests, strict=True):
            done[req.request_id] = len(seq.token_ids)
            if seq.sample:
                rows[req.request_id] = len(rows)
        budget = self.budget
        chosen: list[tuple[Request, int, int, int]] = []  # (request, first position, tokens, prev row)
        for req in self.running:
            if budget <= 0 or len(chosen) >= self.max_num_seqs:
                break
            p = req.params
            if p.adjusts_logits or p.prompt_logprobs is not None:
                return None
            row = rows.get(req.request_id, -1)
            start = req.num_computed + done.get(req.request_id, 0)
            if row >= 0:  # decodes the token ``out`` samples for it
                if req.num_output + 1 >= p.max_tokens or req.num_tokens + 1 >= self.max_model_len:
                    continue  # finishes by length with the pending token
                n = 1
            else:
                n = min(req.num_tokens - start, budget)
            if not self.kv.grow(req.request_id, start + n):
                return None  # the blocks taken stay with their requests; the next schedule() uses them
            chosen.append((req, start, n, row))
            budget -= n
        admits, first = self._admit(budget, stop_at_scoring=True)
        chosen += [(r, 0, n, -1) for r, n in admits]
        return self._output(chosen, first, 0) if chosen else None

    def _seq(self, req: Request, n: int, prev_row: int = -1, start: int | None = None) -> ScheduledSeq:
        """The next ``n`` tokens of ``req`` from ``start`` (default: its ``num_computed``; a step
        scheduled ahead passes the position the step before leaves it at); with ``prev_row`` >= 0, the
        decode of its pending token (scheduled ahead: the runner feeds the token sampled in that row
        of the step before)."""
        if prev_row < 0:
            start, num_output = req.num_computed if start is None else start, req.num_output
            tokens = req.token_ids[start : start + n]
        else:
            start, num_output = req.num_tokens, req.num_output + 1
            tokens = [0]  # a placeholder
        return ScheduledSeq(
            token_ids=tokens,
            num_computed=start,
            block_ids=tuple(self.kv.block_table(req.request_id)),
            state_slot=self.kv.slot(req.request_id),
            sample=prev_row >= 0 or start + n == req.num_tokens,
            request_id=req.request_id,
            params=req.params,
            num_output=num_output,
            history=req.token_ids,
            num_prompt=req.num_prompt_tokens,
            prompt_lp_from=len(req.prompt_logprobs),
            prev_row=prev_row,
        )

    def update(self, out: SchedulerOutput, sampled: SamplerOutput) -> list[EngineOutput]:
        """Advance ``num_computed``, append sampled tokens, finish requests that stopped."""
        results: list[EngineOutput] = []
        k = 0
        scored = sampled.prompt_logprobs
        for i, (seq, req) in enumerate(zip(out.seqs, out.requests, strict=True)):
            if req.is_finished:  # aborted between schedule and update; its slot of samples still counts
                k += int(seq.sample)
                continue
            req.num_computed += len(seq.token_ids)
            if scored and scored[i]:
                req.prompt_logprobs.extend(scored[i])  # type: ignore[arg-type]
            if not seq.sample:
                continue
            token = sampled.token_ids[k]
            lp = sampled.logprobs[k] if k < len(sampled.logprobs) else None
            k += 1
            prompt_lps = req.prompt_logprobs if req.params.prompt_logprobs is not None else None
            if req.params.max_tokens == 0:  # prompt scoring only: the sampled token is dropped
                self.running.remove(req)
                self._finish(req, FinishReason.LENGTH)
                done = EngineOutput(
                    req.request_id, finish_reason=FinishReason.LENGTH, prompt_logprobs=prompt_lps
                )
                results.append(done)
                continue
            req.token_ids.append(token)
            timings = None
            if req.num_output != 1:
                prompt_lps = None
            else:
                timings = [req.queued_time, req.scheduled_time, time.monotonic()]
            reason = self._stop_reason(req, token)
            if reason is not None:
                if reason is FinishReason.STOP:
                    req.stop_token = token
                self.running.remove(req)
                self._finish(req, reason)
            results.append(
                EngineOutput(
                    req.request_id,
                    [token],
                    [lp] if lp is not None else None,
                    finish_reason=reason,
                    stop_token=req.stop_token,
                    prompt_logprobs=prompt_lps,
                    timings=timings,
                )
            )
        if k != len(sampled.token_ids):
            raise RuntimeError(f"runner returned {len(sampled.token_ids)} tokens for {k} sampled sequences")
        return results

    def _stop_reason(self, req: Request, token: int) -> FinishReason | None:
        p = req.params
        # min_tokens counts tokens generated before this one: the first min_tokens never stop.
        if req.num_output - 1 >= p.min_tokens and (
            token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)
        ):
            return FinishReason.STOP
        if req.num_output >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def check_invariants(self) -> None:
        self.kv.check_invariants()
        assert len(self.running) <= self.max_num_seqs
        assert set(self.requests) == {r.request_id for r in self.waiting} | {
            r.request_id for r in self.running
        }
        assert len(self.requests) == len(self.waiting) + len(self.running)
        assert self.kv.owners() <= {r.request_id for r in self.running}
        for r in self.waiting:
            assert r.status is RequestStatus.WAITING and r.num_computed == 0
        for r in self.running:
            assert r.status is RequestStatus.RUNNING
            assert self.kv.slot(r.request_id) >= 1
            assert 0 <= r.num_computed < r.num_tokens
            assert len(self.kv.block_table(r.request_id)) * self.kv.block_size >= r.num_computed

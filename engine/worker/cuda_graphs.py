"""Decode steps replayed from CUDA graphs captured at bucketed sizes.

A decode-only step of ``b`` sequences whose longest block table has ``n`` blocks runs the graph of
the smallest bucket (B >= b, N >= n). Every bucket is captured at start-up (``--cuda-graph-capture
startup``, the default; ``lazy`` captures each on first use) into one shared memory pool (they replay
one at a time, so they can share it; with the piecewise graphs, the pool is theirs too). A graph's
per-step inputs are views of one static device buffer that each step fills with one host-to-device
copy from one pinned buffer, built by numpy (:func:`decode_arrays`). Padding rows point at the
reserved null KV block 0 and the reserved state slot 0, so whatever they compute lands where nothing
reads it.

KV-length buckets. With the paged attention kernel (arm attention.paged) a graph's block-table width
only sets the attention's split plan (the kernel reads the block ids a sequence has, in place), so
the buckets grow 8x (8, 64, 512, ... blocks): on the H200 a step's replay at any wider bucket up to
512 blocks is within 0.2% of its own power-of-two bucket's (batch 1 at 200 tokens: 0.5-0.8%), and
the table's width costs the host a memset (session 34, docs/bench-evidence/2026-12-04-s34.md). Each
bucket dropped is a graph per batch bucket less, each ~0.9 MiB of driver memory and a capture at
start-up (twice: probe and real; 56 graphs took 2.0 s at 32 sequences, 28 take 1.4-1.5 s). The
reference attention materialises every row's KV up to the bucket length, so with it the buckets stay
powers of two.

Why: on the H200 a batch-32 decode step of the 4B model spent ~34 ms of its 47.5 ms issuing ~1,000
kernels from Python (docs/bench-evidence/2026-11-29-model-server-w1.md); a replay issues them at once.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.model.cache import ModelCache
from engine.model.forward_batch import ForwardBatch, fill, layout, unpack
from engine.model.qwen3_5.model import Qwen35Model
from engine.ops.arms import pads_attention
from engine.ops.launch_ex import programmatic_launches
from engine.worker.step import ScheduledSeq

log = logging.getLogger(__name__)
PoolHandle = Any  # torch.cuda.graph_pool_handle()'s value (torch types it as a private NewType)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
# The reference attention materialises every row's KV up to the bucket length, so with it graphs are
# only used while B x N x block_size stays under this many token positions (eager above it); the paged
# attention kernel (arm attention.paged) reads the block table in place and needs no such bound.
MAX_GRAPH_KV_TOKENS = 1 << 17


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One stream per device for the whole process: every capture, and (ModelRunner) every step.
    cuBLAS keeps a workspace (32 MiB on Hopper) per stream it ever ran on, never freed, and torch's
    allocator caches blocks per stream: a fresh side stream per capture left ~0.25 GiB of workspaces
    behind after the lazily captured buckets of a W1 run, and serving on the default stream beside
    this one kept a second workspace and a second block cache. ``cuda`` and ``cuda:0`` are one key."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    s = _CAPTURE_STREAMS.get(index)
    if s is None:
        s = _CAPTURE_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index))
    return s


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Collect garbage now, then keep Python's collector off until the capture inside is done (used as
    a decorator on each capture, and around each set's ``capture_all``).
    A collection that runs mid-capture can destroy an unreachable CUDA graph (a runner or probe
    left in a reference cycle), and a graph destroyed while a stream captures invalidates that
    capture (cudaErrorStreamCaptureInvalidated, seen with two runners in one test process). Inside
    an outer ``no_gc`` the collector is already off and nothing was collected since it was turned
    off, so there is nothing to collect: a full collection of the server's heap takes tens of ms
    (~90 ms on the 2-core CI machine), once per capture was hundreds of them at start-up."""
    was = gc.isenabled()
    if was:
        gc.collect()
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def graph_launches(pdl: bool) -> contextlib.AbstractContextManager[None]:
    """How a capture launches kernels: programmatic launches with arm graphs.pdl, else as usual."""
    return programmatic_launches() if pdl else contextlib.nullcontext()


def _bucket(x: int, buckets: Sequence[int]) -> int | None:
    return next((b for b in buckets if b >= x), None)


def batch_buckets(max_seqs: int) -> tuple[int, ...]:
    return tuple(b for b in BATCH_BUCKETS if b < max_seqs) + (max_seqs,)


def block_buckets(max_blocks: int, ratio: int = 2) -> tuple[int, ...]:
    """8 blocks times powers of ``ratio`` (2 or 8), capped at (and ending with) the model's longest
    block table."""
    if ratio not in (2, 8):
        raise ValueError(f"block bucket ratio must be 2 or 8, got {ratio}")
    sizes, n = {max_blocks}, 8
    while n < max_blocks:
        sizes.add(n)
        n *= ratio
    return tuple(sorted(sizes))


def decode_arrays(
    seqs: Sequence[ScheduledSeq], batch: int, blocks: int, block_size: int
) -> dict[str, np.ndarray]:
    """A decode step's graph inputs at bucket (``batch``, ``blocks``), named as ForwardBatch's fields:
    padding rows read token 0 at position 0 (seq_len 1) through the null block 0 and state slot 0,
    and table columns past a sequence's blocks hold 0 (never read). With no ``seqs``: the inputs a
    graph is captured with. Numpy, so the host's cost follows the blocks the sequences hold, not the
    bucket's width (nested lists through ``torch.tensor`` took 2-5 ms at 32-64 x 1,024 blocks). Not
    ``host_arrays`` plus padding: that builds more than a decode graph reads, 70-200 us more a step
    at 32 sequences (CPU)."""
    b = len(seqs)
    if b > batch:
        raise ValueError(f"{b} sequences do not fit a decode graph of {batch}")
    pos = np.zeros(batch, np.int64)
    pos[:b] = [s.num_computed for s in seqs]
    ids = np.zeros(batch, np.int64)
    ids[:b] = [s.token_ids[0] for s in seqs]
    table = np.zeros((batch, blocks), np.int32)
    for i, s in enumerate(seqs):
        table[i, : len(s.block_ids)] = s.block_ids
    slots = np.zeros(batch, np.int64)
    p = pos[:b]
    if b and (p // block_size >= np.asarray([len(s.block_ids) for s in seqs])).any():
        raise ValueError("a decode's block table does not cover its position")
    slots[:b] = table[np.arange(b), p // block_size].astype(np.int64) * block_size + p % block_size
    state = np.zeros(batch, np.int32)
    state[:b] = [s.state_slot for s in seqs]
    return {
        "input_ids": ids,
        "positions": pos,
        "seq_lens": (pos + 1).astype(np.int32),
        "num_computed": pos.astype(np.int32),
        "slot_mapping": slots,
        "state_slot": state,
        "block_table": table,
    }


def graph_bucket(
    seqs: Sequence[ScheduledSeq],
    batches: Sequence[int],
    blocks: Sequence[int],
    block_size: int,
    max_kv_tokens: int | None = MAX_GRAPH_KV_TOKENS,
) -> tuple[int, int] | None:
    """The (batch, blocks) bucket for a decode-only step, or None when it must run eagerly: a prefill
    in the batch, a sequence without sampling, or a bucket beyond the graphs' KV budget."""
    if not seqs or not all(s.is_decode and s.sample for s in seqs):
        return None
    b = _bucket(len(seqs), batches)
    n = _bucket(max(len(s.block_ids) for s in seqs), blocks)
    if b is None or n is None or (max_kv_tokens is not None and b * n * block_size > max_kv_tokens):
        return None
    return b, n


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    batch: ForwardBatch  # static device tensors the graph reads
    inputs: torch.Tensor  # the uint8 device buffer behind the batch's decode_arrays (one copy a step)
    logits: torch.Tensor  # [B, vocab] in the model dtype (the raw lm_head output), written by every replay


class DecodeGraphs:
    def __init__(
        self,
        model: Qwen35Model,
        cache: ModelCache,
        max_seqs: int,
        max_blocks: int,
        pdl: bool = False,
        pool: PoolHandle | None = None,
        logits: torch.Tensor | None = None,
    ):
        self.model, self.cache = model, cache
        self.pdl = pdl  # arm graphs.pdl: capture the kernels that support it as programmatic launches
        self.block_size = cache.block_size
        self.batch_buckets = batch_buckets(max_seqs)
        self.block_buckets = block_buckets(max_blocks, 2 if pads_attention(model.ops.paged_attention) else 8)
        # ``pool``: another set of graphs' pool to share (the piecewise graphs'). Every graph here and
        # there leaves its outputs in buffers outside the pool and replays on one stream, one at a time,
        # so what one graph's transients used, any other may reuse.
        self.pool = torch.cuda.graph_pool_handle() if pool is None else pool
        self.graphs: dict[tuple[int, int], _Graph] = {}
        # One logits buffer for every graph (a replay's rows are sampled before the next replay), so
        # each captured bucket does not keep a [B, vocab] output of its own; ``logits`` lends one (the
        # piecewise graphs' scratch, dead between steps: PiecewiseGraphs.logits_buffer). It holds the
        # raw logits in the model dtype; the sampler widens them only when a row needs more than argmax.
        shape, dtype = (self.batch_buckets[-1], model.cfg.vocab_size), model.dtype
        if logits is not None and (tuple(logits.shape) != shape or logits.dtype != dtype):
            got = f"{tuple(logits.shape)} {logits.dtype}"
            raise ValueError(f"decode graphs' logits buffer: need {shape} {dtype}, got {got}")
        self.owns_logits = logits is None
        if logits is None:
            logits = torch.empty(shape, dtype=dtype, device=self._device())
        self.logits = logits
        self.reserved_bytes = 0  # torch memory reserved by the captures so far (the graph pool)
        self.max_kv_tokens = MAX_GRAPH_KV_TOKENS if pads_attention(model.ops.paged_attention) else None

    def bucket(self, seqs: Sequence[ScheduledSeq]) -> tuple[int, int] | None:
        return graph_bucket(seqs, self.batch_buckets, self.block_buckets, self.block_size, self.max_kv_tokens)

    def run(
        self,
        seqs: Sequence[ScheduledSeq],
        key: tuple[int, int],
        patch: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Raw logits ``[len(seqs), vocab]`` in the model dtype (a view of the shared buffer: sample them
        before the next replay) from the graph of bucket ``key``; ``patch`` may rewrite the
        static input ids on the device before the replay (tokens a step scheduled ahead reads)."""
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = self._capture(*key)
        fill(g.inputs, list(decode_arrays(seqs, *key, self.block_size).values()))
        if patch is not None:
            patch(g.batch.input_ids)
        g.graph.replay()
        return g.logits[: len(seqs)]

    def capture_largest(self) -> None:
        """Capture the biggest bucket now (most sequences, longest block table), so the graph pool's
        size is known at start-up; the other buckets are captured on first use into the same pool."""
        key = (self.batch_buckets[-1], self.block_buckets[-1])
        if self.max_kv_tokens is not None and key[0] * key[1] * self.block_size > self.max_kv_tokens:
            key = (self.batch_buckets[-1], self.block_buckets[0])
        self.capture(key)

    def capture(self, key: tuple[int, int]) -> None:
        """Capture the bucket ``key`` now, unless it already is."""
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)

    def keys(self) -> list[tuple[int, int]]:
        """Every (batch, blocks) bucket :meth:`bucket` can pick."""
        limit = self.max_kv_tokens
        return [
            (b, n)
            for b in self.batch_buckets
            for n in self.block_buckets
            if limit is None or b * n * self.block_size <= limit
        ]

    @no_gc()
    def capture_all(self) -> None:
        """Capture every bucket now (``--cuda-graph-capture startup``), so no step waits for a capture
        while serving."""
        t0 = time.perf_counter()
        for key in self.keys():
            self.capture(key)
        log.info(
            "captured %d decode graphs (batch %s x KV blocks %s) in %.1f s",
            len(self.graphs),
            list(self.batch_buckets),
            list(self.block_buckets),
            time.perf_counter() - t0,
        )

    def _device(self) -> torch.device:
        return self.cache.k_cache[0].device if self.cache.k_cache else self.cache.conv_state[0].device

    def _static_batch(self, batch: int, blocks: int) -> tuple[ForwardBatch, torch.Tensor]:
        """The graph's static batch (every row padding) and the device buffer its per-step inputs view."""
        dev = self._device()
        host = decode_arrays([], batch, blocks, self.block_size)
        arrays = list(host.values())
        offsets, total = layout(arrays)
        inputs = torch.empty(total, dtype=torch.uint8, device=dev)
        fill(inputs, arrays)
        views: dict[str, Any] = dict(zip(host, unpack(inputs, arrays, offsets), strict=True))
        return ForwardBatch(
            **views,
            query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=dev),
            has_initial_state=torch.ones(batch, dtype=torch.bool, device=dev),
            logits_indices=torch.arange(batch, dtype=torch.int64, device=dev),
            num_decodes=batch,
            max_query_len=1,
            max_seq_len=blocks * self.block_size,
            query_start_loc_cpu=tuple(range(batch + 1)),
            seq_lens_cpu=(1,) * batch,
            num_computed_cpu=(0,) * batch,
            block_size=self.block_size,
        ), inputs

    @no_gc()
    def _capture(self, batch: int, blocks: int) -> _Graph:
        fb, inputs = self._static_batch(batch, blocks)
        # Warm up on the capture stream first (kernel compilation, cuBLAS workspaces, cached tables);
        # the static inputs all point at null block 0 and state slot 0, so this touches no live state.
        side = capture_stream(fb.input_ids.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.model(fb, self.cache)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        out = self.logits[:batch]
        dev = fb.input_ids.device
        # What torch.cuda.graph() does first, less its gc.collect() (no_gc's job, once for every
        # capture of a capture_all): the allocator's cache emptied, so that ``reserved`` is read with
        # the warm-up's freed transients gone and the delta is the graph pool's growth alone (read
        # before, they counted against it: 56 captures at start-up summed to -1.44 GiB)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(dev)
        with torch.cuda.stream(side), graph_launches(self.pdl):
            graph.capture_begin(pool=self.pool)
            try:
                self.model(fb, self.cache, out=out)
            finally:
                graph.capture_end()
        self.reserved_bytes += torch.cuda.memory_reserved(dev) - reserved
        log.debug("captured decode graph: batch %d, %d KV blocks", batch, blocks)
        return _Graph(graph, fb, inputs, out)

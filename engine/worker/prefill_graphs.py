"""Whole-step CUDA graphs for prefill steps of one sequence (arm ``graphs.prefill``).

The piecewise graphs (engine/worker/piecewise.py) replay a prefill step's dense work but run its
varlen layer cores eagerly: ~160 CuPy launches from Python a step, whose host time (~0.35-0.45 ms a
layer core) can exceed the device's. On the H200's host in session 31 (run 1) a 1 x 1,024 prompt
step took 15.97 ms to queue against 14.84 ms on the device, so a lone prompt's first token waited
on Python. A step that holds one sequence and nothing else (every lone user's prompt, W2's) has
launch shapes that depend on its token count alone, so here it is captured whole, per token bucket
(the piecewise buckets up to ``MAX_TOKENS``), and a step is one pinned copy of its metadata and one
replay:

- every kernel reads the sequence's length, positions, KV slots, block table and state slot from
  static device buffers (:class:`ForwardBatch` views of one buffer per graph), which the copy fills;
- grids come from the bucket: the conv's token blocks, the delta rule's chunk rows and the
  attention's query tiles are upper bounds whose CTAs past the sequence exit at once (the same bounds
  a varlen batch already uses); the attention's KV splits are planned for the longest block table,
  and a split that sees no key weighs nothing in the combine;
- the rows past the sequence compute on stale values in the piecewise buffers, and nothing reads
  them: their KV writes go to the reserved null block 0 (slot 0), the GDN kernels walk only the
  sequence's own tokens and every dense op is row by row;
- the cores' largest transients (a GDN core's conv output and split delta rule's chunk entries, ~34
  MB at 1,024 tokens; an attention core's rotated q, 8 MB) live in piecewise scratch rows that are
  dead while a core runs (``PiecewiseGraphs.core_spare`` and ``q_spare``, sized by
  ``spare_tokens``), not in the graph pool, where the GDN ones raised W1's peak by 20 MiB more
  (session 31, runs 4-5). What the graphs still cost W1 (12 MiB) is the driver's memory for the
  executable graphs, ~1 MiB each (session 32, run 2).

A replay computes what an eager run of the same static batch computes, bit for bit (the tests). Against
the piecewise path it can differ in the last bits where a plan differs (the attention's split count,
planned here for the longest block table; the delta rule's split path, chosen by the bucket).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.model.cache import ModelCache
from engine.model.forward_batch import ForwardBatch, SeqSpec, host_arrays, layout, pack_pinned, unpack
from engine.model.qwen3_5.layers import GDNMeta
from engine.worker.cuda_graphs import capture_stream, graph_launches, no_gc
from engine.worker.piecewise import PiecewiseGraphs

log = logging.getLogger(__name__)

# Lone prompts up to this many tokens take the graphs. Above it the step waits on the device, not the
# host (a 2,048-token prefill: ~9 ms to queue piecewise against ~25 ms on the H200), while the largest
# graph sets how much static memory its transients need (~70 MB at 2,048 tokens, half at 1,024).
MAX_TOKENS = 1024


def padded_arrays(
    seq: SeqSpec, block_size: int, tokens: int, blocks: int
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One sequence's batch arrays (``host_arrays``) padded to a graph's static shapes: ``tokens``
    rows (ids and positions 0, KV slot 0: the null block) and a ``blocks``-wide block table (0s)."""
    host, ints = host_arrays([seq], block_size)
    n, nb = len(seq.token_ids), len(seq.block_ids)
    if n > tokens or nb > blocks:
        raise ValueError(f"a prefill of {n} tokens over {nb} blocks exceeds the graph's {tokens} x {blocks}")
    for name in ("input_ids", "positions", "slot_mapping"):
        host[name] = np.pad(host[name], (0, tokens - n))
    host["block_table"] = np.pad(host["block_table"], ((0, 0), (0, blocks - nb)))
    return host, ints


def fill(buf: torch.Tensor, arrays: list[np.ndarray]) -> None:
    """Copy host arrays into a static buffer laid out for them (:func:`layout`): on CUDA one pinned,
    non-blocking copy, stream-ordered after the replays before it (the pinned buffer is torch's
    caching host allocator's, not reused until the copy has run)."""
    if buf.is_cuda:
        buf.copy_(pack_pinned(arrays)[0], non_blocking=True)
        return
    for t, a in zip(unpack(buf, arrays, layout(arrays)[0]), arrays, strict=True):
        t.copy_(torch.from_numpy(np.ascontiguousarray(a)))


def one_prefill(seqs: Sequence[SeqSpec]) -> bool:
    """Whether a step is what these graphs serve: one sequence, not a decode, its last token sampled."""
    return len(seqs) == 1 and not seqs[0].is_decode and seqs[0].sample


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: run eagerly (capture=False)
    buf: torch.Tensor  # uint8 device buffer behind every tensor of ``batch``
    batch: ForwardBatch  # static views the graph reads
    logits: torch.Tensor | None  # [1, vocab] raw logits in the model dtype, written by every replay


class PrefillGraphs:
    """One whole-step graph per token bucket of the piecewise graphs ``pw`` up to ``MAX_TOKENS`` (over
    their static buffers, scratch and pool), for steps of one prefill sequence. ``capture=False`` runs
    the same steps eagerly on the same static buffers: the oracle a replay is compared with bit for
    bit."""

    def __init__(
        self, pw: PiecewiseGraphs, cache: ModelCache, max_blocks: int, *, pdl: bool, capture: bool = True
    ):
        self.pw, self.cache, self.pdl, self.capturing = pw, cache, pdl, capture
        self.model = pw.model
        self.block_size = cache.block_size
        self.max_blocks = max_blocks
        self.buckets = tuple(b for b in pw.buckets if b <= MAX_TOKENS)
        self.graphs: dict[int, _Graph] = {}
        self.reserved_bytes = 0  # torch memory the captures grew (the shared graph pool)

    def bucket(self, seqs: Sequence[SeqSpec]) -> int | None:
        """The token bucket of a step these graphs serve, else None (run it another way)."""
        if not one_prefill(seqs) or len(seqs[0].block_ids) > self.max_blocks:
            return None
        n = len(seqs[0].token_ids)
        return next((b for b in self.buckets if b >= n), None)

    def run(self, seq: SeqSpec, tb: int) -> torch.Tensor:
        """``seq``'s raw next-token logits ``[1, vocab]`` in the model dtype, from bucket ``tb``'s
        graph (a view of the piecewise scratch: sample it before the next step runs)."""
        g = self.graphs.get(tb)
        if g is None:
            g = self.graphs[tb] = self._build(tb)
        host, _ = padded_arrays(seq, self.block_size, tb, self.max_blocks)
        fill(g.buf, list(host.values()))
        if g.graph is None:
            with torch.inference_mode():
                return self._step(g.batch)
        g.graph.replay()
        return g.logits  # type: ignore[return-value]

    def capture_all(self) -> None:
        """Every bucket, largest first (the smaller ones reuse its pool memory)."""
        t0 = time.perf_counter()
        for tb in reversed(self.buckets):
            self.capture(tb)
        log.info(
            "captured %d whole-step prefill graphs (one sequence, token buckets %s) in %.1f s; the "
            "shared graph pool grew %.1f MiB",
            len(self.graphs),
            list(self.buckets),
            time.perf_counter() - t0,
            self.reserved_bytes / 2**20,
        )

    def capture(self, tb: int) -> None:
        if tb not in self.graphs:
            self.graphs[tb] = self._build(tb)

    def _static_batch(self, tb: int) -> tuple[torch.Tensor, ForwardBatch]:
        """A ForwardBatch of views into one device buffer, laid out as :meth:`run` packs its copy and
        filled with a batch that touches no live state: state slot 0 (no kernel reads or writes a slot
        <= 0), every KV slot and block table entry 0 (the reserved null block)."""
        bs = self.block_size
        dummy = SeqSpec(token_ids=[0] * tb, num_computed=0, block_ids=[0] * -(-tb // bs), state_slot=1)
        host, _ = padded_arrays(dummy, bs, tb, self.max_blocks)
        host["state_slot"][:] = 0
        host["slot_mapping"][:] = 0
        arrays = list(host.values())
        offsets, total = layout(arrays)
        buf = torch.empty(total, dtype=torch.uint8, device=self.pw.ids.device)
        fill(buf, arrays)
        views: dict[str, Any] = dict(zip(host, unpack(buf, arrays, offsets), strict=True))
        fb = ForwardBatch(
            **views,
            num_decodes=0,
            max_query_len=tb,
            max_seq_len=self.max_blocks * bs,  # plans the attention for the longest block table
            query_start_loc_cpu=(0, tb),
            seq_lens_cpu=(self.max_blocks * bs,),
            num_computed_cpu=(0,),
            block_size=bs,
        )
        return buf, fb

    def _step(self, fb: ForwardBatch) -> torch.Tensor:
        """The whole step over the bucket's rows of the piecewise buffers (what a graph captures)."""
        pw, m = self.pw, self.model
        tb = fb.max_query_len
        pw.ids[:tb].copy_(fb.input_ids)
        meta = GDNMeta.from_batch(fb)
        spare = pw.core_spare(tb)  # the GDN cores' conv output and chunk entries in dead scratch rows
        if spare is not None:
            meta = dataclasses.replace(meta, conv_out=spare[0], workspace=spare[1])
        q = pw.q_spare(tb)  # and the attention cores' q
        for k in range(pw.num_layers + 1):
            pw.piece(k, tb)
            if k < pw.num_layers:
                m.layer_core(k, pw.proj(k, tb), fb, meta, self.cache, out=pw.core(k, tb), q_out=q)
        out = pw.logits_buffer(1, m.cfg.vocab_size)
        if out is None:
            raise RuntimeError("the piecewise scratch cannot hold one row of logits")
        return m.logits(pw.x[:tb], pw.h[:tb], fb.logits_indices, out=out)

    @no_gc()
    def _build(self, tb: int) -> _Graph:
        """Bucket ``tb``'s static batch and graph: one eager pass on the capture stream first (kernel
        builds, cuBLAS's workspace), then the capture into the piecewise graphs' pool."""
        buf, fb = self._static_batch(tb)
        if not self.capturing:  # the eager oracle: no dummy pass (the reference ops write slot 0)
            return _Graph(None, buf, fb, None)
        with torch.inference_mode():
            side = capture_stream(buf.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step(fb)
                graph = torch.cuda.CUDAGraph()
                reserved = torch.cuda.memory_reserved(buf.device)
                graph.capture_begin(pool=self.pw.pool)
                try:
                    with graph_launches(self.pdl):
                        logits = self._step(fb)
                finally:
                    graph.capture_end()
                self.reserved_bytes += torch.cuda.memory_reserved(buf.device) - reserved
            torch.cuda.current_stream().wait_stream(side)
        log.debug("captured the whole-step prefill graph of %d tokens", tb)
        return _Graph(graph, buf, fb, logits)

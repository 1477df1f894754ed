"""Whole-step CUDA graphs for steps of one prefill sequence, alone (arm ``graphs.prefill``) or behind
decodes (arm ``graphs.mixed``).

The piecewise graphs (engine/worker/piecewise.py) replay a prefill step's dense work but run its
varlen layer cores eagerly: ~160 CuPy launches from Python a step, whose host time (~0.35-0.45 ms a
layer core) can exceed the device's. On the H200's host in session 31 (run 1) a 1 x 1,024 prompt
step took 15.97 ms to queue against 14.84 ms on the device, so a lone prompt's first token waited
on Python; a step of a few decodes and a short prompt (interactive serving, W3's arrivals) is worse
off, ~14 ms of launches for a few ms of device work. A step that holds decodes and one prefill
sequence has launch shapes that depend on two counts alone, so here it is captured whole per key
(decode bucket, token bucket): ``(0, tb)`` for a lone prompt, the piecewise buckets up to
``MAX_TOKENS``; ``(d, tb)`` for up to ``d`` decodes (``decode_buckets``) and a prefill chunk that fit
``tb`` rows, up to ``MIXED_MAX_TOKENS``. A step is one pinned copy of its metadata and one replay:

- every kernel reads the sequences' lengths, positions, KV slots, block tables and state slots from
  static device buffers (:class:`ForwardBatch` views of one buffer per graph), which the copy fills;
- the step's decodes take the first rows, padding decodes the next ones up to ``d`` (token 0 at
  position 0, one key in the null block 0, state slot 0, which no CUDA kernel reads or writes), then
  the prefill's rows; decodes scheduled ahead read their tokens on the device, as in a decode graph;
- grids come from the bucket: the conv's token blocks, the delta rule's chunk rows and the
  attention's query tiles are upper bounds whose CTAs past the sequence exit at once (the same bounds
  a varlen batch already uses); the attention's KV splits are planned for the longest block table,
  and a split that sees no key weighs nothing in the combine;
- the rows past the prefill compute on stale values in the piecewise buffers, and nothing reads
  them: their KV writes go to the reserved null block 0 (slot 0), the GDN kernels walk only the
  sequences' own tokens and every dense op is row by row;
- the cores' largest transients (a GDN core's conv output and split delta rule's chunk entries, ~34
  MB at 1,024 tokens; an attention core's rotated q, 8 MB) live in piecewise scratch rows that are
  dead while a core runs (``PiecewiseGraphs.core_spare`` and ``q_spare``, sized by
  ``spare_tokens``), not in the graph pool, where the GDN ones raised W1's peak by 20 MiB more
  (session 31, runs 4-5). What the graphs still cost is the driver's memory for the executable
  graphs, ~1 MiB each (session 32, run 2).

A lone prompt's replay leaves every row's hidden state in the piecewise buffers, which is what a
prompt-scoring step (echo + logprobs) reads (:meth:`PrefillGraphs.hidden_states`).

A replay computes what an eager run of the same static batch computes, bit for bit (the tests). Against
the piecewise path it can differ in the last bits where a plan differs (the attention's split count,
planned here for the longest block table; its warps, chosen by the bucket; the delta rule's split
path, chosen by the bucket).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.model.cache import ModelCache
from engine.model.forward_batch import ForwardBatch, SeqSpec, fill, host_arrays, layout, unpack
from engine.model.qwen3_5.layers import GDNMeta
from engine.worker.cuda_graphs import capture_stream, graph_launches, no_gc
from engine.worker.piecewise import PiecewiseGraphs

log = logging.getLogger(__name__)

# Lone prompts up to this many tokens take the graphs. Above it the step waits on the device, not the
# host (a 2,048-token prefill: ~9 ms to queue piecewise against ~25 ms on the H200), while the largest
# graph sets how much static memory its transients need (~70 MB at 2,048 tokens, half at 1,024).
MAX_TOKENS = 1024
# Steps with decodes take them up to this many rows in all. In an isolated step bench the device's
# time seemed to hide the pieces' launches above 512 rows (4 decodes + 1,000 tokens: 16.52 ms as a
# whole graph against 16.58 piecewise, docs/bench-evidence/2026-12-03-s33.md), but served, with the
# engine's I/O threads sharing the interpreter, a step of ~10 decodes and one 768-token prompt left
# the device idle between its kernels for 2.1-5.4 ms of its 15.0-18.8 (--profile-steps on two servers,
# docs/bench-evidence/2026-12-04-s38.md, run 2); up to 1,024 rows, W6's TTFT mean went 0.811x (run 4).
# Each (decode, token) bucket pair is one more graph (~1.4 MiB of driver memory, ~0.07 s of capture,
# twice).
MIXED_MAX_TOKENS = 1024
# What the decode rows of a mixed step are padded to (then the runner's most decodes, max_num_seqs - 1):
# a padding decode costs a GEMM row and CTAs that exit at once, a bucket costs graphs.
MIXED_DECODES = (8, 16, 32, 64, 128, 256)


def decode_buckets(max_decodes: int) -> tuple[int, ...]:
    """Decode counts the mixed graphs are captured at (none when ``max_decodes`` is 0)."""
    if max_decodes <= 0:
        return ()
    return (*(b for b in MIXED_DECODES if b < max_decodes), max_decodes)


def padded_arrays(
    seqs: Sequence[SeqSpec], block_size: int, decodes: int, tokens: int, blocks: int
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A step's batch arrays (``host_arrays``: its decodes, then one prefill sequence) padded to a
    graph's static shapes: ``decodes`` decode rows (the step's own, then padding decodes: token 0 at
    position 0, KV slot 0 of the null block, one key, state slot 0), the prefill's rows, padded rows
    up to ``tokens`` (ids and positions 0, KV slot 0), ``decodes + 1`` block tables ``blocks`` wide
    (0s past each), and ``decodes + 1`` logits rows: the sampled ones first, in the step's order."""
    host, ints = host_arrays(seqs, block_size)
    nd, n = ints["num_decodes"], ints["query_start_loc_cpu"][-1]
    pad, nb = decodes - nd, host["block_table"].shape[1]
    if len(seqs) - nd != 1 or pad < 0 or n + pad > tokens or nb > blocks:
        raise ValueError(
            f"a step of {nd} decodes and {len(seqs) - nd} prefills over {n} tokens and {nb} blocks "
            f"exceeds the graph's {decodes} decodes + 1 prefill, {tokens} x {blocks}"
        )

    def spread(a: np.ndarray, fill: int, size: int) -> np.ndarray:  # padding decodes at nd, rows at the end
        tail = np.zeros(size - len(a) - pad, a.dtype)
        return np.concatenate([a[:nd], np.full(pad, fill, a.dtype), a[nd:], tail])

    for name in ("input_ids", "positions", "slot_mapping"):
        host[name] = spread(host[name], 0, tokens)
    host["seq_lens"] = spread(host["seq_lens"], 1, decodes + 1)
    for name in ("num_computed", "state_slot", "has_initial_state"):
        host[name] = spread(host[name], 0, decodes + 1)
    qsl = host["query_start_loc"]
    host["query_start_loc"] = np.concatenate([np.arange(decodes + 1, dtype=qsl.dtype), qsl[nd + 1 :] + pad])
    table = np.zeros((decodes + 1, blocks), np.int32)
    table[:nd, :nb] = host["block_table"][:nd]
    table[decodes, :nb] = host["block_table"][nd]
    host["block_table"] = table
    li = host["logits_indices"]  # a decode's row is its index; the prefill's moves past the padding
    li = np.where(li >= nd, li + pad, li)
    host["logits_indices"] = np.concatenate([li, np.zeros(decodes + 1 - len(li), li.dtype)])
    return host, ints


Key = tuple[int, int]  # (decode rows, token rows) of a graph


def step_shape(seqs: Sequence[SeqSpec]) -> tuple[int, int] | None:
    """(decodes, prefill tokens) of a step these graphs can serve: decodes first, every one sampled,
    then exactly one prefill sequence (sampled or not: a chunk's logits row is computed and dropped);
    else None."""
    nd = len(seqs) - 1
    if nd < 0 or seqs[-1].is_decode or not all(s.is_decode and s.sample for s in seqs[:-1]):
        return None
    return nd, len(seqs[-1].token_ids)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: run eagerly (capture=False)
    buf: torch.Tensor  # uint8 device buffer behind every tensor of ``batch``
    batch: ForwardBatch  # static views the graph reads
    logits: torch.Tensor | None  # [decodes + 1, vocab] raw logits in the model dtype, written by every replay


class PrefillGraphs:
    """One whole-step graph per key (decode rows, token rows) over the piecewise graphs ``pw``'s
    static buffers, scratch and pool: ``(0, tb)`` for lone prompts at every piecewise bucket up to
    ``MAX_TOKENS``; with ``max_decodes`` (arm graphs.mixed), ``(d, tb)`` for each decode bucket ``d``
    and token bucket ``d < tb <= MIXED_MAX_TOKENS``. ``capture=False`` runs the same steps eagerly on
    the same static buffers: the oracle a replay is compared with bit for bit."""

    def __init__(
        self,
        pw: PiecewiseGraphs,
        cache: ModelCache,
        max_blocks: int,
        *,
        pdl: bool,
        capture: bool = True,
        max_decodes: int = 0,
    ):
        self.pw, self.cache, self.pdl, self.capturing = pw, cache, pdl, capture
        self.model = pw.model
        self.block_size = cache.block_size
        self.max_blocks = max_blocks
        self.buckets = tuple(b for b in pw.buckets if b <= MAX_TOKENS)
        self.decode_buckets = decode_buckets(max_decodes)
        self.keys: tuple[Key, ...] = tuple((0, tb) for tb in self.buckets) + tuple(
            (d, tb) for d in self.decode_buckets for tb in self.buckets if d < tb <= MIXED_MAX_TOKENS
        )
        self._known = frozenset(self.keys)
        self.graphs: dict[Key, _Graph] = {}
        self.reserved_bytes = 0  # torch memory the captures grew (the shared graph pool)

    def bucket(self, seqs: Sequence[SeqSpec]) -> Key | None:
        """The key of a step these graphs serve, else None (run it another way)."""
        shape = step_shape(seqs)
        if shape is None or max(len(s.block_ids) for s in seqs) > self.max_blocks:
            return None
        nd, n = shape
        d = 0 if nd == 0 else next((b for b in self.decode_buckets if b >= nd), None)
        if d is None:
            return None
        return next(((d, tb) for tb in self.buckets if tb >= d + n and (d, tb) in self._known), None)

    def run(
        self, seqs: Sequence[SeqSpec], key: Key, patch: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        """The sampled sequences' raw next-token logits ``[sampled, vocab]`` in the model dtype, in the
        step's order, from ``key``'s graph (a view of the piecewise scratch: sample it before the next
        step runs); ``patch`` may rewrite the static input ids on the device first (the tokens of
        decodes scheduled ahead: a decode's token row is its index in ``seqs``)."""
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = self._build(key)
        host, _ = padded_arrays(seqs, self.block_size, *key, self.max_blocks)
        fill(g.buf, list(host.values()))
        if patch is not None:
            patch(g.batch.input_ids)
        rows = sum(s.sample for s in seqs)
        if g.graph is None:
            with torch.inference_mode():
                return self._step(g.batch)[:rows]
        g.graph.replay()
        return g.logits[:rows]  # type: ignore[index]

    def hidden_states(self, num_tokens: int) -> torch.Tensor:
        """The last lone-prompt replay's hidden states (the last layer's output before the final norm,
        what ``model.hidden_states`` gives) for its first ``num_tokens`` rows, as a new tensor: a
        prompt-scoring step reads every row (only a ``(0, tb)`` key's rows start at row 0)."""
        return self.pw.h[:num_tokens] + self.pw.x[:num_tokens]

    @no_gc()
    def capture_all(self) -> None:
        """Every key, the most token rows first (the smaller ones reuse its pool memory)."""
        t0 = time.perf_counter()
        for key in sorted(self.keys, key=lambda k: (-k[1], -k[0])):
            self.capture(key)
        log.info(
            "captured %d whole-step graphs (one prefill behind 0 / %s decodes; token buckets %s) in "
            "%.1f s; the shared graph pool grew %.1f MiB",
            len(self.graphs),
            list(self.decode_buckets),
            list(self.buckets),
            time.perf_counter() - t0,
            self.reserved_bytes / 2**20,
        )

    def capture(self, key: Key) -> None:
        if key not in self.graphs:
            self.graphs[key] = self._build(key)

    def _static_batch(self, key: Key) -> tuple[torch.Tensor, ForwardBatch]:
        """A ForwardBatch of views into one device buffer, laid out as :meth:`run` packs its copy and
        filled with a batch that touches no live state: state slot 0 (no kernel reads or writes a slot
        <= 0), every KV slot and block table entry 0 (the reserved null block)."""
        bs, (d, tb) = self.block_size, key
        n = tb - d  # the longest prefill the graph holds
        dummy = SeqSpec(token_ids=[0] * n, num_computed=0, block_ids=[0] * -(-n // bs), state_slot=1)
        host, _ = padded_arrays([dummy], bs, d, tb, self.max_blocks)
        host["state_slot"][:] = 0
        host["slot_mapping"][:] = 0
        arrays = list(host.values())
        offsets, total = layout(arrays)
        buf = torch.empty(total, dtype=torch.uint8, device=self.pw.ids.device)
        fill(buf, arrays)
        views: dict[str, Any] = dict(zip(host, unpack(buf, arrays, offsets), strict=True))
        fb = ForwardBatch(
            **views,
            num_decodes=d,
            max_query_len=n,
            max_seq_len=self.max_blocks * bs,  # plans the attention for the longest block table
            query_start_loc_cpu=(*range(d + 1), tb),
            seq_lens_cpu=(self.max_blocks * bs,) * (d + 1),
            num_computed_cpu=(0,) * (d + 1),
            block_size=bs,
        )
        return buf, fb

    def _step(self, fb: ForwardBatch) -> torch.Tensor:
        """The whole step over the key's rows of the piecewise buffers (what a graph captures)."""
        pw, m = self.pw, self.model
        tb, d = fb.input_ids.shape[0], fb.num_decodes
        pw.ids[:tb].copy_(fb.input_ids)
        meta = GDNMeta.from_batch(fb)
        spare = pw.core_spare(tb)  # the GDN cores' conv output and chunk entries in dead scratch rows
        if spare is not None:  # sized for the prefill's rows (the decodes' go through K4)
            meta = dataclasses.replace(meta, conv_out=spare[0][: tb - d], workspace=spare[1])
        q = pw.q_spare(tb)  # and the attention cores' q
        for k in range(pw.num_layers + 1):
            pw.piece(k, tb)
            if k < pw.num_layers:
                m.layer_core(k, pw.proj(k, tb), fb, meta, self.cache, out=pw.core(k, tb), q_out=q)
        out = pw.logits_buffer(d + 1, m.cfg.vocab_size)
        if out is None:
            raise RuntimeError(f"the piecewise scratch cannot hold {d + 1} rows of logits")
        return m.logits(pw.x[:tb], pw.h[:tb], fb.logits_indices, out=out)

    @no_gc()
    def _build(self, key: Key) -> _Graph:
        """``key``'s static batch and graph: one eager pass on the capture stream first (kernel builds,
        cuBLAS's workspace), then the capture into the piecewise graphs' pool."""
        buf, fb = self._static_batch(key)
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
        log.debug("captured the whole-step graph of %d decode and %d token rows", *key)
        return _Graph(graph, buf, fb, logits)

"""Mixed and prefill steps replayed piecewise: per-token dense work from CUDA graphs, varlen ops eager.

A decode graph (engine/worker/cuda_graphs.py) holds a whole step, which works because every decode
row looks alike. A step with prefill chunks does not: its conv, delta rule and attention launches
depend on how many sequences it holds and how long each is. Everything else in a layer (the
projections, residual adds, norms and the MLP) works row by row and depends only on the token count.
So, as vLLM's piecewise graphs do, the decoder is cut at its varlen ops (``Qwen35Model.layer_core``):

    piece 0:  embed, layer 0's input norm and projection
    piece k:  layer k-1's output projection, post norm and MLP, layer k's input norm and projection
    piece L:  the last layer's output projection, post norm and MLP

Each piece is captured once per token bucket; a step of ``T`` tokens runs in the smallest bucket
``Tb >= T``: the pieces replay over ``Tb`` rows (the rows past ``T`` compute on stale values and
nothing reads them: every op in a piece is per row), and between them the layer cores run eagerly
on the first ``T`` rows with the step's own ForwardBatch. The pieces read and write only static
buffers (token ids, the residual stream, each layer's projection and core output) that live for the
whole server; they never touch the KV or state pools, so graphs captured on the profile pool keep
serving after it is replaced by the real pools. Nothing is copied between them: the residual stream
is updated in place by both of a layer's adds, the cores write the core buffer directly, and the
MLP's gate|up projection and activation borrow the projection and core buffer while it is dead; so
do the step's logits after the last piece, and the decode graphs' logits. The decode graphs capture
into this pool too (engine/worker/cuda_graphs.py): graphs of both kinds replay one at a time on one
stream.

Why: an eager mixed step of the 4B model issues ~1,000 launches from Python, ~18 ms of host time
against ~29 ms on the device, so any slowdown of the host's CPU lands on the step
(docs/bench-evidence/2026-12-01-host-path.md). Piecewise, a step issues L + 1 replays plus the layer
cores' launches: 161 CuPy kernels for a W1 mixed step of the 4B, whose host launch time went from
21.4 to 14.3 ms (2026-12-01-piecewise.md). Prompt-scoring steps run here too (:meth:`hidden_states`).
"""

from __future__ import annotations

import logging
import time

import torch

from engine.model.cache import ModelCache
from engine.model.forward_batch import ForwardBatch
from engine.model.qwen3_5.layers import GatedAttention, GatedDeltaNet, GDNMeta
from engine.model.qwen3_5.model import Qwen35Model
from engine.ops.gdn.chunk_split import entry_bytes
from engine.worker.cuda_graphs import capture_stream, graph_launches, no_gc

log = logging.getLogger(__name__)

SMALL_BUCKETS = (16, 32, 64, 128, 256)
STRIDE = 128  # buckets above 256 tokens are 128 apart: at most 127 padded rows, 6% of a 2,048-token step
# Steps above this many tokens run eagerly. At 2,048 tokens the 4B's eager step already waits on the
# device, not the host (W1's A/B: within noise), while every further bucket grows the static buffers
# and the graph pool with the token count (the 4B's: ~136 KiB a token), which a 16 GB card needs for
# KV and state slots.
MAX_TOKENS = 2048


def _align(n: int, to: int = 128) -> int:
    """``n`` rounded up to a multiple of ``to`` elements (256-byte aligned bf16 views)."""
    return -(-n // to) * to


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token counts to capture at: 16 to 256 doubling, then every 128, ending with ``max_tokens``
    (--max-num-batched-tokens, the most a step holds) or MAX_TOKENS, whichever is smaller."""
    if max_tokens < 1:
        raise ValueError(f"piecewise graphs need max_tokens >= 1, got {max_tokens}")
    top = min(max_tokens, MAX_TOKENS)
    steps = [*SMALL_BUCKETS, *range(SMALL_BUCKETS[-1] + STRIDE, top, STRIDE)]
    return (*(b for b in steps if b < top), top)


class PiecewiseGraphs:
    """The static buffers and, per token bucket, the ``L + 1`` captured pieces of one model.

    ``capture=False`` builds the buffers alone and :meth:`run` executes the pieces eagerly on them
    (the CPU, and the oracle a replay is compared with bit for bit)."""

    def __init__(
        self,
        model: Qwen35Model,
        max_tokens: int,
        device: torch.device,
        *,
        capture: bool = True,
        pdl: bool = False,
        spare_tokens: int = 0,
    ):
        self.model = model
        self.num_layers = len(model.layers)
        self.buckets = token_buckets(max_tokens)
        self.capturing = capture
        self.pdl = pdl
        tmax, dt = self.buckets[-1], model.dtype
        cfg = model.cfg
        # each layer's projection width (the fused input projection) and core width (out_proj's input)
        linear = set(cfg.linear_layers)
        attn_width = cfg.num_attention_heads * cfg.head_dim
        self.proj_width = [
            sum(GatedDeltaNet.split_sizes(cfg) if i in linear else GatedAttention.split_sizes(cfg))
            for i in range(self.num_layers)
        ]
        self.core_width = [cfg.value_dim if i in linear else attn_width for i in range(self.num_layers)]

        def zeros(*shape: int, dtype: torch.dtype = dt) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.ids = zeros(tmax, dtype=torch.int64)  # padded rows keep valid token ids (0 or stale)
        self.h = zeros(tmax, cfg.hidden_size)  # the residual stream between pieces
        self.x = zeros(tmax, cfg.hidden_size)  # the last MLP's output
        # One scratch buffer: each layer's projection at its start, its core output after that, and
        # the MLP's [T, 2I] gate|up projection over both once both are dead (see mlp_scratch).
        self._core_at = tmax * max(self.proj_width)
        self.mlp_width = 2 * cfg.intermediate_size
        size = max(self._core_at + tmax * max(self.core_width), tmax * self.mlp_width)
        self._spare = self._spare_layout(
            spare_tokens if linear else 0, torch.tensor([], dtype=dt).element_size()
        )
        size = max([size, *(end for *_, end in self._spare.values())])
        self.scratch = zeros(size)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.reserved_bytes = 0  # torch memory the buffers and the graph pool hold (build_piecewise)

    def _spare_layout(self, spare_tokens: int, itemsize: int) -> dict[int, tuple[int, int, int, int]]:
        """Per bucket up to ``spare_tokens``: where a layer core's transients fit in the scratch rows
        that are dead while it runs (past the projection's rows, and past the core buffer's) -> (conv
        output at, workspace at, its elements, the scratch end that needs). The conv output's spot
        also holds an attention core's rotated q (the larger of the two sizes it)."""
        cfg = self.model.cfg
        out = {}
        for tb in self.buckets:
            if tb > spare_tokens:
                break
            conv_n = tb * max(cfg.conv_dim, cfg.num_attention_heads * cfg.head_dim)
            ws_n = -(-entry_bytes(tb, 1, cfg.linear_num_value_heads) // itemsize)
            gap1, gap1_end = _align(tb * max(self.proj_width)), self._core_at
            gap2 = _align(self._core_at + tb * max(self.core_width))
            options = []  # (scratch end needed, conv at, workspace at)
            if gap1 + ws_n <= gap1_end:  # the workspace before the core buffer, the conv output after it
                options.append((gap2 + conv_n, gap2, gap1))
            if gap1 + conv_n <= gap1_end:
                options.append((gap2 + ws_n, gap1, gap2))
            options.append((_align(gap2 + conv_n) + ws_n, gap2, _align(gap2 + conv_n)))
            end, conv_at, ws_at = min(options)
            out[tb] = (conv_at, ws_at, ws_n, end)
        return out

    def core_spare(self, tb: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Bucket ``tb``'s static memory for a prefill-only GDN core's transients (``GDNMeta.conv_out``
        and ``.workspace``: the conv output [tb, C] and the delta rule's uint8 workspace), in scratch
        rows that no projection or core buffer of that bucket uses; None beyond ``spare_tokens``."""
        spot = self._spare.get(tb)
        if spot is None:
            return None
        conv_at, ws_at, ws_n, _ = spot
        conv = self.scratch[conv_at : conv_at + tb * self.model.cfg.conv_dim].view(tb, -1)
        return conv, self.scratch[ws_at : ws_at + ws_n].view(torch.uint8)

    def q_spare(self, tb: int) -> torch.Tensor | None:
        """Bucket ``tb``'s static memory for an attention core's rotated q ([tb, H, D], the
        ``q_out`` of ``layer_core``), where a GDN core's conv output goes (no two cores run at once);
        None beyond ``spare_tokens``."""
        spot = self._spare.get(tb)
        if spot is None:
            return None
        cfg, at = self.model.cfg, spot[0]
        n = tb * cfg.num_attention_heads * cfg.head_dim
        return self.scratch[at : at + n].view(tb, cfg.num_attention_heads, cfg.head_dim)

    def bucket(self, num_tokens: int) -> int | None:
        return next((b for b in self.buckets if b >= num_tokens), None)

    def proj(self, i: int, tb: int) -> torch.Tensor:
        """Layer i's projection output at bucket ``tb``: [tb, width], contiguous."""
        w = self.proj_width[i]
        return self.scratch[: tb * w].view(tb, w)

    def core(self, i: int, tb: int) -> torch.Tensor:
        """Layer i's core output (out_proj's input) at bucket ``tb``, past every projection's rows."""
        w = self.core_width[i]
        return self.scratch[self._core_at : self._core_at + tb * w].view(tb, w)

    def mlp_scratch(self, tb: int) -> torch.Tensor:
        """The MLP's [tb, 2I] gate|up projection, its activation written over the gate half: the whole
        scratch buffer, dead by then (the layer's projection was last read by its core, the core output
        by the output projection before the MLP) until the next layer's input projection writes it. Without it
        the 4B's graph pool held 72 MiB of projection and 36 MiB of activation at 2,048 tokens."""
        return self.scratch[: tb * self.mlp_width].view(tb, self.mlp_width)

    def logits_buffer(self, rows: int, vocab: int) -> torch.Tensor | None:
        """A [rows, vocab] view of the scratch buffer (the model dtype) for a step's raw logits, or None
        when it does not fit. The scratch is dead from the last piece's MLP to the next step's first
        piece, and a step's logits are sampled on this stream before the next step starts, so the
        piecewise steps and the decode graphs (engine/worker/cuda_graphs.py) both write their logits
        here instead of keeping a [max_num_seqs, vocab] buffer (15.5 MiB for the 4B at 32 sequences)
        beside it."""
        if rows * vocab > self.scratch.numel():
            return None
        return self.scratch[: rows * vocab].view(rows, vocab)

    def piece(self, k: int, tb: int) -> None:
        """Piece k over ``tb`` rows of the static buffers (what a graph of bucket ``tb`` captures)."""
        m, h, x = self.model, self.h[:tb], self.x[:tb]
        last = k == self.num_layers
        if k == 0:  # the embedding starts the residual stream
            m.layer_in(0, m.embed(self.ids[:tb], out=h), None, out=self.proj(0, tb), norm_out=x)
            return
        # The residual stream is updated in place by both adds (add_rms_norm's h_out). x holds, in
        # turn, the output projection (read by the first add alone), the next layer's normalised
        # input (or, in the last piece, the MLP's output): the graph pool keeps only the post norm's
        # output and the MLP's, 20 MiB of the 4B at 2,048 tokens.
        # With the fused output op the MLP's down projection moves into the next piece's input norm,
        # as in the model's own forward (Qwen35Model._decoder): mlp is then its activation.
        defer = m.ops.linear_add_rms_norm is not None and not last
        mlp, _ = m.layer_out(
            k - 1,
            self.core(k - 1, tb),
            h,
            out=x if last else None,
            h_out=h,
            mlp_scratch=self.mlp_scratch(tb),
            mixer_out=x,
            defer_down=defer,
        )
        if not last:
            down = m.mlp_down(k - 1) if defer else None
            m.layer_in(k, mlp, h, out=self.proj(k, tb), h_out=h, norm_out=x, down=down)

    @torch.inference_mode()
    def run(self, fb: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        """The step's raw logits ``[len(fb.logits_indices), vocab]`` in the model dtype (``model(fb,
        cache)`` gives the same values widened to fp32), through the pieces of the smallest bucket that
        holds the step. They live in the scratch buffer (:meth:`logits_buffer`) when they fit: read
        them before the next step runs."""
        x, h = self._decoder(fb, cache)
        n, vocab = len(fb.logits_indices), self.model.cfg.vocab_size
        out = self.logits_buffer(n, vocab)
        if out is None:
            out = torch.empty((n, vocab), dtype=self.scratch.dtype, device=self.scratch.device)
        return self.model.logits(x, h, fb.logits_indices, out=out)

    @torch.inference_mode()
    def hidden_states(self, fb: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        """Every token's last hidden state ``[T, hidden]``, as ``model.hidden_states`` gives it (a new
        tensor: the static buffers are overwritten by the next step), for prompt scoring."""
        x, h = self._decoder(fb, cache)
        return h + x

    def _decoder(self, fb: ForwardBatch, cache: ModelCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the step: pieces (replayed, or eager without capture) with the layer cores between them
        -> views of the first ``T`` rows of the last MLP output and the residual stream."""
        t = fb.num_tokens
        tb = self.bucket(t)
        if tb is None:
            raise ValueError(f"a step of {t} tokens is beyond the largest bucket, {self.buckets[-1]}")
        graphs = self.graphs.get(tb) if self.capturing else None
        if self.capturing and graphs is None:
            graphs = self.capture(tb)  # lazy capture; not called once captured (no_gc collects)
        self.ids[:t].copy_(fb.input_ids)
        meta = GDNMeta.from_batch(fb)
        m = self.model
        for k in range(self.num_layers + 1):
            if graphs is None:
                self.piece(k, tb)
            else:
                graphs[k].replay()
            if k < self.num_layers:
                m.layer_core(k, self.proj(k, tb)[:t], fb, meta, cache, out=self.core(k, tb)[:t])
        return self.x[:t], self.h[:t]

    @no_gc()
    def capture(self, tb: int) -> list[torch.cuda.CUDAGraph]:
        """Capture bucket ``tb``'s pieces now (unless they are), after one eager pass over them on the
        capture stream (kernel builds, cuBLAS's workspace for that stream)."""
        done = self.graphs.get(tb)
        if done is not None:
            return done
        side = capture_stream(self.ids.device)
        side.wait_stream(torch.cuda.current_stream())
        graphs = []
        with torch.cuda.stream(side), torch.inference_mode():
            for k in range(self.num_layers + 1):
                self.piece(k, tb)
            for k in range(self.num_layers + 1):
                g = torch.cuda.CUDAGraph()
                # capture_begin directly: torch.cuda.graph() would gc.collect() and empty the
                # allocator's cache before each of the hundreds of pieces
                g.capture_begin(pool=self.pool)
                try:
                    with graph_launches(self.pdl):
                        self.piece(k, tb)
                finally:
                    g.capture_end()
                graphs.append(g)
        torch.cuda.current_stream().wait_stream(side)
        self.graphs[tb] = graphs
        return graphs

    @no_gc()
    def capture_all(self) -> None:
        """Every bucket, largest first (the smaller ones reuse its pool memory)."""
        t0 = time.perf_counter()
        for tb in reversed(self.buckets):
            self.capture(tb)
        log.info(
            "captured %d piecewise graphs (%d pieces x token buckets %s) in %.1f s",
            sum(len(g) for g in self.graphs.values()),
            self.num_layers + 1,
            list(self.buckets),
            time.perf_counter() - t0,
        )


def build_piecewise(
    model: Qwen35Model,
    max_tokens: int,
    device: torch.device,
    pdl: bool,
    every: bool,
    spare_tokens: int = 0,
) -> PiecewiseGraphs:
    """The server's piecewise graphs: every bucket captured (``every``, --cuda-graph-capture startup)
    or the largest (lazy: the rest on first use), with ``reserved_bytes`` measured around the build.
    They touch no KV or state pool, so they can be built on the profile pool and kept."""

    def settled() -> tuple[int, int]:  # (torch's reservations, device-wide use)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        return torch.cuda.memory_reserved(device), total - free

    reserved, used = settled()
    pw = PiecewiseGraphs(model, max_tokens, device, pdl=pdl, spare_tokens=spare_tokens)
    if every:
        pw.capture_all()
    else:
        pw.capture(pw.buckets[-1])
    reserved_after, used_after = settled()
    pw.reserved_bytes = reserved_after - reserved
    # the rest of the device-wide growth lies outside torch: the driver's executable graphs (and the
    # first use of the capture stream's cuBLAS workspace), in the split's non_torch part
    log.info(
        "piecewise graphs: %d captured over %d token buckets; %.0f MiB of static buffers and graph "
        "pool, %.0f MiB device-wide",
        sum(len(g) for g in pw.graphs.values()),
        len(pw.graphs),
        pw.reserved_bytes / 2**20,
        (used_after - used) / 2**20,
    )
    return pw

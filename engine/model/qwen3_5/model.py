"""Qwen3.5 dense text model over a flat varlen batch (``ForwardBatch``), paged KV and GDN state slots."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.cache import CacheSpec, ModelCache
from engine.model.forward_batch import ForwardBatch
from engine.model.qwen3_5.config import LINEAR, Qwen35Config
from engine.model.qwen3_5.layers import MLP, GatedAttention, GatedDeltaNet, GDNMeta
from engine.ops import Ops


def cache_spec(c: Qwen35Config) -> CacheSpec:
    """What the pools hold for this model: paged K/V per gated-attention layer, a conv and a recurrent
    state slot per GDN layer (a function of the config alone, so it needs no built model)."""
    return CacheSpec(
        num_kv_layers=len(c.full_layers),
        kv_token_shape=(c.num_key_value_heads, c.head_dim),
        num_state_layers=len(c.linear_layers),
        conv_state_shape=(c.conv_dim, c.linear_conv_kernel_dim - 1),
        ssm_state_shape=(c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim),
    )


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen35Config, layer_type: str, dtype: torch.dtype):
        super().__init__()
        self.is_linear = layer_type == LINEAR
        self.mixer: GatedDeltaNet | GatedAttention = (
            GatedDeltaNet(cfg, dtype) if self.is_linear else GatedAttention(cfg, dtype)
        )
        self.input_norm = nn.Parameter(torch.empty(cfg.hidden_size, dtype=dtype), requires_grad=False)
        self.post_norm = nn.Parameter(torch.empty(cfg.hidden_size, dtype=dtype), requires_grad=False)
        self.mlp = MLP(cfg, dtype)


class Qwen35Model(nn.Module):
    """Embedding -> decoder layers (GDN or gated attention, each followed by an MLP) -> norm -> lm_head."""

    def __init__(self, cfg: Qwen35Config, ops: Ops, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg = cfg
        self.ops = ops
        self.dtype = dtype
        self.embed_tokens = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype), False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t, dtype) for t in cfg.layer_types)
        self.norm = nn.Parameter(torch.empty(cfg.hidden_size, dtype=dtype), requires_grad=False)
        # Tied checkpoints share the embedding; untied ones get their own head.
        self.lm_head = (
            self.embed_tokens
            if cfg.tie_word_embeddings
            else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype), False)
        )
        # Map a layer index to its slot in the GDN pools or the KV pools.
        self._linear_idx = {layer: i for i, layer in enumerate(cfg.linear_layers)}
        self._full_idx = {layer: i for i, layer in enumerate(cfg.full_layers)}

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, cache: ModelCache, out: torch.Tensor | None = None) -> torch.Tensor:
        """Returns fp32 logits ``[len(fb.logits_indices), vocab]`` for the sampled positions: the last
        residual add and the final norm run on those rows only, fused into one op. With ``out`` (in
        the model dtype, e.g. a decode graph's static output) the lm_head writes its raw logits there
        and ``out`` is returned: see :meth:`logits`."""
        x, h = self._decoder(fb, cache)
        return self.logits(x, h, fb.logits_indices, out=out)

    @torch.inference_mode()
    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and lm_head of some rows of :meth:`hidden_states`: ``[R, hidden] -> [R, vocab]`` fp32.
        The norm is per row, so gathering rows first and normalising after is exact."""
        return self.raw_logits(h).float()

    @torch.inference_mode()
    def raw_logits(self, h: torch.Tensor) -> torch.Tensor:
        """:meth:`compute_logits` in the model dtype (its exact fp32 widening is compute_logits): what
        the prompt scorer reads, so no [R, vocab] fp32 copy is made for it."""
        return self.ops.linear(self.ops.rms_norm(h, self.norm, self.cfg.rms_norm_eps), self.lm_head)

    @torch.inference_mode()
    def hidden_states(self, fb: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        """The last decoder layer's output for every token, before the final norm: [T, hidden]
        (prompt scoring needs every row; a plain step uses :meth:`forward`)."""
        x, h = self._decoder(fb, cache)
        return x if h is None else h + x

    def _decoder(self, fb: ForwardBatch, cache: ModelCache) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder layers -> (the last MLP's output x, the residual stream h before its add)."""
        x = self.embed(fb.input_ids)  # [T, hidden]
        h: torch.Tensor | None = None
        meta = GDNMeta.from_batch(fb)
        # With the fused output op, each MLP but the last leaves its down projection to the next
        # layer's input norm (x is then that MLP's activation); the last one's output is the caller's.
        fuse, down = self.ops.linear_add_rms_norm is not None, None
        last = len(self.layers) - 1
        for i in range(len(self.layers)):
            p, h = self.layer_in(i, x, h, down=down)
            c = self.layer_core(i, p, fb, meta, cache)
            defer = fuse and i < last
            x, h = self.layer_out(i, c, h, defer_down=defer)
            down = self.mlp_down(i) if defer else None
        return x, h

    # The decoder split at its varlen ops, for the piecewise graphs (engine/worker/piecewise.py):
    # layer_in and layer_out are per-token dense work a graph captured at a padded token count can
    # replay; layer_core reads the batch's sequence layout and runs eagerly. Each norm folds in the
    # residual add before it, so the last add is left to logits().

    def embed(self, input_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings [T, hidden], into ``out`` when given (the same rows F.embedding gathers)."""
        if out is None:
            return F.embedding(input_ids, self.embed_tokens)
        return torch.index_select(self.embed_tokens, 0, input_ids, out=out)

    def layer_in(
        self,
        i: int,
        x: torch.Tensor,
        h: torch.Tensor | None,
        out: torch.Tensor | None = None,
        h_out: torch.Tensor | None = None,
        norm_out: torch.Tensor | None = None,
        down: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's residual add, input norm and mixer input projection -> (projection, residual);
        ``out`` and ``h_out`` (which may be ``h``: the residual stream in place) receive them,
        ``norm_out`` the normalised rows the projection reads. With ``down`` (the previous MLP's down
        weight), x is that MLP's activation and its projection is fused into the add and norm."""
        layer: DecoderLayer = self.layers[i]  # type: ignore[assignment]
        eps = self.cfg.rms_norm_eps
        if down is None:
            y, h = self.ops.add_rms_norm(x, h, layer.input_norm, eps, h_out=h_out, y_out=norm_out)
        else:
            fused = self.ops.linear_add_rms_norm
            assert fused is not None
            y, h = fused(x, down, h, layer.input_norm, eps, h_out=h_out, y_out=norm_out)
        return layer.mixer.project(y, self.ops, out=out), h

    def mlp_down(self, i: int) -> torch.Tensor:
        """Layer i's MLP down weight (what :meth:`layer_in` takes as ``down`` after layer i)."""
        layer: DecoderLayer = self.layers[i]  # type: ignore[assignment]
        return layer.mlp.down

    def layer_core(
        self,
        i: int,
        proj: torch.Tensor,
        fb: ForwardBatch,
        meta: GDNMeta,
        cache: ModelCache,
        out: torch.Tensor | None = None,
        q_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Layer i's mixer between its projections (GDN conv/gates/delta rule, or attention), into
        ``out`` when given; an attention layer writes its rotated q into ``q_out`` when given."""
        layer: DecoderLayer = self.layers[i]  # type: ignore[assignment]
        mixer = layer.mixer
        if isinstance(mixer, GatedDeltaNet):
            j = self._linear_idx[i]
            return mixer.core(proj, meta, cache.conv_state[j], cache.ssm_state[j], self.ops, out=out)
        j = self._full_idx[i]
        return mixer.core(proj, fb, cache.k_cache[j], cache.v_cache[j], self.ops, out=out, q_out=q_out)

    def layer_out(
        self,
        i: int,
        c: torch.Tensor,
        h: torch.Tensor,
        out: torch.Tensor | None = None,
        h_out: torch.Tensor | None = None,
        mlp_scratch: torch.Tensor | None = None,
        mixer_out: torch.Tensor | None = None,
        defer_down: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's mixer output projection, residual add, post norm and MLP -> (MLP output, residual);
        ``out`` and ``h_out`` (which may be ``h``) receive them, ``mlp_scratch`` ([T, 2I]) the MLP's
        gate|up projection and activation, ``mixer_out`` the output projection (read by the add
        alone, so it may be ``out``). With ``defer_down`` the MLP's activation comes back instead of
        its output (for :meth:`layer_in`'s ``down``)."""
        layer: DecoderLayer = self.layers[i]  # type: ignore[assignment]
        eps, fused = self.cfg.rms_norm_eps, self.ops.linear_add_rms_norm
        if fused is None:
            x = layer.mixer.output(c, self.ops, out=mixer_out)
            y, h = self.ops.add_rms_norm(x, h, layer.post_norm, eps, h_out=h_out)
        else:  # the projection may never be materialised (mixer_out then stays unwritten)
            w = layer.mixer.output_weight
            y, h = fused(c, w, h, layer.post_norm, eps, h_out=h_out, x_out=mixer_out)
        return layer.mlp(y, self.ops, out=out, scratch=mlp_scratch, defer_down=defer_down), h

    def logits(
        self, x: torch.Tensor, h: torch.Tensor | None, rows: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits of ``rows``: the last residual add and the final norm on those rows alone. Without
        ``out``, fp32. With ``out`` ([len(rows), vocab] in the model dtype: a graph's static output),
        the lm_head writes its raw logits there and nothing is widened: HF's logits are this bf16
        tensor before ``.float()``, so its fp32 widening (the sampler's, when a row needs more than
        greedy argmax) is exact and the argmax of either is the same token. Widening in here cost a
        [B, vocab] copy kernel in every decode graph (24 us at batch 32) and twice the buffer."""
        eps = self.cfg.rms_norm_eps
        y, _ = self.ops.add_rms_norm(x[rows], None if h is None else h[rows], self.norm, eps)
        if out is None:
            return self.ops.linear(y, self.lm_head).float()
        if out.dtype != self.lm_head.dtype or tuple(out.shape) != (y.shape[0], self.lm_head.shape[0]):
            raise ValueError(
                f"logits out: need [{y.shape[0]}, {self.lm_head.shape[0]}] {self.lm_head.dtype}, "
                f"got {tuple(out.shape)} {out.dtype}"
            )
        return self.ops.linear(y, self.lm_head, out=out)

    def cache_spec(self) -> CacheSpec:
        return cache_spec(self.cfg)

    def num_parameters(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total

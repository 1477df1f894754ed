"""Qwen3.5 layers over a flat varlen token batch: gated DeltaNet, gated full attention, SwiGLU MLP.

Each mixer is ``project`` (its fused input projection), ``core`` (what lies between the projections:
the varlen part) and ``output`` (its output projection); the model composes them, and the piecewise
graphs capture the projections (engine/worker/piecewise.py). Projections that read the same input are
fused into one weight at load time (GDN: qkv|z|b|a; attention: q+gate|k|v; MLP: gate|up), so each
layer issues one GEMM per input. The loader knows the row offsets (``fused_shards``). Every op, the
GEMMs included (``ops.linear``), goes through the ``Ops`` table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.model.forward_batch import ForwardBatch
from engine.model.qwen3_5.config import Qwen35Config
from engine.ops import Ops


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


@dataclass(frozen=True)
class GDNMeta:
    """Per-step views of the batch for GDN layers, computed once per forward, not per layer."""

    num_decodes: int
    prefill_qsl: torch.Tensor  # [P+1] int32, offsets of the prefill sequences within the prefill tokens
    prefill_slots: torch.Tensor  # [P] int32
    prefill_has_state: torch.Tensor  # [P] bool
    decode_slots: torch.Tensor  # [D] int32
    prefill_max_len: int
    # Static memory for a prefill-only core's transients (a whole-step graph's, from the piecewise
    # scratch's rows dead during a layer core: engine/worker/prefill_graphs.py): the conv output
    # [T, C] and the delta rule's workspace (uint8). None: allocated per call.
    conv_out: torch.Tensor | None = None
    workspace: torch.Tensor | None = None

    @staticmethod
    def from_batch(fb: ForwardBatch) -> GDNMeta:
        nd = fb.num_decodes
        lens = [
            b - a for a, b in zip(fb.query_start_loc_cpu[nd:], fb.query_start_loc_cpu[nd + 1 :], strict=False)
        ]
        return GDNMeta(
            num_decodes=nd,
            prefill_qsl=fb.query_start_loc[nd:] - nd,
            prefill_slots=fb.state_slot[nd:],
            prefill_has_state=fb.has_initial_state[nd:],
            decode_slots=fb.state_slot[:nd],
            prefill_max_len=max(lens, default=0),
        )


class MLP(nn.Module):
    def __init__(self, cfg: Qwen35Config, dtype: torch.dtype):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up = _param(2 * cfg.intermediate_size, cfg.hidden_size, dtype=dtype)
        self.down = _param(cfg.hidden_size, cfg.intermediate_size, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,
        ops: Ops,
        out: torch.Tensor | None = None,
        scratch: torch.Tensor | None = None,
        defer_down: bool = False,
    ) -> torch.Tensor:
        """SwiGLU MLP -> [T, hidden] (into ``out``). With ``scratch`` ([T, 2I], memory the caller knows
        is dead here: the piecewise graphs lend their projection buffer), the gate|up projection goes
        there and the activation overwrites its gate half in place, so the MLP allocates nothing. With
        ``defer_down`` it returns the activation [T, I] and the caller applies ``down`` (fused with the
        next norm: Ops.linear_add_rms_norm)."""
        gu = ops.linear(x, self.gate_up, out=scratch)  # [T, 2I]
        act = ops.silu_mul(gu, out=None if scratch is None else gu[:, : self.inter])
        return act if defer_down else ops.linear(act, self.down, out=out)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Qwen35Config, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        nv = cfg.linear_num_value_heads
        self.splits = self.split_sizes(cfg)
        self.in_proj = _param(sum(self.splits), cfg.hidden_size, dtype=dtype)
        self.conv_weight = _param(cfg.conv_dim, cfg.linear_conv_kernel_dim, dtype=dtype)
        # HF has no keep-in-fp32 modules, so A_log and the norm weight live in the model dtype.
        self.A_log = _param(nv, dtype=dtype)
        self.dt_bias = _param(nv, dtype=dtype)
        self.norm_weight = _param(cfg.linear_value_head_dim, dtype=dtype)
        self.out_proj = _param(cfg.hidden_size, cfg.value_dim, dtype=dtype)

    @staticmethod
    def split_sizes(cfg: Qwen35Config) -> list[int]:
        """The fused input projection's parts: qkv | z | b | a."""
        nv = cfg.linear_num_value_heads
        return [cfg.conv_dim, cfg.value_dim, nv, nv]

    def project(self, x: torch.Tensor, ops: Ops, out: torch.Tensor | None = None) -> torch.Tensor:
        """The fused input projection, qkv | z | b | a: [T, hidden] -> [T, C + Nv*dv + 2 Nv]."""
        return ops.linear(x, self.in_proj, out=out)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.out_proj

    def output(self, y: torch.Tensor, ops: Ops, out: torch.Tensor | None = None) -> torch.Tensor:
        return ops.linear(y, self.out_proj, out=out)

    def core(
        self,
        proj: torch.Tensor,  # [T, C + Nv*dv + 2 Nv], project()'s output
        meta: GDNMeta,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
        ops: Ops,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Everything between the two projections (the varlen part: conv, gates, delta rule, gated
        norm) -> [T, Nv*dv]; written into ``out`` when given (a piecewise graph's static input)."""
        cfg = self.cfg
        qkv, z, b, a = torch.split(proj, self.splits, dim=-1)
        nd = meta.num_decodes
        if nd == 0 or ops.gdn_decode is None:
            return self._mixed(qkv, z, b, a, nd, meta, conv_state, ssm_state, ops, out=out)
        else:
            # decode rows through the fused kernel (K4), the prefill rows (if any) as usual
            y = ops.gdn_decode(
                qkv[:nd],
                z[:nd],
                b[:nd],
                a[:nd],
                self.conv_weight,
                conv_state,
                self.A_log,
                self.dt_bias,
                self.norm_weight,
                cfg.rms_norm_eps,
                ssm_state,
                meta.decode_slots,
                cfg.linear_num_key_heads,
            )
            if nd < proj.shape[0]:
                tail = None if out is None else out[nd:]
                q, zz, bb, aa = qkv[nd:], z[nd:], b[nd:], a[nd:]
                rest = self._mixed(q, zz, bb, aa, 0, meta, conv_state, ssm_state, ops, out=tail)
                if out is None:
                    return torch.cat([y, rest])
                out[:nd].copy_(y)  # the decode rows only: the prefill rows were written in place
                return out
        return y if out is None else out.copy_(y)

    def _mixed(
        self,
        qkv: torch.Tensor,  # [T, C]
        z: torch.Tensor,  # [T, Nv*dv]
        b: torch.Tensor,  # [T, Nv]
        a: torch.Tensor,  # [T, Nv]
        nd: int,  # how many leading rows are decodes (the rest are meta's prefill sequences)
        meta: GDNMeta,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
        ops: Ops,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Conv, gates, delta rule and gated norm as separate ops -> [T, Nv*dv] (out_proj's input),
        the norm writing into ``out`` (contiguous) when given."""
        cfg = self.cfg
        t = qkv.shape[0]
        parts = []
        if nd:
            parts.append(ops.causal_conv1d_decode(qkv[:nd], self.conv_weight, conv_state, meta.decode_slots))
        # the static transients serve a prefill-only core of exactly their rows
        static = nd == 0 and meta.conv_out is not None and meta.conv_out.shape[0] == t
        if nd < t:
            parts.append(
                ops.causal_conv1d_prefill(
                    qkv[nd:],
                    self.conv_weight,
                    conv_state,
                    meta.prefill_qsl,
                    meta.prefill_slots,
                    meta.prefill_has_state,
                    meta.prefill_max_len,
                    out=meta.conv_out if static else None,
                )
            )
        qkv = parts[0] if len(parts) == 1 else torch.cat(parts)
        q, k, v = torch.split(qkv, [cfg.key_dim, cfg.key_dim, cfg.value_dim], dim=-1)
        q = q.reshape(t, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        k = k.reshape(t, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        v = v.reshape(t, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        g, beta = ops.gdn_gating(a, b, self.A_log, self.dt_bias)
        outs = []
        if nd:
            outs.append(
                ops.recurrent_gated_delta_rule(
                    q[:nd], k[:nd], v[:nd], g[:nd], beta[:nd], ssm_state, meta.decode_slots
                )
            )
        dv = cfg.linear_value_head_dim
        # A prefill-only core (the piecewise path's) has the delta rule write ``out`` and normalises
        # it there in place: no [T, Nv, dv] temporary beside the conv output.
        direct = out is not None and nd == 0
        if nd < t:
            outs.append(
                ops.chunk_gated_delta_rule(
                    q[nd:],
                    k[nd:],
                    v[nd:],
                    g[nd:],
                    beta[nd:],
                    ssm_state,
                    meta.prefill_qsl,
                    meta.prefill_slots,
                    meta.prefill_has_state,
                    meta.prefill_max_len,
                    out=out if direct else None,
                    workspace=meta.workspace if static else None,
                )
            )
        o = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, Nv, dv]
        nv = cfg.linear_num_value_heads
        dst = None if out is None else out.view(t, nv, dv)
        # z stays the [T, Nv, dv] view of the projection: as [T * Nv, dv] rows it would be a copy (the
        # projection's rows are wider than z), 24 x ~22 us of a 2,048-token step's device time
        y = ops.gated_rms_norm(o.view(t, nv, dv), z.view(t, nv, dv), self.norm_weight, cfg.rms_norm_eps, dst)
        return y.reshape(t, cfg.value_dim) if out is None else out


class GatedAttention(nn.Module):
    def __init__(self, cfg: Qwen35Config, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.num_attention_heads, cfg.head_dim
        self.splits = self.split_sizes(cfg)
        self.qkv_proj = _param(sum(self.splits), cfg.hidden_size, dtype=dtype)
        self.q_norm = _param(d, dtype=dtype)
        self.k_norm = _param(d, dtype=dtype)
        self.o_proj = _param(cfg.hidden_size, h * d, dtype=dtype)
        self.scale = d**-0.5

    @staticmethod
    def split_sizes(cfg: Qwen35Config) -> list[int]:
        """The fused input projection's parts: per-head [query | gate] interleaved | k | v."""
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        return [2 * h * d, hkv * d, hkv * d]

    def project(self, x: torch.Tensor, ops: Ops, out: torch.Tensor | None = None) -> torch.Tensor:
        """The fused input projection, per-head [query | gate] | k | v: [T, hidden] -> [T, 2HD + 2 Hkv D]."""
        return ops.linear(x, self.qkv_proj, out=out)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.o_proj

    def output(self, o: torch.Tensor, ops: Ops, out: torch.Tensor | None = None) -> torch.Tensor:
        return ops.linear(o, self.o_proj, out=out)

    def core(
        self,
        proj: torch.Tensor,  # [T, 2HD + 2 Hkv D], project()'s output
        fb: ForwardBatch,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        ops: Ops,
        out: torch.Tensor | None = None,
        q_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q/k norm, RoPE, the KV write and the gated attention -> [T, H*D] (o_proj's input); written
        into ``out`` when given (a piecewise graph's static input), the rotated q into ``q_out`` ([T,
        H*D] contiguous: a whole-step graph's dead scratch rows)."""
        cfg = self.cfg
        t = proj.shape[0]
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qg, k, v = torch.split(proj, self.splits, dim=-1)
        qg = qg.reshape(t, h, 2 * d)
        gate = qg[..., d:]
        q = ops.qk_norm_rope_kv(
            qg,
            k.reshape(t, hkv, d),
            v.reshape(t, hkv, d),
            self.q_norm,
            self.k_norm,
            cfg.rms_norm_eps,
            fb.positions,
            cfg.rotary_dim,
            cfg.rope_theta,
            k_cache,
            v_cache,
            fb.slot_mapping,
            out=q_out,
        )  # [T, H, D]; k, v are in the cache now
        o = ops.paged_attention(
            q,
            k_cache,
            v_cache,
            fb.block_table,
            fb.query_start_loc,
            fb.seq_lens,
            fb.num_computed,
            self.scale,
            fb.max_query_len,
            fb.max_seq_len,
            gate=gate,
            out=out,
        )  # [T, H, D], already multiplied by sigmoid(gate); in ``out`` when given
        return o.reshape(t, h * d) if out is None else out

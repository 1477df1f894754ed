"""The single dispatch point between the model and its kernels.

The model calls every op through an :class:`Ops` table it receives at construction; nothing is
global. ``make_ops("torch")`` gives the float32-internal torch reference ops (CPU and CUDA);
``make_ops("cuda")`` swaps in the CuPy RawKernel implementations op by op where they exist and
keeps the reference for the rest.

Shapes use: T flat tokens of a varlen batch, B sequences, C conv channels, K conv width,
Nk/Nv key/value heads, dk/dv head dims, H/Hkv attention heads, D head dim, S state slots,
NB KV blocks of ``bs`` tokens. Pools (conv state, recurrent state, KV) are updated in place.

Reference signatures (every backend implements exactly these):

linear(x [M, K], w [N, K], out=None) -> [M, N]
    F.linear without bias, in x.dtype (every projection and the lm_head go through it); with ``out``
    [M, N] the same GEMM written into it (torch.mm), as a piecewise graph's static buffers need.
rms_norm(x [N, D], weight [D], eps) -> [N, D]
    Zero-centred RMSNorm: fp32 compute, scale (1 + w), cast to x.dtype after the multiply.
gated_rms_norm(x [N, dv], z [N, dv], weight [dv], eps, out=None) -> x's shape  (out: N * dv contiguous values)
    x and z may also be [T, H, dv] (the model passes its gate as the [T, Nv, dv] view of the projection).
    GDN output norm, HF semantics: y = x.float() * rsqrt(mean(x^2) + eps); y = weight * y.to(x.dtype);
    y = y * silu(z.float()); return y.to(x.dtype). Plain weight, not (1 + w).
causal_conv1d_prefill(x [T, C], weight [C, K], conv_state [S, C, K-1], query_start_loc [B+1],
                      state_slot [B], has_initial_state [B], max_query_len, out=None) -> [T, C]
    Per sequence: causal depthwise conv over its tokens with the K-1 previous inputs taken from
    conv_state[slot] when has_initial_state else zeros, then SiLU; compute in weight dtype as HF;
    writes the last K-1 *inputs* (history included when the sequence is shorter) to conv_state[slot].
causal_conv1d_decode(x [B, C], weight [C, K], conv_state [S, C, K-1], state_slot [B]) -> [B, C]
    One token per sequence: out = silu(sum_j w[:, j] * window[:, j]) with window = state ++ x;
    shifts x into conv_state[slot].
gdn_gating(a [T, Nv], b [T, Nv], A_log [Nv], dt_bias [Nv]) -> (g [T, Nv] fp32, beta [T, Nv] fp32)
    g = -exp(A_log.float()) * softplus(a.float() + dt_bias.float()); beta = sigmoid(b) in b.dtype, then fp32.
chunk_gated_delta_rule(q [T, Nk, dk], k [T, Nk, dk], v [T, Nv, dv], g [T, Nv], beta [T, Nv],
                       ssm_state [S, Nv, dk, dv], query_start_loc [B+1], state_slot [B],
                       has_initial_state [B], max_query_len, out=None, workspace=None) -> o [T, Nv, dv]
    in v.dtype; out: T * Nv * dv contiguous values; workspace: uint8 scratch the CUDA split path may
    put its chunk entries in (a CUDA graph's static memory), ignored elsewhere.
    Value head j reads key head j // (Nv // Nk). q, k are L2-normalised in fp32 (eps 1e-6 added to the
    sum of squares) and q is scaled by dk**-0.5 inside. Chunk size 64 from each sequence's first new
    token, HF torch_chunk_gated_delta_rule math. Initial state from ssm_state[slot] when
    has_initial_state else zeros; the final state is written back to ssm_state[slot].
    ssm_state is fp32 or bf16 (--mamba-ssm-cache-dtype): every op computes in fp32 and rounds to the
    pool's dtype only when it stores the state (once per call, decode step or prefill alike).
recurrent_gated_delta_rule(q [B, Nk, dk], k [B, Nk, dk], v [B, Nv, dv], g [B, Nv], beta [B, Nv],
                           ssm_state [S, Nv, dk, dv], state_slot [B]) -> o [B, Nv, dv] in v.dtype
    One token per sequence, HF torch_recurrent_gated_delta_rule math (decay, delta update, read after
    write); state read from and written to ssm_state[slot] in place.
apply_rope(q [T, H, D], k [T, Hkv, D], positions [T], rotary_dim, theta) -> (q, k)
    Neox rotate-half over the first rotary_dim dims; cos/sin computed in fp32 then cast to q.dtype.
write_kv(k [T, Hkv, D], v [T, Hkv, D], k_cache [NB, bs, Hkv, D], v_cache [NB, bs, Hkv, D], slot_mapping [T])
paged_attention(q [T, H, D], k_cache, v_cache, block_table [B, M], query_start_loc [B+1], seq_lens [B],
                num_computed [B], scale, max_query_len, max_seq_len, *, gate=None, out=None) -> [T, H, D]
    Token j of sequence b sits at position num_computed[b] + j and attends causally to every cached
    position <= its own (the tokens of this step must already be written). GQA: head h uses kv head
    h // (H // Hkv). Softmax in fp32. gate [T, H, D] (any row strides): out.to(q.dtype) * sigmoid(gate).
    out: T * H * D contiguous values that receive the result (a piecewise graph's static buffer).
add_rms_norm(x [N, D], residual [N, D] | None, weight [D], eps, h_out=None, y_out=None) -> (y, h) [N, D]
    h = residual + x in x.dtype (h is x when residual is None); y = rms_norm(h, weight, eps). With
    h_out [N, D] (which may be residual itself), h is written there (needs a residual); with y_out
    (contiguous, apart from the inputs), y.
silu_mul(gu [N, 2I], out=None) -> [N, I]
    silu(gu[:, :I]) * gu[:, I:] (SwiGLU on the fused gate|up projection); out may be gu[:, :I].
qk_norm_rope_kv(qg [T, H, 2D], k [T, Hkv, D], v [T, Hkv, D], q_norm [D], k_norm [D], eps, positions [T],
                rotary_dim, theta, k_cache, v_cache, slot_mapping [T], out=None) -> q [T, H, D]
    qg holds each head's query then its gate; exactly rms_norm(q), rms_norm(k), apply_rope(q, k) and
    write_kv(k, v, ...) in that order; the normed, rotated q comes back contiguous (in out, T * H * D
    contiguous values 16-byte aligned, when given: a whole-step graph's static buffer).
argmax(x [S, V]) -> [S] int64
    x.argmax(dim=-1) (the sampler's greedy token): the first NaN wins, else the largest value, ties to
    the lowest index. Not called by the model: the runner hands it to the sampler.
logprobs(x [R, V], targets [R] int64, k, rank=True) -> (chosen [R] fp32, rank [R] int64 | None,
         top_v [R, k] fp32 | None, top_i [R, k] int64 | None)
    Of logp = log_softmax(x, dtype=float32): each row's target logprob, its rank (1 + the entries
    above it; None unless ``rank``) and logp.topk(k) (None when k is 0). Targets lie in [0, V). The
    sampler's logprobs and the prompt scorer's; not called by the model.

Optional fused ops (``None`` in a table: the model composes the ops above instead):

gdn_decode(qkv [B, C], z [B, Nv*dv], b [B, Nv], a [B, Nv], conv_weight, conv_state, A_log, dt_bias,
           norm_weight, eps, ssm_state, state_slot [B], num_k_heads) -> y [B, Nv*dv]
    A GDN layer's decode step from its projection outputs to out_proj's input, in one kernel
    (K4 in docs/kernels.md): exactly causal_conv1d_decode, gdn_gating, recurrent_gated_delta_rule and
    gated_rms_norm in that order (``engine.ops.reference.gdn_decode`` composes them).
linear_add_rms_norm(a [M, K], w [N, K], residual [M, N], weight [N], eps, h_out=None, y_out=None,
                    x_out=None) -> (y, h) [M, N]
    add_rms_norm(linear(a, w, out=x_out), residual, weight, eps, h_out, y_out): a mixer's output
    projection and the post norm. An implementation may never materialise the projection (x_out is
    then left unwritten): arm linear.split_norm sums a split-K GEMM's fp32 partials inside the norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

OP_NAMES = (
    "linear",
    "rms_norm",
    "gated_rms_norm",
    "causal_conv1d_prefill",
    "causal_conv1d_decode",
    "gdn_gating",
    "chunk_gated_delta_rule",
    "recurrent_gated_delta_rule",
    "apply_rope",
    "write_kv",
    "paged_attention",
    "add_rms_norm",
    "silu_mul",
    "qk_norm_rope_kv",
    "argmax",
    "logprobs",
)


@dataclass(frozen=True)
class Ops:
    """A table of op implementations. Build it with :func:`make_ops`; the model only calls it."""

    linear: Callable[..., Any]
    rms_norm: Callable[..., Any]
    gated_rms_norm: Callable[..., Any]
    causal_conv1d_prefill: Callable[..., Any]
    causal_conv1d_decode: Callable[..., Any]
    gdn_gating: Callable[..., Any]
    chunk_gated_delta_rule: Callable[..., Any]
    recurrent_gated_delta_rule: Callable[..., Any]
    apply_rope: Callable[..., Any]
    write_kv: Callable[..., Any]
    paged_attention: Callable[..., Any]
    add_rms_norm: Callable[..., Any]
    silu_mul: Callable[..., Any]
    qk_norm_rope_kv: Callable[..., Any]
    argmax: Callable[..., Any]
    logprobs: Callable[..., Any]
    gdn_decode: Callable[..., Any] | None = None
    linear_add_rms_norm: Callable[..., Any] | None = None
    backend: str = "torch"


def reference_ops() -> Ops:
    from engine.ops import reference as r

    return Ops(**{name: getattr(r, name) for name in OP_NAMES}, backend="torch")


def make_ops(backend: str = "torch", arms: frozenset[str] = frozenset()) -> Ops:
    """``backend``: "torch" (reference) or "cuda" (CuPy kernels where they exist, reference elsewhere)."""
    ops = reference_ops()
    if backend == "torch":
        return ops
    if backend == "cuda":
        from engine.ops.arms import cuda_overrides

        return replace(ops, **cuda_overrides(arms), backend="cuda")
    raise ValueError(f"unknown op backend {backend!r} (expected 'torch' or 'cuda')")

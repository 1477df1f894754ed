"""CuPy/NVRTC implementations of the GDN ops (sources in the repo's top-level ``cuda/`` folder).

``cuda_overrides(arms)`` maps op names to callables with the exact reference signatures of
:mod:`engine.ops`; arms (KERNELS.md) are compile-time template choices bound here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

ARMS = frozenset(
    {
        "conv.chunk8",
        "conv.k4",
        "conv.vec4",
        "decode.fused",
        "prefill.tensorcore",
        "norm.fused",
        "attention.qk_fused",
    }
)
# Kept by the end-to-end A/B of docs/bench-evidence/2026-11-29-s2-gdn-kernels.md (run 2): W1 5% faster,
# TTFT -7%, TPOT -4.5%, every metric outside the A/A band. conv.vec4 (26% faster conv prefill at
# kernel level) was within the A/A noise end to end (run 3), so it stays off.
DEFAULT_ARMS = frozenset({"conv.chunk8", "conv.k4", "decode.fused", "prefill.tensorcore"})
# norm.fused (add_rms_norm, silu_mul) and attention.qk_fused (qk_norm_rope_kv): bf16 kernels of
# cuda/norm/fused.cu, off until an end-to-end A/B; without them the reference compositions run.


def cuda_overrides(arms: frozenset[str] = DEFAULT_ARMS) -> dict[str, Callable]:
    """Op name -> CUDA implementation. Unknown arm names are an error, not silently ignored."""
    unknown = set(arms) - ARMS
    if unknown:
        raise ValueError(f"unknown kernel arms {sorted(unknown)}; known: {sorted(ARMS)}")
    from engine.ops.conv import cuda as conv
    from engine.ops.gdn import chunk, decode, gating
    from engine.ops.gdn import recurrent as delta
    from engine.ops.norm import cuda as norm

    arms = frozenset(arms)
    fused: dict[str, Callable] = {}
    if "decode.fused" in arms:  # K4: a GDN layer's decode step in one launch (``Ops.gdn_decode``)
        fused["gdn_decode"] = functools.partial(decode.gdn_decode, arms=arms)
    if arms & {"norm.fused", "attention.qk_fused"}:
        from engine.ops.norm import fused_cuda

        if "norm.fused" in arms:
            fused |= {"add_rms_norm": fused_cuda.add_rms_norm, "silu_mul": fused_cuda.silu_mul}
        if "attention.qk_fused" in arms:
            fused["qk_norm_rope_kv"] = fused_cuda.qk_norm_rope_kv
    # K2+K3 on tensor cores (mma.sync); without the arm the fp32 token-recurrent kernel runs
    prefill = chunk.chunk_gated_delta_rule if "prefill.tensorcore" in arms else delta.chunk_gated_delta_rule
    return fused | {
        "causal_conv1d_prefill": functools.partial(conv.causal_conv1d_prefill, arms=arms),
        "causal_conv1d_decode": functools.partial(conv.causal_conv1d_decode, arms=arms),
        "gdn_gating": gating.gdn_gating,
        "chunk_gated_delta_rule": functools.partial(prefill, arms=arms),
        "recurrent_gated_delta_rule": functools.partial(delta.recurrent_gated_delta_rule, arms=arms),
        "gated_rms_norm": norm.gated_rms_norm,
    }


def usable_arms(arms: frozenset[str], conv_width: int) -> tuple[frozenset[str], str | None]:
    """``arms`` minus those this model's shapes rule out, and why (None when nothing was dropped).
    K4 (decode.fused) unrolls a width-4 conv; the unfused kernels take any width up to 8."""
    if "decode.fused" in arms and conv_width != 4:
        return arms - {"decode.fused"}, f"decode.fused needs conv width 4, not {conv_width}: decoding unfused"
    return arms, None


def unsupported_reason(key_head_dim: int, value_head_dim: int, dtype_name: str) -> str | None:
    """Why the CUDA kernels cannot run a model of these shapes (None when they can)."""
    if key_head_dim != 128 or value_head_dim != 128:
        return f"GDN head dims {key_head_dim}/{value_head_dim} (kernels are built for 128/128)"
    if dtype_name != "bfloat16":
        return f"dtype {dtype_name} (kernels take bfloat16 activations)"
    return None

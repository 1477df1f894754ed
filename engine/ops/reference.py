"""Float32-internal torch reference ops (CPU and CUDA), HF-exact where HF defines the math.

Every op takes the flat varlen batch described in :mod:`engine.ops` and never syncs the device:
padded lengths come from host ints (``max_query_len``, ``max_seq_len``).
"""

from engine.ops.attention.reference import apply_rope, paged_attention, write_kv
from engine.ops.conv.reference import causal_conv1d_decode, causal_conv1d_prefill
from engine.ops.gdn.reference import (
    chunk_gated_delta_rule,
    gdn_decode,
    gdn_gating,
    recurrent_gated_delta_rule,
)
from engine.ops.gemm.reference import linear
from engine.ops.norm.fused_reference import add_rms_norm, linear_add_rms_norm, qk_norm_rope_kv, silu_mul
from engine.ops.norm.reference import gated_rms_norm, rms_norm
from engine.ops.sample.reference import argmax, logprobs

__all__ = [
    "argmax",
    "add_rms_norm",
    "apply_rope",
    "causal_conv1d_decode",
    "causal_conv1d_prefill",
    "chunk_gated_delta_rule",
    "gated_rms_norm",
    "gdn_decode",
    "gdn_gating",
    "linear",
    "linear_add_rms_norm",
    "logprobs",
    "paged_attention",
    "qk_norm_rope_kv",
    "recurrent_gated_delta_rule",
    "rms_norm",
    "silu_mul",
    "write_kv",
]

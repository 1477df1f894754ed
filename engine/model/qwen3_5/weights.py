"""The Qwen3.5 text model's tensor schema: every checkpoint tensor, its shape, the parameter (and row
offset of a fused parameter) it fills, and how the random initialiser draws it.

The one table both the loader (``engine.model.loader``) and the seeded random weights
(``engine.model.random_init``) read, so a new tensor is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.model.qwen3_5.config import LINEAR, Qwen35Config


@dataclass(frozen=True)
class TensorSpec:
    param: str
    """Our parameter's name."""
    row_offset: int
    """First row of the fused parameter this tensor fills."""
    shape: tuple[int, ...]
    """The HF tensor's shape."""
    init: str
    """Random-init family: embed, norm, in, out, conv, a_log, dt_bias, gated_norm."""


# The official files keep these two in float32 (A_log and the GDN output norm).
FP32_INITS = frozenset({"a_log", "gated_norm"})


def tensor_schema(cfg: Qwen35Config) -> dict[str, TensorSpec]:
    """HF tensor name without the ``model.`` / ``model.language_model.`` prefix -> its spec."""
    h, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    out: dict[str, TensorSpec] = {
        "embed_tokens.weight": TensorSpec("embed_tokens", 0, (vocab, h), "embed"),
        "norm.weight": TensorSpec("norm", 0, (h,), "norm"),
    }
    for i, kind in enumerate(cfg.layer_types):
        p, m = f"layers.{i}.", f"layers.{i}.mixer."
        out[p + "input_layernorm.weight"] = TensorSpec(p + "input_norm", 0, (h,), "norm")
        out[p + "post_attention_layernorm.weight"] = TensorSpec(p + "post_norm", 0, (h,), "norm")
        out[p + "mlp.gate_proj.weight"] = TensorSpec(p + "mlp.gate_up", 0, (inter, h), "in")
        out[p + "mlp.up_proj.weight"] = TensorSpec(p + "mlp.gate_up", inter, (inter, h), "in")
        out[p + "mlp.down_proj.weight"] = TensorSpec(p + "mlp.down", 0, (h, inter), "out")
        if kind == LINEAR:
            a, nv, c, vd = p + "linear_attn.", cfg.linear_num_value_heads, cfg.conv_dim, cfg.value_dim
            out[a + "in_proj_qkv.weight"] = TensorSpec(m + "in_proj", 0, (c, h), "in")
            out[a + "in_proj_z.weight"] = TensorSpec(m + "in_proj", c, (vd, h), "in")
            out[a + "in_proj_b.weight"] = TensorSpec(m + "in_proj", c + vd, (nv, h), "in")
            out[a + "in_proj_a.weight"] = TensorSpec(m + "in_proj", c + vd + nv, (nv, h), "in")
            conv_shape = (c, 1, cfg.linear_conv_kernel_dim)
            out[a + "conv1d.weight"] = TensorSpec(m + "conv_weight", 0, conv_shape, "conv")
            out[a + "A_log"] = TensorSpec(m + "A_log", 0, (nv,), "a_log")
            out[a + "dt_bias"] = TensorSpec(m + "dt_bias", 0, (nv,), "dt_bias")
            out[a + "norm.weight"] = TensorSpec(
                m + "norm_weight", 0, (cfg.linear_value_head_dim,), "gated_norm"
            )
            out[a + "out_proj.weight"] = TensorSpec(m + "out_proj", 0, (h, vd), "out")
        else:
            a, nh, nkv, d = p + "self_attn.", cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            q = 2 * nh * d  # query and output gate per head
            out[a + "q_proj.weight"] = TensorSpec(m + "qkv_proj", 0, (q, h), "in")
            out[a + "k_proj.weight"] = TensorSpec(m + "qkv_proj", q, (nkv * d, h), "in")
            out[a + "v_proj.weight"] = TensorSpec(m + "qkv_proj", q + nkv * d, (nkv * d, h), "in")
            out[a + "q_norm.weight"] = TensorSpec(m + "q_norm", 0, (d,), "norm")
            out[a + "k_norm.weight"] = TensorSpec(m + "k_norm", 0, (d,), "norm")
            out[a + "o_proj.weight"] = TensorSpec(m + "o_proj", 0, (h, nh * d), "out")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = TensorSpec("lm_head", 0, (vocab, h), "in")
    return out

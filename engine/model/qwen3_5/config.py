"""Qwen3.5 text-model configuration parsed from an HF ``config.json``.

Accepts the flat text config (``qwen3_5_text``) and the multimodal wrapper (``qwen3_5`` with a
nested ``text_config``); ``layer_types`` or ``full_attention_interval``; rope settings either in
``rope_parameters`` or at the top level. Anything else is refused with an error naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LINEAR = "linear_attention"
FULL = "full_attention"


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    model_type: str
    mamba_ssm_dtype: str | None = None
    """The checkpoint's storage dtype for the GDN recurrent state (``mamba_ssm_dtype``, "float32" in
    the Qwen3.5 releases), lower case without a ``torch.`` prefix; None when absent. Checked where the
    cache config is resolved (``engine.worker.resolve.resolve_cache``), not here."""

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Qwen35Config:
        model_type = raw.get("model_type", "")
        if model_type in MOE_TYPES or "num_experts" in raw.get("text_config", raw):
            raise UnsupportedModelError(
                f"model_type {model_type!r}: Qwen3.5 MoE checkpoints are not supported yet (dense only)"
            )
        if model_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"unsupported model_type {model_type!r}; deltaserve serves {', '.join(SUPPORTED_TYPES)}"
            )
        text = raw.get("text_config") or raw
        if text is not raw:
            # The wrapper's tie flag is authoritative for the official checkpoints.
            text = {
                **text,
                "tie_word_embeddings": raw.get("tie_word_embeddings", text.get("tie_word_embeddings")),
            }

        def need(key: str) -> Any:
            if key not in text:
                raise UnsupportedModelError(f"config.json is missing {key!r}")
            return text[key]

        n_layers = int(need("num_hidden_layers"))
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = [LINEAR if (i + 1) % interval else FULL for i in range(n_layers)]
        if len(layer_types) != n_layers:
            raise UnsupportedModelError(f"layer_types has {len(layer_types)} entries for {n_layers} layers")
        bad = sorted({t for t in layer_types if t not in (LINEAR, FULL)})
        if bad:
            raise UnsupportedModelError(f"unsupported layer types {bad}")
        rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported (only 'default')")
        theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
        prf = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        head_dim = int(text.get("head_dim") or need("hidden_size") // need("num_attention_heads"))
        ssm_dtype = text.get("mamba_ssm_dtype", raw.get("mamba_ssm_dtype"))
        cfg = Qwen35Config(
            vocab_size=int(need("vocab_size")),
            hidden_size=int(need("hidden_size")),
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=int(need("num_attention_heads")),
            num_key_value_heads=int(need("num_key_value_heads")),
            head_dim=head_dim,
            linear_num_key_heads=int(need("linear_num_key_heads")),
            linear_num_value_heads=int(need("linear_num_value_heads")),
            linear_key_head_dim=int(need("linear_key_head_dim")),
            linear_value_head_dim=int(need("linear_value_head_dim")),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            partial_rotary_factor=float(prf),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            eos_token_ids=eos_ids,
            model_type=model_type,
            mamba_ssm_dtype=None if ssm_dtype is None else str(ssm_dtype).lower().removeprefix("torch."),
        )
        if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
            raise UnsupportedModelError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise UnsupportedModelError("num_attention_heads must be a multiple of num_key_value_heads")
        return cfg

    @staticmethod
    def from_dir(path: str | Path) -> Qwen35Config:
        p = Path(path) / "config.json"
        if not p.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        return Qwen35Config.from_dict(json.loads(p.read_text()))

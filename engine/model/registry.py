"""model_type -> the classes of its family: config parser, model, tensor schema, kernel shapes.

A new family (say Qwen3.5-MoE) is a sibling folder of ``qwen3_5/`` and one entry here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.model.qwen3_5.config import SUPPORTED_TYPES, Qwen35Config, UnsupportedModelError
from engine.model.qwen3_5.model import Qwen35Model
from engine.model.qwen3_5.weights import TensorSpec, tensor_schema
from engine.ops.arms import KernelShapes


@dataclass(frozen=True)
class ModelFamily:
    config: Callable[[dict[str, Any]], Any]
    """config.json -> the family's frozen config."""
    model: type
    """Constructed as ``model(cfg, ops, dtype)``; declares ``cache_spec()`` for the pools."""
    weights: Callable[[Any], dict[str, TensorSpec]]
    """cfg -> the tensor schema the loader and the random init read."""
    kernel_shapes: Callable[[Any, str], KernelShapes]
    """(cfg, dtype) -> what the CUDA kernels' arms check."""


def _qwen35_shapes(cfg: Qwen35Config, dtype: str) -> KernelShapes:
    return KernelShapes(
        cfg.linear_conv_kernel_dim,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
        dtype,
        attention_head_dim=cfg.head_dim,
        hidden_size=cfg.hidden_size,
    )


QWEN3_5 = ModelFamily(Qwen35Config.from_dict, Qwen35Model, tensor_schema, _qwen35_shapes)
FAMILIES: dict[str, ModelFamily] = {t: QWEN3_5 for t in SUPPORTED_TYPES}


def read_config(path: str | Path) -> tuple[ModelFamily, Any]:
    """The family and parsed config of a checkpoint directory."""
    p = Path(path) / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    raw = json.loads(p.read_text())
    family = FAMILIES.get(raw.get("model_type", ""))
    if family is None:
        Qwen35Config.from_dict(raw)  # names what is wrong (an MoE checkpoint, an unknown type)
        raise UnsupportedModelError(f"unsupported model_type {raw.get('model_type')!r}")
    return family, family.config(raw)


def kernel_shapes(path: str | Path, dtype: str) -> KernelShapes:
    family, cfg = read_config(path)
    return family.kernel_shapes(cfg, dtype)

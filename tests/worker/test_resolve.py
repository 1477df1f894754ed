"""Config resolution settles the backend and the kernel arms once, so the logged config is what runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from engine.checkpoints.presets import make_checkpoint
from engine.config import ModelConfig
from engine.ops.arms import DEFAULT_ARMS, KernelShapes
from engine.worker.resolve import resolve_model, settle_kernels

QWEN_4B = KernelShapes(conv_width=4, key_head_dim=128, value_head_dim=128, dtype="bfloat16")


def test_cuda_gets_the_default_arms_when_none_are_asked_for() -> None:
    assert settle_kernels("cuda", (), QWEN_4B) == ("cuda", tuple(sorted(DEFAULT_ARMS)), [])


def test_asked_arms_are_kept_exactly() -> None:
    assert settle_kernels("cuda", ("conv.vec4", "conv.chunk8"), QWEN_4B) == (
        "cuda",
        ("conv.chunk8", "conv.vec4"),
        [],
    )


def test_arms_the_shapes_rule_out_are_dropped_with_a_warning() -> None:
    backend, arms, notes = settle_kernels("cuda", (), dataclasses.replace(QWEN_4B, conv_width=3))
    assert backend == "cuda" and "decode.fused" not in arms and set(arms) == DEFAULT_ARMS - {"decode.fused"}
    assert len(notes) == 1 and "decode.fused" in notes[0]


@pytest.mark.parametrize(
    "shapes", [dataclasses.replace(QWEN_4B, key_head_dim=64), dataclasses.replace(QWEN_4B, dtype="float32")]
)
def test_cuda_falls_back_to_torch_when_the_kernels_cannot_run(shapes: KernelShapes) -> None:
    backend, arms, notes = settle_kernels("cuda", ("decode.fused",), shapes)
    assert (backend, arms) == ("torch", ()) and "torch reference" in notes[0]


def test_torch_backend_runs_no_arms_and_unknown_arms_fail() -> None:
    assert settle_kernels("torch", ("conv.k4",), None) == ("torch", (), [])
    with pytest.raises(ValueError, match="unknown kernel arms"):
        settle_kernels("torch", ("conv.k5",), None)


def test_resolve_model_on_cpu_is_final_and_idempotent(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "tiny", preset="tiny", seed=0)
    cfg = ModelConfig(model=str(ckpt), device="cpu", kernel_arms=("decode.fused",))
    once = resolve_model(cfg)
    assert (once.device, once.dtype, once.gdn_backend, once.kernel_arms) == ("cpu", "float32", "torch", ())
    assert once.served_model_name == "tiny"
    assert resolve_model(once) == once
    assert json.loads((ckpt / "config.json").read_text())["model_type"].startswith("qwen3_5")

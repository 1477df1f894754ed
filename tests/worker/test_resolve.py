"""Config resolution settles the backend, the kernel arms and the GDN state pool's dtype once, so the
logged config is what runs."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from engine.checkpoints.presets import make_checkpoint
from engine.config import CacheConfig, ModelConfig
from engine.ops.arms import DEFAULT_ARMS, KernelShapes
from engine.worker.resolve import (
    kernels_for_device,
    resolve_cache,
    resolve_model,
    settle_kernels,
    settle_ssm_dtype,
)

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


def test_gpus_older_than_sm80_fall_back_to_torch_and_newer_ones_keep_the_kernels(caplog) -> None:
    # a T4 (7.5) or V100 (7.0) has no bf16 mma.sync / cp.async: the torch ops serve, with a warning
    mc = ModelConfig(model="m", device="cuda", gdn_backend="cuda", kernel_arms=tuple(sorted(DEFAULT_ARMS)))
    for cc in (70, 75):
        with caplog.at_level(logging.WARNING):
            got = kernels_for_device(mc, cc)
        assert (got.gdn_backend, got.kernel_arms) == ("torch", ())
        assert f"this GPU has {cc // 10}.{cc % 10}" in caplog.text
    for cc in (80, 86, 89, 90, 100, 120, 121):  # rows of their own or the newest not newer
        assert kernels_for_device(mc, cc) is mc
    torch_mc = dataclasses.replace(mc, gdn_backend="torch", kernel_arms=())
    assert kernels_for_device(torch_mc, 75) is torch_mc


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


def _with_ssm_dtype(tmp_path: Path, value: object) -> Path:
    """The tiny checkpoint with ``mamba_ssm_dtype`` set (None: removed) in its config.json."""
    ckpt = make_checkpoint(tmp_path / "tiny", preset="tiny", seed=0)
    raw = json.loads((ckpt / "config.json").read_text())
    raw.pop("mamba_ssm_dtype", None)
    if value is not None:
        raw["mamba_ssm_dtype"] = value
    (ckpt / "config.json").write_text(json.dumps(raw))
    return ckpt


@pytest.mark.parametrize(
    "checkpoint,want",
    [(None, "float32"), ("float32", "float32"), ("bfloat16", "bfloat16"), ("torch.bfloat16", "bfloat16")],
)
def test_auto_ssm_cache_dtype_reads_the_checkpoint(tmp_path: Path, checkpoint: str | None, want: str) -> None:
    ckpt = _with_ssm_dtype(tmp_path, checkpoint)
    once = resolve_cache(CacheConfig(), str(ckpt))
    assert once.mamba_ssm_cache_dtype == want
    assert resolve_cache(once, str(ckpt)) == once
    assert (
        resolve_cache(CacheConfig(mamba_ssm_cache_dtype="float32"), str(ckpt)).mamba_ssm_cache_dtype
        == "float32"
    )


def test_ssm_cache_dtype_errors_name_the_fix(tmp_path: Path) -> None:
    ckpt = _with_ssm_dtype(tmp_path, "float16")
    with pytest.raises(ValueError, match="mamba_ssm_dtype 'float16'.*--mamba-ssm-cache-dtype"):
        resolve_cache(CacheConfig(), str(ckpt))
    # an explicit choice overrides a checkpoint value the pools cannot store
    assert (
        resolve_cache(CacheConfig(mamba_ssm_cache_dtype="bfloat16"), str(ckpt)).mamba_ssm_cache_dtype
        == "bfloat16"
    )
    with pytest.raises(ValueError, match="--mamba-ssm-cache-dtype 'fp8'"):
        resolve_cache(CacheConfig(mamba_ssm_cache_dtype="fp8"), str(ckpt))  # type: ignore[arg-type]


def test_the_4b_release_config_keeps_an_fp32_state() -> None:
    from engine.checkpoints.presets import qwen35_4b_config
    from engine.model.qwen3_5.config import Qwen35Config

    assert Qwen35Config.from_dict(qwen35_4b_config()).mamba_ssm_dtype == "float32"  # nested text_config
    assert settle_ssm_dtype("auto", "float32") == "float32"


def test_cli_flag_reaches_the_resolved_config(tmp_path: Path) -> None:
    from engine.cli import configs_from_args, parser

    ckpt = _with_ssm_dtype(tmp_path, "bfloat16")
    base = ["serve", "--model", str(ckpt), "--device", "cpu"]
    engine, _ = configs_from_args(parser().parse_args(base))
    assert engine.cache.mamba_ssm_cache_dtype == "bfloat16"  # auto: the checkpoint's
    engine, _ = configs_from_args(parser().parse_args([*base, "--mamba-ssm-cache-dtype", "float32"]))
    assert engine.cache.mamba_ssm_cache_dtype == "float32"
    with pytest.raises(SystemExit):
        parser().parse_args([*base, "--mamba-ssm-cache-dtype", "float16"])

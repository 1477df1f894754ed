"""Config resolution: every "auto" of a ModelConfig and a CacheConfig settled once, before anything
starts.

Device, dtype, the embedded default model, and which kernels run: the GDN backend falls back to the
torch reference when the CUDA kernels cannot run the model, and the kernel arms are the exact set that
will be bound (defaults filled in, arms the model's shapes rule out dropped with a warning). The GDN
recurrent-state pool's dtype comes from the checkpoint when "auto" (``resolve_cache``). The resolved
configs are what ``deltaserve serve`` logs and what the ModelRunner builds its Ops table and pools from.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from engine.config import CacheConfig, ModelConfig, default_cache_dir
from engine.ops.arms import DEFAULT_ARMS, KernelShapes, check_known, unsupported_reason, usable_arms

log = logging.getLogger(__name__)

SSM_CACHE_DTYPES = ("float32", "bfloat16")


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cupy_imports() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def settle_kernels(
    backend: str, requested: tuple[str, ...], shapes: KernelShapes | None
) -> tuple[str, tuple[str, ...], list[str]]:
    """(backend, arms, warnings) for a resolved device: "cuda" only where the kernels can run the
    model, the arms exactly those that will be bound (none on the torch backend)."""
    check_known(frozenset(requested))
    if backend != "cuda":
        return "torch", (), []
    assert shapes is not None
    why = unsupported_reason(shapes)
    if why is not None:
        return "torch", (), [f"gdn backend cuda cannot run this model ({why}): using the torch reference ops"]
    arms, notes = usable_arms(frozenset(requested) or DEFAULT_ARMS, shapes)
    return "cuda", tuple(sorted(arms)), notes


MIN_CC = 80  # the CUDA kernels' floor: bf16 mma.sync, cp.async, ldmatrix (sm_80)


def kernels_for_device(mc: ModelConfig, cc: int) -> ModelConfig:
    """``mc`` unchanged where its CUDA kernels run on a GPU of compute capability ``cc`` (90 for
    sm_90); below MIN_CC (T4, V100) the torch reference ops instead, with a warning. The engine calls
    this once its CUDA context exists; ``resolve_model`` does not ask the GPU, so the API server's
    process never opens a context of its own."""
    if mc.gdn_backend != "cuda" or cc >= MIN_CC:
        return mc
    log.warning(
        "gdn backend cuda needs compute capability %d.%d or newer, this GPU has %d.%d: using the torch "
        "reference ops",
        MIN_CC // 10,
        MIN_CC % 10,
        cc // 10,
        cc % 10,
    )
    return dataclasses.replace(mc, gdn_backend="torch", kernel_arms=())


def resolve_model(cfg: ModelConfig) -> ModelConfig:
    """Fill every "auto" of a ModelConfig: device, dtype, the tiny default model path, gdn backend and
    kernel arms. Resolving a resolved config returns it unchanged."""
    from engine.model.registry import kernel_shapes

    device = resolve_device(cfg.device)
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    model, default_name = cfg.model, ""
    if not model:
        from engine.checkpoints.default import TINY_NAME, ensure_default_model

        model, default_name = str(ensure_default_model(default_cache_dir())), TINY_NAME
    wanted: str = cfg.gdn_backend
    if wanted == "auto":
        wanted = "cuda" if device.startswith("cuda") and _cupy_imports() else "torch"
    shapes = kernel_shapes(model, dtype) if wanted == "cuda" else None
    backend, arms, notes = settle_kernels(wanted, cfg.kernel_arms, shapes)
    for note in notes:
        log.warning("%s", note)
    name = cfg.served_model_name or default_name or Path(model).name
    return dataclasses.replace(
        cfg,
        model=model,
        device=device,
        dtype=dtype,  # type: ignore[arg-type]
        gdn_backend=backend,  # type: ignore[arg-type]
        kernel_arms=arms,
        served_model_name=name,
    )


def settle_ssm_dtype(requested: str, checkpoint: str | None) -> str:
    """The GDN recurrent-state pool's dtype: ``requested`` unless "auto", then the checkpoint's
    ``mamba_ssm_dtype`` when it names one (float32 when it names none)."""
    if requested != "auto":
        if requested not in SSM_CACHE_DTYPES:
            raise ValueError(
                f"--mamba-ssm-cache-dtype {requested!r}: choose auto, {' or '.join(SSM_CACHE_DTYPES)}"
            )
        return requested
    if checkpoint is None:
        return "float32"
    if checkpoint not in SSM_CACHE_DTYPES:
        raise ValueError(
            f"the checkpoint's mamba_ssm_dtype {checkpoint!r} is not a GDN state dtype deltaserve "
            f"stores ({' or '.join(SSM_CACHE_DTYPES)}); pass --mamba-ssm-cache-dtype float32 or bfloat16"
        )
    return checkpoint


def resolve_cache(cache: CacheConfig, model: str) -> CacheConfig:
    """Fill the "auto" of a CacheConfig for the checkpoint directory ``model`` (a resolved
    ModelConfig's ``model``). Resolving a resolved config returns it unchanged."""
    checkpoint = None
    if cache.mamba_ssm_cache_dtype == "auto":
        from engine.model.registry import read_config

        checkpoint = getattr(read_config(model)[1], "mamba_ssm_dtype", None)
    ssm = settle_ssm_dtype(cache.mamba_ssm_cache_dtype, checkpoint)
    return dataclasses.replace(cache, mamba_ssm_cache_dtype=ssm)  # type: ignore[arg-type]

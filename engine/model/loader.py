"""Load HF Qwen3.5 safetensors checkpoints (single file or sharded) into ``Qwen35Model``.

Tensors are read one at a time from memory-mapped files and copied straight into parameters
already allocated on the target device, so host RAM never holds the whole model. Accepted name
prefixes: ``model.language_model.`` (official multimodal checkpoints) and ``model.`` (text-only
saves); ``model.visual.*`` and ``mtp.*`` are skipped. Fused parameters receive each HF tensor at
its row offset. Missing, unexpected or mis-shaped tensors fail with the tensor's name and shapes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from engine.model.qwen3_5.model import Qwen35Model
from engine.model.qwen3_5.weights import TensorSpec
from engine.model.registry import FAMILIES, read_config
from engine.ops import Ops

log = logging.getLogger(__name__)

SKIP_PREFIXES = ("model.visual.", "mtp.", "model.mtp.")


class CheckpointError(ValueError):
    pass


def strip_prefix(name: str) -> str | None:
    """Checkpoint name -> our HF-relative name, or None for tensors we skip."""
    if name.startswith(SKIP_PREFIXES):
        return None
    if name.startswith("model.language_model."):
        return name[len("model.language_model.") :]
    if name.startswith("model."):
        return name[len("model.") :]
    return name  # lm_head.weight sits at the top level


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({path / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"shards listed in {index.name} are missing: {missing}")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")


def _copy_into(params: dict[str, torch.nn.Parameter], tgt: TensorSpec, name: str, t: torch.Tensor) -> None:
    if tuple(t.shape) != tgt.shape:
        raise CheckpointError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {tgt.shape}")
    dst = params[tgt.param].data
    rows = t.shape[0]
    if t.dim() != dst.dim():  # conv1d.weight [C, 1, K] -> [C, K]
        t = t.reshape(rows, *dst.shape[1:])
    dst[tgt.row_offset : tgt.row_offset + rows].copy_(t.to(dtype=dst.dtype))


def load_weights(
    model: Qwen35Model, tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | Path
) -> int:
    """Fill ``model`` from a checkpoint directory, a name->tensor dict or (name, tensor) pairs.
    Returns the number of tensors loaded."""
    from safetensors import safe_open

    expected = FAMILIES[model.cfg.model_type].weights(model.cfg)
    params = dict(model.named_parameters(remove_duplicate=False))
    seen: set[str] = set()

    def take(raw_name: str, get: object) -> None:
        name = strip_prefix(raw_name)
        if name is None:
            return
        if name == "lm_head.weight" and model.cfg.tie_word_embeddings:
            return  # some tools save the tied head anyway; the embedding is authoritative
        tgt = expected.get(name)
        if tgt is None:
            raise CheckpointError(f"unexpected tensor {raw_name!r} (not part of a dense Qwen3.5 text model)")
        if name in seen:
            raise CheckpointError(f"tensor {raw_name!r} appears twice")
        seen.add(name)
        _copy_into(params, tgt, raw_name, get())  # type: ignore[operator]

    if isinstance(tensors, dict):
        for raw, t in tensors.items():
            take(raw, lambda t=t: t)
    elif not isinstance(tensors, Path):
        for raw, t in tensors:
            take(raw, lambda t=t: t)
    else:
        for f in checkpoint_files(tensors):
            with safe_open(str(f), framework="pt", device="cpu") as fh:
                for raw in fh.keys():
                    take(raw, lambda raw=raw, fh=fh: fh.get_tensor(raw))
    missing = sorted(set(expected) - seen)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"checkpoint is missing tensors {missing[:5]}{more}")
    return len(seen)


def build_model(
    path: str | Path,
    ops: Ops,
    dtype: torch.dtype,
    device: torch.device | str,
    load_format: str = "auto",
    seed: int = 0,
) -> Qwen35Model:
    """Allocate the model on ``device`` and fill it from the checkpoint (or seeded random weights)."""
    path = Path(path)
    family, cfg = read_config(path)
    with torch.device(device):
        model = family.model(cfg, ops, dtype)
    if load_format == "dummy":
        from engine.model.random_init import iter_random_tensors

        raw = json.loads((path / "config.json").read_text())
        text = raw.get("text_config") or raw
        text = {**text, "tie_word_embeddings": cfg.tie_word_embeddings}
        n = load_weights(model, iter_random_tensors(text, seed=seed, dtype=dtype, device=device))
    elif load_format in ("auto", "safetensors"):
        n = load_weights(model, path)
    else:
        raise ValueError(f"unknown load_format {load_format!r} (auto, safetensors or dummy)")
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # loading temporaries must not count as the server's memory
    log.info("loaded %d tensors, %.3f B parameters (%s, %s)", n, model.num_parameters() / 1e9, dtype, device)
    return model.eval()

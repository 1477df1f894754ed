"""Seeded random weights with the exact names, shapes and dtypes of a Qwen3.5 text checkpoint (read
from the model's tensor schema, ``engine.model.qwen3_5.weights``).

Used for the embedded tiny model and for ``--load-format dummy`` runs of full-size shapes. Scales
are chosen so activations stay finite through 32 layers and a tiny model's greedy output is not
a fixed point (see the tuning notes in ``_SCALES``). Each tensor has its own generator seeded from
(seed, name), so a tensor's values do not depend on which other tensors are built.

On the CPU the values come from numpy's ``Generator`` (PCG64) in float64, scaled in float64 and
rounded once to the target dtype: torch's CPU RNG picks a vectorised path by instruction set
(AVX-512 vs AVX2 vs scalar), so its values, and every digest and greedy output built on them,
differed between machines. ``log`` (for A_log) runs in Python's ``math`` for the same reason. On CUDA
(the 4B ``--load-format dummy`` model) sampling stays on the device with torch's device generator:
bulk and fast, but not the CPU's values and not bit-identical across GPU generations.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from engine.model.qwen3_5.config import Qwen35Config
from engine.model.qwen3_5.weights import FP32_INITS, tensor_schema

# Multipliers on 1/sqrt(fan_in) for projections. Output projections (o_proj, out_proj, down_proj)
# are much larger than a variance-preserving init: with tied embeddings the residual stream must
# move away from the input embedding, or argmax keeps returning the input token. Tuned on the tiny
# model in HF (out 1.0: every prompt repeats one token; 8.0: ~30 distinct tokens in 32 greedy
# steps) and checked on a 32-layer stack: residual RMS grows to ~30, finite in bf16.
_SCALES = {
    "in": 1.0,
    "out": 8.0,
    "embed": 1.0,
    "norm": 0.1,  # zero-centred norms: effective scale 1 + w
    "conv": 0.5,
}


def _seed_for(seed: int, name: str) -> int:
    return (int(seed) * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 62)


def text_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, init family) for every tensor of the text model (``model.`` prefix, HF names),
    read from the model's tensor schema."""
    schema = tensor_schema(Qwen35Config.from_dict({"model_type": "qwen3_5_text", **cfg}))
    return {("" if n == "lm_head.weight" else "model.") + n: (s.shape, s.init) for n, s in schema.items()}


def random_state_dict(
    text_config: Mapping[str, Any],
    seed: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Seeded random text weights, HF names with the ``model.`` prefix (not ``model.language_model.``)."""
    return dict(iter_random_tensors(text_config, seed, dtype, device))


def iter_random_tensors(
    text_config: Mapping[str, Any],
    seed: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> Iterator[tuple[str, torch.Tensor]]:
    """The same tensors as :func:`random_state_dict`, one at a time, so a loader can copy each into
    its parameter and drop it: the model is never held twice on the device."""
    dev = torch.device(device)
    gain = _out_gain(int(text_config["num_hidden_layers"]))
    for name, (shape, kind) in text_shapes(text_config).items():
        tdtype = torch.float32 if kind in FP32_INITS else dtype
        if dev.type == "cpu":
            rng = np.random.default_rng(_seed_for(seed, name))
            yield name, _sample_cpu(shape, kind, rng, tdtype, gain)
        else:
            gen = torch.Generator(device=dev)
            gen.manual_seed(_seed_for(seed, name))
            yield name, _sample(shape, kind, gen, tdtype, dev, gain)


def _out_gain(num_layers: int) -> float:
    """Output-projection gain: 8 for the 4-layer tiny model, shrinking as 1/sqrt(depth) so a 32-layer
    stack (2.8) keeps every layer's contribution without turning chaotic: with 8 in all 32 layers, bf16
    rounding alone flipped the 4B dummy model's greedy tokens at the first step."""
    return min(_SCALES["out"], max(1.0, _SCALES["out"] * math.sqrt(4 / max(num_layers, 1))))


_CHUNK = 1 << 22
"""Elements drawn per numpy call: bounds the float64 scratch for the 4B embedding (a Generator's
stream does not depend on how the draws are split)."""


def normal_cpu(
    rng: np.random.Generator, shape: tuple[int, ...], std: float, mean: float = 0.0
) -> torch.Tensor:
    """``mean + std * N(0, 1)`` as float32, identical on every CPU: float64 draws, one rounding."""
    n = math.prod(shape)
    out = np.empty(n, dtype=np.float32)
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        x = rng.standard_normal(stop - start) * std
        out[start:stop] = x + mean if mean else x
    return torch.from_numpy(out.reshape(shape))


def uniform_cpu(rng: np.random.Generator, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    return torch.from_numpy((low + (high - low) * rng.random(shape)).astype(np.float32))


def log_cpu(t: torch.Tensor) -> torch.Tensor:
    """Elementwise natural log through Python's math (vectors of a few heads only): numpy's and
    torch's vectorised log may differ in the last bit between instruction sets."""
    flat = [math.log(float(v)) for v in t.reshape(-1).tolist()]
    return torch.tensor(flat, dtype=torch.float64).to(torch.float32).reshape(t.shape)


def _sample_cpu(
    shape: tuple[int, ...], kind: str, rng: np.random.Generator, dtype: torch.dtype, out_gain: float
) -> torch.Tensor:
    if kind == "a_log":
        t = log_cpu(uniform_cpu(rng, shape, 1.0, 16.0))
    elif kind == "dt_bias":
        t = uniform_cpu(rng, shape, 0.0, 1.0)
    elif kind == "gated_norm":
        t = normal_cpu(rng, shape, 0.1, 1.0)
    elif kind in ("in", "out"):
        t = normal_cpu(rng, shape, (out_gain if kind == "out" else _SCALES["in"]) / math.sqrt(shape[-1]))
    else:
        t = normal_cpu(rng, shape, _SCALES[kind])
    return t if dtype == torch.float32 else t.to(dtype)  # float32 -> bf16 rounding is exact IEEE


def _sample(
    shape: tuple[int, ...],
    kind: str,
    gen: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
    out_gain: float,
) -> torch.Tensor:
    if kind == "a_log":
        # A in [1, 16] like HF's init: decays exp(-A * softplus(.)) spread from slow to fast.
        return torch.empty(shape, device=device, dtype=dtype).uniform_(1.0, 16.0, generator=gen).log_()
    if kind == "dt_bias":
        return torch.empty(shape, device=device, dtype=dtype).uniform_(0.0, 1.0, generator=gen)
    if kind == "gated_norm":
        return torch.randn(shape, generator=gen, device=device, dtype=dtype).mul_(0.1).add_(1.0)
    if kind in ("in", "out"):
        std = (out_gain if kind == "out" else _SCALES["in"]) / math.sqrt(shape[-1])
    else:
        std = _SCALES[kind]
    # Sampling straight into the target dtype avoids a float32 copy of the 248320-row embedding.
    return torch.randn(shape, generator=gen, device=device, dtype=dtype).mul_(std)

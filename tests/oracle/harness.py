"""Shared by the live oracle (HF transformers) and the cached oracle: run deltaserve on a case."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.generate import generate
from engine.model.forward_batch import ForwardBatch, SeqSpec
from engine.worker.model_runner import ModelRunner

CACHE_FILE = Path(__file__).with_name("hf_cache.json")


def ds_runner(path: Path, dtype: str = "float32", device: str = "cpu", backend: str = "torch") -> ModelRunner:
    mc = ModelConfig(model=str(path), dtype=dtype, device=device, gdn_backend=backend, max_model_len=1024)
    cfg = EngineConfig(model=mc, cache=CacheConfig(block_size=16), scheduler=SchedulerConfig(max_num_seqs=8))
    return ModelRunner(cfg)


def ds_prefill_logits(runner: ModelRunner, prompt: Sequence[int]) -> torch.Tensor:
    """fp32 logits for every prompt position, from one fresh prefill in slot 1."""
    blocks = list(range(1, (len(prompt) + runner.block_size - 1) // runner.block_size + 1))
    spec = SeqSpec(token_ids=list(prompt), num_computed=0, block_ids=blocks, state_slot=1)
    fb = ForwardBatch.build([spec], runner.block_size, runner.device, all_logits=True)
    return runner.execute(fb).cpu()


def ds_greedy(runner: ModelRunner, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    return generate(runner, prompts, n)


def logit_rows(prompt_len: int) -> list[int]:
    """Positions whose full logit rows the cache stores."""
    return sorted({0, prompt_len // 2, prompt_len - 1})


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> tuple[bool, float, float]:
    """max |a - b| <= rel * max(1, max |b|): tolerance relative to the logit scale."""
    diff = (a - b).abs().max().item()
    bound = rel * max(1.0, b.abs().max().item())
    return diff <= bound, diff, bound


# Counters printed at the end of the run (tests/conftest.py): how many oracle cases and assertions passed.
STATS: dict = {"cases": set(), "assertions": 0}

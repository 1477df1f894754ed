"""What a launched step leaves behind and how the next one reads it: :class:`Launched` (sampled
tokens on their way to the host), :func:`patch_inputs` (the tokens a step scheduled ahead reads on the
device), and :func:`read_eos_ids` (the checkpoint's stop tokens). Split out of model_runner.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.worker.sampler import SampledTokens
from engine.worker.step import SamplerOutput


@dataclass
class Launched:
    """A step queued on the device: its sampled tokens (copy to the host in flight) and the prompt
    logprobs (computed on the host at launch, since that step ran eagerly)."""

    tokens: SampledTokens | None
    scored: list

    def result(self) -> SamplerOutput:
        if self.tokens is None:
            return SamplerOutput([], [], self.scored)
        ids, logprobs = self.tokens.host()
        return SamplerOutput(ids, logprobs, self.scored)


def patch_inputs(input_ids: torch.Tensor, feed: tuple | None) -> None:
    """Write the tokens sampled by the previous step into this step's input rows, on the device."""
    if feed is None:
        return
    tokens, src, dst = feed
    n = len(src)
    if src == list(range(n)) and dst == src:  # the steady state: the same batch, one step on
        input_ids[:n].copy_(tokens[:n])
        return
    idx = torch.tensor([src, dst], dtype=torch.int64)
    cuda = input_ids.device.type == "cuda"
    idx = (idx.pin_memory() if cuda else idx).to(input_ids.device, non_blocking=cuda)
    input_ids.index_copy_(0, idx[1], tokens.index_select(0, idx[0]))


def read_eos_ids(path: Path, fallback: tuple[int, ...]) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (Qwen3.5 lists both <|im_end|> and <|endoftext|>)."""
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(eos, int):
            return (eos,)
        if isinstance(eos, list) and eos:
            return tuple(int(e) for e in eos)
    return fallback

"""vLLM's ``--dataset-name random``: synthetic prompts of random token ids, no file needed.

Prompt and output lengths are drawn uniformly from ``len * (1 - range_ratio) .. len * (1 + range_ratio)``
(vLLM's ``--random-range-ratio``); token ids uniformly from ``[0, vocab)``. With a tokenizer the
vocabulary is its regular (non-special) tokens; without one it is the 256 byte-level ids, which
every Qwen BPE vocabulary (the tiny model's included) starts with, so the prompts are valid for any
served model. Seeded with numpy's Generator: the same records on every machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .jsonstream import DatasetError

BYTE_VOCAB = 256


def regular_vocab_size(checkpoint: Path) -> int:
    """Ids below the first added (special) token: what a random prompt may contain."""
    from .dataset import load_tokenizer

    tok = load_tokenizer(checkpoint)
    added = [t for t in tok.get_added_tokens_decoder()]
    return min(added) if added else tok.get_vocab_size(with_added_tokens=False)


def random_records(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    vocab_size: int = BYTE_VOCAB,
) -> list[dict]:
    """Records {"id", "prompt_token_ids", "output_len"} like a pretokenized file's."""
    if num_prompts < 1:
        raise DatasetError("--num-prompts must be at least 1")
    if input_len < 1 or output_len < 1:
        raise DatasetError("--random-input-len and --random-output-len must be at least 1")
    if not 0.0 <= range_ratio < 1.0:
        raise DatasetError("--random-range-ratio must be in [0, 1)")
    if vocab_size < 1:
        raise DatasetError("the vocabulary for random prompts is empty")
    rng = np.random.default_rng(seed)

    def lengths(mean: int) -> np.ndarray:
        lo = max(1, int(mean * (1 - range_ratio)))
        hi = max(lo, int(mean * (1 + range_ratio)))
        return rng.integers(lo, hi + 1, size=num_prompts)

    in_lens, out_lens = lengths(input_len), lengths(output_len)
    return [
        {
            "id": f"random-{i}",
            "prompt_token_ids": rng.integers(0, vocab_size, size=int(n)).tolist(),
            "output_len": int(m),
        }
        for i, (n, m) in enumerate(zip(in_lens, out_lens, strict=True))
    ]

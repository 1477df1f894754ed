"""vLLM's ``prompt_logprobs`` response field: one entry per prompt token, ``None`` for the first
(nothing predicts it), else ``{token_id: {logprob, rank, decoded_token}}`` for the prompt token and
its top alternatives (JSON turns the ids into string keys, as vLLM's responses have them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.sampling_params import TokenLogprobs


def vllm_prompt_logprobs(
    tok: Any, prompt_ids: Sequence[int], scored: Sequence[TokenLogprobs] | None, k: int
) -> list[dict[str, Any] | None] | None:
    if scored is None:
        return None
    out: list[dict[str, Any] | None] = [None]
    for lp in scored[: max(len(prompt_ids) - 1, 0)]:
        entry = {
            str(lp.token_id): {
                "logprob": lp.logprob,
                "rank": lp.rank,
                "decoded_token": tok.decode([lp.token_id], skip_special_tokens=False),
            }
        }
        for rank, (alt, alt_lp) in enumerate(lp.top[:k], 1):
            entry.setdefault(
                str(alt),
                {
                    "logprob": alt_lp,
                    "rank": rank,
                    "decoded_token": tok.decode([alt], skip_special_tokens=False),
                },
            )
        out.append(entry)
    return out

"""Offline batch generation straight on the ModelRunner (no server, no scheduler process).

Used by the oracle tests and ``deltaserve generate``. Every prompt gets its own state slot and a
contiguous run of KV blocks; prefill can be split into chunks at arbitrary boundaries
(``prefill_chunks``), which must not change the result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.sampling_params import SamplingParams, TokenLogprobs
from engine.worker.model_runner import ModelRunner
from engine.worker.step import ScheduledSeq


def _chunks(n: int, sizes: Sequence[int] | None) -> list[int]:
    """Split a prompt of n tokens into the given chunk sizes (the last one takes the rest)."""
    if not sizes:
        return [n]
    out, left = [], n
    for s in sizes:
        if left <= 0:
            break
        out.append(min(s, left))
        left -= out[-1]
    if left > 0:
        out.append(left)
    return out


def generate(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    params: SamplingParams | None = None,
    prefill_chunks: Sequence[int] | None = None,
    stop_at_eos: bool = False,
) -> list[list[int]]:
    """Generate ``max_tokens`` tokens for each prompt (greedy unless ``params`` says otherwise)."""
    params = params or SamplingParams(temperature=0.0, max_tokens=max_tokens)
    if len(prompts) >= runner.num_state_slots:
        raise ValueError(f"{len(prompts)} prompts need more than {runner.num_state_slots - 1} state slots")
    bs = runner.block_size
    need = [math.ceil((len(p) + max_tokens) / bs) for p in prompts]
    if sum(need) >= runner.num_kv_blocks:
        raise ValueError(f"prompts need {sum(need)} KV blocks, the pool has {runner.num_kv_blocks - 1}")
    tables, nxt = [], 1
    for n in need:
        tables.append(list(range(nxt, nxt + n)))
        nxt += n
    outs: list[list[int]] = [[] for _ in prompts]
    # Prefill every prompt chunk by chunk; all prompts' k-th chunks go in one batch.
    plans = [_chunks(len(p), prefill_chunks) for p in prompts]
    computed = [0] * len(prompts)
    for k in range(max(len(p) for p in plans)):
        seqs = []
        for i, p in enumerate(prompts):
            if k >= len(plans[i]):
                continue
            n = plans[i][k]
            last = k == len(plans[i]) - 1
            seqs.append(
                ScheduledSeq(
                    token_ids=list(p[computed[i] : computed[i] + n]),
                    num_computed=computed[i],
                    block_ids=tables[i],
                    state_slot=i + 1,
                    sample=last,
                    request_id=str(i),
                    params=params,
                    num_output=0,
                )
            )
            computed[i] += n
        # Single-token chunks with history count as decodes and must lead the batch.
        seqs.sort(key=lambda s: not s.is_decode)
        result = runner.execute_model(seqs)
        sampled = [s for s in seqs if s.sample]
        for s, tok in zip(sampled, result.token_ids, strict=False):
            outs[int(s.request_id)].append(tok)
    eos = set(runner.eos_token_ids)
    done = [stop_at_eos and o[-1] in eos for o in outs]
    for _ in range(max_tokens - 1):
        live = [i for i in range(len(prompts)) if not done[i]]
        if not live:
            break
        seqs = [
            ScheduledSeq(
                token_ids=[outs[i][-1]],
                num_computed=len(prompts[i]) + len(outs[i]) - 1,
                block_ids=tables[i],
                state_slot=i + 1,
                request_id=str(i),
                params=params,
                num_output=len(outs[i]),
            )
            for i in live
        ]
        result = runner.execute_model(seqs)
        for i, tok in zip(live, result.token_ids, strict=False):
            outs[i].append(tok)
            done[i] = stop_at_eos and tok in eos
    return outs


def score_prompts(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    top_k: int = 0,
    prefill_chunks: Sequence[int] | None = None,
) -> list[list[TokenLogprobs]]:
    """Prompt logprobs (tokens 1..) of each prompt, from its prefill alone, one prompt at a time."""
    bs = runner.block_size
    params = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=top_k)
    out = []
    for p in prompts:
        table = list(range(1, math.ceil(len(p) / bs) + 1))
        if len(table) >= runner.num_kv_blocks:
            raise ValueError(f"a prompt of {len(p)} tokens does not fit the KV pool")
        scored: list[TokenLogprobs] = []
        done = 0
        for n in _chunks(len(p), prefill_chunks):
            seq = ScheduledSeq(
                token_ids=list(p[done : done + n]),
                num_computed=done,
                block_ids=table,
                state_slot=1,
                sample=done + n == len(p),
                params=params,
                history=p,
                num_prompt=len(p),
                prompt_lp_from=len(scored),
            )
            result = runner.execute_model([seq])
            scored.extend(result.prompt_logprobs[0] or [])
            done += n
        out.append(scored)
    return out

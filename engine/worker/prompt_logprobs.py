"""Prompt logprobs from the prefill's own hidden states, a few hundred rows of vocab logits at a time.

The hidden state at prompt position ``p`` predicts token ``p + 1``, so a chunk of a prompt covering
positions ``[c, c + n)`` scores the prompt tokens ``c + 1 .. c + n`` (never past the prompt's end).
The target of a chunk's last row is the first token of the next chunk, which the sequence's
``history`` (the whole request) provides. Rows already scored before a preemption are skipped via
``prompt_lp_from``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.ops.sample.reference import logprobs as reference_logprobs
from engine.sampling_params import TokenLogprobs
from engine.worker.step import ScheduledSeq

# rows of [vocab] logits alive at once: 256 x 248k x 2 B = 127 MB of bf16 logits on the 4B model (the
# reference op adds their fp32 log-softmax, 254 MB; the sample.logprobs kernel nothing of that size)
CHUNK_ROWS = 256


def wanted_positions(seq: ScheduledSeq) -> range:
    """Positions of this step whose hidden state scores a prompt token not scored yet."""
    if seq.params.prompt_logprobs is None:
        return range(0)
    lo = max(seq.num_computed, seq.prompt_lp_from)
    hi = min(seq.num_computed + len(seq.token_ids), seq.num_prompt - 1)
    return range(lo, max(lo, hi))


def wants_prompt_logprobs(seqs: Sequence[ScheduledSeq]) -> bool:
    return any(len(wanted_positions(s)) for s in seqs)


def score_rows(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],  # [r, hidden] -> raw logits [r, V]
    hidden: torch.Tensor,  # [T, hidden] pre-norm, the whole step
    rows: Sequence[int],  # flat token indices into hidden
    targets: Sequence[int],  # the token each row predicts
    k: int,
    chunk_rows: int = CHUNK_ROWS,
    logprobs: Callable[..., tuple] = reference_logprobs,  # Ops.logprobs
) -> list[TokenLogprobs]:
    """Logprob, rank and top-k of each target under its row's distribution, chunk by chunk."""
    out: list[TokenLogprobs] = []
    dev = hidden.device
    for start in range(0, len(rows), chunk_rows):
        tgt_host = list(targets[start : start + chunk_rows])
        idx = torch.tensor(rows[start : start + chunk_rows], dtype=torch.int64, device=dev)
        tgt = torch.tensor(tgt_host, dtype=torch.int64, device=dev)
        logits = logits_fn(hidden[idx])
        if min(tgt_host) < 0 or max(tgt_host) >= logits.shape[-1]:
            raise ValueError(f"prompt token ids must lie in [0, {logits.shape[-1]}) to be scored")
        chosen, rank, top_v, top_i = logprobs(logits, tgt, k)
        # one copy to the host per tensor; the first waits for the device
        lps, ranks = chosen.tolist(), rank.tolist()
        tv: list[list[float]] = top_v.tolist() if top_v is not None else [[] for _ in tgt_host]
        ti: list[list[int]] = top_i.tolist() if top_i is not None else [[] for _ in tgt_host]
        for t, lp, r, vs, ids in zip(tgt_host, lps, ranks, tv, ti, strict=True):
            out.append(TokenLogprobs(t, lp, list(zip(ids, vs, strict=True)), r))
    return out


def prompt_logprobs(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],  # [r, hidden] -> raw logits [r, V]
    hidden: torch.Tensor,
    seqs: Sequence[ScheduledSeq],
    query_start: Sequence[int],  # flat offset of each sequence in the step
    logprobs: Callable[..., tuple] = reference_logprobs,  # Ops.logprobs
) -> list[list[TokenLogprobs] | None]:
    """Per sequence: the prompt tokens this step scores (in order), or None when it scores none."""
    rows: list[int] = []
    targets: list[int] = []
    spans: list[tuple[int, int] | None] = []
    for s, q0 in zip(seqs, query_start, strict=False):
        pos = wanted_positions(s)
        if not len(pos):
            spans.append(None)
            continue
        spans.append((len(rows), len(pos)))
        rows.extend(q0 + p - s.num_computed for p in pos)
        targets.extend(s.history[p + 1] for p in pos)
    if not rows:
        return [None] * len(seqs)
    # One top-k width for the step; each sequence keeps its own k of it.
    k = max(s.params.prompt_logprobs or 0 for s, sp in zip(seqs, spans, strict=True) if sp is not None)
    scored = score_rows(logits_fn, hidden, rows, targets, k, logprobs=logprobs)
    result: list[list[TokenLogprobs] | None] = []
    for s, sp in zip(seqs, spans, strict=True):
        if sp is None:
            result.append(None)
            continue
        kk = s.params.prompt_logprobs or 0
        part = scored[sp[0] : sp[0] + sp[1]]
        if kk != k:
            part = [TokenLogprobs(t.token_id, t.logprob, t.top[:kk], t.rank) for t in part]
        result.append(part)
    return result

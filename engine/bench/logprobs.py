"""``python -m engine.bench.logprobs``: Ops.logprobs, the one-read kernel (arm ``sample.logprobs``,
cuda/sample/logprobs.cu) beside the torch reference, on the 4B's vocabulary (248,320 entries a row).

1. Correctness per shape: the largest |logprob| difference to the reference, ranks equal, top-1 the
   argmax (torch's order).
2. The op alone in a CUDA graph (median of 20 replays): rows 1 and 32 with k 0 and 5 (the sampler's
   logprobs at decode batches), 200 and 256 with k 1 (a scored prompt, lm-eval's echo + logprobs 1;
   256 rows is the scorer's chunk); bandwidth on the bf16 logits, a fraction of the copy bandwidth.
3. The prompt scorer as the runner calls it (``score_rows``: lm_head GEMM, the op, the host copies
   and the TokenLogprobs), wall time with the host included, order-alternated rounds A B B A:
   A = the session-34 path (fp32 logits from ``compute_logits``, the reference op), B = the raw bf16
   logits and the kernel; 200 and 512 rows, hidden 2,560.
The Markdown table comes last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from engine.bench import kernels as B
from engine.ops.sample import logprobs as lp
from engine.ops.sample import reference as ref
from engine.worker.prompt_logprobs import score_rows

VOCAB, HIDDEN = 248320, 2560
ROWS: list[tuple[str, str, float, str]] = []


def row(what: str, impl: str, us: float, note: str = "") -> None:
    ROWS.append((what, impl, us, note))
    print(f"  {what:<34}{impl:<22}{us:>10.1f} us  {note}", flush=True)


def logits(rng: np.random.Generator, rows: int) -> torch.Tensor:
    a = rng.standard_normal((rows, VOCAB), dtype=np.float32) * np.float32(4)
    return torch.from_numpy(a).to(device="cuda", dtype=torch.bfloat16)


def check(x: torch.Tensor, t: torch.Tensor, k: int) -> bool:
    c, r, v, i = lp.logprobs(x, t, k)
    wc, wr, _, _ = ref.logprobs(x, t, k)
    diff = (c - wc).abs().max().item()
    ranks = r is not None and wr is not None and torch.equal(r, wr)
    # the kernel's top-1 follows torch's argmax; a wider top-k is torch's topk (ties in its own order)
    top1 = i is None or torch.equal(x.gather(1, i[:, :1])[:, 0], x.max(dim=-1).values)
    if i is not None and k == 1:
        top1 = torch.equal(i[:, 0], x.argmax(dim=-1))
    ok = diff < 2e-5 and ranks and top1
    print(
        f"  check {tuple(x.shape)} k {k}: max |dlogprob| {diff:.2e}, ranks equal {ranks}, top-1 argmax {top1}"
    )
    return ok


def op_times(copy_bw: float, rng: np.random.Generator) -> bool:
    ok = True
    for rows, ks in ((1, (0, 5)), (32, (0, 5)), (200, (1,)), (256, (1,))):
        x = logits(rng, rows)
        t = torch.from_numpy(rng.integers(0, VOCAB, rows)).to("cuda")
        for k in ks:
            ok &= check(x, t, k)
            nbytes = rows * VOCAB * 2
            for impl, fn in (("reference", ref.logprobs), ("kernel", lp.logprobs)):
                us = B.replay_us([lambda fn=fn, x=x, t=t, k=k: fn(x, t, k)] * 3)
                bw = nbytes / (us * 1e-6)
                row(f"op {rows} rows k {k}", impl, us, f"{bw / 1e12:.2f} TB/s = {bw / copy_bw:.0%} copy")
    return ok


def scorer(rng: np.random.Generator, rounds: int) -> None:
    def normal(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to("cuda", torch.bfloat16)

    w = normal(VOCAB, HIDDEN) * 0.02
    for rows in (200, 512):
        hidden = normal(rows, HIDDEN)
        idx, targets = list(range(rows)), [int(v) for v in rng.integers(0, VOCAB, rows)]

        def old(hidden=hidden, idx=idx, targets=targets) -> list:
            return score_rows(lambda h: F.linear(h, w).float(), hidden, idx, targets, 1)

        def new(hidden=hidden, idx=idx, targets=targets) -> list:
            return score_rows(lambda h: F.linear(h, w), hidden, idx, targets, 1, logprobs=lp.logprobs)

        a, b = old(), new()  # warm-up, and the two agree
        assert [(p.token_id, p.rank) for p in a] == [(p.token_id, p.rank) for p in b]
        worst = max(abs(p.logprob - q.logprob) for p, q in zip(a, b, strict=True))
        print(f"  scorer {rows} rows: ranks equal, max |dlogprob| {worst:.2e}")
        times: dict[str, list[float]] = {"A session 34": [], "B kernel": []}
        for rnd in range(rounds):
            order = (("A session 34", old), ("B kernel", new))
            for name, fn in order if rnd % 2 == 0 else order[::-1]:
                for _ in range(5):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()  # ends in .tolist(): waits for the device
                    times[name].append((time.perf_counter() - t0) * 1e6)
        for name, ts in times.items():
            row(
                f"score_rows {rows} rows k 1 (wall)",
                name,
                statistics.median(ts),
                f"min {min(ts):.0f} max {max(ts):.0f}",
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.logprobs", description=__doc__)
    ap.add_argument("--rounds", type=int, default=4, help="A/B rounds of the scorer (alternated)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    from engine.bench.attention import copy_bandwidth

    copy_bw = max(copy_bandwidth())  # the better of memcpy and an elementwise copy kernel
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})")
    rng = np.random.default_rng(0)
    ok = op_times(copy_bw, rng)
    scorer(rng, args.rounds)
    print("\n| what | impl | us | note |\n|---|---|---|---|")
    for what, impl, us, note in ROWS:
        print(f"| {what} | {impl} | {us:.1f} | {note} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

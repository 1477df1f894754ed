"""Model-level step timing on one GPU, without the server: where a W1-shaped step spends its time.

    python -m engine.bench.model --model DIR --load-format dummy --batch 32 --prompt-len 1024

Prefills ``batch`` random prompts in chunks of the token budget (as the scheduler would), then runs
decode steps. Reports per-step wall time (host batch build + forward + sampling, synchronised by the
sampler's ``tolist``) and the forward alone (CUDA events), then a torch.profiler table of the decode
steps sorted by device time, so a gap can be attributed before code changes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.model.forward_batch import ForwardBatch
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner
from engine.worker.step import ScheduledSeq


def _seqs(toks, computed, tables, ids, outs, greedy) -> list[ScheduledSeq]:
    return [
        ScheduledSeq(
            token_ids=toks[i],
            num_computed=computed[i],
            block_ids=tables[i],
            state_slot=i + 1,
            request_id=str(i),
            params=greedy,
            num_output=len(outs[i]),
        )
        for i in ids
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--gdn-backend", default="auto")
    ap.add_argument("--kernel-arms", nargs="*", default=[])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=2048, help="prefill tokens per step")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--profile-steps", type=int, default=5)
    a = ap.parse_args(argv)
    mc = ModelConfig(
        model=a.model, load_format=a.load_format, gdn_backend=a.gdn_backend, kernel_arms=tuple(a.kernel_arms)
    )
    bs = 32
    per_seq = math.ceil((a.prompt_len + a.decode_steps + a.profile_steps + 1) / bs)
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=bs, num_gpu_blocks_override=a.batch * per_seq),
        scheduler=SchedulerConfig(max_num_seqs=a.batch, max_num_batched_tokens=a.budget),
    )
    runner = ModelRunner(cfg)
    print(
        f"backend {runner.gdn_backend}, device {runner.device_name}, params {runner.model.num_parameters()}"
    )
    greedy = SamplingParams(temperature=0.0)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, runner.vocab_size - 1, (a.prompt_len,), generator=g).tolist() for _ in range(a.batch)
    ]
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(a.batch)]
    outs: list[list[int]] = [[] for _ in prompts]
    per_step = max(1, a.budget // a.prompt_len)
    pre_times = []
    for start in range(0, a.batch, per_step):
        ids = list(range(start, min(a.batch, start + per_step)))
        seqs = _seqs(prompts, [0] * a.batch, tables, ids, outs, greedy)
        t0 = time.perf_counter()
        res = runner.execute_model(seqs)
        pre_times.append(time.perf_counter() - t0)
        for i, tok in zip(ids, res.token_ids, strict=True):
            outs[i].append(tok)

    def decode_step() -> float:
        toks = [[o[-1]] for o in outs]
        computed = [len(p) + len(o) - 1 for p, o in zip(prompts, outs, strict=True)]
        seqs = _seqs(toks, computed, tables, range(a.batch), outs, greedy)
        t0 = time.perf_counter()
        res = runner.execute_model(seqs)
        for o, tok in zip(outs, res.token_ids, strict=True):
            o.append(tok)
        return time.perf_counter() - t0

    for _ in range(3):
        decode_step()
    # CUDA-graph replay (A) vs eager (B), order-alternated A B B A ..., same batch shape and state.
    graphs = runner.graphs
    walls_by: dict[str, list[float]] = {"graph": [], "eager": []}
    for r in range(max(1, a.decode_steps // 4)):
        for arm in ("graph", "eager") if r % 2 == 0 else ("eager", "graph"):
            runner.graphs = graphs if arm == "graph" else None
            if arm == "graph" and graphs is None:
                continue
            walls_by[arm] += [decode_step() for _ in range(2)]
    runner.graphs = graphs
    # The forward alone, on the same batch shape, with CUDA events.
    toks = [[o[-1]] for o in outs]
    computed = [len(p) + len(o) - 1 for p, o in zip(prompts, outs, strict=True)]
    fb = ForwardBatch.build(_seqs(toks, computed, tables, range(a.batch), outs, greedy), bs, runner.device)
    fwd = []
    cuda = runner.device.type == "cuda"
    for _ in range(10):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            runner.execute(fb)
            e1.record()
            torch.cuda.synchronize()
            fwd.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            runner.execute(fb)
            fwd.append((time.perf_counter() - t0) * 1e3)
    pre_ms = statistics.median(pre_times) * 1e3
    print(f"prefill step ({min(per_step, a.batch)} x {a.prompt_len} tokens): median {pre_ms:.1f} ms")
    for arm, ws in walls_by.items():
        if ws:
            med = statistics.median(ws) * 1e3
            print(f"decode step, batch {a.batch}, {arm}: wall median {med:.2f} ms over {len(ws)} steps")
    print(f"decode forward alone, eager (CUDA events): median {statistics.median(fwd):.2f} ms")
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(a.profile_steps):
            decode_step()
    print(
        prof.key_averages().table(
            sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=30, max_name_column_width=60
        )
    )


if __name__ == "__main__":
    main()

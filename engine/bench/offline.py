"""A workload through the real EngineCore stepped in this thread: step times, host time, device memory.

    python -m engine.bench.offline --model DIR --load-format dummy --num-prompts 128 \
        --input-len 1024 --output-len 128 --max-num-seqs 32 --num-gpu-blocks-override 1280

No server and no ZeroMQ: what it times is the engine's own loop (schedule, execute, sample, update),
so the gap between its decode step time and a served TPOT is what the sockets and the API process
add. Reported: the start-up memory split, the device-memory peak while serving (cudaMemGetInfo at every
step end, the same reading as the server's gauge) and torch's allocator counters, and the engine's
step time by kind (prefill-only, mixed, decode-only); set against ``engine.bench.steps``' device time
for the same shapes it gives the host share of a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams


def _used() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--kernel-arms", nargs="*", default=[])
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--num-gpu-blocks-override", type=int, default=0)
    ap.add_argument("--kv-cache-memory", default="")
    ap.add_argument("--device-memory-limit", default="")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", default="", help="also write the result here")
    ap.add_argument(
        "--memory-history",
        type=int,
        default=0,
        help="record allocation history; list the N largest allocation sites live at the end",
    )
    a = ap.parse_args(argv)

    torch.zeros(1, device="cuda")
    context = _used()
    config = EngineConfig(
        model=ModelConfig(model=a.model, load_format=a.load_format, kernel_arms=tuple(a.kernel_arms)),
        cache=CacheConfig(
            num_gpu_blocks_override=a.num_gpu_blocks_override,
            kv_cache_memory=a.kv_cache_memory,
            device_memory_limit=a.device_memory_limit,
            gpu_memory_utilization=a.gpu_memory_utilization,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=a.max_num_seqs,
            max_num_batched_tokens=a.max_num_batched_tokens,
            max_waiting_requests=max(a.num_prompts, 1),
            async_scheduling=a.async_scheduling,
        ),
    )
    if a.memory_history:
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    t0 = time.perf_counter()
    core = EngineCore(config)
    startup_s = time.perf_counter() - t0
    runner = core.runner
    at_start = _used()
    rng = np.random.default_rng(0)
    vocab = runner.vocab_size  # type: ignore[attr-defined]
    params = SamplingParams(temperature=0.0, max_tokens=a.output_len, ignore_eos=True)
    wave = [
        EngineRequest(str(i), rng.integers(1, vocab - 1, size=a.input_len).tolist(), params)
        for i in range(a.num_prompts)
    ]
    core.add_requests(AddRequests(wave))
    steps: dict[str, list[float]] = defaultdict(list)
    tokens = 0
    t0 = time.perf_counter()
    while core.has_work():
        out = core.step()
        s = out.stats
        assert s is not None
        kind = "decode" if s.num_prefill_tokens == 0 else "prefill" if s.num_decode_tokens == 0 else "mixed"
        steps[kind].append(s.step_time_s * 1e3)
        tokens += sum(len(o.new_token_ids) for o in out.outputs)
    duration = time.perf_counter() - t0
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    used_now, peak = runner.device_memory()  # type: ignore[attr-defined]
    result = {
        "device": runner.device_name,  # type: ignore[attr-defined]
        "startup_s": round(startup_s, 2),
        "duration_s": round(duration, 3),
        "output_tokens": tokens,
        "context_bytes": context,
        "used_at_start": at_start,
        "peak_used": peak,
        "used_after": used_now,
        "split": runner.memory.as_dict() if runner.memory else {},  # type: ignore[attr-defined]
        "torch_reserved_peak": stats.get("reserved_bytes.all.peak", 0),
        "torch_allocated_peak": stats.get("allocated_bytes.all.peak", 0),
        "torch_reserved_now": stats.get("reserved_bytes.all.current", 0),
        "torch_allocated_now": stats.get("allocated_bytes.all.current", 0),
        "torch_segments": stats.get("segment.all.current", 0),
        "slots": runner.num_state_slots - 1,  # type: ignore[attr-defined]
        "kv_blocks": runner.num_kv_blocks - 1,  # type: ignore[attr-defined]
        "graphs": len(runner.graphs.graphs) if runner.graphs else 0,  # type: ignore[attr-defined]
        "steps": {
            k: {
                "n": len(v),
                "median_ms": round(statistics.median(v), 3),
                "mean_ms": round(statistics.mean(v), 3),
            }
            for k, v in steps.items()
        },
    }
    line = json.dumps(result)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    print(line)
    gi = 2**30
    print(
        f"duration {duration:.2f} s, {tokens} tokens; device memory: context {context / gi:.2f} GiB, "
        f"after start-up {at_start / gi:.2f}, peak while serving {peak / gi:.2f} GiB; torch reserved peak "
        f"{result['torch_reserved_peak'] / gi:.2f}, allocated peak {result['torch_allocated_peak'] / gi:.2f}"
    )
    for k, v in result["steps"].items():
        print(f"  {k:<8} {v['n']:>5} steps  median {v['median_ms']:.2f} ms  mean {v['mean_ms']:.2f} ms")
    if a.memory_history:
        live_sites(a.memory_history)


def live_sites(top: int) -> None:
    """The allocation sites (first frame inside this repository) of the blocks live now, by bytes."""
    snap: Any = torch.cuda.memory._snapshot()
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    pools: dict[str, int] = defaultdict(int)
    for seg in snap["segments"]:
        pool = "graph pool" if seg.get("segment_pool_id", (0, 0)) != (0, 0) else "default pool"
        pools[pool] += seg["total_size"]
        for blk in seg["blocks"]:
            if blk["state"] != "active_allocated":
                continue
            frames: list[dict[str, Any]] = blk.get("frames", [])
            here = [f for f in frames if "/engine/" in str(f["filename"])]
            f = here[0] if here else (frames[0] if frames else {"filename": "?", "line": 0, "name": "?"})
            where = str(f["filename"]).split("/engine/")[-1]
            key = f"{where}:{f['line']} {f['name']} ({pool})"
            sites[key][0] += blk["size"]
            sites[key][1] += 1
    print("reserved by pool: " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in pools.items()))
    print(f"live allocations by site, the {top} largest (MiB, blocks):")
    for k, (size, n) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {size / 2**20:>9.1f} {n:>6}  {k}")


if __name__ == "__main__":
    main()

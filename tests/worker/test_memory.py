"""Device-memory accounting and budget (engine/worker/memory.py): the arithmetic on CPU, and on a GPU
the Qwen3.5-4B dummy engine under a 16 GiB budget serving W1-shaped traffic in a fresh process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.worker.memory import (
    CUBLAS_WORKSPACE,
    MemorySplit,
    configure_cuda_memory,
    measure_split,
    parse_bytes,
    plan_pools,
    size_cublas_workspace,
    use_expandable_segments,
    workspace_reserve,
)

GIB = 1 << 30


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", 0),
        ("1073741824", GIB),
        ("3GiB", 3 * GIB),
        ("1.5gib", 3 * GIB // 2),
        ("16G", 16 * 10**9),
        ("512MiB", 512 << 20),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text, "--kv-cache-memory") == expected


@pytest.mark.parametrize("text", ["3 GiBs", "-1G", "lots", "1e9"])
def test_parse_bytes_names_the_flag(text):
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        parse_bytes(text, "--kv-cache-memory")


def test_split_adds_up_to_the_measured_use():
    s = measure_split(
        weights=7 * GIB,
        kv_cache=GIB,
        state_pool=2 * GIB,
        cuda_graphs=GIB // 4,
        activation_peak=GIB // 2,
        torch_reserved=11 * GIB,
        device_used=11 * GIB + (600 << 20),
        total=16 * GIB,
    )
    assert s.used == 11 * GIB + (600 << 20)
    assert s.workspace == 11 * GIB - 10 * GIB - GIB // 4
    assert s.non_torch == 600 << 20 and s.free == 16 * GIB - s.used
    assert set(s.as_dict()) >= {"weights", "kv_cache", "state_pool", "cuda_graphs", "workspace", "non_torch"}
    assert "kv_cache 1.00 GiB" in s.log_line()
    assert "state_pool (float32 recurrent state) 2.00 GiB" in s.log_line()
    assert "state_pool (bfloat16 recurrent state) 2.00 GiB" in s.log_line("bfloat16")


def test_an_on_demand_state_outside_torch_is_counted_once_and_its_full_size_shown():
    """An on-demand recurrent state is mapped outside torch's allocator (engine/model/vmm.py): it is in
    the device's use and in the state pool, and in neither the workspace nor non_torch."""
    s = measure_split(
        weights=7 * GIB,
        kv_cache=GIB,
        state_pool=GIB // 8 + GIB // 2,  # conv in torch's reservation, 0.5 GiB of recurrent state mapped
        state_outside_torch=GIB // 2,
        state_pool_full=3 * GIB,
        cuda_graphs=GIB // 4,
        torch_reserved=9 * GIB,
        device_used=9 * GIB + GIB // 2 + (600 << 20),
        total=16 * GIB,
        activation_peak=0,
    )
    assert s.used == 9 * GIB + GIB // 2 + (600 << 20)
    assert s.non_torch == 600 << 20
    assert s.workspace == 9 * GIB - (8 * GIB + GIB // 8) - GIB // 4
    assert "on demand: 3.00 GiB with every slot in use" in s.log_line()
    assert s.as_dict()["state_pool_full"] == 3 * GIB


MIB = 1 << 20
SLOT = 49 * MIB  # a Qwen3.5-4B GDN state slot
BLOCK = 1 * MIB  # a 4B KV block of 32 tokens


def test_slots_first_then_kv_from_what_they_leave():
    slots, blocks = plan_pools(
        room=10 * GIB, wanted_slots=32, slot_bytes=SLOT, block_bytes=BLOCK, fixed_kv=0, kv_floor=GIB
    )
    assert slots == 32
    assert blocks == (10 * GIB - 33 * SLOT) // BLOCK  # slot 0 is allocated beside the 32


def test_slots_shrink_to_the_budget_keeping_the_kv_floor():
    slots, blocks = plan_pools(
        room=3 * GIB, wanted_slots=64, slot_bytes=SLOT, block_bytes=BLOCK, fixed_kv=0, kv_floor=GIB
    )
    assert slots == (3 * GIB - SLOT - GIB) // SLOT < 64
    assert blocks * BLOCK >= GIB  # one full-context request still fits


def test_a_fixed_kv_pool_is_kept_and_no_room_means_no_slot():
    slots, blocks = plan_pools(
        room=4 * GIB, wanted_slots=64, slot_bytes=SLOT, block_bytes=BLOCK, fixed_kv=3 * GIB, kv_floor=GIB
    )
    assert blocks == 3 * GIB // BLOCK and slots == (GIB - SLOT) // SLOT
    assert (
        plan_pools(
            room=GIB, wanted_slots=8, slot_bytes=SLOT, block_bytes=BLOCK, fixed_kv=2 * GIB, kv_floor=0
        )[0]
        == 0
    )


def test_a_bf16_recurrent_state_fits_about_twice_the_slots():
    """--mamba-ssm-cache-dtype bfloat16: the 4B slot shrinks from 49.1 to 25.1 MiB (conv state stays
    bf16), so a budget that held 16 fp32 slots holds 32."""
    import torch

    from engine.checkpoints.presets import qwen35_4b_config
    from engine.model.cache import state_bytes_per_slot
    from engine.model.qwen3_5.config import Qwen35Config
    from engine.model.qwen3_5.model import cache_spec

    spec = cache_spec(Qwen35Config.from_dict(qwen35_4b_config()))
    fp32, bf16 = (state_bytes_per_slot(spec, torch.bfloat16, d) for d in (torch.float32, torch.bfloat16))
    assert fp32 - bf16 == 24 * 32 * 128 * 128 * 2
    room = GIB + 17 * fp32  # the KV floor, slot 0 and 16 slots
    got = [
        plan_pools(room=room, wanted_slots=64, slot_bytes=b, block_bytes=BLOCK, fixed_kv=0, kv_floor=GIB)[0]
        for b in (fp32, bf16)
    ]
    assert got == [16, 32]


def test_workspace_reserve_covers_sampling_rows_and_a_floor():
    # 0.16 GiB profile peak (the 4B at 2,048 tokens) and 64 rows of a 248,320-token vocabulary
    peak = int(0.16 * GIB)
    assert workspace_reserve(peak, 64, 248_320) == int(peak * 1.25) + 16 * 64 * 248_320
    assert workspace_reserve(0, 1, 100) == 256 * MIB


_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.generate import generate
    from engine.worker.model_runner import ModelRunner

    mc = ModelConfig(model=sys.argv[1], dtype="bfloat16", device="cuda", load_format="dummy")
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(device_memory_limit="16GiB", gpu_memory_utilization=0.9),
        scheduler=SchedulerConfig(max_num_batched_tokens=2048),
    )
    runner = ModelRunner(cfg)
    free, total = torch.cuda.mem_get_info()
    used_at_start = total - free
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 200000, size=1024).tolist() for _ in range(48)]
    # the real scheduler (an EngineCore stepped in this thread): W1-shaped prefills, then decodes
    outs = generate(runner, prompts, 32, token_budget=2048)
    # the cuBLAS workspace torch hands a stream it has not seen: the size it read at the runner's
    # first GEMM, so this is what the runner asked for before it (configure_cuda_memory)
    with torch.cuda.stream(torch.cuda.Stream()):
        x = torch.ones(16, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
        before = torch.cuda.memory_allocated()
        y = torch.nn.functional.linear(x, w)
        torch.cuda.synchronize()
        cublas_ws = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    print(json.dumps({"split": runner.memory.as_dict(), "used_at_start": used_at_start,
                      "cublas_ws": cublas_ws,
                      "peak": runner.device_memory()[1], "counts": [len(o) for o in outs],
                      "slots": runner.num_state_slots - 1, "blocks": runner.num_kv_blocks - 1,
                      "graphs": runner.graph_bytes, "graph_plan": runner._graph_plan}))
    """
)


@pytest.mark.gpu
def test_4b_serves_w1_shaped_traffic_under_16gib(tmp_path: Path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from engine.checkpoints.presets import qwen35_4b_config

    d = tmp_path / "qwen3.5-4b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(qwen35_4b_config()))
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}  # the runner's choice
    p = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(d)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    split = MemorySplit(**r["split"])
    print(split.log_line(), r["slots"], "slots", r["blocks"], "blocks", "peak", r["peak"])
    assert r["counts"] == [32] * 48, "every request finished with all its tokens"
    assert split.total == 16 * GIB
    assert abs(split.used - r["used_at_start"]) <= 0.01 * r["used_at_start"]
    assert split.weights == 4_205_751_296 * 2
    # every decode graph is captured at start-up; the plan reserved what they took (the probe
    # captures every bucket), so the process starts inside --gpu-memory-utilization. They may take
    # nothing device-wide: their transients fit the pool they share with the piecewise graphs, and
    # their logits live in the piecewise scratch (0 and 2 MiB on the 4B in session 20)
    assert 0 <= r["graphs"] <= r["graph_plan"] + 16 * MIB, (r["graphs"], r["graph_plan"])
    start = r["used_at_start"] / GIB
    assert start <= 0.9 * 16, f"start-up {start:.3f} GiB over the 0.9 x 16 GiB budget"
    parts = split.as_dict()
    assert all(v >= 0 for v in parts.values()), f"a negative part in the split: {parts}"
    assert split.cuda_graphs > 0, "the decode graphs were captured, so their pool is in the split"
    assert r["peak"] <= 16 * GIB, f"peak {r['peak'] / GIB:.2f} GiB over the 16 GiB budget"
    # 16 MiB + 128 KiB (CUBLAS_WORKSPACE), not torch's 32 MiB: the variable was set before the first GEMM
    assert abs(r["cublas_ws"] - workspace_kib(CUBLAS_WORKSPACE) * 1024) <= 4096, r["cublas_ws"]


STACK_SCRIPT = textwrap.dedent(
    """
    import json

    import cupy
    import numpy as np
    import torch

    from engine.worker.memory import shrink_thread_stacks, stack_limit

    torch.zeros(1, device="cuda")
    before, now, freed = shrink_thread_stacks(torch.device("cuda"))
    # a 2 KiB local array read at runtime indices: a 2 KiB stack frame the driver must grow for
    src = r'''
    extern "C" __global__ void deep_stack(const int* idx, float* out) {
      float buf[512];
      for (int i = 0; i < 512; ++i) buf[i] = i * 0.5f + threadIdx.x;
      out[blockIdx.x * blockDim.x + threadIdx.x] = buf[idx[threadIdx.x] & 511];
    }
    '''
    blocks = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    idx = cupy.asarray(np.arange(256, dtype=np.int32) * 7)
    out = cupy.full(blocks * 256, np.nan, dtype=cupy.float32)
    cupy.RawKernel(src, "deep_stack")((blocks,), (256,), (idx, out))
    cupy.cuda.runtime.deviceSynchronize()
    want = np.tile((np.arange(256) * 7 % 512) * 0.5 + np.arange(256), blocks).astype(np.float32)
    print(json.dumps({"before": before, "now": now, "freed": freed, "after_kernel": stack_limit(),
                      "exact": bool((cupy.asnumpy(out) == want).all())}))
    """
)


@pytest.mark.gpu
def test_no_thread_stack_up_front_and_the_driver_grows_it_for_a_kernel_that_needs_one():
    """The runner's first step (shrink_thread_stacks) frees the context's stack reservation, and a
    kernel with a 2 KiB stack frame launched afterwards still runs exactly: the driver grows the limit
    for it (what makes asking for 0 safe). In a fresh process: the limit is process-wide."""
    pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-c", STACK_SCRIPT], capture_output=True, text=True, cwd=root, timeout=300
    )
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["before"] == 1024 and r["now"] < r["before"], r  # 1 KiB: the driver's default
    assert r["freed"] > 0, r
    assert r["exact"] and r["after_kernel"] >= 2048, r


@pytest.mark.parametrize(
    ("conf", "on"),
    [("expandable_segments:False", False), ("max_split_size_mb:64,expandable_segments:True", True)],
)
def test_expandable_segments_follow_an_allocator_setting_the_environment_made(monkeypatch, conf, on):
    """Whoever set PYTORCH_CUDA_ALLOC_CONF's expandable_segments decides; the runner does not override it."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
    assert use_expandable_segments() is on


def workspace_kib(config: str) -> int:
    """KiB torch's parseChosenWorkspaceSize reads from a CUBLAS_WORKSPACE_CONFIG (:SIZE:COUNT pairs)."""
    return sum(int(size) * int(count) for size, count in re.findall(r":([0-9]+):([0-9]+)", config))


def test_cublas_workspace_is_asked_for_unless_the_user_chose(monkeypatch):
    """Unset: the runner asks for 16 MiB (torch's default on sm_90 / 100 / 120 is 32). Set by the user
    (e.g. :4096:8 for deterministic cuBLAS): left exactly as it was."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert configure_cuda_memory() is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert 16 * 1024 <= workspace_kib(CUBLAS_WORKSPACE) < 32 * 1024
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert size_cublas_workspace() == ":4096:8" == os.environ["CUBLAS_WORKSPACE_CONFIG"]

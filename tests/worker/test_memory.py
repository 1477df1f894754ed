"""Device-memory accounting and budget (engine/worker/memory.py): the arithmetic on CPU, and on a GPU
the Qwen3.5-4B dummy engine under a 16 GiB budget serving W1-shaped traffic in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.worker.memory import (
    MemorySplit,
    kv_budget_blocks,
    measure_split,
    parse_bytes,
    state_slots_that_fit,
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


def test_kv_blocks_keep_room_for_the_step_workspace():
    # 10 GiB budget, 8 GiB in use, a 1 GiB activation peak (1.1 GiB reserved for it), 1 MiB blocks
    n = kv_budget_blocks(
        budget=10 * GIB, device_used=8 * GIB, activation_peak=GIB, workspace_cached=0, block_bytes=1 << 20
    )
    assert n == (2 * GIB - int(GIB * 1.1)) // (1 << 20)
    # workspace torch already caches is not reserved twice
    m = kv_budget_blocks(
        budget=10 * GIB, device_used=8 * GIB, activation_peak=GIB, workspace_cached=GIB, block_bytes=1 << 20
    )
    assert m > n
    assert (
        kv_budget_blocks(
            budget=GIB, device_used=2 * GIB, activation_peak=0, workspace_cached=0, block_bytes=1
        )
        == 0
    )


def test_state_slots_follow_the_budget():
    assert state_slots_that_fit(wanted=64, slot_bytes=49 << 20, room=10 * GIB) == 64
    assert state_slots_that_fit(wanted=64, slot_bytes=49 << 20, room=GIB) == GIB // (49 << 20)
    assert state_slots_that_fit(wanted=64, slot_bytes=49 << 20, room=-5) == 0


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
    print(json.dumps({"split": runner.memory.as_dict(), "used_at_start": used_at_start,
                      "peak": runner.device_memory()[1], "counts": [len(o) for o in outs],
                      "slots": runner.num_state_slots - 1, "blocks": runner.num_kv_blocks - 1}))
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
    p = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(d)], capture_output=True, text=True, timeout=600, cwd=root
    )
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    split = MemorySplit(**r["split"])
    print(split.log_line(), r["slots"], "slots", r["blocks"], "blocks", "peak", r["peak"])
    assert r["counts"] == [32] * 48, "every request finished with all its tokens"
    assert split.total == 16 * GIB
    assert abs(split.used - r["used_at_start"]) <= 0.01 * r["used_at_start"]
    assert split.weights == 4_205_751_296 * 2
    assert r["peak"] <= 16 * GIB, f"peak {r['peak'] / GIB:.2f} GiB over the 16 GiB budget"

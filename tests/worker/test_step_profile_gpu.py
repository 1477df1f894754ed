"""On CUDA: --profile-steps over a real serving run of the embedded model. The window's steps are
timed from the trace (a mark per step, each step's span split into kernel time and idle), the summary
and the trace are written, and the tokens served are the ones an unprofiled engine serves."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner
from engine.worker.resolve import resolve_model

pytestmark = pytest.mark.gpu


def _serve(
    profile: str, out: Path | None, after_first_step: Callable[[], None] | None = None
) -> tuple[dict[str, list[int]], ModelRunner]:
    mc = resolve_model(
        ModelConfig(device="cuda", max_model_len=1024, profile_steps=profile, profile_dir=str(out or ""))
    )
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_gpu_blocks_override=256),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8),
    )
    runner = ModelRunner(cfg)
    core = EngineCore(cfg, runner)
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)
    # prompts of 3-90 tokens under a 64-token budget: prefill, mixed and decode steps, chunked prompts
    reqs = [
        EngineRequest(
            f"{i}",
            [(7 * i + j) % 500 + 3 for j in range(3 + 29 * i)],
            msgspec.structs.replace(greedy, max_tokens=16),
        )
        for i in range(4)
    ]
    core.add_requests(AddRequests(reqs))
    toks: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    while core.has_work():
        for o in core.step().outputs:
            toks[o.request_id] += o.new_token_ids
        if after_first_step is not None:
            after_first_step()
            after_first_step = None
    return toks, runner


def test_a_profiled_run_times_its_window_and_serves_the_same_tokens(tmp_path: Path):
    plain, _ = _serve("", None)
    toks, runner = _serve("2:10", tmp_path)
    assert toks == plain and all(len(t) == 16 for t in toks.values())
    s = runner.profiler.summary  # type: ignore[union-attr]
    assert s is not None
    assert json.loads((tmp_path / "step-profile.json").read_text()) == json.loads(json.dumps(s))
    assert (tmp_path / "trace.json").stat().st_size > 0
    assert s["window"] == {"start": 2, "count": 10} and s["marks"] == 11 and s["steps"] == 10
    assert sum(k["steps"] for k in s["by_kind"].values()) == 10
    assert any(label.startswith("decode / decode graph") for label in s["by_kind"])
    assert 0 < s["busy_ms"] < s["span_ms"] and 0 < s["busy_fraction"] < 1
    for k in s["by_kind"].values():
        assert k["busy_ms"] > 0
        assert k["busy_ms"] + k["idle_ms"] == pytest.approx(k["span_ms"], rel=1e-6)
        assert k["lead_ms"] + k["inner_ms"] + k["tail_ms"] == pytest.approx(k["idle_ms"], rel=1e-6)
        # a step's kernels by family: their durations add up to at least the union of their intervals
        assert sum(k["families_ms"].values()) >= k["busy_ms"] * (1 - 1e-6)
    # every kernel inside the window is in some family; their sum covers the union of their intervals
    total = sum(s["families_ms"].values())
    assert s["busy_ms"] <= total * (1 + 1e-6)
    assert runner.profiler.index > 12  # type: ignore[union-attr]
    assert all(g["count"] >= 1 and g["max_ms"] <= g["total_ms"] for g in s["gc_pauses"].values())


def test_a_profile_that_cannot_be_written_stops_profiling_not_serving(tmp_path: Path):
    plain, _ = _serve("", None)
    out = tmp_path / "prof"

    def clobber() -> None:  # the directory made at start-up turns into a file before the window ends
        shutil.rmtree(out)
        out.write_text("not a directory")

    toks, runner = _serve("2:10", out, clobber)
    assert toks == plain
    s = runner.profiler.summary  # type: ignore[union-attr]
    assert s is not None and s["steps"] == 0 and "FileExistsError" in s["error"]
    assert out.is_file()


def test_a_profile_dir_that_cannot_be_made_is_refused_at_start_up(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="--profile-dir"):
        _serve("2:10", blocker / "prof")

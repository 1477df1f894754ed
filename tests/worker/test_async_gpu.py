"""On CUDA: decode steps launched ahead (async scheduling) read their input token on the device from
the step before, through CUDA-graph replays and eager steps alike, and give bit-identical tokens and
logprobs to one-step-at-a-time scheduling."""

from __future__ import annotations

import msgspec
import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner
from engine.worker.resolve import resolve_model

pytestmark = pytest.mark.gpu


def _outputs(async_on: bool, eager: bool) -> tuple[dict[str, list], int]:
    mc = resolve_model(ModelConfig(device="cuda", max_model_len=1024, enforce_eager=eager))
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_gpu_blocks_override=256),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, async_scheduling=async_on),
    )
    runner = ModelRunner(cfg)
    ahead = 0
    real = runner.launch

    def counted(seqs, prev=None):
        nonlocal ahead
        ahead += any(s.prev_row >= 0 for s in seqs)
        return real(seqs, prev)

    runner.launch = counted  # type: ignore[method-assign]
    core = EngineCore(cfg, runner)
    kinds = [
        SamplingParams(temperature=0.0, ignore_eos=True),
        SamplingParams(temperature=0.9, top_k=20, seed=3, ignore_eos=True),
        SamplingParams(temperature=0.0, ignore_eos=True, logprobs=2),
    ]
    # different lengths: requests finishing by length leave the batch, so rows shift between steps
    reqs = [
        EngineRequest(
            f"{i}", [3 + i, 17, 40 + i, 9], msgspec.structs.replace(kinds[i % 3], max_tokens=5 + 4 * i)
        )
        for i in range(8)
    ]
    core.add_requests(AddRequests(reqs))
    outs: dict[str, list] = {r.request_id: [] for r in reqs}
    while core.has_work():
        for o in core.step().outputs:
            outs[o.request_id].append((o.new_token_ids, o.logprobs, o.finish_reason))
    return outs, ahead


@pytest.mark.parametrize("eager", [False, True])
def test_async_equals_sync_on_cuda(eager: bool):
    sync, none = _outputs(False, eager)
    ahead, n = _outputs(True, eager)
    assert none == 0 and n > 10
    assert ahead == sync
    assert [sum(len(t) for t, _, _ in v) for v in ahead.values()] == [5 + 4 * i for i in range(8)]

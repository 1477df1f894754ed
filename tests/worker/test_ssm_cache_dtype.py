"""--mamba-ssm-cache-dtype bfloat16 on the tiny model (CPU, torch reference ops) through the real
scheduler: the runner allocates a bf16 recurrent-state pool of half the recurrent bytes, and greedy
decoding with chunked prefills (a 64-token budget) stays within a small logprob distance of the
fp32-state run, step by step; the first token of a prompt prefilled in one chunk is bit-identical
(its logits never read a rounded state). Token equality across dtypes is not asserted."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.checkpoints.presets import make_checkpoint
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.generate import score_prompts
from engine.messages import AddRequests, EngineRequest
from engine.model.cache import state_bytes_per_slot
from engine.sampling_params import SamplingParams, TokenLogprobs
from engine.worker.model_runner import ModelRunner

BUDGET = 64  # tokens per step: the 150- and 300-token prompts prefill over several chunks
LENS = (5, 40, 150, 300)
STEPS = 10
TOP = 5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ssm") / "tiny", preset="tiny", seed=0)


def _config(ckpt: Path, ssm: str) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=str(ckpt), device="cpu"),
        cache=CacheConfig(block_size=16, mamba_ssm_cache_dtype=ssm),  # type: ignore[arg-type]
        scheduler=SchedulerConfig(max_num_seqs=len(LENS), max_num_batched_tokens=BUDGET),
    )


def _greedy(cfg: EngineConfig, runner: ModelRunner, prompts: list[list[int]]) -> list[list[TokenLogprobs]]:
    """Every prompt as one request of one wave, stepped to the end by an EngineCore: the sampled
    tokens' logprobs with the top alternatives, per request."""
    core = EngineCore(cfg, runner)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, logprobs=TOP, ignore_eos=True)
    ids = [str(i) for i in range(len(prompts))]
    core.add_requests(AddRequests([EngineRequest(r, p, params) for r, p in zip(ids, prompts, strict=True)]))
    got: dict[str, list[TokenLogprobs]] = {r: [] for r in ids}
    while core.has_work():
        for out in core.step().outputs:
            assert out.error is None, out.error
            got[out.request_id].extend(out.logprobs or [])
    return [got[r] for r in ids]


def test_bf16_state_engine_stays_close_to_fp32_state(ckpt: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="engine.worker.model_runner")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 400, n).tolist() for n in LENS]
    runs = {}
    for ssm in ("float32", "bfloat16"):
        cfg = _config(ckpt, ssm)
        runner = ModelRunner(cfg)
        want = torch.float32 if ssm == "float32" else torch.bfloat16
        assert runner.cache_config.mamba_ssm_cache_dtype == ssm
        assert all(t.dtype == want for t in runner.cache.ssm_state)
        assert f"recurrent state in {ssm}" in caplog.text  # the start-up capacity line names it
        runs[ssm] = (
            _greedy(cfg, runner, prompts),
            score_prompts(runner, prompts, TOP, token_budget=BUDGET),
            runner,
        )
    (g32, s32, r32), (g16, s16, r16) = runs["float32"], runs["bfloat16"]
    spec = r16.cache_spec
    recurrent = spec.num_state_layers * int(np.prod(spec.ssm_state_shape))
    assert (
        state_bytes_per_slot(spec, r32.dtype, r32.ssm_dtype)
        - state_bytes_per_slot(spec, r16.dtype, r16.ssm_dtype)
        == 2 * recurrent
    )
    worst = 0.0
    for i, n in enumerate(LENS):
        a, b = g32[i], g16[i]
        assert len(a) == len(b) == STEPS
        if n <= BUDGET:  # prefilled in one chunk: the first logits read no rounded state
            assert a[0] == b[0], f"prompt {i}: first token's logprobs differ"
        for step, (x, y) in enumerate(zip(a, b, strict=True)):
            if x.token_id != y.token_id:
                break  # the paths part (a near-tie); later steps see different inputs
            assert abs(x.logprob - y.logprob) < 2e-2, (i, step, x.logprob, y.logprob)
            same_top = [t for t, _ in x.top] == [t for t, _ in y.top]
            if same_top:
                d = max(abs(u - v) for (_, u), (_, v) in zip(x.top, y.top, strict=True))
                assert d < 6e-2, (i, step, d)
                worst = max(worst, d)
        # prompt logprobs scored over several 64-token prefill chunks: the state is rounded between them
        for x, y in zip(s32[i], s16[i], strict=True):
            assert x.token_id == y.token_id and abs(x.logprob - y.logprob) < 3e-2
    print(f"largest top-{TOP} logprob difference fp32 vs bf16 state: {worst:.4f}")

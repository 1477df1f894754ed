"""On CUDA: prompt logprobs next to decode steps replayed from CUDA graphs, and penalised seeded
sampling that does not depend on the batch (the tiny model in fp32; the reference ops)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.generate import score_prompts
from engine.messages import AddRequests, EngineRequest
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner
from engine.worker.resolve import resolve_model

pytestmark = pytest.mark.gpu


def _config(device: str) -> EngineConfig:
    mc = resolve_model(ModelConfig(device=device, dtype="float32", gdn_backend="torch", max_model_len=1024))
    return EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_gpu_blocks_override=256),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4),
    )


def _run(core: EngineCore, reqs: list[EngineRequest]) -> dict[str, list]:
    core.add_requests(AddRequests(reqs))
    outs: dict[str, list] = {r.request_id: [] for r in reqs}
    while core.has_work():
        for o in core.step().outputs:
            outs[o.request_id].append(o)
    return outs


def test_prompt_logprobs_and_penalties_beside_graph_decodes() -> None:
    pytest.importorskip("cupy")
    gpu = ModelRunner(_config("cuda"))
    assert gpu.graphs is not None, "decode steps should replay CUDA graphs here"
    cpu = ModelRunner(_config("cpu"))
    rng = np.random.default_rng(0)
    long_prompt = rng.integers(0, 400, size=150).tolist()
    short = rng.integers(0, 400, size=12).tolist()
    ref = score_prompts(cpu, [long_prompt], top_k=2)[0]

    pen = SamplingParams(max_tokens=24, temperature=0.8, seed=5, ignore_eos=True, presence_penalty=1.0,
                         frequency_penalty=0.5, repetition_penalty=1.3, logit_bias=((3, 4.0),))  # fmt: skip
    score = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    alone = _run(EngineCore(_config("cuda"), gpu), [EngineRequest("a", short, pen)])["a"]
    # "a" decodes (graph steps once "b" is done) while "b"'s prompt is scored over three chunks.
    mixed = _run(
        EngineCore(_config("cuda"), gpu),
        [EngineRequest("a", short, pen), EngineRequest("b", long_prompt, score)],
    )
    tokens = lambda outs: [t for o in outs for t in o.new_token_ids]  # noqa: E731
    assert tokens(mixed["a"]) == tokens(alone) and len(tokens(alone)) == 24
    scored = mixed["b"][0].prompt_logprobs
    assert [s.token_id for s in scored] == long_prompt[1:]
    for g, c in zip(scored, ref, strict=True):
        assert abs(g.logprob - c.logprob) <= 1e-3 * max(1.0, abs(c.logprob))


def test_greedy_on_raw_bf16_logits_on_cuda_picks_the_fp32_token() -> None:
    """The decode graphs and the piecewise steps hand the sampler raw bf16 logits, and an all-greedy
    step takes their argmax on the device unwidened: the token is the one the fp32 widening gives,
    ties (planted at the maximum, several per row) going to the lowest index, at the 4B's vocabulary."""
    import torch

    from engine.worker.sampler import Sampler

    rows, vocab = 64, 248_320
    rng = np.random.default_rng(3)
    x = torch.from_numpy((rng.standard_normal((rows, vocab)) * 4).astype(np.float32)).to(torch.bfloat16)
    for r in range(rows):
        top = x[r].max()
        for j in rng.choice(vocab, size=1 + r % 4, replace=False):
            x[r, int(j)] = top
    x = x.cuda()
    s = Sampler("cuda")
    greedy = [SamplingParams(temperature=0.0)] * rows
    ids, _ = s.sample(x, s.prepare(greedy, [0] * rows, vocab))
    want = x.float().argmax(dim=-1).tolist()
    lowest = [int(torch.nonzero(x[r] == x[r].max())[0]) for r in range(rows)]
    assert ids == want == lowest

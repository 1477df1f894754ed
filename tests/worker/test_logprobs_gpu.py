"""On CUDA, served: the logprob kernel (arm ``sample.logprobs``) reports what the torch reference does.

Two bf16 runners of the small model differ in that arm alone, so their logits are the same bits and
every difference is the op's: five requests through the real EngineCore (greedy with logprobs 2,
seeded sampling, a scored prompt with prompt logprobs 3; chunked prompts, whole-step graphs, decode
graphs) give the same tokens, the same chosen and top-1 ids, ranks and top-k values within two fp32
ulps. (The kernel alone against the reference, on the 4B's vocabulary: tests/ops/test_logprobs.py.)
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.ops.arms import DEFAULT_ARMS  # noqa: E402
from tests.model.test_prefill_graphs_gpu import _ckpt  # noqa: E402
from tests.model.test_small_model_gpu import _small_runner  # noqa: E402
from tests.worker.test_prefill_graphs import _serve_one_by_one  # noqa: E402

pytestmark = pytest.mark.gpu


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 2e-6 + 4e-7 * abs(b)


def test_served_logprobs_equal_the_reference_ops(tmp_path) -> None:
    pytest.importorskip("cupy")
    d = _ckpt(tmp_path)
    arms = tuple(sorted(DEFAULT_ARMS | {"sample.logprobs"}))
    kernel = _small_runner(d, "bfloat16", "cuda", eager=False, arms=arms)
    without = tuple(a for a in arms if a != "sample.logprobs")
    plain = _small_runner(d, "bfloat16", "cuda", eager=False, arms=without)
    assert "sample.logprobs" in kernel.model_config.kernel_arms
    assert "sample.logprobs" not in plain.model_config.kernel_arms
    assert kernel.vocab_size % 8 == 0  # rows the kernel takes (else the wrapper hands them to torch)
    a, b = _serve_one_by_one(kernel), _serve_one_by_one(plain)
    assert a.keys() == b.keys()
    checked = 0
    for rid in a:
        assert [t for t, _, _ in a[rid]] == [t for t, _, _ in b[rid]], rid  # the same bits sampled
        for (_, lps_a, _), (_, lps_b, _) in zip(a[rid], b[rid], strict=True):
            assert len(lps_a) == len(lps_b)
            for x, y in zip(lps_a, lps_b, strict=True):
                assert x.token_id == y.token_id and x.rank == y.rank and _close(x.logprob, y.logprob)
                assert len(x.top) == len(y.top) > 0
                # the top-1 id, unless two entries tie for it (then torch's topk orders them its way)
                assert x.top[0][0] == y.top[0][0] or _close(x.top[1][1], y.top[0][1])
                assert all(_close(u, v) for (_, u), (_, v) in zip(x.top, y.top, strict=True))
                checked += 1
    assert checked > 60  # the scored prompt's rows and the greedy request's tokens

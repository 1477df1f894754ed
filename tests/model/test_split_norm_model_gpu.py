"""Arm linear.split_norm in the whole small model (tests/model/test_small_model_gpu.py's runners): the
fused output and down projections against the composition and the fp32 model on the same weights.
The op and kernel tests: tests/ops/test_split_norm_gpu.py."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tests.model.test_model_gpu import report  # noqa: E402
from tests.model.test_small_model_gpu import _small_ckpt, _small_runner  # noqa: E402
from tests.oracle import harness  # noqa: E402

pytestmark = pytest.mark.gpu


def test_split_norm_in_the_model_as_accurate(tmp_path):
    """Arm linear.split_norm in the whole model (eager: every output projection and every down but
    the last fused into the next norm): a prompt of 40 tokens (rows in the split range) gives prefill
    logits no further from the fp32 model on the same weights than the composition's; a 6-token prompt
    (rows outside it: the op composes) gives the composition's logits bit for bit."""
    pytest.importorskip("cupy")
    from engine.ops.arms import DEFAULT_ARMS

    d = _small_ckpt(tmp_path)
    base = tuple(sorted(DEFAULT_ARMS - {"linear.split_norm"}))
    plain = _small_runner(d, "bfloat16", "cuda", eager=True, arms=base)
    split = _small_runner(d, "bfloat16", "cuda", eager=True, arms=(*base, "linear.split_norm"))
    truth = _small_runner(d, "float32", "torch", eager=True)
    assert plain.ops.linear_add_rms_norm is None and split.ops.linear_add_rms_norm is not None
    with torch.no_grad():
        weights = dict(plain.model.named_parameters())
        for name, p in split.model.named_parameters():
            p.copy_(weights[name])
        for name, p in truth.model.named_parameters():
            p.copy_(weights[name].float())
    prompt = [(11 * j + 5) % 400 for j in range(40)]
    t = harness.ds_prefill_logits(truth, prompt)
    err = {
        n: ((harness.ds_prefill_logits(r, prompt) - t).norm() / t.norm()).item()
        for n, r in (("plain", plain), ("split", split))
    }
    assert err["split"] <= 1.5 * err["plain"] + 1e-3, err
    short = prompt[:6]
    assert torch.equal(harness.ds_prefill_logits(plain, short), harness.ds_prefill_logits(split, short))
    report(test="split_norm_model_logits", **err)

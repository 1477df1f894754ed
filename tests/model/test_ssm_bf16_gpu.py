"""--mamba-ssm-cache-dtype bfloat16 in the whole model on CUDA: the 4B dummy shape with the CUDA
kernels (fused decode, tensor-core prefill, CUDA graphs) against the torch reference ops, both on a
bf16 recurrent-state pool (the fp32-state version of this check: test_model_gpu.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.generate import generate  # noqa: E402
from tests.model.test_model_gpu import _runner_4b_fp32, _tame, report, runner_4b  # noqa: E402
from tests.oracle import harness  # noqa: E402

pytestmark = pytest.mark.gpu


def test_cuda_kernels_match_torch_reference_bf16_state(tmp_path):
    """--mamba-ssm-cache-dtype bfloat16 on the 4B dummy model with the output projections scaled by
    2**-3 (test_model_gpu.py's tamed weights): the CUDA kernels (CUDA graphs on) against the torch
    reference ops, both on a bf16 state pool. Prefill logits no further from the fp32 truth (fp32 weights and
    state) than the reference's; greedy tokens of 4 prompts of 1,024 tokens over 32 steps equal, or
    the first divergence a near-tie of the truth (top-2 margin below 1e-2 of the top logit)."""
    pytest.importorskip("cupy")
    gc.collect()  # the 4B runners of earlier tests
    torch.cuda.empty_cache()
    ref = runner_4b(tmp_path, backend="torch", seqs=5, blocks=200, ssm="bfloat16")
    ker = runner_4b(tmp_path, backend="cuda", seqs=5, blocks=200, ssm="bfloat16")
    assert ker.gdn_backend == "cuda" and ker.graphs is not None
    for r in (ref, ker):
        assert all(t.dtype == torch.bfloat16 for t in r.cache.ssm_state)
    truth = _runner_4b_fp32(tmp_path)
    assert truth.cache.ssm_state[0].dtype == torch.float32  # the checkpoint's mamba_ssm_dtype
    with torch.no_grad():
        weights = dict(ref.model.named_parameters())
        for name, p in truth.model.named_parameters():
            p.copy_(weights[name].float())
    for r in (ref, ker, truth):
        _tame(r.model, 2**-3)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 248000, 1024).tolist() for _ in range(4)]
    t = harness.ds_prefill_logits(truth, prompts[0])
    err_ref, err_ker = (
        ((harness.ds_prefill_logits(r, prompts[0]) - t).norm() / t.norm()).item() for r in (ref, ker)
    )
    a, b = generate(ref, prompts, 32), generate(ker, prompts, 32)
    equal, unexplained = 0, []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            equal += 1
            continue
        k = next(j for j in range(32) if x[j] != y[j])
        top2 = harness.ds_prefill_logits(truth, prompts[i] + x[:k])[-1].topk(2).values
        margin = (top2[0] - top2[1]).item() / max(1.0, top2[0].abs().item())
        if margin >= 1e-2:
            unexplained.append((i, k, margin))
    report(
        test="cuda_vs_torch_bf16_state",
        ref_rel=err_ref,
        cuda_rel=err_ker,
        identical=equal,
        of=4,
        unexplained=unexplained,
        state_pool_mib=ker.num_state_slots * ker._slot_bytes() / 2**20,
    )
    assert err_ker <= 1.5 * err_ref + 1e-3, (err_ker, err_ref)
    assert not unexplained, unexplained

"""``Ops.linear_add_rms_norm`` (a mixer's output projection + the post norm) and its arm
``linear.split_norm`` off the GPU: the reference composition, the model's routing through the optional
op, the arm's binding. The kernel and the split path: test_split_norm_gpu.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from engine.ops import make_ops
from engine.ops import reference as ref
from tests.ops.fused_check import rand


def test_reference_is_linear_then_add_rms_norm():
    rng = np.random.default_rng(3)
    a, w = rand(rng, 5, 24, dtype=torch.bfloat16), rand(rng, 16, 24, scale=0.2, dtype=torch.bfloat16)
    res, nw = rand(rng, 5, 16, dtype=torch.bfloat16), rand(rng, 16, dtype=torch.bfloat16)
    want_y, want_h = ref.add_rms_norm(ref.linear(a, w), res, nw, 1e-6)
    x_out, h_out = torch.empty(5, 16, dtype=torch.bfloat16), res.clone()
    y, h = ref.linear_add_rms_norm(a, w, h_out, nw, 1e-6, h_out=h_out, x_out=x_out)
    assert torch.equal(y, want_y) and torch.equal(h, want_h) and h.data_ptr() == h_out.data_ptr()
    assert torch.equal(x_out, ref.linear(a, w))


def test_model_routes_the_output_and_down_projections_through_the_fused_op():
    """With the optional op in the table, every layer's mixer output projection and post norm go
    through it (GDN out_proj and attention o_proj weights alike), and every MLP's down projection but
    the last with the next layer's input norm; the logits do not move by a bit."""
    from engine.checkpoints.presets import tiny_text_config
    from engine.model.cache import ModelCache
    from engine.model.forward_batch import ForwardBatch, SeqSpec
    from engine.model.loader import load_weights
    from engine.model.qwen3_5.config import Qwen35Config
    from engine.model.qwen3_5.model import Qwen35Model
    from engine.model.random_init import iter_random_tensors

    text = tiny_text_config(400, 0, "float32")
    cfg = Qwen35Config.from_dict(text)
    seen: list[torch.Tensor] = []

    def counted(a, w, *args, **kw):
        seen.append(w)
        return ref.linear_add_rms_norm(a, w, *args, **kw)

    plain = make_ops("torch")
    assert plain.linear_add_rms_norm is None  # the reference table composes in the model
    fused = replace(plain, linear_add_rms_norm=counted)
    models = [Qwen35Model(cfg, ops, torch.float32) for ops in (plain, fused)]
    for mdl in models:
        load_weights(mdl, iter_random_tensors(text, seed=5, dtype=torch.float32))
    logits = []
    for mdl in models:
        cache = ModelCache.allocate(mdl.cache_spec(), 4, 16, 2, torch.float32, "cpu")
        spec = SeqSpec(token_ids=[5, 9, 17, 3, 11], num_computed=0, block_ids=[1], state_slot=1)
        logits.append(mdl(ForwardBatch.build([spec], 16, "cpu"), cache))
    assert torch.equal(logits[0], logits[1])
    layers = models[1].layers
    want = []  # layer i's output projection in its layer_out, its MLP's down in layer i + 1's layer_in
    for i, lyr in enumerate(layers):
        want.append(getattr(lyr.mixer, "out_proj" if lyr.is_linear else "o_proj"))
        if i < len(layers) - 1:
            want.append(lyr.mlp.down)
    assert len(seen) == len(want) and all(s is w for s, w in zip(seen, want, strict=True))
    assert any(lyr.is_linear for lyr in layers) and not all(lyr.is_linear for lyr in layers)


def test_arm_is_a_default_and_binds_the_tables_ops():
    from engine.ops.arms import ARMS, DEFAULT_ARMS, KernelShapes, cuda_overrides, usable_arms
    from engine.ops.gemm import cuda as gemm
    from engine.ops.gemm import split_norm
    from engine.ops.norm import fused_cuda

    assert "linear.split_norm" in DEFAULT_ARMS and ARMS["linear.split_norm"].op == "linear_add_rms_norm"
    assert "linear_add_rms_norm" not in cuda_overrides(DEFAULT_ARMS - {"linear.split_norm"})
    bound = cuda_overrides(DEFAULT_ARMS)["linear_add_rms_norm"]
    assert bound.func is split_norm.linear_add_rms_norm
    assert bound.keywords == {"linear": gemm.linear, "add_rms_norm": fused_cuda.add_rms_norm}
    bare = cuda_overrides(frozenset({"linear.split_norm"}))["linear_add_rms_norm"]
    assert bare.keywords == {"linear": ref.linear, "add_rms_norm": ref.add_rms_norm}
    fp32 = KernelShapes(4, 128, 128, "float32")
    arms, notes = usable_arms(frozenset({"linear.split_norm"}), fp32)
    assert arms == frozenset() and "bfloat16" in notes[0]


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_split_path_needs_a_cuda_tensor(device):
    from engine.ops.gemm import split_norm

    a = torch.empty(32, 4096, dtype=torch.bfloat16, device=device)
    w = torch.empty(2560, 4096, dtype=torch.bfloat16, device=device)
    res = torch.empty(32, 2560, dtype=torch.bfloat16, device=device)
    assert split_norm.split_count(a, w, res) == 0

"""Ops.linear and the skinny GEMM (cuda/gemm/skinny.cu, arm linear.skinny).

CPU: the reference is F.linear bit for bit, the wrapper's dispatch rules (which inputs the kernel
takes, everything else F.linear), the launch plan, the arm's registration, and the model sending
every projection and the lm_head through ``ops.linear``.

GPU: the kernel on every Qwen3.5-4B decode shape (and awkward N and K) at M = 1, 2, 3, 4, 5, 8
against the fp32 product (x.float() @ w.float().T). Each output is the bf16 rounding of an fp32 sum,
so it must lie within half a bf16 ulp (2^-8 relative) of the fp32 reference, plus a small absolute
slack for the fp32 accumulation order (2e-4 of the output's largest value). Against F.linear (cuBLAS,
the same bf16 inputs and fp32 accumulation on tensor cores) the largest difference must be at most 3x
cuBLAS's own largest error against fp32: both round the same sums, so they differ by at most about
an ulp where either rounds. Outputs are poisoned before each run, every run is repeated and compared
bitwise, and a CUDA-graph replay must equal the eager call.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.ops import make_ops
from engine.ops import reference as ref
from engine.ops.gemm import cuda as gemm

# (name, N, K) of the 4B's decode GEMMs (qkv_proj = [q|gate] 2*16*256 + k, v 2*4*256; o_proj has
# out_proj's shape), then awkward sizes: N not a multiple of the 16- or 32-row tile, K with a
# partial chunk (2568 = 20 * 128 + 8), K smaller than one chunk
SHAPES = [
    ("gdn_in_proj", 12352, 2560),
    ("attn_qkv_proj", 10240, 2560),
    ("mlp_gate_up", 18432, 2560),
    ("mlp_down", 2560, 9216),
    ("out_proj", 2560, 4096),
    ("lm_head", 248320, 2560),
    ("odd_n", 2568, 2560),
    ("n100", 100, 2560),
    ("odd_k", 2600, 2568),
    ("tiny_k", 33, 72),
]
ROWS = [1, 2, 3, 4, 5, 8]


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0, dtype=torch.float32, device="cpu"):
    """Seeded normal data from numpy (independent of torch's CPU RNG)."""
    a = rng.standard_normal(shape, dtype=np.float32)
    if scale != 1.0:
        a *= np.float32(scale)
    return torch.from_numpy(a).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 40, 24), (7, 33, 64), (130, 17, 8)])
def test_reference_is_f_linear(dtype, m, n, k):
    rng = np.random.default_rng(m + n + k)
    x, w = rand(rng, m, k, dtype=dtype), rand(rng, n, k, scale=0.1, dtype=dtype)
    y = ref.linear(x, w)
    assert y.dtype == dtype and y.shape == (m, n)
    assert torch.equal(y, F.linear(x, w))
    assert make_ops("torch").linear is ref.linear


def test_cuda_wrapper_is_f_linear_off_the_gpu():
    rng = np.random.default_rng(1)
    x, w = rand(rng, 3, 64, dtype=torch.bfloat16), rand(rng, 40, 64, dtype=torch.bfloat16)
    assert torch.equal(gemm.linear(x, w), F.linear(x, w))


def z(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


def _misaligned(m: int, k: int) -> torch.Tensor:
    return z(m * k + 1)[1:].view(m, k)  # 2 bytes off a 16-byte boundary


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: (torch.zeros(2, 64), torch.zeros(8, 64)), "dtypes"),
        (lambda: (z(2, 3, 64), z(8, 64)), "shapes"),
        (lambda: (z(9, 64), z(8, 64)), "9 rows"),
        (lambda: (z(0, 64), z(8, 64)), "0 rows"),
        (lambda: (z(2, 64), z(8, 72)), "do not match"),
        (lambda: (z(2, 100), z(8, 100)), "K = 100"),
        (lambda: (z(64, 2).t(), z(8, 64)), "contiguous"),
        (lambda: (z(2, 64), z(64, 8).t()), "contiguous"),
        (lambda: (_misaligned(2, 64), z(8, 64)), "aligned"),
        (lambda: (z(2, 64), z(8, 64)), "devices cpu"),  # everything else fits: only the device fails
    ],
)
def test_dispatch_rules(make, why):
    x, w = make()
    reason = gemm.why_not(x, w)
    assert reason is not None and why in reason, reason
    if x.dim() == 2 and x.shape[1] == w.shape[1]:
        assert torch.equal(gemm.linear(x, w), F.linear(x, w))  # the fallback


@pytest.mark.parametrize("m", range(1, 9))
def test_plan_rounds_rows_up_and_covers_n(m):
    row = (16, 4)  # (warps, iterations per warp a narrow N aims at)
    rows = min(r for r in gemm.ROW_COUNTS if r >= m)
    # narrow N (160 CTAs on 132 SMs): unroll until each warp has <= 4 iterations of K
    for k, unroll in ((4096, 2), (9216, 4), (2560, 2), (512, 1)):
        p = gemm.make_plan(m, 2560, k, 132, row)
        assert (p.rows, p.tiles, p.warps, p.unroll, p.blocks) == (rows, 1, 16, unroll, 160), k
    wide = gemm.make_plan(m, 248320, 2560, 132, row)  # wide N: plain streaming, one 16-row tile per CTA
    assert (wide.unroll, wide.blocks) == (1, 15520)
    assert wide.name == f"skinny_gemm_kernel<{rows}, 1, 16, 1>"
    assert gemm.make_plan(m, 100, 2560, 132, row).blocks * 16 >= 100
    assert gemm.make_plan(m, 2560, 4096, 132, row, warps=8, unroll=1).name.endswith("8, 1>")


def test_table_rows_cover_every_arch():
    from engine.ops.compile import tuning_table

    rows = tuning_table(gemm.SRC, gemm.TABLE)
    assert set(rows) == {80, 90, 120}
    for warps, iters in rows.values():
        assert 1 <= warps <= 32 and iters >= 1


def test_arm_registered_on_by_default():
    from engine.ops.arms import ARMS, DEFAULT_ARMS, KernelShapes, cuda_overrides, usable_arms

    arm = ARMS["linear.skinny"]
    assert arm.op == "linear" and arm.default and "linear.skinny" in DEFAULT_ARMS
    assert cuda_overrides(DEFAULT_ARMS)["linear"] is gemm.linear
    assert "linear" not in cuda_overrides(DEFAULT_ARMS - {"linear.skinny"})
    ok = KernelShapes(4, 128, 128, "bfloat16", hidden_size=2560)
    assert usable_arms(frozenset({"linear.skinny"}), ok) == (frozenset({"linear.skinny"}), [])
    for bad, word in (
        (KernelShapes(4, 128, 128, "float32"), "float32"),
        (KernelShapes(4, 128, 128, "bfloat16", hidden_size=2564), "2564"),
    ):
        arms, notes = usable_arms(frozenset({"linear.skinny"}), bad)
        assert arms == frozenset() and word in notes[0]


def test_model_sends_every_gemm_through_ops_linear(monkeypatch):
    from dataclasses import replace

    from engine.checkpoints.presets import tiny_text_config
    from engine.model.cache import ModelCache
    from engine.model.forward_batch import ForwardBatch, SeqSpec
    from engine.model.loader import load_weights
    from engine.model.qwen3_5.config import Qwen35Config
    from engine.model.qwen3_5.model import Qwen35Model
    from engine.model.random_init import iter_random_tensors

    text = tiny_text_config(400, 0, "float32")
    cfg = Qwen35Config.from_dict(text)
    seen: list[tuple[int, ...]] = []

    def counted(x, w, out=None):
        seen.append(tuple(w.shape))
        return ref.linear(x, w, out=out)

    direct = []
    real = F.linear
    monkeypatch.setattr(F, "linear", lambda *a, **k: direct.append(1) or real(*a, **k))
    models = [
        Qwen35Model(cfg, ops, torch.float32)
        for ops in (make_ops("torch"), replace(make_ops("torch"), linear=counted))
    ]
    for mdl in models:
        load_weights(mdl, iter_random_tensors(text, seed=3, dtype=torch.float32))
    logits = []
    for mdl in models:
        cache = ModelCache.allocate(mdl.cache_spec(), 4, 16, 2, torch.float32, "cpu")
        fb = ForwardBatch.build(
            [SeqSpec(token_ids=[5, 9, 17], num_computed=0, block_ids=[1], state_slot=1)], 16, "cpu"
        )
        logits.append(mdl(fb, cache))
    assert torch.equal(logits[0], logits[1])
    layers = cfg.num_hidden_layers
    assert len(seen) == 4 * layers + 1  # mixer in / out, MLP gate_up / down per layer, then lm_head
    assert seen[-1] == (cfg.vocab_size, cfg.hidden_size)
    assert len(direct) == 2 * len(seen), "a projection bypassed ops.linear"


# ------------------------------------------------------------------------------------------------ GPU


@pytest.fixture
def cuda_env():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    yield
    torch.backends.cuda.matmul.allow_tf32 = tf32


@functools.cache
def weights(n: int, k: int) -> torch.Tensor:
    """w [N, K] bf16 on the GPU, scaled so every output is O(1); one copy per shape for the session."""
    return rand(np.random.default_rng(n * 7 + k), n, k, scale=k**-0.5, dtype=torch.bfloat16, device="cuda")


def poison(m: int, n: int) -> None:
    """Fill and free a block of the output's size, so the op's torch.empty hands out NaNs."""
    torch.empty((m, n), dtype=torch.bfloat16, device="cuda").fill_(float("nan"))


def run_twice(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    poison(x.shape[0], w.shape[0])
    a = gemm.skinny(x, w)
    poison(x.shape[0], w.shape[0])
    b = gemm.skinny(x, w)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16)), "run-to-run mismatch"
    return a


@pytest.mark.gpu
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("name", "n", "k"), SHAPES, ids=[s[0] for s in SHAPES])
def test_skinny_matches_fp32_and_cublas(cuda_env, name, n, k, m):
    w = weights(n, k)
    x = rand(np.random.default_rng(100 * m + k), m, k, dtype=torch.bfloat16, device="cuda")
    assert gemm.why_not(x, w) is None
    got = run_twice(x, w)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    g = got.float()
    assert torch.isfinite(g).all(), "non-finite output (an unwritten, poisoned element?)"
    want = x.float() @ w.float().T  # [M, N] fp32
    scale = want.abs().max().item()
    err = (g - want).abs()
    assert (err <= want.abs() * 2**-8 + 2e-4 * scale).all(), f"{name} m={m}: max error {err.max().item():.3e}"
    cublas = F.linear(x, w).float()
    e_cublas = (cublas - want).abs().max().item()
    d_cublas = (g - cublas).abs().max().item()
    e = err.max().item()
    print(f"{name} m={m}: vs fp32 {e:.2e}, cuBLAS vs fp32 {e_cublas:.2e}, vs cuBLAS {d_cublas:.2e}")
    assert d_cublas <= 3 * e_cublas + 1e-6 * scale
    assert torch.equal(gemm.linear(x, w), got), "Ops.linear takes the kernel here"


@pytest.mark.gpu
def test_gpu_fallbacks_are_f_linear(cuda_env):
    rng = np.random.default_rng(8)
    w = weights(2560, 4096)
    x9 = rand(rng, 9, 4096, dtype=torch.bfloat16, device="cuda")
    x_strided = rand(rng, 4, 8192, dtype=torch.bfloat16, device="cuda")[:, :4096]
    x32, w32 = x9[:2].float(), w.float()
    for x, ww in ((x9, w), (x_strided, w), (x32, w32)):
        assert gemm.why_not(x, ww) is not None
        assert torch.equal(gemm.linear(x, ww), F.linear(x, ww))
    with pytest.raises(ValueError, match="9 rows"):
        gemm.skinny(x9, w)


def chain(x: torch.Tensor) -> list[torch.Tensor]:
    """A decode-like sequence where every GEMM reads what the kernel just before it wrote: gate_up-sized,
    a torch elementwise kernel, down-sized, then in_proj-sized straight on the previous GEMM's output."""
    y1 = gemm.linear(x, weights(9216, 2560))  # [M, 9216]
    y2 = gemm.linear(y1 * 0.5, weights(2560, 9216))  # [M, 2560]
    y3 = gemm.linear(y2, weights(12352, 2560))  # [M, 12352]
    return [y1, y2, y3]


@pytest.mark.gpu
def test_graph_replay_equals_eager(cuda_env):
    xs = [rand(np.random.default_rng(7 + m), m, 2560, dtype=torch.bfloat16, device="cuda") for m in (1, 3, 8)]
    eager = [y.clone() for x in xs for y in chain(x)]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [y for x in xs for y in chain(x)]
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(outs, eager, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_out_takes_the_kernel_when_it_can_and_torch_mm_otherwise(cuda_env):
    """``linear(x, w, out=...)`` (a decode graph's lm_head into its logits buffer) runs what the call
    without ``out`` runs, bit for bit: the kernel for a contiguous, aligned bf16 [M, N] ``out`` at
    M <= 8, ``torch.mm`` into a strided ``out`` or for more rows. (cuBLAS may pick another algorithm
    for a strided output, so the strided case is compared with ``torch.mm`` into the same layout.)"""
    rng = np.random.default_rng(12)
    w = weights(12352, 2560)
    for m in (1, 5, 8, 9):
        x = rand(rng, m, 2560, dtype=torch.bfloat16, device="cuda")
        out = torch.full((m, 12352), float("nan"), dtype=torch.bfloat16, device="cuda")
        assert gemm.linear(x, w, out=out) is out
        assert torch.equal(out, gemm.linear(x, w))
        wide, wide_mm = (torch.full((m, 12360), float("nan"), dtype=x.dtype, device="cuda") for _ in "ab")
        strided = wide[:, :12352]  # rows 12,360 apart: not the kernel's layout (but one row is contiguous)
        assert gemm.linear(x, w, out=strided).data_ptr() == strided.data_ptr()
        if m == 1:
            assert strided.is_contiguous() and torch.equal(strided, out)
        else:
            torch.mm(x, w.t(), out=wide_mm[:, :12352])
            assert torch.equal(wide[:, :12352], wide_mm[:, :12352])
        assert torch.isnan(wide[:, 12352:]).all(), "wrote past the strided view"
        torch.testing.assert_close(strided, out, rtol=2**-7, atol=1e-2)

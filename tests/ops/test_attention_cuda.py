"""Tensor-core paged attention (engine.ops.attention.cuda, cuda/attention/paged_attention.cu) against the
fp32 torch reference (engine.ops.reference.paged_attention).

Random bf16 data (numpy RNG); query lengths 1, 2, 63, 64, 65, 1000; cached prefixes ending mid-block
and on block boundaries; block sizes 16 / 32 / 64; GQA 1 and 4; D 64 / 128 / 256; mixed batches
(decodes first, then prefill chunks with and without prefixes); with and without the strided output
gate; every cache slot a sequence may not read NaN-filled for the kernel; outputs poisoned before
each run; every run twice and bitwise equal; forced and automatic KV splits; CUDA-graph replays
equal to eager with seq_lens changed between replays; the lazy O rescale (rescale_slack) on ordinary
and 8x-sharpened logits. Relative Frobenius error vs the fp32 reference
< 5e-3 (the reference's own bf16 output error is printed beside it).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.ops import reference as ref  # noqa: E402
from engine.ops.attention import cuda as attn  # noqa: E402
from engine.ops.attention.batches import Batch, make_batch, reference_fp32, rel  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = 5e-3


def poison(batch: Batch, splits: int) -> None:
    """Fill, then free, blocks of the sizes the op allocates, so the caching allocator hands it NaNs."""
    T, H, D = batch.q.shape
    torch.empty((T, H, D), dtype=torch.bfloat16, device="cuda").fill_(float("nan"))
    torch.empty((max(splits, 2), T, H, D), dtype=torch.float32, device="cuda").fill_(float("nan"))


def run_twice(batch: Batch, use_gate: bool, splits: int | None, slack: float = 0.0) -> torch.Tensor:
    kc, vc = batch.poisoned_caches()
    gate = batch.gate if use_gate else None
    outs = []
    for _ in range(2):
        poison(batch, splits or attn.MAX_SPLITS)
        outs.append(attn.paged_attention(*batch.args(kc, vc), gate=gate, splits=splits, rescale_slack=slack))
        torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1]), "two runs differ (a race?)"
    return outs[0]


def check(
    batch: Batch, use_gate: bool, splits: int | None = None, label: str = "", slack: float = 0.0
) -> float:
    want32 = reference_fp32(batch, use_gate)
    want16 = ref.paged_attention(*batch.args(), gate=batch.gate if use_gate else None)
    got = run_twice(batch, use_gate, splits, slack)
    assert got.dtype == torch.bfloat16 and got.shape == batch.q.shape
    err, ref_err = rel(got, want32), rel(want16, want32)
    print(f"{label} splits={splits}: rel {err:.2e} (reference bf16 {ref_err:.2e})")
    assert err < TOL, f"{label}: rel {err:.2e} vs the fp32 reference"
    return err


def mixed_specs(bs: int) -> list[tuple[int, int]]:
    """Decodes (new token opening a block, ending a block, mid-block, second token), then prefill
    chunks: 1000 fresh tokens, 63 after a mid-block prefix, 64 after a block-aligned one, 65, 2, 1."""
    decodes = [(2 * bs, 1), (3 * bs - 1, 1), (37, 1), (1, 1)]
    prefills = [(0, 1000), (bs + 5, 63), (2 * bs, 64), (7, 65), (0, 2), (0, 1)]
    return decodes + prefills


@pytest.mark.parametrize("bs", [16, 32, 64])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_mixed_batch(d, group, bs):
    batch = make_batch(mixed_specs(bs), bs, 2, group, d, seed=d + group + bs, strided_q=bs == 32)
    check(batch, use_gate=(d + bs) % 3 != 0, label=f"mixed d{d} g{group} bs{bs}")


@pytest.mark.parametrize("q_len", [1, 2, 63, 64, 65, 1000])
@pytest.mark.parametrize("prefix", [0, 16, 45])
def test_query_lengths(q_len, prefix):
    """One sequence per case: prefixes empty, on a block boundary and mid-block (bs 16, G 4, D 128)."""
    if q_len == 1 and prefix == 0:
        prefix = 3
    batch = make_batch([(prefix, q_len)], 16, 4, 4, 128, seed=q_len * 7 + prefix)
    check(batch, use_gate=q_len % 2 == 1, label=f"q_len {q_len} prefix {prefix}")


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("splits", [None, 1, 3, 9, 64])
def test_decode_splits(d, group, splits):
    """Decode-only batches (the one-warp kernel): automatic, single, three, nine and 64 splits (each
    combine instantiation; 64 leaves splits with no tiles at all, which must contribute nothing)."""
    specs = [(0, 1), (30, 1), (31, 1), (32, 1), (700, 1), (1100, 1)]
    batch = make_batch(specs, 32, 4, group, d, seed=11 * d + group)
    check(batch, use_gate=group == 4, splits=splits, label=f"decode d{d} g{group}")


@pytest.mark.parametrize("splits", [None, 2, 5])
def test_prefill_long_prefix_splits(splits):
    """Few query tiles over a long cached prefix: the four-warp kernel with split KV and causal
    masking inside the last split; rows whose split holds no visible key."""
    batch = make_batch([(3000, 65), (5, 40)], 64, 4, 4, 256, seed=5)
    check(batch, use_gate=True, splits=splits, label="long prefix")


def test_w1_like_shapes():
    """Qwen3.5-4B attention shapes: H 16, Hkv 4, D 256, block 32; 4 decodes + 2 x 300-token chunks."""
    batch = make_batch([(1100, 1)] * 4 + [(0, 300), (333, 300)], 32, 4, 4, 256, seed=9, strided_q=True)
    check(batch, use_gate=True, label="4B shapes")


@pytest.mark.parametrize(("d", "group", "bs"), [(256, 4, 32), (128, 1, 16), (64, 4, 64)])
@pytest.mark.parametrize("q_scale", [1.0, 8.0])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_lazy_rescale(d, group, bs, q_scale, splits):
    """The arm attention.lazy_rescale (rescale_slack 8) on mixed batches. With q scaled 8x the logits
    spread over ~12 log2 units per standard deviation, so within a row some tiles raise the max by
    less than the slack (O not rescaled, P up to 2^8) and some by more (rescaled): both branches,
    split and unsplit, must stay within TOL of fp32 and bitwise repeatable. And the slack must take
    effect: a kernel that ignored it would give the plain kernel's bits (P is rounded to bf16 against
    a stale max in the rows it skips, so their outputs differ in the last bits)."""
    batch = make_batch(mixed_specs(bs), bs, 2, group, d, seed=d + group + bs + int(q_scale))
    batch = dataclasses.replace(batch, q=(batch.q.float() * q_scale).to(torch.bfloat16))
    slack = attn.LAZY_RESCALE_SLACK
    err = check(batch, True, splits, f"lazy d{d} g{group} bs{bs} x{q_scale:g}", slack)
    plain = check(batch, True, splits, "plain", 0.0)
    assert err < max(2 * plain, 1e-3), f"lazy rescale rel {err:.2e} vs the plain kernel's {plain:.2e}"
    lazy_out, plain_out = (run_twice(batch, True, splits, s) for s in (slack, 0.0))
    assert not torch.equal(lazy_out, plain_out), "rescale_slack changed no bit: the kernel ignores it"


@pytest.mark.parametrize("shape", [(16, 4, 4), (32, 4, 3), (64, 1, 2), (16, 8, 2)])
def test_other_instantiations(shape):
    """Tile shapes the bench sweeps (BN, NW, stages) beside the defaults: the same results within
    tolerance on a mixed batch (the template, not only the instantiated rows, is correct)."""
    batch = make_batch(mixed_specs(16), 16, 2, 4, 128, seed=sum(shape))
    want32 = reference_fp32(batch, True)
    got = attn.paged_attention(*batch.args(*batch.poisoned_caches()), gate=batch.gate, shape=shape)
    assert rel(got, want32) < TOL


def graph_case(batch_fn, vary) -> None:
    """Capture at the batch's bounds, replay after changing the device metadata with ``vary``, compare
    each replay with an eager call on the same inputs (bitwise)."""
    batch = batch_fn()
    args = batch.args()
    eager = attn.paged_attention(*args, gate=batch.gate)  # compiles before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = attn.paged_attention(*args, gate=batch.gate)
    for step in range(3):
        if step:
            vary(batch, step)
        graph.replay()
        torch.cuda.synchronize()
        eager = attn.paged_attention(*args, gate=batch.gate)
        assert torch.equal(static, eager), f"replay {step} differs from eager"
        err = rel(static, reference_fp32(batch, True))
        assert err < TOL, f"replay {step}: rel {err:.2e}"


def test_cuda_graph_decode_equals_eager():
    """Decode batch captured at a 512-token bound (the engine's bucket), seq_lens moved between replays."""

    def vary(batch: Batch, step: int) -> None:
        new = torch.tensor([40 + 100 * step, 300 + step, 1 + step, 512], dtype=torch.int32, device="cuda")
        batch.seq_lens.copy_(new)
        batch.num_computed.copy_(new - 1)

    specs = [(511, 1)] * 4  # every block of the bound assigned; step 0 runs at the bound itself
    graph_case(lambda: make_batch(specs, 32, 4, 4, 256, seed=3, max_seq_len=512), vary)


def test_cuda_graph_mixed_equals_eager():
    """Mixed batch (two decodes, one 96-token chunk): prefixes changed between replays."""

    def vary(batch: Batch, step: int) -> None:
        nc = torch.tensor([50 + step, 8 * step, 17 * step], dtype=torch.int32, device="cuda")
        batch.num_computed.copy_(nc)
        batch.seq_lens.copy_(nc + torch.tensor([1, 1, 96], dtype=torch.int32, device="cuda"))

    specs = [(52, 1), (16, 1), (34, 96)]
    graph_case(lambda: make_batch(specs, 16, 2, 4, 128, seed=4, max_seq_len=160), vary)


def test_gate_matches_model_composition():
    """With the gate the op equals the model's former ``attn(...) * torch.sigmoid(gate)`` on bf16 up to
    the attention itself: compare against the reference op's gated bf16 output."""
    batch = make_batch(mixed_specs(32), 32, 4, 4, 256, seed=21)
    got = attn.paged_attention(*batch.args(), gate=batch.gate)
    want = ref.paged_attention(*batch.args()) * torch.sigmoid(batch.gate)
    assert rel(got, want) < TOL
    assert torch.equal(ref.paged_attention(*batch.args(), gate=batch.gate), want)


@pytest.mark.parametrize("splits", [None, 1])
def test_out_receives_exactly_the_output(splits):
    """``out=`` (a piecewise graph's static core buffer, viewed [T, H * D]) gets the very bits of a fresh
    output, through the split-KV reduction and without it; a wrong-sized out is refused by name."""
    batch = make_batch(mixed_specs(16), 16, 4, 4, 256, seed=22)
    want = attn.paged_attention(*batch.args(), gate=batch.gate, splits=splits)
    T, H, D = batch.q.shape
    out = torch.full((T, H * D), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = attn.paged_attention(*batch.args(), gate=batch.gate, splits=splits, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(out.view(T, H, D), want)
    with_out = ref.paged_attention(*batch.args(), gate=batch.gate, out=out.clone())  # [T, H * D]
    assert torch.equal(with_out.view(T, H, D), ref.paged_attention(*batch.args(), gate=batch.gate))
    with pytest.raises(ValueError, match="out must be contiguous"):
        attn.paged_attention(*batch.args(), out=out[:-1])


def test_bad_inputs_name_the_tensor():
    batch = make_batch([(3, 2)], 16, 2, 2, 64, seed=1)
    a = list(batch.args())
    with pytest.raises(ValueError, match="gate"):
        attn.paged_attention(*a, gate=batch.gate[:, :1])
    with pytest.raises(ValueError, match="q must be bfloat16"):
        attn.paged_attention(a[0].float(), *a[1:])
    with pytest.raises(ValueError, match="v_cache"):
        attn.paged_attention(a[0], a[1], a[2][:, :8].contiguous(), *a[3:])
    with pytest.raises(ValueError, match="seq_lens"):
        attn.paged_attention(*a[:5], a[5].cpu(), *a[6:])
    for slack in (-1.0, float("nan"), attn.MAX_RESCALE_SLACK + 1):
        with pytest.raises(ValueError, match="rescale_slack"):
            attn.paged_attention(*a, rescale_slack=slack)


def test_kernel_resources():
    """Every instantiation compiled by NVRTC for this device: no local memory (spills), smem <= 99 KB."""
    for d in attn.HEAD_DIMS:
        for nw in (1, 4):
            bn, _, stages = attn.tile_shape(d, nw)
            smem = attn.smem_bytes(d, bn, nw, stages)
            fn = attn._function(attn.kernel_name(d, bn, nw, stages), smem)
            local = fn.local_size_bytes
            print(f"d{d} bn{bn} nw{nw} st{stages}: {fn.num_regs} regs, {smem} B smem, {local} B local")
            assert fn.local_size_bytes == 0 and smem <= 99 * 1024
        for per in attn.COMBINE_PER:
            name = attn.combine_name(d, attn.COMBINE_GROUPS * per)
            assert attn._function(name, 0).local_size_bytes == 0

"""K4 fused GDN decode (engine.ops.gdn.decode) against the fp32 torch reference composition and
against today's four CUDA ops composed (conv decode -> gating -> recurrent delta rule -> gated norm).

Nv = Nk and Nv = 2 Nk, batches 1, 3, 33, 64 with padding rows (slot 0), inputs as strided views of
one fused projection buffer (qkv | z | b | a) as in the model, random state pools; outputs poisoned,
every run twice and compared bitwise (pools too); chained steps (the cross-CTA counters must come
back to zero); CUDA-graph replay equal to eager.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.ops import reference as ref  # noqa: E402
from engine.ops.conv import cuda as conv  # noqa: E402
from engine.ops.gdn import (
    decode,  # noqa: E402
    gating,  # noqa: E402
)
from engine.ops.gdn import recurrent as delta  # noqa: E402
from engine.ops.norm import cuda as norm  # noqa: E402
from tests.ops.kernel_check import bf16, poison, rel, twice  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
D = 128
EPS = 1e-6


@dataclass
class Step:
    """One decode step's inputs: strided views of one fused projection row block, as the model has."""

    qkv: torch.Tensor
    z: torch.Tensor
    b: torch.Tensor
    a: torch.Tensor


@dataclass
class Layer:
    nk: int
    nv: int
    w: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    nw: torch.Tensor
    slots: torch.Tensor
    cst0: torch.Tensor
    sst0: torch.Tensor

    def step(self) -> Step:
        B, C, vd = self.slots.shape[0], (2 * self.nk + self.nv) * D, self.nv * D
        proj = bf16(B, C + vd + 2 * self.nv)
        return Step(
            proj[:, :C], proj[:, C : C + vd], proj[:, C + vd : C + vd + self.nv], proj[:, C + vd + self.nv :]
        )


def make_layer(B: int, nk: int, nv: int, pdtype: torch.dtype, pad: list[int], seed: int) -> Layer:
    torch.manual_seed(seed)
    C, S = (2 * nk + nv) * D, B + 3
    slots = (torch.randperm(S - 1, device=DEV)[:B] + 1).to(torch.int32)
    if pad:
        slots[pad] = 0
    return Layer(
        nk,
        nv,
        bf16(C, 4, scale=0.5),
        (torch.rand(nv, device=DEV) - 1.0).to(pdtype),
        bf16(nv).to(pdtype),
        (torch.rand(D, device=DEV) + 0.5).to(pdtype),
        slots,
        bf16(S, C, 3),
        torch.randn(S, nv, D, D, device=DEV) * 0.1,
    )


def ref_step(L: Layer, s: Step, cst: torch.Tensor, sst: torch.Tensor) -> torch.Tensor:
    """The fp32 torch reference ops composed as GatedDeltaNet.forward runs them for decode rows."""
    B, nk, nv = s.qkv.shape[0], L.nk, L.nv
    x = ref.causal_conv1d_decode(s.qkv, L.w, cst, L.slots)
    q, k = x[:, : nk * D].reshape(B, nk, D), x[:, nk * D : 2 * nk * D].reshape(B, nk, D)
    v = x[:, 2 * nk * D :].reshape(B, nv, D)
    g, beta = ref.gdn_gating(s.a, s.b, L.A_log, L.dt_bias)
    o = ref.recurrent_gated_delta_rule(q, k, v, g, beta, sst, L.slots)
    return ref.gated_rms_norm(o.reshape(-1, D), s.z.reshape(-1, D), L.nw, EPS).reshape(B, nv * D)


def composed_step(L: Layer, s: Step, cst: torch.Tensor, sst: torch.Tensor) -> torch.Tensor:
    """Today's four CUDA launches (best arms)."""
    B, nk, nv = s.qkv.shape[0], L.nk, L.nv
    x = conv.causal_conv1d_decode(s.qkv, L.w, cst, L.slots, arms=frozenset({"conv.k4"}))
    q, k = x[:, : nk * D].view(B, nk, D), x[:, nk * D : 2 * nk * D].view(B, nk, D)
    v = x[:, 2 * nk * D :].view(B, nv, D)
    g, beta = gating.gdn_gating(s.a, s.b, L.A_log, L.dt_bias)
    o = delta.recurrent_gated_delta_rule(q, k, v, g, beta, sst, L.slots)
    return norm.gated_rms_norm(o.reshape(-1, D), s.z.reshape(-1, D), L.nw, EPS).reshape(B, nv * D)


def fused_step(L: Layer, s: Step, cst: torch.Tensor, sst: torch.Tensor) -> torch.Tensor:
    return decode.gdn_decode(
        s.qkv, s.z, s.b, s.a, L.w, cst, L.A_log, L.dt_bias, L.nw, EPS, sst, L.slots, L.nk
    )


def pad_rows(B: int) -> list[int]:
    return [] if B == 1 else [B // 2] + ([B - 1] if B > 3 else [])


def check_pools(L: Layer, cst, sst, cst_ref, sst_ref) -> None:
    live = L.slots[L.slots > 0].long()
    assert torch.equal(cst[live], cst_ref[live]), "conv state of live slots differs from the reference"
    for s in live.tolist():
        assert rel(sst[s], sst_ref[s]) < 1e-3, f"ssm state of slot {s}"
    untouched = torch.ones(L.cst0.shape[0], dtype=torch.bool, device=DEV)
    untouched[live] = False  # slot 0 (padding) and the slots no row uses
    assert torch.equal(cst[untouched], L.cst0[untouched]), "a padding/unused conv state slot was written"
    assert torch.equal(sst[untouched], L.sst0[untouched]), "a padding/unused ssm state slot was written"


def assert_counters_zero() -> None:
    assert int(decode.counters(torch.device(DEV)).abs().sum()) == 0, "counters not reset to zero"


@pytest.mark.parametrize("B", [1, 3, 33, 64])
@pytest.mark.parametrize("ratio", [1, 2])
def test_gdn_decode_matches_reference(ratio, B):
    nk = 16 // ratio
    pdtype = torch.bfloat16 if B in (1, 33) else torch.float32
    L = make_layer(B, nk, nk * ratio, pdtype, pad_rows(B), seed=B + 100 * ratio)
    s = L.step()
    cst_ref, sst_ref = L.cst0.clone(), L.sst0.clone()
    want = ref_step(L, s, cst_ref, sst_ref)
    cst, sst = L.cst0.clone(), L.sst0.clone()
    got = twice(lambda: fused_step(L, s, cst, sst), [cst, sst], ((B, L.nv * D), torch.bfloat16))
    assert torch.isfinite(got).all(), "padding rows must be written with finite values too"
    keep = L.slots > 0
    assert rel(got[keep], want[keep]) < 2e-3
    check_pools(L, cst, sst, cst_ref, sst_ref)
    cst_c, sst_c = L.cst0.clone(), L.sst0.clone()
    comp = composed_step(L, s, cst_c, sst_c)
    assert rel(got, comp) < 2e-3
    assert_counters_zero()


@pytest.mark.parametrize("pdtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_gdn_decode_bitwise_vs_composition(ratio, pdtype):
    """Same rounding points and reduction orders as the four CUDA ops: identical bits, pools too."""
    B, nk = 33, 16 // ratio
    L = make_layer(B, nk, nk * ratio, pdtype, pad_rows(B), seed=7)
    s = L.step()
    cst_c, sst_c = L.cst0.clone(), L.sst0.clone()
    comp = composed_step(L, s, cst_c, sst_c)
    cst, sst = L.cst0.clone(), L.sst0.clone()
    poison(((B, L.nv * D), torch.bfloat16))
    got = fused_step(L, s, cst, sst)
    live = L.slots[L.slots > 0].long()
    assert torch.equal(got.view(torch.int16), comp.view(torch.int16)), (
        f"y differs in {(got.view(torch.int16) != comp.view(torch.int16)).sum().item()} elements"
    )
    assert torch.equal(cst[live], cst_c[live])
    assert torch.equal(sst[live].view(torch.int32), sst_c[live].view(torch.int32))


def test_gdn_decode_chained_steps():
    """Four consecutive steps on the same slots: each launch must leave the counters at zero, or the
    next step's q|k conv state (written by the last sharer) and norm (last arriver) go wrong."""
    B, nk, nv = 33, 16, 32
    L = make_layer(B, nk, nv, torch.bfloat16, pad_rows(B), seed=11)
    cst_ref, sst_ref = L.cst0.clone(), L.sst0.clone()
    cst, sst = L.cst0.clone(), L.sst0.clone()
    keep = L.slots > 0
    for t in range(4):
        s = L.step()
        want = ref_step(L, s, cst_ref, sst_ref)
        poison(((B, nv * D), torch.bfloat16))
        got = fused_step(L, s, cst, sst)
        assert rel(got[keep], want[keep]) < 2e-3, f"step {t}"
        assert_counters_zero()
    check_pools(L, cst, sst, cst_ref, sst_ref)


def test_gdn_decode_cuda_graph_equals_eager():
    """Two chained steps captured in one graph; replayed twice from the same pools: equal to eager."""
    B, nk, nv = 8, 16, 32
    L = make_layer(B, nk, nv, torch.bfloat16, [3], seed=5)
    steps = [L.step(), L.step()]
    cst, sst = L.cst0.clone(), L.sst0.clone()

    def both():
        return [fused_step(L, s, cst, sst) for s in steps]

    eager = both()  # compiles and allocates the counters before the capture
    eager_pools = (cst.clone(), sst.clone())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = both()
    for _ in range(2):
        cst.copy_(L.cst0)
        sst.copy_(L.sst0)
        for y in static:
            y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(static, eager, strict=True):
            assert torch.equal(a, b)
        assert torch.equal(cst, eager_pools[0]) and torch.equal(sst, eager_pools[1])
    assert_counters_zero()


def test_gdn_decode_checks():
    B, nk, nv = 3, 16, 32
    L = make_layer(B, nk, nv, torch.bfloat16, [], seed=3)
    s = L.step()
    cst, sst = L.cst0.clone(), L.sst0.clone()
    args = [s.qkv, s.z, s.b, s.a, L.w, cst, L.A_log, L.dt_bias, L.nw, EPS, sst, L.slots, nk]
    bad = {
        1: s.z[:, :-4],  # wrong width
        5: cst[:, :, :2],  # conv state of width 3 expected
        10: sst.to(torch.float16),  # state must be fp32 or bf16
        11: L.slots[:2],  # one slot per row
    }
    for i, t in bad.items():
        with pytest.raises(ValueError, match="gdn_decode"):
            decode.gdn_decode(*[t if j == i else x for j, x in enumerate(args)])
    # rows only 8-byte aligned, row stride a multiple of 4 (not 8): still accepted
    proj = bf16(B, 2 * nk * D + nv * D + nv * D + 2 * nv + 4)[:, 4:]
    odd = [proj[:, : 2 * nk * D + nv * D], proj[:, 2 * nk * D + nv * D : 2 * nk * D + 2 * nv * D]]
    assert torch.isfinite(decode.gdn_decode(*odd, *args[2:])).all()
    with pytest.raises(ValueError, match="qkv"):  # 2-byte offset: not 8-byte aligned
        decode.gdn_decode(bf16(B, 2 * nk * D + nv * D + 1)[:, 1:], *args[1:])


def test_gdn_decode_counter_allocation_refused_during_capture():
    idx = torch.cuda.current_device()
    B, nk, nv = 2, 16, 32
    L = make_layer(B, nk, nv, torch.bfloat16, [], seed=4)
    s = L.step()
    cst, sst = L.cst0.clone(), L.sst0.clone()
    saved = decode._COUNTERS.pop(idx, None)
    try:
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="counter buffer"), torch.cuda.graph(graph):
            fused_step(L, s, cst, sst)
    finally:
        if saved is not None:
            decode._COUNTERS[idx] = saved

"""The CUDA GDN kernels with a bf16 recurrent-state pool (--mamba-ssm-cache-dtype bfloat16) against the
torch reference with one: the tensor-core chunk (K2+K3, every dv block), the fp32-recurrent kernel
(prefill and decode) and the fused decode (K4). Outputs poisoned, every run twice and compared
bitwise (pools too), output and live-slot state rel < 2e-3, padding and unused slots never written;
K4 bit-equal to the four CUDA ops composed on bf16 pools. And per kernel: a bf16 pool gives the fp32
pool's outputs bit for bit and exactly its new state rounded to bf16 (the math is the fp32 path's,
only the load and the store differ). Seeded data from numpy Generators; the shapes of test_gdn.py,
test_gdn_chunk.py and test_gdn_decode.py."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.ops import reference as ref  # noqa: E402
from engine.ops.gdn import chunk  # noqa: E402
from engine.ops.gdn import recurrent as delta  # noqa: E402
from tests.ops.kernel_check import rel, twice  # noqa: E402
from tests.ops.test_gdn_decode import (  # noqa: E402
    Layer,
    Step,
    assert_counters_zero,
    composed_step,
    fused_step,
    pad_rows,
    ref_step,
)

pytestmark = pytest.mark.gpu
DEV = "cuda"
BF16 = torch.bfloat16
D = 128
LENS = (1, 2, 3, 63, 64, 65, 1000)


def _dev(a: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(DEV).to(dtype)


def _bf16(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return _dev(rng.standard_normal(shape) * scale, BF16)


def _varlen(rng: np.random.Generator, lens, init_mask):
    """qsl [B+1], slots [B] (a zero-length padding sequence on slot 0 appended), has_init [B]."""
    lens = [*lens, 0]
    B = len(lens)
    qsl = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32, device=DEV)
    slots = torch.tensor([*(rng.permutation(B - 1) + 1).tolist(), 0], dtype=torch.int32, device=DEV)
    hinit = torch.tensor([*list(init_mask)[: B - 1], False], device=DEV)
    return qsl, slots, hinit, max(lens), B


def _prefill(rng: np.random.Generator, T: int, nk: int, nv: int, scale_g: float):
    """q, k, v as views of one fused projection buffer (as the model passes them), g <= 0, beta."""
    buf = _bf16(rng, T, (2 * nk + nv) * D)
    q = buf[:, : nk * D].view(T, nk, D)
    k = buf[:, nk * D : 2 * nk * D].view(T, nk, D)
    v = buf[:, 2 * nk * D :].view(T, nv, D)
    g = _dev(-rng.uniform(0.0, scale_g, (T, nv)))
    beta = _dev(rng.uniform(0.0, 1.0, (T, nv))).to(BF16).float()
    return q, k, v, g, beta


def _check_pool(st: torch.Tensor, st_ref: torch.Tensor, st0: torch.Tensor, live: list[int]) -> float:
    """Live slots close to the reference (bf16 values rounded from nearby fp32 ones), the rest
    untouched; returns the fraction of live state elements bit-equal to the reference's."""
    assert st.dtype == BF16
    for s in live:
        e = rel(st[s], st_ref[s])
        assert e < 2e-3, f"slot {s}: state rel {e:.2e}"
    for s in range(st.shape[0]):
        if s not in live:
            assert torch.equal(st[s], st0[s]), f"slot {s} written"
    idx = torch.tensor(live, device=DEV)
    return (st[idx] == st_ref[idx]).float().mean().item()


def _run_prefill(kind: str, dv: int | None, args) -> torch.Tensor:
    if kind == "tensorcore":
        return chunk.chunk_gated_delta_rule(*args, arms=frozenset({f"chunk.dv{dv}"} if dv else set()))
    return delta.chunk_gated_delta_rule(*args)


@pytest.mark.parametrize(
    "kind,dv",
    [("tensorcore", 32), ("tensorcore", 64), ("tensorcore", 128), ("tensorcore", None), ("recurrent", None)],
)
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("init", [False, True])
def test_prefill_bf16_state(kind: str, dv: int | None, ratio: int, init: bool) -> None:
    rng = np.random.default_rng(10 * ratio + init)
    nk, nv = 2, 2 * ratio
    qsl, slots, hinit, maxlen, B = _varlen(rng, LENS, [init, not init] * 4)
    T = int(qsl[-1])
    q, k, v, g, beta = _prefill(rng, T, nk, nv, 0.3)
    st0 = _bf16(rng, B + 3, nv, D, D, scale=0.1)
    st_ref, st = st0.clone(), st0.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, st_ref, qsl, slots, hinit, maxlen)
    args = (q, k, v, g, beta, st, qsl, slots, hinit, maxlen)
    got = twice(lambda: _run_prefill(kind, dv, args), [st], ((T, nv, D), BF16))
    err = rel(got, want)
    assert err < 2e-3, f"output rel {err:.2e}"
    same = _check_pool(st, st_ref, st0, [s for s in slots.tolist() if s > 0])
    print(f"{kind} dv={dv} ratio={ratio} init={init}: output rel {err:.2e}, state bit-equal {same:.4f}")


def test_prefill_bf16_state_long_strong_decay() -> None:
    """One 4,096-token sequence from a large bf16 initial state with g ~ -U(0, 1), and one beside it."""
    rng = np.random.default_rng(4)
    qsl, slots, hinit, maxlen, B = _varlen(rng, (4096, 77), [True, True])
    T = int(qsl[-1])
    q, k, v, g, beta = _prefill(rng, T, 2, 4, 1.0)
    st0 = _bf16(rng, B + 1, 4, D, D, scale=1.0)
    st_ref, st = st0.clone(), st0.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, st_ref, qsl, slots, hinit, maxlen)
    got = chunk.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, maxlen)
    assert rel(got, want) < 2e-3
    _check_pool(st, st_ref, st0, [s for s in slots.tolist() if s > 0])


@pytest.mark.parametrize("ratio", [1, 2])
def test_recurrent_decode_bf16_state(ratio: int) -> None:
    rng = np.random.default_rng(20 + ratio)
    nk, S, B = 16 // ratio, 40, 33
    nv = nk * ratio
    q, k, v = _bf16(rng, B, nk, D), _bf16(rng, B, nk, D), _bf16(rng, B, nv, D)
    g = _dev(-rng.uniform(0.0, 1.0, (B, nv)))
    beta = _dev(rng.uniform(0.0, 1.0, (B, nv))).to(BF16).float()
    slots = torch.tensor(rng.permutation(S - 1)[:B] + 1, dtype=torch.int32, device=DEV)
    slots[7] = 0
    st0 = _bf16(rng, S, nv, D, D, scale=0.1)
    st_ref, st = st0.clone(), st0.clone()
    want = ref.recurrent_gated_delta_rule(q, k, v, g, beta, st_ref, slots)
    got = twice(
        lambda: delta.recurrent_gated_delta_rule(q, k, v, g, beta, st, slots), [st], ((B, nv, D), BF16)
    )
    keep = slots > 0
    assert rel(got[keep], want[keep]) < 2e-3
    same = _check_pool(st, st_ref, st0, slots[keep].tolist())
    print(f"recurrent decode ratio={ratio}: state bit-equal {same:.4f}")


def _layer(rng: np.random.Generator, B: int, nk: int, nv: int, pdtype: torch.dtype, pad: list[int]) -> Layer:
    C, S = (2 * nk + nv) * D, B + 3
    slots = torch.tensor(rng.permutation(S - 1)[:B] + 1, dtype=torch.int32, device=DEV)
    if pad:
        slots[pad] = 0
    return Layer(
        nk,
        nv,
        _bf16(rng, C, 4, scale=0.5),
        _dev(rng.uniform(-1.0, 0.0, nv)).to(pdtype),
        _bf16(rng, nv).to(pdtype),
        _dev(rng.uniform(0.5, 1.5, D)).to(pdtype),
        slots,
        _bf16(rng, S, C, 3),
        _bf16(rng, S, nv, D, D, scale=0.1),
    )


def _step(rng: np.random.Generator, L: Layer) -> Step:
    B, C, vd = L.slots.shape[0], (2 * L.nk + L.nv) * D, L.nv * D
    p = _bf16(rng, B, C + vd + 2 * L.nv)
    return Step(p[:, :C], p[:, C : C + vd], p[:, C + vd : C + vd + L.nv], p[:, C + vd + L.nv :])


@pytest.mark.parametrize("B", [1, 3, 33, 64])
@pytest.mark.parametrize("ratio", [1, 2])
def test_fused_decode_bf16_state(ratio: int, B: int) -> None:
    rng = np.random.default_rng(100 * ratio + B)
    nk = 16 // ratio
    pdtype = torch.bfloat16 if B in (1, 33) else torch.float32
    L = _layer(rng, B, nk, nk * ratio, pdtype, pad_rows(B))
    assert L.sst0.dtype == BF16
    live = L.slots[L.slots > 0].tolist()
    cst_ref, sst_ref = L.cst0.clone(), L.sst0.clone()
    cst, sst = L.cst0.clone(), L.sst0.clone()
    for t in range(3):  # chained steps: the rounded state is what the next step reads
        s = _step(rng, L)
        want = ref_step(L, s, cst_ref, sst_ref)
        got = twice(lambda s=s: fused_step(L, s, cst, sst), [cst, sst], ((B, L.nv * D), BF16))
        assert torch.isfinite(got).all()
        keep = L.slots > 0
        assert rel(got[keep], want[keep]) < 2e-3, f"step {t}"
        assert_counters_zero()
    assert torch.equal(cst[live], cst_ref[live])
    same = _check_pool(sst, sst_ref, L.sst0, live)
    print(f"fused decode B={B} ratio={ratio}: state bit-equal {same:.4f} after 3 steps")


@pytest.mark.parametrize("ratio", [1, 2])
def test_fused_decode_bf16_state_bitwise_vs_composition(ratio: int) -> None:
    """K4 and the four CUDA ops round at the same points, the bf16 state store included."""
    rng = np.random.default_rng(7 + ratio)
    B, nk = 33, 16 // ratio
    L = _layer(rng, B, nk, nk * ratio, torch.bfloat16, pad_rows(B))
    s = _step(rng, L)
    cst_c, sst_c = L.cst0.clone(), L.sst0.clone()
    comp = composed_step(L, s, cst_c, sst_c)
    cst, sst = L.cst0.clone(), L.sst0.clone()
    got = fused_step(L, s, cst, sst)
    assert torch.equal(got.view(torch.int16), comp.view(torch.int16))
    assert torch.equal(cst, cst_c) and torch.equal(sst.view(torch.int16), sst_c.view(torch.int16))


def _kernels(rng: np.random.Generator) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each kernel as pool -> output, on fixed inputs."""
    qsl, slots, hinit, maxlen, _ = _varlen(rng, (5, 64, 130), [True, False, True])
    T = int(qsl[-1])
    pre = _prefill(rng, T, 2, 4, 0.3)
    dec = _prefill(rng, 3, 2, 4, 1.0)
    L = _layer(rng, 3, 2, 4, torch.bfloat16, [1])  # slots of 6 (pool of 6), row 1 padding
    st = _step(rng, L)
    cst = L.cst0[:6].clone()
    return {
        "chunk": lambda p: chunk.chunk_gated_delta_rule(*pre, p, qsl, slots, hinit, maxlen),
        "chunk_o1hi": lambda p: chunk.chunk_gated_delta_rule(
            *pre, p, qsl, slots, hinit, maxlen, arms=frozenset({"chunk.o1hi"})
        ),
        "recurrent_prefill": lambda p: delta.chunk_gated_delta_rule(*pre, p, qsl, slots, hinit, maxlen),
        "recurrent_decode": lambda p: delta.recurrent_gated_delta_rule(*dec, p, L.slots),
        "fused_decode": lambda p: fused_step(L, st, cst.clone(), p),
    }


@pytest.mark.parametrize(
    "name", ["chunk", "chunk_o1hi", "recurrent_prefill", "recurrent_decode", "fused_decode"]
)
def test_bf16_instantiation_is_the_fp32_one_rounded(name: str) -> None:
    rng = np.random.default_rng(5)
    fn = _kernels(rng)[name]
    p16 = _bf16(rng, 6, 4, D, D, scale=0.2)
    p32 = p16.float()
    o16, o32 = fn(p16), fn(p32)
    assert torch.equal(o16.view(torch.int16), o32.view(torch.int16)), f"{name}: outputs differ"
    assert torch.equal(p16.view(torch.int16), p32.to(BF16).view(torch.int16)), (
        f"{name}: state not the rounded fp32"
    )


def test_wrappers_refuse_other_state_dtypes() -> None:
    rng = np.random.default_rng(6)
    fns = _kernels(rng)
    pool = _bf16(rng, 6, 4, D, D).to(torch.float16)
    for fn in fns.values():
        with pytest.raises(ValueError, match="ssm_state must be float32 or bfloat16"):
            fn(pool)

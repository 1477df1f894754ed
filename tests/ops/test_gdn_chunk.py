"""Tensor-core chunked gated delta rule (engine.ops.gdn.chunk, cuda/gdn/chunk.cu) against the fp32
torch reference (engine.ops.reference.chunk_gated_delta_rule).

Varlen batches with lengths 1, 2, 3, 63, 64, 65, 1000 plus a zero-length padding sequence (slot 0),
with and without initial state, Nv = Nk and Nv = 2 Nk, q/k/v as strided views of one fused
[T, 2 Nk 128 + Nv 128] buffer (as the model passes them), every dv block size; outputs poisoned,
each run twice and compared bitwise; output rel < 2e-3 and every live state slot rel < 1e-3; slot 0
untouched; CUDA-graph replay equal to eager; the W1 shape (32 x 1,024, Nk 16, Nv 32); one long
sequence with strong decay.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.ops import reference as ref  # noqa: E402
from engine.ops.gdn import chunk  # noqa: E402
from tests.ops.kernel_check import bf16, poison, rel, twice, varlen  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
LENS = (1, 2, 3, 63, 64, 65, 1000)


def fused_inputs(T: int, nk: int, nv: int, scale_g: float):
    """q, k, v as views of one [T, 2 nk 128 + nv 128] projection buffer; g <= 0, beta in [0, 1)."""
    buf = bf16(T, (2 * nk + nv) * 128)
    q = buf[:, : nk * 128].view(T, nk, 128)
    k = buf[:, nk * 128 : 2 * nk * 128].view(T, nk, 128)
    v = buf[:, 2 * nk * 128 :].view(T, nv, 128)
    g = -torch.rand(T, nv, device=DEV) * scale_g
    beta = torch.rand(T, nv, device=DEV).to(torch.bfloat16).float()
    return q, k, v, g, beta


def check(lens, nk, nv, init_mask, arms, *, scale_g=0.3, seed=2, st_scale=0.1, out_tol=2e-3):
    torch.manual_seed(seed)
    qsl, slots, hinit, maxlen, B = varlen(lens, init_mask, seed=seed)
    T = int(qsl[-1])
    q, k, v, g, beta = fused_inputs(T, nk, nv, scale_g)
    S = B + 3
    st0 = torch.randn(S, nv, 128, 128, device=DEV) * st_scale
    st_ref, st = st0.clone(), st0.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, st_ref, qsl, slots, hinit, maxlen)
    got = twice(
        lambda: chunk.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, maxlen, arms=arms),
        [st],
        ((T, nv, 128), torch.bfloat16),
    )
    err = rel(got, want)
    assert err < out_tol, f"output rel {err:.2e}"
    live = [s for s in slots.tolist() if s > 0]
    for s in live:
        e = rel(st[s], st_ref[s])
        assert e < 1e-3, f"slot {s}: state rel {e:.2e}"
    for s in range(S):
        if s not in live:  # padding slot 0 and unused slots: never written
            assert torch.equal(st[s], st0[s]), f"slot {s} written"
    return err


@pytest.mark.parametrize("dv", [32, 64, 128])
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_varlen(dv, ratio, init):
    check(LENS, 2, 2 * ratio, [init, not init] * 4, frozenset({f"chunk.dv{dv}"}))


def test_chunk_auto_dv_and_o1hi():
    check(LENS, 2, 4, [True, False] * 4, frozenset())  # few CTAs: the wrapper splits dv
    check(LENS, 2, 4, [True, False] * 4, frozenset({"chunk.o1hi", "chunk.dv128"}))


def test_chunk_w1_shape():
    """32 sequences x 1,024 tokens, Nk 16, Nv 32 (the W1 prefill), half of them with history."""
    check([1024] * 32, 16, 32, [True, False] * 16, frozenset(), seed=3)


def test_chunk_long_strong_decay():
    """One 4,096-token sequence with g ~ -U(0, 1) and a large initial state, and one beside it."""
    check((4096,), 2, 4, [True], frozenset(), scale_g=1.0, seed=4, st_scale=1.0)
    check((4096, 77), 2, 4, [True, True], frozenset({"chunk.dv128"}), scale_g=1.0, seed=5, st_scale=1.0)


def graph_equals_eager(arms=frozenset()):
    """A CUDA-graph replay of the op (LENS, Nk 4, Nv 8) writes what an eager call writes, bitwise."""
    torch.manual_seed(0)
    nk, nv = 4, 8
    qsl, slots, hinit, maxlen, B = varlen(LENS, [True, False] * 4, seed=7)
    T = int(qsl[-1])
    q, k, v, g, beta = fused_inputs(T, nk, nv, 0.5)
    st0 = torch.randn(B + 1, nv, 128, 128, device=DEV) * 0.1
    st = st0.clone()

    def run():
        return chunk.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, maxlen, arms=arms)

    eager = run()  # compiles before capture
    eager_state = st.clone()
    st.copy_(st0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = run()
    st.copy_(st0)
    poison(((T, nv, 128), torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, eager)
    assert torch.equal(st, eager_state)


def test_chunk_cuda_graph_equals_eager():
    graph_equals_eager()


def test_chunk_kernel_resources():
    """Every instantiation compiled by NVRTC for this device: no local memory (spills)."""
    for dv in (32, 64, 128):
        for o1lo in (True, False):
            fn = chunk._function(dv, o1lo)
            print(f"gdn_chunk_kernel<{dv}, {o1lo}>: {fn.num_regs} regs, {fn.local_size_bytes} B local")
            assert fn.local_size_bytes == 0

"""The split path of the tensor-core chunked gated delta rule (arm prefill.split: cuda/gdn/chunk_prep.cu
then cuda/gdn/chunk_state.cu) against the fp32 torch reference, through the public op as the model
calls it: the same varlen batches, tolerances and bitwise-repeat check as tests/ops/test_gdn_chunk.py
(outputs poisoned, every dv block, GQA 1 and 2, with and without history, slot 0 untouched), the two
W1 prefill shapes it is for, a long sequence with strong decay, a bf16 state pool, and CUDA-graph
replay equal to eager. Each case first asserts that the split path is the one that runs.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.ops import reference as ref  # noqa: E402
from engine.ops.gdn import chunk, chunk_split  # noqa: E402
from tests.ops.kernel_check import rel, varlen  # noqa: E402
from tests.ops.test_gdn_chunk import LENS, check, fused_inputs, graph_equals_eager  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
SPLIT = frozenset({"prefill.split"})


def sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def assert_split(lens, nv, arms=SPLIT):
    T, B = sum(lens), len(lens) + 1  # varlen() appends a zero-length padding sequence
    assert chunk_split.use_split(B, nv, T, max(lens), sms(), arms), "the split path would not run"


@pytest.mark.parametrize("dv", ["dv32", "dv64", "dv128", "dk2"])
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("init", [False, True])
def test_split_varlen(dv, ratio, init):
    arms = SPLIT | {f"chunk.{dv}"}
    assert_split(LENS, 2 * ratio, arms)
    check(LENS, 2, 2 * ratio, [init, not init] * 4, arms)


def test_split_auto_dv_and_o1hi():
    assert_split(LENS, 4)
    check(LENS, 2, 4, [True, False] * 4, SPLIT)
    check(LENS, 2, 4, [True, False] * 4, SPLIT | {"chunk.o1hi"})


@pytest.mark.parametrize("lens", [(1024,), (1024, 1024)])
@pytest.mark.parametrize("extra", [(), ("chunk.dk2",)])
def test_split_w1_prefill_shapes(lens, extra):
    """W2's prompt and W1's prefill steps: Nk 16, Nv 32, with and without history."""
    assert_split(lens, 32)
    check(lens, 16, 32, [True, False], SPLIT | set(extra), seed=3)


@pytest.mark.parametrize("extra", [(), ("chunk.dk2",)])
def test_split_long_strong_decay(extra):
    """One 4,096-token sequence with g ~ -U(0, 1) and a large initial state, and one beside it."""
    assert_split((4096,), 4)
    check((4096,), 2, 4, [True], SPLIT | set(extra), scale_g=1.0, seed=4, st_scale=1.0)
    check((4096, 77), 2, 4, [True, True], SPLIT | {"chunk.dv128"}, scale_g=1.0, seed=5, st_scale=1.0)


def test_split_bf16_state_pool():
    """A bf16 pool: the state stays fp32 across the chunks and is rounded once, as the one-pass kernel
    does, so both paths end within a bf16 rounding of the fp32 reference's state."""
    torch.manual_seed(6)
    lens, nk, nv = (600, 130), 2, 4
    assert_split(lens, nv)
    qsl, slots, hinit, maxlen, B = varlen(lens, [True, True], seed=6)
    T = int(qsl[-1])
    q, k, v, g, beta = fused_inputs(T, nk, nv, 0.3)
    st32 = torch.randn(B + 1, nv, 128, 128, device=DEV) * 0.1
    st16 = st32.to(torch.bfloat16)
    st_ref = st16.float()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, st_ref, qsl, slots, hinit, maxlen)
    got = chunk.chunk_gated_delta_rule(q, k, v, g, beta, st16, qsl, slots, hinit, maxlen, arms=SPLIT)
    assert rel(got, want) < 2e-3
    for s in slots.tolist():
        if s > 0:
            assert rel(st16[s].float(), st_ref[s]) < 5e-3, f"slot {s}"


def test_split_entries_in_a_given_workspace():
    """A large enough, 256-byte aligned uint8 workspace (a whole-step graph's static memory) takes the
    chunk entries: the same bits as allocating them; a misaligned one is passed over."""
    torch.manual_seed(8)
    lens, nk, nv = (700,), 2, 4
    assert_split(lens, nv)
    qsl, slots, hinit, maxlen, B = varlen(lens, [True], seed=8)
    T = int(qsl[-1])
    q, k, v, g, beta = fused_inputs(T, nk, nv, 0.3)
    st0 = torch.randn(B + 1, nv, 128, 128, device=DEV) * 0.1
    runs = []
    n = chunk_split.entry_bytes(T, B, nv)
    ws = torch.zeros(n + 512, dtype=torch.uint8, device=DEV)
    for workspace in (None, ws, ws[1:]):
        st = st0.clone()
        o = chunk.chunk_gated_delta_rule(
            q, k, v, g, beta, st, qsl, slots, hinit, maxlen, arms=SPLIT, workspace=workspace
        )
        runs.append((o, st))
        if workspace is ws:
            assert ws[:n].any() and not ws[n:].any()  # the entries went there, and no further
            ws.zero_()
    for o, st in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(st, runs[0][1])
    assert not ws.any()  # the misaligned view was not written


def test_split_cuda_graph_equals_eager():
    assert_split(LENS, 8)
    graph_equals_eager(SPLIT)


def test_split_kernel_resources():
    """Every instantiation compiled by NVRTC for this device: no local memory (spills)."""
    fn = chunk_split._prep()
    print(f"gdn_chunk_prep_kernel: {fn.num_regs} regs, {fn.local_size_bytes} B local")
    assert fn.local_size_bytes == 0
    for o1lo in (True, False):
        for dv in chunk_split.DVBS:
            fn = chunk_split._state(dv, o1lo, "float")
            print(f"gdn_chunk_state_kernel<{dv}, {o1lo}>: {fn.num_regs} regs, {fn.local_size_bytes} B local")
            assert fn.local_size_bytes == 0
        fn = chunk_split._state2(o1lo, "float")
        print(f"gdn_chunk_state2_kernel<{o1lo}>: {fn.num_regs} regs, {fn.local_size_bytes} B local")
        assert fn.local_size_bytes == 0

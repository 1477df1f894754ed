"""When the split path of the chunked delta rule runs, and with what (engine.ops.gdn.chunk_split):
pure host logic, so it runs on CPU CI."""

from __future__ import annotations

import numpy as np

from engine.ops.gdn import chunk_split as cs

SPLIT = frozenset({"prefill.split"})


def test_entry_rows_bound_every_chunk_count():
    """The prep grid ((T + 63 B) // 64 rows) covers sum ceil(len / 64) for any lengths, zero included,
    and is exact for one sequence."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        lens = rng.integers(0, 300, size=int(rng.integers(1, 20)))
        chunks = int(sum((n + 63) // 64 for n in lens))
        assert chunks <= cs.entry_rows(int(lens.sum()), len(lens))
    for n in range(0, 5000, 7):
        assert cs.entry_rows(n, 1) == (n + 63) // 64


def test_use_split_only_where_it_pays():
    def on(num_seqs, num_tokens, max_len, arms=SPLIT):
        return cs.use_split(num_seqs, 32, num_tokens, max_len, 132, arms, cc=90)

    dvb, min_chunks = cs.state_params(90)
    assert on(2, 2048, 1024)  # W1's prefill step
    assert on(2, 1024, 1024)  # W2's prompt (+ a padding sequence)
    assert not on(2, 2048, 1024, frozenset())  # arm off
    assert not on(2, 64 * (min_chunks - 1), 64 * (min_chunks - 1))  # too short a chain to shorten
    assert on(1, 64 * min_chunks, 64 * min_chunks)
    assert not on(9, 2048, 1024)  # 288 one-pass CTAs fill the H200
    # scratch cap: one 32,768-token prompt would need 0.56 GB of entries
    assert not on(1, 32768, 32768)
    assert cs.entry_rows(2048, 2) * 32 * cs.ENTRY_BYTES <= cs.MAX_ENTRY_BYTES


def test_state_pass_dv_block():
    assert cs.pick_dvb(frozenset(), cc=90) == cs.state_params(90)[0]
    assert cs.pick_dvb(frozenset({"chunk.dv128"}), cc=90) == 128
    for cc in (80, 90, 120):
        assert cs.state_params(cc)[0] in cs.DVBS


def test_dk_split_state_pass_only_where_its_ctas_fit():
    none = frozenset()
    assert cs.use_dk2(1, 32, 132, none)  # one prompt: 128 CTAs on the H200's 132 SMs
    assert not cs.use_dk2(2, 32, 132, none)  # 256 CTAs: the dv-64 pass
    assert not cs.use_dk2(1, 32, 70, none)  # the 5070 Ti's 70 SMs
    assert cs.use_dk2(2, 32, 132, frozenset({"chunk.dk2"}))
    assert not cs.use_dk2(1, 32, 132, frozenset({"chunk.dv64"}))


def test_smem_within_sm120_limit():
    assert cs.PREP_SMEM <= 99 * 1024
    for d in cs.DVBS:
        assert cs.state_smem_bytes(d) <= 99 * 1024
    assert cs.STATE2_SMEM <= 99 * 1024


def test_wrapper_mirrors_the_kernels_static_asserts():
    """The byte sizes the wrapper allocates and launches with are the ones the kernels assert at
    compile time (nvcc checks the .cu side in tests/test_cuda_compile.py; this ties the two)."""
    import re
    from pathlib import Path

    cuda = Path(__file__).resolve().parents[2] / "cuda" / "gdn"
    prep = (cuda / "chunk_prep.cu").read_text()
    assert re.search(rf"L::BYTES == {cs.PREP_SMEM}\b", prep)
    assert re.search(rf"Entry::BYTES == {cs.ENTRY_BYTES}\b", prep)
    state = (cuda / "chunk_state.cu").read_text()
    m = re.search(r"L::BYTES == (\d+) \+ (\d+) \* DVB", state)
    assert m and all(cs.state_smem_bytes(d) == int(m[1]) + int(m[2]) * d for d in cs.DVBS)
    assert re.search(rf"L::BYTES == {cs.STATE2_SMEM}\b", (cuda / "chunk_state2.cu").read_text())


def _param_count(source: str, kernel: str) -> int:
    """Parameters of ``kernel``'s definition in a .cu source (its parenthesised list up to the body)."""
    import re

    m = re.search(rf"{kernel}\((.*?)\)\s*\{{", source, re.S)
    assert m, kernel
    return m.group(1).count(",") + 1


def test_run_launches_both_passes_with_the_kernels_signatures(monkeypatch):
    """The host side of the split path without a GPU: ``run`` launches the prep pass over
    ``entry_rows`` x Nk CTAs and then the state pass the rules pick, each with as many arguments as
    the kernel takes, on scratch of the documented size."""
    from pathlib import Path

    import torch

    from engine.ops import compile as compile_mod

    calls = []
    monkeypatch.setattr(compile_mod, "device_cc", lambda: 90)  # the H200's tuning rows
    record = lambda fn, grid, block, args, shared_mem=0: calls.append((fn, grid, block, args))  # noqa: E731
    monkeypatch.setattr(cs, "launch", record)
    monkeypatch.setattr(cs, "_prep", lambda: "prep")
    monkeypatch.setattr(cs, "_state", lambda dvb, o1lo, st: f"state<{dvb}, {o1lo}, {st}>")
    monkeypatch.setattr(cs, "_state2", lambda o1lo, st: f"state2<{o1lo}, {st}>")
    cuda = Path(__file__).resolve().parents[2] / "cuda" / "gdn"
    n_prep = _param_count((cuda / "chunk_prep.cu").read_text(), "gdn_chunk_prep_kernel")
    n_state = _param_count((cuda / "chunk_state.cu").read_text(), "gdn_chunk_state_kernel")
    n_state2 = _param_count((cuda / "chunk_state2.cu").read_text(), "gdn_chunk_state2_kernel")
    nk, nv = 16, 32
    cases = (((1024,), "state2<True, float>"), ((1024, 1024), "state<64, True, float>"))  # on 132 SMs
    for lens, want in cases:
        calls.clear()
        T, B = sum(lens), len(lens)
        q = k = torch.zeros(T, nk, 128, dtype=torch.bfloat16)
        v = out = torch.zeros(T, nv, 128, dtype=torch.bfloat16)
        g = beta = torch.zeros(T, nv)
        ints = torch.zeros(B + 1, dtype=torch.int32)
        cs.run(q, k, v, g, beta, g, ints, ints[:B], ints[:B], out, nk=nk, nv=nv, st="float", sms=132,
               arms=frozenset({"prefill.split"}))  # fmt: skip
        (f1, grid1, _, args1), (f2, grid2, block2, args2) = calls
        assert (f1, grid1, len(args1)) == ("prep", (nk, cs.entry_rows(T, B)), n_prep)
        assert f2 == want
        assert len(args2) == (n_state2 if f2.startswith("state2") else n_state)
        dvb = 32 if f2.startswith("state2") else 64
        assert grid2 == (nv * 128 // dvb, B) and block2 == ((128,) if dvb == 32 else (dvb * 2,))

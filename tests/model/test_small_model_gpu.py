"""The model on CUDA at small shapes (the tiny preset with 128-wide GDN heads): decode graphs against
eager steps (bit for bit, with and without PDL), graph capture at start-up against lazy capture, and
the fused decode and tensor-core prefill arms inside the whole model. The 4B-shape checks are in
test_model_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig  # noqa: E402
from engine.generate import generate  # noqa: E402
from engine.worker.model_runner import ModelRunner  # noqa: E402
from tests.model.test_model_gpu import _has_cupy, report  # noqa: E402
from tests.oracle import harness  # noqa: E402

pytestmark = pytest.mark.gpu


def _small_ckpt(tmp: Path) -> Path:
    """The tiny preset with 128-wide GDN heads (the CuPy kernels' shape); weights from --load-format dummy."""
    from engine.checkpoints.presets import make_checkpoint

    d = make_checkpoint(tmp / "small", preset="tiny")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(linear_key_head_dim=128, linear_value_head_dim=128, hidden_size=256, intermediate_size=512)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _small_runner(
    d: Path,
    dtype: str,
    backend: str,
    eager: bool,
    arms: tuple[str, ...] = (),
    capture: str = "lazy",
    state: str = "on-demand",
) -> ModelRunner:
    mc = ModelConfig(
        model=str(d),
        dtype=dtype,
        device="cuda",
        load_format="dummy",
        gdn_backend=backend,
        enforce_eager=eager,
        kernel_arms=arms,
        cuda_graph_capture=capture,  # type: ignore[arg-type]
    )
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(num_gpu_blocks_override=64, gdn_state_memory=state),  # type: ignore[arg-type]
        scheduler=SchedulerConfig(max_num_seqs=8),
    )
    return ModelRunner(cfg)


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_decode_graph_replay_bit_equal_to_eager(tmp_path, pdl):
    """One decode step replayed from its CUDA graph equals the same step run eagerly on the same
    static inputs, bit for bit (GDN state restored in between, since a step advances it); with arm
    graphs.pdl the graph's kernels overlap through programmatic launches, replayed several times."""
    from engine.ops import launch_ex
    from engine.ops.arms import DEFAULT_ARMS
    from engine.sampling_params import SamplingParams
    from engine.worker.step import ScheduledSeq

    backend = "cuda" if _has_cupy() else "torch"
    if pdl and (backend != "cuda" or torch.cuda.get_device_capability()[0] < 9):
        pytest.skip("programmatic dependent launch needs the CUDA kernels on sm_90 or newer")
    arms = tuple(sorted(DEFAULT_ARMS | {"graphs.pdl"} if pdl else DEFAULT_ARMS - {"graphs.pdl"}))
    before = launch_ex.launches
    r = _small_runner(_small_ckpt(tmp_path), "bfloat16", backend, eager=False, arms=arms)
    assert r.graphs is not None
    assert (launch_ex.launches > before) == pdl  # the capture really used programmatic launches
    greedy = SamplingParams(temperature=0.0)
    prompts = [[5 + i, 9, 11, 300, 7] * (3 + i) for i in range(5)]
    tables, nxt = [], 1  # contiguous block tables with room for the prompt and three tokens
    for p in prompts:
        n = -(-(len(p) + 3) // r.block_size)
        tables.append(list(range(nxt, nxt + n)))
        nxt += n

    def step(tokens: list[list[int]], computed: list[int], made: int) -> list[int]:
        seqs = [
            ScheduledSeq(
                token_ids=t, num_computed=c, block_ids=b, state_slot=i + 1, params=greedy, num_output=made
            )
            for i, (t, c, b) in enumerate(zip(tokens, computed, tables, strict=True))
        ]
        return r.execute_model(seqs).token_ids

    first = step([list(p) for p in prompts], [0] * len(prompts), 0)  # prefill
    second = step([[t] for t in first], [len(p) for p in prompts], 1)  # one decode step (through a graph)
    seqs = [
        ScheduledSeq(
            token_ids=[o], num_computed=len(p) + 1, block_ids=tables[i], state_slot=i + 1, num_output=2
        )
        for i, (p, o) in enumerate(zip(prompts, second, strict=True))
    ]
    key = r.graphs.bucket(seqs)
    assert key is not None
    # the slots the steps use (and padding slot 0): an on-demand pool has no memory behind the others
    pools = [t[: len(seqs) + 1] for t in r.cache.conv_state + r.cache.ssm_state]
    saved = [t.clone() for t in pools]

    def restore() -> None:
        for t, s in zip(pools, saved, strict=True):
            t.copy_(s)

    replays = []
    for _ in range(5 if pdl else 1):
        restore()
        replays.append(r.graphs.run(seqs, key).clone())
    after = [t.clone() for t in pools]
    restore()
    eager = r.execute(r.graphs.graphs[key].batch)[: len(seqs)]
    for replayed in replays:  # the graph keeps the raw bf16 logits; the eager step widens them
        assert replayed.dtype == torch.bfloat16 and eager.dtype == torch.float32
        assert torch.equal(replayed.float(), eager)
    for t, a in zip(pools, after, strict=True):  # the state a replay leaves equals the eager step's
        assert torch.equal(t, a)
    report(test="graph_replay_bit_equal", backend=backend, bucket=list(key), pdl=pdl)


@pytest.mark.parametrize("state", ["upfront", "on-demand"])
def test_layers_sharing_one_padding_row_serve_what_plain_pools_do(tmp_path, monkeypatch, state):
    """With the CUDA kernels the GDN layers share one padding row (ModelCache shared_pad_slot): layer
    j's slot 0 is layer j-1's last slot. Decode graphs pad their batch with slot-0 rows, so a padded
    replay while the last slot's sequence waits would overwrite that sequence's state in the layer
    below if any kernel wrote a padding row. Eight sequences fill every slot; decode steps of five
    (three padding rows), of all eight and of the last one alone give the plain pools' tokens and
    leave every live slot of every layer bit for bit equal to theirs. With the recurrent state on
    demand (engine/model/vmm.py) only slot 1 is mapped at start-up, slot 0 never: the steps, which
    take slots without a scheduler, have the runner map slots 2..8 first, and a kernel that touched a
    padding row's recurrent state would fault."""
    from engine.model.cache import ModelCache
    from engine.sampling_params import SamplingParams
    from engine.worker.step import ScheduledSeq

    if not _has_cupy():
        pytest.skip("the shared padding row is for the CUDA kernels")
    d = _small_ckpt(tmp_path)
    shared = _small_runner(d, "bfloat16", "cuda", eager=False, state=state)
    allocate = ModelCache.allocate
    plain_pools = {"shared_pad_slot": False, "state_on_demand": False}
    monkeypatch.setattr(
        ModelCache, "allocate", staticmethod(lambda *a, **k: allocate(*a, **(k | plain_pools)))
    )
    plain = _small_runner(d, "bfloat16", "cuda", eager=False)
    sc, pc = shared.cache, plain.cache
    layers, slots = len(sc.ssm_state), sc.num_slots
    assert shared.shared_pad_slot and slots == 9 and layers >= 2
    on_demand = state == "on-demand"
    assert shared.state_on_demand == on_demand and (sc.grown is not None) == on_demand
    # the runners turn on expandable segments before they allocate (unless the environment chose)
    chosen = "expandable_segments" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    assert shared.expandable_segments or chosen
    if shared.expandable_segments:
        assert any(seg.get("is_expandable") for seg in torch.cuda.memory_snapshot())
    for j in range(1, layers):  # layer j's slot 0 is the row of layer j-1's last slot
        if sc.grown is None:
            assert sc.ssm_state[j][0].data_ptr() == sc.ssm_state[j - 1][slots - 1].data_ptr()
        assert sc.conv_state[j][0].data_ptr() == sc.conv_state[j - 1][slots - 1].data_ptr()
    row = pc.state_bytes // (layers * slots)
    if sc.grown is None:
        assert pc.state_bytes - sc.state_bytes == (layers - 1) * row
    else:  # conv shares the padding row; of the recurrent state only slot 1 has memory so far
        ssm_row = sc.grown.row_bytes
        conv = sc.state_bytes - sc.grown.mapped_bytes
        assert conv == (layers * (slots - 1) + 1) * (row - ssm_row)
        assert sc.grown.mapped_rows == 2 and sc.grown.mapped_bytes >= layers * ssm_row
        assert sc.state_reserved_bytes >= conv + layers * (slots - 1) * ssm_row

    greedy = SamplingParams(temperature=0.0)
    prompts = [[7 + i, 3, 250, 11, 90] * (2 + i) for i in range(8)]
    tables, nxt = [], 1
    for p in prompts:
        n = -(-(len(p) + 4) // shared.block_size)
        tables.append(list(range(nxt, nxt + n)))
        nxt += n

    def run(r: ModelRunner) -> list[list[int]]:
        first = [
            ScheduledSeq(token_ids=p, num_computed=0, block_ids=tables[i], state_slot=i + 1, params=greedy)
            for i, p in enumerate(prompts)
        ]
        out = r.execute_model(first).token_ids
        steps, last, made = [out], list(out), [1] * 8
        for rows in ([0, 1, 2, 3, 4], list(range(8)), [7]):
            seqs = [
                ScheduledSeq(
                    token_ids=[last[i]],
                    num_computed=len(prompts[i]) + made[i] - 1,
                    block_ids=tables[i],
                    state_slot=i + 1,
                    params=greedy,
                    num_output=made[i],
                )
                for i in rows
            ]
            assert r.graphs is not None and r.graphs.bucket(seqs) is not None  # replayed from a graph
            toks = r.execute_model(seqs).token_ids
            for i, t in zip(rows, toks, strict=True):
                last[i], made[i] = t, made[i] + 1
            steps.append(toks)
        return steps

    assert run(shared) == run(plain)
    for a, b in zip(sc.conv_state + sc.ssm_state, pc.conv_state + pc.ssm_state, strict=True):
        assert torch.equal(a[1:], b[1:])  # every live slot of every layer
    if sc.grown is not None:  # every slot used: all of them mapped now, as the plan budgeted
        assert sc.grown.mapped_rows == slots and sc.state_bytes == sc.state_reserved_bytes
    report(test="shared_padding_row", state=state, layers=layers, saved_bytes=pc.state_bytes - sc.state_bytes)


def test_graph_and_eager_runners_generate_same_tokens(tmp_path):
    """Greedy decoding with CUDA graphs gives the eager path's tokens (fp32, torch ops)."""
    d = _small_ckpt(tmp_path)
    g = _small_runner(d, "float32", "torch", eager=False)
    e = _small_runner(d, "float32", "torch", eager=True)
    prompts = [[(7 * i + j * 13) % 400 for j in range(20 + 9 * i)] for i in range(6)]
    a, b = generate(g, prompts, 24), generate(e, prompts, 24)
    assert g.graphs is not None and len(g.graphs.graphs) >= 1  # the graph path really ran
    assert a == b
    report(test="graph_vs_eager_tokens", prompts=6, steps=24, graphs=len(g.graphs.graphs))


def test_startup_capture_takes_every_bucket_and_changes_no_token(tmp_path):
    """--cuda-graph-capture startup: every (batch, KV blocks) bucket is captured before serving, no
    capture happens while generating, and the greedy tokens equal those of lazily captured graphs."""
    d = _small_ckpt(tmp_path)
    backend = "cuda" if _has_cupy() else "torch"
    early = _small_runner(d, "bfloat16", backend, eager=False, capture="startup")
    lazy = _small_runner(d, "bfloat16", backend, eager=False)
    assert early.graphs is not None and lazy.graphs is not None
    every = len(early.graphs.keys())  # every bucket a step could pick
    assert every >= len(early.graphs.batch_buckets) and set(early.graphs.graphs) == set(early.graphs.keys())
    assert len(lazy.graphs.graphs) == 1
    prompts = [[(5 * i + j * 11) % 400 for j in range(12 + 7 * i)] for i in range(5)]
    a, b = generate(early, prompts, 20), generate(lazy, prompts, 20)
    assert len(early.graphs.graphs) == every  # nothing captured mid-run
    assert len(lazy.graphs.graphs) > 1  # the lazy runner captured on first use (the path compared)
    assert a == b
    report(test="startup_capture", graphs=every, backend=backend)


def test_fused_decode_in_the_model_equals_four_launches(tmp_path):
    """Arm decode.fused (K4: a GDN layer's decode step in one launch) in the whole model, eager and
    through CUDA graphs: greedy tokens over 24 steps equal the four-launch CUDA path's (the kernel is
    bitwise equal to that composition; a chaotic tiny model would turn any difference into tokens)."""
    pytest.importorskip("cupy")
    d = _small_ckpt(tmp_path)
    prompts = [[(7 * i + j * 13) % 400 for j in range(20 + 9 * i)] for i in range(6)]
    toks = {}
    for arms in (("conv.chunk8",), ("conv.chunk8", "decode.fused")):
        for eager in (True, False):
            r = _small_runner(d, "bfloat16", "cuda", eager=eager, arms=arms)
            assert (r.ops.gdn_decode is not None) == ("decode.fused" in arms)
            toks[arms, eager] = generate(r, prompts, 24)
    first = next(iter(toks.values()))
    assert all(t == first for t in toks.values()), {k: t == first for k, t in toks.items()}
    report(test="fused_decode_model_tokens", prompts=6, steps=24, variants=len(toks))


def test_tensorcore_prefill_in_the_model_as_accurate(tmp_path):
    """Arm prefill.tensorcore (chunked K2+K3 on mma.sync) in the whole model: prefill logits of
    multi-chunk prompts, in one varlen batch with a 1-token and a 63-token prompt, are no further from
    the fp32 reference than the fp32-recurrent CUDA kernel's, and greedy tokens agree with it."""
    pytest.importorskip("cupy")
    d = _small_ckpt(tmp_path)
    truth = _small_runner(d, "float32", "torch", eager=True)
    old = _small_runner(d, "bfloat16", "cuda", eager=True, arms=("conv.chunk8",))
    tc = _small_runner(d, "bfloat16", "cuda", eager=True, arms=("conv.chunk8", "prefill.tensorcore"))
    from engine.ops.gdn import chunk
    from engine.ops.gdn import recurrent as delta

    assert tc.ops.chunk_gated_delta_rule.func is chunk.chunk_gated_delta_rule  # type: ignore[attr-defined]
    assert old.ops.chunk_gated_delta_rule is delta.chunk_gated_delta_rule  # takes no arms: bound as is
    prompts = [[(7 * i + j * 13) % 400 for j in range(n)] for i, n in enumerate((300, 1, 63, 200))]
    errs = []
    for p in prompts:
        t = harness.ds_prefill_logits(truth, p)
        e_old, e_tc = (((harness.ds_prefill_logits(r, p) - t).norm() / t.norm()).item() for r in (old, tc))
        errs.append((e_old, e_tc))
        assert e_tc <= 1.5 * e_old + 1e-3, (len(p), e_old, e_tc)
    a, b = generate(old, prompts, 16), generate(tc, prompts, 16)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    report(test="tensorcore_prefill_model", rel_errs=errs, greedy_identical=same, of=len(prompts))


def test_split_prefill_in_the_model_as_accurate(tmp_path):
    """Arm prefill.split (the chunks' dk-side work in a parallel pass, then the state pass) in the whole
    model: prefill logits of multi-chunk prompts, alone and in a varlen batch, are no further from the
    fp32 reference than the one-pass tensor-core kernel's, and greedy tokens agree with it."""
    pytest.importorskip("cupy")
    from engine.ops.gdn import chunk_split

    d = _small_ckpt(tmp_path)
    truth = _small_runner(d, "float32", "torch", eager=True)
    base = ("conv.chunk8", "prefill.tensorcore")
    one = _small_runner(d, "bfloat16", "cuda", eager=True, arms=base)
    split = _small_runner(d, "bfloat16", "cuda", eager=True, arms=(*base, "prefill.split"))
    nv = split.model.cfg.linear_num_value_heads
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert chunk_split.use_split(1, nv, 600, 600, sms, frozenset({"prefill.split"}))
    prompts = [[(7 * i + j * 13) % 400 for j in range(n)] for i, n in enumerate((600, 1, 63, 520))]
    errs = []
    for p in prompts:
        t = harness.ds_prefill_logits(truth, p)
        e_one, e_split = (
            ((harness.ds_prefill_logits(r, p) - t).norm() / t.norm()).item() for r in (one, split)
        )
        errs.append((e_one, e_split))
        assert e_split <= 1.5 * e_one + 1e-3, (len(p), e_one, e_split)
    a, b = generate(one, prompts, 16), generate(split, prompts, 16)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    report(test="split_prefill_model", rel_errs=errs, greedy_identical=same, of=len(prompts))
    assert same >= len(prompts) - 1, (a, b)


_NO_LIVE_BUILDS = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.generate import generate
    from engine.ops.compile import STATS
    from engine.worker.model_runner import ModelRunner

    arms = tuple(sys.argv[2].split(",")) if sys.argv[2] else ()
    mc = ModelConfig(
        model=sys.argv[1], dtype="bfloat16", device="cuda", load_format="dummy", kernel_arms=arms
    )
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(num_gpu_blocks_override=256),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128),
    )
    runner = ModelRunner(cfg)
    at_ready = len(STATS.names)
    # chunked prefills of 1..8 sequences, mixed steps (decodes + a chunk), then decodes
    prompts = [[(3 * i + 7 * j) % 400 for j in range(9 + 23 * i)] for i in range(8)]
    generate(runner, prompts, 12, token_budget=96)
    generate(runner, prompts[:3], 6, token_budget=128)
    print(json.dumps({"at_ready": at_ready, "live": STATS.names[at_ready:]}))
    """
)


@pytest.mark.parametrize("piecewise", [False, True], ids=["eager-prefill", "piecewise"])
def test_no_kernel_is_built_after_start_up(tmp_path, piecewise):
    """The start-up warm-up (engine/worker/warmup.py) builds every kernel variant serving steps use:
    in a fresh process (the per-process kernel cache empty), serving mixed, chunked and decode steps
    afterwards builds none (with the piecewise graphs, a default arm, and without them)."""
    from engine.ops.arms import DEFAULT_ARMS

    d = _small_ckpt(tmp_path)
    root = Path(__file__).resolve().parents[2]
    pw = {"graphs.piecewise"}
    arms = ",".join(sorted(DEFAULT_ARMS | pw if piecewise else DEFAULT_ARMS - pw))
    p = subprocess.run(
        [sys.executable, "-c", _NO_LIVE_BUILDS, str(d), arms],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["at_ready"] > 0, "the kernels were built at start-up"
    assert r["live"] == [], f"built while serving: {r['live']}"
    report(test="no_live_builds", at_ready=r["at_ready"], piecewise=piecewise)

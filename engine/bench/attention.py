"""``python -m engine.bench.attention``: the tensor-core paged attention (engine.ops.attention.cuda)
beside torch SDPA (flash backend, dense causal) and the fp32 torch reference op.

Qwen3.5-4B attention shapes: H 16, Hkv 4, D 256, KV block 32. Correctness first (every shape against
the fp32 reference), then CUDA-graph-replayed timings (engine.bench.kernels.time_graph: input sets
rotated so the KV does not sit in L2, median of 20 replays):
- decode at batch 1 / 8 / 32 / 64 over 1,100 cached tokens (+ the new one): us per layer and the
  bandwidth on the KV bytes read, as a fraction of the device copy bandwidth measured here;
- prefill 32 x 1,024 new tokens (no prefix) and mixed 2 x 1,024 + 32 decodes: us and causal TFLOP/s
  (4 * sum over sequences of q_len * mean visible keys * H * D) as a fraction of a measured
  8192^3 bf16 matmul;
- each shape again with the lazy O rescale (arm ``attention.lazy_rescale``);
- peers: SDPA flash on the dense causal prefill [32, 16, 1024, 256] (K/V expanded to 16 heads), and
  the reference op (eager, its own gathers) on decode 32 and prefill.
"""

from __future__ import annotations

import argparse
import sys

import torch

from engine.bench import kernels as B
from engine.ops import reference as ref
from engine.ops.attention import cuda as attn
from engine.ops.attention.batches import Batch, make_batch, reference_fp32, rel

H, HKV, D, BS, CTX = 16, 4, 256, 32, 1100
ROWS: list[tuple[str, str, str, float, str]] = []


graph_us = B.replay_us  # us per call of calls captured back to back in one CUDA graph


def copy_bandwidth() -> tuple[float, float]:
    """(memcpy, elementwise kernel) device copy bandwidth over 1 GiB, bytes read + written."""
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4
    memcpy = graph_us([lambda: dst.copy_(src)] * 10)
    kern = graph_us([lambda: torch.mul(src, 1.0, out=dst)] * 10)
    return nbytes / (memcpy * 1e-6), nbytes / (kern * 1e-6)


def matmul_rate() -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    us = graph_us([lambda: torch.mm(a, b)] * 10)
    return 2 * n**3 / (us * 1e-6)


def row(op: str, shape: str, impl: str, us: float, note: str) -> None:
    ROWS.append((op, shape, impl, us, note))
    print(f"  {op:<10}{shape:<24}{impl:<26}{us:>10.1f} us  {note}", flush=True)


def kv_bytes(batch: Batch) -> int:
    return sum(nc + ql for nc, ql in batch.specs) * HKV * D * 2 * 2  # K and V, bf16


def causal_flops(batch: Batch) -> float:
    total = 0.0
    for nc, ql in batch.specs:
        total += ql * (nc + (ql + 1) / 2)  # q_len x mean visible keys
    return 4 * total * H * D


LAZY = attn.LAZY_RESCALE_SLACK  # the rescale_slack of the arm attention.lazy_rescale


def call(batch: Batch, gate: bool = True, splits: int | None = None, shape=None, slack: float = 0.0):
    g = batch.gate if gate else None
    return lambda: attn.paged_attention(
        *batch.args(), gate=g, splits=splits, shape=shape, rescale_slack=slack
    )


def plan_of(batch: Batch, splits: int | None = None, shape=None) -> attn.Plan:
    return attn.make_plan(
        batch.q.shape[0],
        len(batch.specs),
        H,
        HKV,
        D,
        batch.max_query_len,
        batch.max_seq_len,
        attn.device_slots(torch.cuda.current_device(), D),
        lambda nw: attn.tile_shape(D, nw) if shape is None else shape,
        splits,
    )


def check(label: str, batch: Batch, splits: int | None = None, shape=None, slack: float = 0.0) -> bool:
    want = reference_fp32(batch, True)
    err = rel(call(batch, splits=splits, shape=shape, slack=slack)(), want)
    ref_err = rel(ref.paged_attention(*batch.args(), gate=batch.gate), want)
    plan = plan_of(batch, splits, shape)
    print(f"  check {label:<30} rel {err:.2e} (reference bf16 {ref_err:.2e}); {plan}", flush=True)
    return err < 5e-3


def sets(specs, nbytes: int, seed: int) -> list[Batch]:
    """Enough input sets that one graph replay streams >= 4x the L2 size (at least two)."""
    n = max(2, min(16, -(-4 * B.L2_BYTES // max(nbytes, 1))))
    return [make_batch(specs, BS, HKV, H // HKV, D, seed=seed + i) for i in range(n)]


DECODE_SHAPES = ((16, 1, 4), (32, 1, 2), (32, 1, 3))  # (BN, NW, stages) beside the default
SPLIT_SWEEP = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PREFILL_SHAPES = ((32, 8, 2), (16, 4, 3))
PREFILL_SPLITS = (1, 2, 3, 4)  # forced KV splits (the automatic choice is timed first)


def short(plan: attn.Plan) -> str:
    return f"bn{plan.tile_n} nw{plan.warps} st{plan.stages} s{plan.splits}"


def bench_decode(copy_bw: float, sweep: bool) -> None:
    for batch_size in (1, 8, 32, 64):
        specs = [(CTX, 1)] * batch_size
        one = make_batch(specs, BS, HKV, H // HKV, D, seed=1)
        if not check(f"decode b{batch_size}", one):
            raise SystemExit(f"decode b{batch_size}: wrong results")
        batches = sets(specs, kv_bytes(one), seed=100)
        floor = kv_bytes(one) / copy_bw * 1e6

        def note(us: float, nbytes: int = kv_bytes(one), floor: float = floor) -> str:
            bw = nbytes / (us * 1e-6)
            return f"{bw / 1e12:.2f} TB/s = {bw / copy_bw:.0%} copy; floor {floor:.1f} us"

        us = graph_us([call(b) for b in batches])
        row("decode", f"b{batch_size} x {CTX + 1}", f"cuda {short(plan_of(one))}", us, note(us))
        if check(f"decode b{batch_size} lazy rescale", one, slack=LAZY):
            us_lazy = graph_us([call(b, slack=LAZY) for b in batches])
            row("decode", f"b{batch_size} x {CTX + 1}", "cuda, lazy rescale", us_lazy, note(us_lazy))
        if batch_size == 32:
            us_ref = B.time_eager(lambda b=one: ref.paged_attention(*b.args(), gate=b.gate), reps=3)
            row("decode", f"b{batch_size} x {CTX + 1}", "reference op (eager)", us_ref, note(us_ref))
        for sh in ((None,) + DECODE_SHAPES) if sweep else ():
            if sh is not None and not check(f"decode b{batch_size} {sh}", one, shape=sh):
                continue
            for sp in SPLIT_SWEEP if sh is None else (None,):
                t = graph_us([call(b, splits=sp, shape=sh) for b in batches])
                print(f"    sweep decode b{batch_size} {short(plan_of(one, sp, sh))}: {t:.1f} us  {note(t)}")
        del batches, one
        torch.cuda.empty_cache()


def bench_prefill(mm_rate: float, sweep: bool) -> None:
    shapes = {
        "prefill 32 x 1024": [(0, 1024)] * 32,
        "mixed 2x1024 + 32 dec": [(CTX, 1)] * 32 + [(0, 1024)] * 2,
        "prefill 2 x 1024": [(0, 1024)] * 2,  # the step shapes of engine.bench.steps
        "prefill 1 x 1024": [(0, 1024)],
    }
    for label, specs in shapes.items():
        batch = make_batch(specs, BS, HKV, H // HKV, D, seed=7)
        if not check(label, batch):
            raise SystemExit(f"{label}: wrong results")
        fl = causal_flops(batch)

        def note(us: float, fl: float = fl) -> str:
            return f"{fl / us / 1e6:.1f} TFLOP/s = {fl / (us * 1e-6) / mm_rate:.1%} bf16 mm"

        us = graph_us([call(batch)] * 4)
        row("prefill", label, f"cuda {short(plan_of(batch))}", us, note(us))
        us_ng = graph_us([call(batch, gate=False)] * 4)
        row("prefill", label, "cuda, no gate", us_ng, note(us_ng))
        if check(f"{label} lazy rescale", batch, slack=LAZY):
            us_lazy = graph_us([call(batch, slack=LAZY)] * 4)
            row("prefill", label, "cuda, lazy rescale", us_lazy, note(us_lazy))
        us_ref = B.time_eager(lambda b=batch: ref.paged_attention(*b.args(), gate=b.gate), reps=2)
        row("prefill", label, "reference op (eager)", us_ref, note(us_ref))
        if label.startswith("prefill 32"):
            sdpa_peer(batch, fl, mm_rate)
        for sp in PREFILL_SPLITS if sweep else ():
            t = graph_us([call(batch, splits=sp)] * 4)
            print(f"    sweep {label} {short(plan_of(batch, sp))}: {t:.1f} us  {note(t)}", flush=True)
        for sh in PREFILL_SHAPES if sweep else ():
            if check(f"{label} {sh}", batch, shape=sh):
                t = graph_us([call(batch, shape=sh)] * 4)
                print(
                    f"    sweep {label} {short(plan_of(batch, None, sh))}: {t:.1f} us  {note(t)}", flush=True
                )
        del batch
        torch.cuda.empty_cache()


def sdpa_peer(batch: Batch, flops: float, mm_rate: float) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    nseq, L = len(batch.specs), batch.max_query_len
    q = batch.q.view(nseq, L, H, D).transpose(1, 2)  # [B, H, L, D]
    kv = torch.randn(2, nseq, H, L, D, device="cuda").to(torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        us = graph_us(
            [lambda: torch.nn.functional.scaled_dot_product_attention(q, kv[0], kv[1], is_causal=True)] * 4
        )
    row(
        "prefill",
        "prefill 32 x 1024",
        "torch SDPA flash (dense)",
        us,
        f"{flops / us / 1e6:.1f} TFLOP/s = {flops / (us * 1e-6) / mm_rate:.1%} bf16 mm",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", choices=("decode", "prefill"), action="append", default=[])
    p.add_argument("--sweep", action="store_true", help="also time other tile shapes and split counts")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    mm_rate = matmul_rate()  # first: it also brings the clocks up
    memcpy_bw, kernel_bw = copy_bandwidth()
    copy_bw = max(memcpy_bw, kernel_bw)
    rates = (
        f"copy {copy_bw / 1e12:.2f} TB/s (memcpy {memcpy_bw / 1e12:.2f}, elementwise {kernel_bw / 1e12:.2f})"
    )
    rates += f", bf16 matmul 8192^3 {mm_rate / 1e12:.0f} TFLOP/s"
    print(f"  measured {rates}", flush=True)
    if "decode" not in args.skip:
        bench_decode(copy_bw, args.sweep)
    if "prefill" not in args.skip:
        bench_prefill(mm_rate, args.sweep)
    print(f"\nmeasured {rates}")
    print("| op | shape | impl | us | note |\n|---|---|---|---|---|")
    for op, shape, impl, us, note in ROWS:
        print(f"| {op} | {shape} | {impl} | {us:.1f} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

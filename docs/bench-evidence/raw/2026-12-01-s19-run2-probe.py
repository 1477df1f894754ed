"""Session 19 memory probe: where the piecewise graphs' device memory goes, bucket by bucket (an eager
pass over the pieces first, then the capture), and what the CUDA context's stack reservation costs."""
import subprocess
import sys

import torch

MiB = 2**20


def used():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / MiB, torch.cuda.memory_reserved() / MiB


if sys.argv[1:] == ["stack"]:
    import cupy

    torch.zeros(1, device="cuda")
    base = used()[0]
    lim = cupy.cuda.runtime.deviceGetLimit(0)  # cudaLimitStackSize
    print(f"context after torch init: {base:.0f} MiB; stack limit {lim} B")
    for v in (256, 4096, 1024):
        cupy.cuda.runtime.deviceSetLimit(0, v)
        print(f"stack {v} B: {used()[0]:.0f} MiB (delta {used()[0] - base:+.0f})")
    a = torch.randn(2048, 2560, device="cuda", dtype=torch.bfloat16)
    (a @ a.t()).sum().item()
    print(f"after a bf16 matmul (cuBLAS handle + workspace): {used()[0]:.0f} MiB")
    sys.exit(0)

print(subprocess.run([sys.executable, __file__, "stack"], capture_output=True, text=True).stdout)
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig  # noqa: E402
from engine.worker.cuda_graphs import capture_stream  # noqa: E402
from engine.worker.model_runner import ModelRunner  # noqa: E402
from engine.worker.piecewise import PiecewiseGraphs  # noqa: E402

M = sys.argv[1]
cfg = EngineConfig(
    model=ModelConfig(model=M, load_format="dummy", enforce_eager=True),
    cache=CacheConfig(num_gpu_blocks_override=1280),
    scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=2048),
)
runner = ModelRunner(cfg)
dev = torch.device("cuda")
print(f"runner (eager, W1 pools): {used()[0]:.0f} MiB device, {used()[1]:.0f} MiB torch")
u0 = used()
pw = PiecewiseGraphs(runner.model, 2048, dev)
u1 = used()
print(f"static buffers: {u1[0] - u0[0]:+.0f} MiB device, {u1[1] - u0[1]:+.0f} torch")
print(f"{'bucket':>7}{'eager dev':>10}{'torch':>7}{'capture dev':>12}{'torch':>7}")
tot_e = tot_c = 0.0
for tb in reversed(pw.buckets):
    a = used()
    side = capture_stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for k in range(pw.num_layers + 1):
            pw.piece(k, tb)
    torch.cuda.current_stream().wait_stream(side)
    b = used()
    pw.capture(tb)
    c = used()
    tot_e += b[0] - a[0]
    tot_c += c[0] - b[0]
    print(f"{tb:>7}{b[0] - a[0]:>+10.0f}{b[1] - a[1]:>+7.0f}{c[0] - b[0]:>+12.0f}{c[1] - b[1]:>+7.0f}")
print(f"sum: eager passes {tot_e:+.0f} MiB, captures {tot_c:+.0f} MiB; total {used()[0] - u0[0]:+.0f} MiB device, {used()[1] - u0[1]:+.0f} torch")
n = sum(len(g) for g in pw.graphs.values())
del pw
print(f"after releasing the {n} graphs: {used()[0] - u0[0]:+.0f} MiB device vs before them, {used()[1] - u0[1]:+.0f} torch")

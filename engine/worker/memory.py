"""Device-memory budget and accounting for the model runner (CUDA only).

The runner sizes its pools in this order: weights are loaded, the GDN state pool is allocated, one
profile forward runs at the full token budget (its activation peak is measured and its blocks stay in
torch's cache as the step workspace), the largest decode graph is captured, and only then is the KV
pool sized from what is left under the budget (or fixed by ``--num-gpu-blocks-override`` /
``--kv-cache-memory``). :class:`MemorySplit` is the resulting account: every byte that
``cudaMemGetInfo`` reports in use lands in exactly one part.

Budget: ``--gpu-memory-utilization`` is a fraction of the whole device for the whole process (weights,
pools, graphs, workspace, CUDA context), as in vLLM. ``--device-memory-limit`` makes the device look
smaller (a 16 GiB card on an H200): the fraction applies to the limit, and torch's allocator is capped
there too so the process fails at start-up rather than using memory a real 16 GiB card does not have.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, what: str) -> int:
    """``"3GiB"``, ``"16G"``, ``"512MiB"`` or a plain byte count -> bytes; ``""`` -> 0 (unset)."""
    if not text:
        return 0
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"{what}: expected a size such as 3GiB, 16G or 1073741824, got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class MemorySplit:
    """Where the device memory in use went, in bytes, measured once the pools and graphs exist."""

    weights: int
    """Model parameters (tied embedding counted once)."""
    kv_cache: int
    """Paged K and V for every full-attention layer."""
    state_pool: int
    """GDN conv + recurrent state slots for every GDN layer (the recurrent state in the ssm dtype)."""
    cuda_graphs: int
    """torch memory reserved while capturing decode graphs at start-up."""
    workspace: int
    """torch's cached blocks: the step activations at the full token budget and allocator slack."""
    non_torch: int
    """Outside torch's allocator: CUDA context, kernel modules (CuPy/NVRTC, cuBLAS), driver pools."""
    free: int
    """Free on the device (or under --device-memory-limit)."""
    total: int
    """The device's memory, or --device-memory-limit."""
    activation_peak: int = 0
    """The profile step's peak of transient tensors (part of ``workspace``), for reference."""
    state_pool_full: int = 0
    """What the GDN state pools hold with every slot in use, which the memory plan budgets; above
    ``state_pool`` when slots are mapped on demand (``--gdn-state-memory``), for reference."""

    @property
    def used(self) -> int:
        return (
            self.weights
            + self.kv_cache
            + self.state_pool
            + self.cuda_graphs
            + self.workspace
            + self.non_torch
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def log_line(self, ssm_dtype: str = "float32") -> str:
        """One line for the start-up log; ``ssm_dtype`` names the recurrent state's storage dtype."""
        parts = ("weights", "kv_cache", "state_pool", "cuda_graphs", "workspace", "non_torch")
        state = f"{ssm_dtype} recurrent state"
        if self.state_pool_full > self.state_pool:
            state += f", on demand: {gib(self.state_pool_full)} with every slot in use"
        label = {"state_pool": f"state_pool ({state})"}
        body = ", ".join(f"{label.get(p, p)} {gib(getattr(self, p))}" for p in parts)
        return (
            f"device memory: {body}; in use {gib(self.used)} of {gib(self.total)}, free {gib(self.free)} "
            f"(activation peak at the full token budget {gib(self.activation_peak)})"
        )


def measure_split(
    *,
    weights: int,
    kv_cache: int,
    state_pool: int,
    cuda_graphs: int,
    activation_peak: int,
    torch_reserved: int,
    device_used: int,
    total: int,
    state_outside_torch: int = 0,
    state_pool_full: int = 0,
) -> MemorySplit:
    """Split ``device_used`` (cudaMemGetInfo) into parts. The tensors' sizes are exact; torch's reserved
    memory beyond the tensors and the graphs is its cached workspace; what lies outside torch's
    reservations is the context and the other libraries' memory, less ``state_outside_torch`` (the
    part of ``state_pool`` mapped outside torch's allocator: an on-demand recurrent state)."""
    tensors = weights + kv_cache + state_pool - state_outside_torch
    workspace = max(0, torch_reserved - tensors - cuda_graphs)
    non_torch = max(0, device_used - torch_reserved - state_outside_torch)
    return MemorySplit(
        weights=weights,
        kv_cache=kv_cache,
        state_pool=state_pool,
        cuda_graphs=cuda_graphs,
        workspace=workspace,
        non_torch=non_torch,
        free=max(0, total - device_used),
        total=total,
        activation_peak=activation_peak,
        state_pool_full=max(state_pool_full, state_pool),
    )


def workspace_reserve(activation_peak: int, max_num_seqs: int, vocab_size: int) -> int:
    """Bytes kept free for a step's transient tensors: the profile forward's measured peak with 25%
    headroom, plus four fp32 [max_num_seqs, vocab] sampling rows (softmax, noise, sort) that the
    profile forward does not allocate; never less than 256 MiB."""
    return max(int(activation_peak * 1.25) + 4 * max_num_seqs * vocab_size * 4, 256 << 20)


def plan_pools(
    *,
    room: int,
    wanted_slots: int,
    slot_bytes: int,
    block_bytes: int,
    fixed_kv: int,
    kv_floor: int,
) -> tuple[int, int]:
    """(GDN state slots, KV blocks), neither counting its reserved index 0, from ``room`` bytes (the
    budget minus what is in use, the step workspace and the graph pool). Slots come first, as many of
    ``wanted_slots`` as fit beside the reserved slot 0 and ``kv_floor`` bytes of KV; the KV pool is
    ``fixed_kv`` bytes when that is set, else what the slots leave."""
    room -= slot_bytes  # slot 0, the padding slot, is allocated too
    slots = max(0, min(wanted_slots, (room - (fixed_kv or kv_floor)) // max(slot_bytes, 1)))
    kv = fixed_kv or room - slots * slot_bytes
    return slots, max(0, kv // block_bytes)


def log_startup(r: Any, out: logging.Logger) -> None:
    """The start-up lines of a model runner ``r``, on its logger ``out``: capacity in requests and
    tokens, and on CUDA the memory split (``r.memory``) and the kernel builds."""
    from engine.model.cache import kv_bytes_per_block
    from engine.ops.compile import SLOW_COMPILE_S
    from engine.ops.compile import STATS as KERNEL_BUILDS

    kv_tokens = (r.num_kv_blocks - 1) * r.block_size
    ssm_dtype = r.cache_config.mamba_ssm_cache_dtype
    out.info(
        "capacity: %d concurrent requests (GDN state slots, %.1f MiB, recurrent state in %s%s), %d KV "
        "tokens in %d blocks of %d (%.1f MiB; %.1f requests at the full max_model_len %d)",
        r.num_state_slots - 1,
        r.cache.state_reserved_bytes / 2**20,
        ssm_dtype,
        ", mapped as requests first use them" if r.cache.grown is not None else "",
        kv_tokens,
        r.num_kv_blocks - 1,
        r.block_size,
        r.num_kv_blocks * kv_bytes_per_block(r.cache_spec, r.block_size, r.dtype) / 2**20,
        kv_tokens / r.max_model_len,
        r.max_model_len,
    )
    if r.memory is None:
        return
    out.info(
        "%s; thread stacks %s bytes; expandable segments %s; CUBLAS_WORKSPACE_CONFIG %s",
        r.memory.log_line(ssm_dtype),
        stack_limit(),
        "on" if r.expandable_segments else "off",
        os.environ.get("CUBLAS_WORKSPACE_CONFIG", "(torch's default)"),
    )
    out.info(
        "kernels: %d modules built in %.1f s, %d of them over %.1f s each (NVRTC compiles; a load "
        "from CuPy's disk cache takes milliseconds)",
        len(KERNEL_BUILDS.names),
        KERNEL_BUILDS.seconds,
        len(KERNEL_BUILDS.slow),
        SLOW_COMPILE_S,
    )


# torch gives each (cuBLAS handle, stream) one workspace, shared with cuBLASLt, of 32 MiB on sm_90,
# sm_100 and sm_120 (4 MiB x 2 + 16 KiB x 8 elsewhere) unless CUBLAS_WORKSPACE_CONFIG says otherwise.
# 16 MiB ran the 4B's GEMMs of decode (16-64 rows) and prefill (1,024 / 2,048 rows) steps as fast as
# 32 on the H200 (three rotated rounds) and took W1's peak from 11,791 to 11,723 MiB; 8 MiB saved
# 76 but its decode GEMMs were 1-2% slower (split-K on the 2,560-row outputs).
# docs/bench-evidence/2026-12-04-s37.md, runs 2-3.
CUBLAS_WORKSPACE = ":4096:4:16:8"


def size_cublas_workspace() -> str:
    """Ask torch for a ``CUBLAS_WORKSPACE`` cuBLAS workspace unless ``CUBLAS_WORKSPACE_CONFIG`` is
    already set (the user's choice stands); returns the setting in effect. torch reads it once, at the
    process's first cuBLAS call, so call it before any GEMM."""
    return os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def configure_cuda_memory() -> bool:
    """The runner's allocator settings, before its first allocation: the cuBLAS workspace size and
    expandable segments (returned: True when on)."""
    size_cublas_workspace()
    return use_expandable_segments()


def use_expandable_segments() -> bool:
    """Have torch's allocator grow one mapped segment per stream (``expandable_segments:True``)
    instead of caching separate cudaMalloc blocks, unless ``PYTORCH_CUDA_ALLOC_CONF`` (or
    ``PYTORCH_ALLOC_CONF``) already chooses; True when it is on. Blocks of one size cannot serve a
    request of another, so with fixed segments a serving step's transients kept claiming new memory:
    W1's peak at 32 slots was 11,945 MiB, 11,819 with expandable segments, in the same session
    (docs/bench-evidence/2026-12-01-memory-s20.md). Call it before the runner allocates anything:
    segments made before keep their kind."""
    import torch

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "expandable_segments" in conf:
        return "expandable_segments:true" in conf.replace(" ", "").lower()
    setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if setter is None:  # a torch without the runtime switch: fixed segments, as before
        log.warning("torch has no allocator settings switch: expandable segments stay off")
        return False
    setter("expandable_segments:True")
    return True


# cudaLimitStackSize. The CUDA context reserves this much local memory per thread for every thread the
# device can hold at once; the driver's default of 1 KiB costs 264 MiB on an H200 (132 SMs x 2,048
# threads; 198 MiB of it freed at 256 bytes, measured in docs/bench-evidence/2026-12-01-memory-s19.md),
# 105 MiB on the RTX 5070 Ti (70 x 1,536). No kernel here needs a stack frame near that, and the driver
# grows the reservation by itself for any launch that needs more (it "automatically increases the
# per-thread stack size for each kernel launch as needed" and keeps it), so the runner asks for none
# and lets the kernels it actually runs (warm-up and graph captures included) size it.
STACK_BYTES = 0
_LIMIT_STACK_SIZE = 0  # enum cudaLimit: cudaLimitStackSize


def stack_limit() -> int | None:
    """The context's per-thread stack reservation in bytes, or None without CuPy."""
    try:
        import cupy
    except ImportError:
        return None
    return int(cupy.cuda.runtime.deviceGetLimit(_LIMIT_STACK_SIZE))


def shrink_thread_stacks(device: Any, stack_bytes: int = STACK_BYTES) -> tuple[int, int, int] | None:
    """Ask the CUDA context of ``device`` (a torch.device) for ``stack_bytes`` of stack per thread and log
    it -> (bytes per thread before, bytes the driver set, device bytes freed), or None without CuPy.
    Call it before the first kernel runs: the driver blocks until queued work is done."""
    try:
        import cupy
    except ImportError:
        return None
    import torch

    rt = cupy.cuda.runtime
    torch.cuda.init()
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index), cupy.cuda.Device(index):
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        before = int(rt.deviceGetLimit(_LIMIT_STACK_SIZE))
        try:
            rt.deviceSetLimit(_LIMIT_STACK_SIZE, stack_bytes)
        except rt.CUDARuntimeError as e:  # a memory saving only: serve with the driver's default
            log.warning("CUDA thread stacks left at %d bytes per thread: %s", before, e)
            return None
        now = int(rt.deviceGetLimit(_LIMIT_STACK_SIZE))
        freed = torch.cuda.mem_get_info()[0] - free_before
    log.info(
        "CUDA thread stacks: %d -> %d bytes per thread, %.0f MiB of the context's reservation freed (the "
        "driver grows it again for any kernel that needs more)",
        before,
        now,
        freed / 2**20,
    )
    return before, now, freed


def device_total(device: Any, limit_text: str) -> int:
    """The device's memory, or --device-memory-limit (torch's allocator is then capped there)."""
    import torch

    total = torch.cuda.mem_get_info(device)[1]
    limit = parse_bytes(limit_text, "--device-memory-limit")
    if not limit or limit >= total:
        return total
    # what lies outside torch's allocator (the CUDA context) counts against the limit too
    outside = total - torch.cuda.mem_get_info(device)[0] - torch.cuda.memory_reserved(device)
    # the hard wall is the card itself; --gpu-memory-utilization is the planning target under it
    cap = (limit - outside) / total
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(max(cap, 0.01), index)
    return limit

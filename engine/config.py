"""Frozen configuration, one dataclass per component.

Each field's docstring is its CLI help (``engine.cli`` reads them; a ``Literal`` type gives the flag
its choices). "auto" values are resolved once at start-up by ``engine.worker.resolve.resolve_model``
into new frozen objects, which are logged; nothing mutates a config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
LoadFormat = Literal["auto", "safetensors", "dummy"]
GdnBackend = Literal["auto", "torch", "cuda"]
GraphCapture = Literal["lazy", "startup"]
SsmCacheDtype = Literal["auto", "float32", "bfloat16"]


@dataclass(frozen=True)
class ModelConfig:
    model: str = ""
    """Checkpoint directory (HF layout). Empty: the embedded tiny model (written to the cache dir once)."""
    served_model_name: str = ""
    """Name clients send as `model`; defaults to the checkpoint directory's name."""
    dtype: Dtype = "auto"
    """bfloat16, float16, float32 or auto (bfloat16 on CUDA, float32 on CPU)."""
    load_format: LoadFormat = "auto"
    """auto (safetensors) or dummy (seeded random weights of the exact shapes)."""
    device: str = "auto"
    """cuda, cpu or auto (cuda when available)."""
    gdn_backend: GdnBackend = "auto"
    """torch (reference ops) or cuda (CuPy kernels); auto = cuda on GPU when CuPy imports, else torch."""
    kernel_arms: tuple[str, ...] = ()
    """The full set of kernel variants (arms) to use; empty = the defaults (conv.chunk8 conv.k4
    conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused
    attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill graphs.mixed).
    Also known: attention.lazy_rescale, sample.argmax (the registry: engine/ops/arms.py)."""
    max_model_len: int = 0
    """Context length (prompt + output); 0 = the model's max_position_embeddings capped at 32768."""
    seed: int = 0
    """Seed for dummy weights and unseeded sampling."""
    enforce_eager: bool = False
    """Never replay decode steps from CUDA graphs (graphs are used on CUDA otherwise)."""
    cuda_graph_capture: GraphCapture = "startup"
    """When the decode graphs are captured: startup (every (batch, KV blocks) bucket before serving,
    a few seconds longer start, no capture while requests wait) or lazy (the largest bucket at
    start-up, every other one on its first step: ~80 ms each on the 4B, paid while serving)."""
    profile_steps: str = ""
    """START:COUNT: profile the device over serving steps START .. START + COUNT - 1 (CUDA): each step's
    kernel time and the device's idle time before, between and after its kernels (the host's share
    of the step), by step kind, logged once the window has run and, with --profile-dir, written as
    step-profile.json beside the torch profiler's trace.json. Serving pauses a few seconds then.
    Empty: off (engine/worker/step_profile.py)."""
    profile_dir: str = ""
    """Where --profile-steps writes step-profile.json and trace.json (empty: the summary is only logged)."""
    generation_config: str = "auto"
    """Sampling defaults for requests that omit them: auto (the checkpoint's generation_config.json),
    vllm (ignore it), or a directory holding a generation_config.json."""


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 32
    """Tokens per paged-KV block."""
    num_gpu_blocks_override: int = 0
    """KV blocks to allocate (0 = from free memory on GPU, from max_num_seqs x max_model_len on CPU)."""
    gpu_memory_utilization: float = 0.85
    """Fraction of the device's memory the whole engine process may use (weights, pools, CUDA graphs,
    step workspace, CUDA context); the KV pool gets what is left (as in vLLM)."""
    kv_cache_memory: str = ""
    """Fix the KV pool's size in bytes instead (e.g. 3GiB, 1.5G, 1073741824; vLLM's name)."""
    device_memory_limit: str = ""
    """Treat the device as having this much memory (e.g. 16GiB to run as on a 16 GB card): the
    utilization applies to it and torch's allocator is capped there."""
    gdn_state_memory: Literal["on-demand", "upfront"] = "on-demand"
    """How the GDN state slots take device memory (CUDA kernels; the torch ops always allocate
    upfront): on-demand reserves every slot's address range and budget at start-up but maps a slot's
    recurrent state when a request first uses it, so the pool holds what the most requests run at once
    needed; upfront allocates every slot at start-up."""
    mamba_ssm_cache_dtype: SsmCacheDtype = "auto"
    """Storage dtype of the GDN recurrent-state pool: float32, bfloat16 (half the memory per state
    slot; the math stays fp32, the state is rounded once per step: lossy) or auto (the checkpoint's
    mamba_ssm_dtype, else float32; vLLM's name)."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    """Token budget per engine step (decodes first, then prefill chunks)."""
    max_num_seqs: int = 64
    """Most sequences in one step; also the number of GDN state slots."""
    max_waiting_requests: int = 1024
    """Queue bound: beyond it new requests get 503 with Retry-After."""
    async_scheduling: bool = True
    """Schedule and launch a decode step before the previous step's tokens reach the host (they are fed
    to it on the device), so the host's work per step overlaps the device's; off: one step at a time."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8000
    """Port to listen on."""
    api_key: str = ""
    """If set, every route but /health needs `Authorization: Bearer <key>`."""
    admission_window_ms: float = 0.0
    """Requests arriving within this window travel to the engine as one wave (0 = same event-loop turn)."""
    max_request_bytes: int = 8 * 1024 * 1024
    """Largest accepted HTTP body."""
    engine_stall_timeout_s: float = 30.0
    """/ready turns 503 when requests wait and no engine step finished for this long."""
    request_timeout_s: float = 600.0
    """A request still running after this long is aborted."""
    body_read_timeout_s: float = 30.0
    """A request body not fully received this long after its head is cut off with 408."""
    max_connections: int = 2048
    """Open connections beyond which the oldest one still sending its request is closed."""
    reasoning_parser: str = ""
    """qwen3: chat output between <think> and </think> becomes reasoning_content (empty: off)."""
    enable_auto_tool_choice: bool = False
    """Parse the model's tool calls into tool_calls when tools are sent (needs --tool-call-parser)."""
    tool_call_parser: str = ""
    """qwen3_coder (Qwen3.5's XML tool calls) or hermes (JSON inside <tool_call>)."""


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


def default_cache_dir() -> Path:
    """Where the embedded tiny model is written: $DELTASERVE_CACHE or ~/.cache/deltaserve."""
    env = os.environ.get("DELTASERVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "deltaserve"

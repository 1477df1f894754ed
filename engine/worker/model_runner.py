"""ModelRunner: owns the model, the memory pools and the sampler; runs one scheduled step.

``execute(batch) -> logits`` is the model call; ``execute_model(seqs)`` builds the ForwardBatch
on the host (no device sync), runs it and samples on device. Pool sizes are decided here, once:
state slots = ``max_num_seqs + 1`` (slot 0 reserved), KV blocks from the override or from free
device memory measured after a warm-up forward at the full token budget.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.model.cache import ModelCache, kv_bytes_per_block, state_bytes_per_slot
from engine.model.forward_batch import ForwardBatch, SeqSpec
from engine.model.loader import build_model
from engine.ops import make_ops
from engine.worker.cuda_graphs import MAX_GRAPH_KV_TOKENS, DecodeGraphs
from engine.worker.prompt_logprobs import prompt_logprobs, wants_prompt_logprobs
from engine.worker.resolve import resolve_model
from engine.worker.sampler import Sampler
from engine.worker.step import SamplerOutput, ScheduledSeq

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def read_eos_ids(path: Path, fallback: tuple[int, ...]) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (Qwen3.5 lists both <|im_end|> and <|endoftext|>)."""
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(eos, int):
            return (eos,)
        if isinstance(eos, list) and eos:
            return tuple(int(e) for e in eos)
    return fallback


class ModelRunner:
    def __init__(self, config: EngineConfig):
        mc = resolve_model(config.model)
        self.model_config = mc
        self.device = torch.device(mc.device)
        if mc.dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {mc.dtype!r} (bfloat16, float16 or float32)")
        self.dtype = DTYPES[mc.dtype]
        # Backend and arms were settled by resolve_model: build exactly what the config says.
        self.gdn_backend = mc.gdn_backend
        self.ops = make_ops(mc.gdn_backend, frozenset(mc.kernel_arms))
        self.model = build_model(mc.model, self.ops, self.dtype, self.device, mc.load_format, mc.seed)
        cfg = self.model.cfg
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = read_eos_ids(Path(mc.model), cfg.eos_token_ids)
        self.max_model_len = mc.max_model_len or min(cfg.max_position_embeddings, 32768)
        self.block_size = config.cache.block_size
        sc = config.scheduler
        self.num_state_slots = sc.max_num_seqs + 1
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        self._peak = 0
        self.cache_spec = self.model.cache_spec()
        self.num_kv_blocks = self._size_kv_pool(config)
        self.cache = ModelCache.allocate(
            self.cache_spec,
            self.num_kv_blocks,
            self.block_size,
            self.num_state_slots,
            self.dtype,
            self.device,
        )
        self.sampler = Sampler(self.device, mc.seed, self.eos_token_ids)
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda" and not mc.enforce_eager:
            max_blocks = math.ceil(self.max_model_len / self.block_size)
            self.graphs = DecodeGraphs(self.model, self.cache, sc.max_num_seqs, max_blocks)
        kv_tokens = (self.num_kv_blocks - 1) * self.block_size
        log.info(
            "capacity: %d concurrent requests (GDN state slots, %.1f MiB), %d KV tokens in %d blocks of %d "
            "(%.1f MiB; %.1f requests at the full max_model_len %d)",
            self.num_state_slots - 1,
            self.num_state_slots * state_bytes_per_slot(self.cache_spec, self.dtype) / 2**20,
            kv_tokens,
            self.num_kv_blocks - 1,
            self.block_size,
            self.num_kv_blocks * kv_bytes_per_block(self.cache_spec, self.block_size, self.dtype) / 2**20,
            kv_tokens / self.max_model_len,
            self.max_model_len,
        )

    def _size_kv_pool(self, config: EngineConfig) -> int:
        cs, bs = self.cache_spec, self.block_size
        if config.cache.num_gpu_blocks_override:
            return config.cache.num_gpu_blocks_override + 1  # + the reserved null block
        if self.device.type != "cuda":
            per_seq = math.ceil(min(self.max_model_len, 8192) / bs)
            return config.scheduler.max_num_seqs * per_seq + 1
        # Warm up at the full token budget with a minimal pool to measure activation memory.
        budget = config.scheduler.max_num_batched_tokens
        probe_blocks = math.ceil(budget / bs) + 1
        self.cache = ModelCache.allocate(cs, probe_blocks, bs, 2, self.dtype, self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        spec = SeqSpec(
            token_ids=[0] * budget, num_computed=0, block_ids=list(range(1, probe_blocks)), state_slot=1
        )
        self.execute(ForwardBatch.build([spec], bs, self.device))
        torch.cuda.synchronize(self.device)
        activation = torch.cuda.max_memory_allocated(self.device) - torch.cuda.memory_allocated(self.device)
        del self.cache
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        allowed = total * config.cache.gpu_memory_utilization - (total - free)
        states = self.num_state_slots * state_bytes_per_slot(self.cache_spec, self.dtype)
        # Decode graphs keep their own pool: the padded KV of the largest graph bucket, bf16 + fp32.
        graphs = (
            0 if config.model.enforce_eager else MAX_GRAPH_KV_TOKENS * 2 * math.prod(cs.kv_token_shape) * 6
        )
        avail = allowed - states - activation * 1.2 - graphs
        blocks = int(avail // kv_bytes_per_block(cs, bs, self.dtype))
        if blocks < 2:
            raise RuntimeError(
                f"not enough device memory for the KV cache: {avail / 2**30:.2f} GiB left after weights, "
                f"{states / 2**30:.2f} GiB of GDN state and {activation / 2**30:.2f} GiB of activations"
            )
        return blocks

    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]`` in fp32."""
        return self.model(batch, self.cache)

    def execute_model(self, seqs: list[ScheduledSeq]) -> SamplerOutput:
        scored: list = []
        if wants_prompt_logprobs(seqs):
            # The prompt's own hidden states are kept for scoring, so this step runs eagerly.
            fb = ForwardBatch.build(seqs, self.block_size, self.device)
            hidden = self.model.hidden_states(fb, self.cache)
            logits = self.model.compute_logits(hidden[fb.logits_indices])
            scored = prompt_logprobs(self.model.compute_logits, hidden, seqs, fb.query_start_loc_cpu)
        else:
            key = self.graphs.bucket(seqs) if self.graphs is not None else None
            if key is not None:
                logits = self.graphs.run(seqs, key)  # type: ignore[union-attr]
            else:
                logits = self.execute(ForwardBatch.build(seqs, self.block_size, self.device))
        sampled = [s for s in seqs if s.sample]
        if not sampled:
            return SamplerOutput([], [], scored)
        ids, logprobs = self.sampler.sample(
            logits,
            [s.params for s in sampled],
            [s.num_output for s in sampled],
            [s.history for s in sampled],
            [s.num_prompt for s in sampled],
        )
        return SamplerOutput(ids, logprobs, scored)

    def device_memory(self) -> tuple[int, int]:
        """(bytes in use on the device now, peak seen at step ends); includes CuPy and the CUDA context.

        EngineCore reads this at the end of every step, which is where the peak is sampled."""
        if self.device.type != "cuda":
            return 0, 0
        free, total = torch.cuda.mem_get_info(self.device)
        self._peak = max(self._peak, total - free)
        return total - free, self._peak

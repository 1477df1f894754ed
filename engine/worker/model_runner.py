"""ModelRunner: owns the model, the memory pools and the sampler; runs one scheduled step.

``execute(batch) -> logits`` is the model call; ``execute_model(seqs)`` builds the step on the host (no
device sync), runs it (a decode graph, a whole-step graph, the piecewise graphs or eagerly) and samples
on device. Pool sizes are decided here, once (engine/worker/memory.py): state slots = ``max_num_seqs +
1`` (slot 0 reserved) or as many as the budget holds, KV blocks from the override, ``--kv-cache-memory``
or what the budget leaves after the warm-up steps (engine/worker/warmup.py) and the graphs, all
measured on a small profile pool."""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.model.cache import ModelCache, kv_bytes_per_block, state_bytes_per_slot
from engine.model.forward_batch import ForwardBatch
from engine.model.loader import build_model
from engine.ops import make_ops
from engine.ops.compile import device_cc
from engine.worker.cuda_graphs import DecodeGraphs, PoolHandle, capture_stream
from engine.worker.launched import Launched, patch_inputs, read_eos_ids
from engine.worker.memory import (
    MemorySplit,
    configure_cuda_memory,
    device_total,
    gib,
    log_startup,
    measure_split,
    parse_bytes,
    plan_pools,
    shrink_thread_stacks,
    workspace_reserve,
)
from engine.worker.piecewise import PiecewiseGraphs, build_piecewise
from engine.worker.prefill_graphs import MAX_TOKENS as PREFILL_GRAPH_TOKENS
from engine.worker.prefill_graphs import PrefillGraphs
from engine.worker.prompt_logprobs import prompt_logprobs, wants_prompt_logprobs
from engine.worker.resolve import kernels_for_device, resolve_cache, resolve_model
from engine.worker.sampler import Sampler
from engine.worker.step import PendingStep, SamplerOutput, ScheduledSeq
from engine.worker.step_profile import make_profiler
from engine.worker.warmup import probe_pool_size, warmup_batches

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ModelRunner:
    def __init__(self, config: EngineConfig):
        mc = resolve_model(config.model)
        self.device = torch.device(mc.device)
        self.stream: torch.cuda.Stream | None = None
        self.expandable_segments = False
        if self.device.type == "cuda":
            self.expandable_segments = configure_cuda_memory()  # before the first allocation
            shrink_thread_stacks(self.device)  # before any kernel: the context's stack reservation
            # Everything runs on the capture stream (one cuBLAS workspace, one allocator stream:
            # cuda_graphs.capture_stream); launch() and execute() enter it from any thread.
            self.stream = capture_stream(self.device)
            torch.cuda.set_stream(self.stream)
            mc = kernels_for_device(mc, device_cc())  # the sm_80 floor, asked once the context exists
        self.model_config = mc
        if mc.dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {mc.dtype!r} (bfloat16, float16 or float32)")
        self.dtype = DTYPES[mc.dtype]
        self.gdn_backend = mc.gdn_backend  # settled by resolve_model (+ kernels_for_device): build that
        self.ops = make_ops(mc.gdn_backend, frozenset(mc.kernel_arms))
        # the CUDA kernels never touch a slot <= 0, so the GDN layers can share one padding row
        self.shared_pad_slot = self.device.type == "cuda" and mc.gdn_backend == "cuda"
        # and never map slot 0: each slot's recurrent state is mapped when a request first uses it
        self.state_on_demand = self.shared_pad_slot and config.cache.gdn_state_memory == "on-demand"
        self.pdl = "graphs.pdl" in mc.kernel_arms  # how the decode graphs launch (engine/ops/launch_ex.py)
        self.model = build_model(mc.model, self.ops, self.dtype, self.device, mc.load_format, mc.seed)
        cfg = self.model.cfg
        self.cache_spec = self.model.cache_spec()
        # the recurrent-state pool's dtype (--mamba-ssm-cache-dtype, settled once); the ops compute in fp32
        self.cache_config = resolve_cache(config.cache, mc.model)
        self.ssm_dtype = DTYPES[self.cache_config.mamba_ssm_cache_dtype]
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = read_eos_ids(Path(mc.model), cfg.eos_token_ids)
        self.max_model_len = mc.max_model_len or min(cfg.max_position_embeddings, 32768)
        self.block_size = config.cache.block_size
        sc = config.scheduler
        self._max_seqs = sc.max_num_seqs
        self._activation_peak = 0
        self._total = 0  # the device's memory, or --device-memory-limit (set by _plan_cuda)
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        self._peak = 0
        self.memory: MemorySplit | None = None
        self.graphs: DecodeGraphs | None = None
        # arm graphs.piecewise: mixed and prefill steps (built by _plan_cuda, kept for serving)
        self.piecewise: PiecewiseGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None  # arm graphs.prefill: lone prompts, whole steps
        self._prefill_pool = 0  # what their probe grew the shared graph pool by (the real capture reuses it)
        self._graph_plan = 0  # device bytes the memory plan reserved for the decode graphs
        self.graph_bytes = 0  # what capturing them took (device-wide, measured at start-up)
        use_graphs = self.device.type == "cuda" and not mc.enforce_eager
        max_blocks = math.ceil(self.max_model_len / self.block_size)
        if self.device.type == "cuda":
            self.num_state_slots, self.num_kv_blocks = self._plan_cuda(config, use_graphs, max_blocks)
        else:
            self.num_state_slots = sc.max_num_seqs + 1
            per_seq = math.ceil(min(self.max_model_len, 8192) / self.block_size)
            self.num_kv_blocks = config.cache.num_gpu_blocks_override or sc.max_num_seqs * per_seq
            self.num_kv_blocks += 1  # + the reserved null block
        self.cache = ModelCache.allocate(
            self.cache_spec,
            self.num_kv_blocks,
            self.block_size,
            self.num_state_slots,
            self.dtype,
            self.device,
            ssm_dtype=self.ssm_dtype,
            shared_pad_slot=self.shared_pad_slot,
            state_on_demand=self.state_on_demand,
        )
        self.sampler = Sampler(self.device, mc.seed, self.eos_token_ids, self.ops.argmax, self.ops.logprobs)
        if use_graphs:
            before = self._settled_use()  # measured as the plan's probe was: the logits buffer included
            self.graphs = DecodeGraphs(
                self.model,
                self.cache,
                self.num_state_slots - 1,
                max_blocks,
                self.pdl,
                pool=self._graph_pool(),
                logits=self._graph_logits(self.num_state_slots - 1),
            )
            every = mc.cuda_graph_capture == "startup"
            self.graphs.capture_all() if every else self.graphs.capture_largest()
            self.prefill_graphs = self._prefill_graphs(self.cache, max_blocks, every)
            self.graph_bytes = self._settled_use() - before
            log.info(
                "decode graphs: %d captured, %.0f MiB on the device (the memory plan reserved %.0f MiB)",
                len(self.graphs.graphs),
                self.graph_bytes / 2**20,
                self._graph_plan / 2**20,
            )
        kv_tokens = (self.num_kv_blocks - 1) * self.block_size
        if kv_tokens < self.max_model_len:
            # A request longer than the pool could never finish: refuse it at admission instead.
            log.warning("max_model_len %d capped to the KV pool's %d tokens", self.max_model_len, kv_tokens)
            self.max_model_len = kv_tokens
        if self.device.type == "cuda":
            self.memory = self._measure()
        log_startup(self, log)
        self.profiler = make_profiler(mc.profile_steps, mc.profile_dir, self)  # after warm-up and capture

    def _slot_bytes(self) -> int:
        """One GDN state slot over every layer: conv state in the model dtype, recurrent in the ssm dtype."""
        return state_bytes_per_slot(self.cache_spec, self.dtype, self.ssm_dtype)

    def _used(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def _plan_cuda(self, config: EngineConfig, use_graphs: bool, max_blocks: int) -> tuple[int, int]:
        """(state slots, KV blocks), both with their reserved index 0, under the memory budget."""
        bs, sc, cc = self.block_size, config.scheduler, config.cache
        total = self._total = device_total(self.device, config.cache.device_memory_limit)
        budget = int(total * cc.gpu_memory_utilization)
        # Profile forwards on a small pool: the full-budget prefill and the other step shapes of
        # engine/worker/warmup.py (their kernels built now, not in a live step); the peak over them
        # is the step workspace.
        tokens = sc.max_num_batched_tokens
        probe_blocks, probe_slots = probe_pool_size(tokens, sc.max_num_seqs, bs)
        self.cache = ModelCache.allocate(
            self.cache_spec,
            probe_blocks,
            bs,
            probe_slots,
            self.dtype,
            self.device,
            ssm_dtype=self.ssm_dtype,
            shared_pad_slot=self.shared_pad_slot,
        )
        torch.cuda.reset_peak_memory_stats(self.device)
        for specs in warmup_batches(tokens, sc.max_num_seqs, bs, probe_slots - 1):
            self.execute(ForwardBatch.build(specs, bs, self.device))
        torch.cuda.synchronize(self.device)
        dev = self.device
        self._activation_peak = torch.cuda.max_memory_allocated(dev) - torch.cuda.memory_allocated(dev)
        every = self.model_config.cuda_graph_capture == "startup"
        if use_graphs and "graphs.piecewise" in self.model_config.kernel_arms:
            # before the pools are sized, so what they hold is in the memory in use the plan reads
            spare = PREFILL_GRAPH_TOKENS if "graphs.prefill" in self.model_config.kernel_arms else 0
            self.piecewise = build_piecewise(self.model, tokens, self.device, self.pdl, every, spare)
        graph_bytes = 0
        if use_graphs:
            graph_bytes = self._graph_plan = self._probe_graphs(sc.max_num_seqs, max_blocks, every)
        del self.cache
        torch.cuda.empty_cache()
        used = self._used()
        slot_bytes = self._slot_bytes()
        block_bytes = kv_bytes_per_block(self.cache_spec, bs, self.dtype)
        fixed_kv = cc.num_gpu_blocks_override * block_bytes
        kv_memory = parse_bytes(cc.kv_cache_memory, "--kv-cache-memory")
        if kv_memory:
            fixed_kv = max(kv_memory // block_bytes, 1) * block_bytes
        # Slots come first (each running request needs one), keeping room for at least one request of
        # the full context in the KV pool when its size is not fixed.
        kv_floor = math.ceil(self.max_model_len / bs) * block_bytes
        pending = workspace_reserve(self._activation_peak, sc.max_num_seqs, self.vocab_size) + graph_bytes
        slots, blocks = plan_pools(
            room=budget - used - pending,
            wanted_slots=sc.max_num_seqs,
            slot_bytes=slot_bytes,
            block_bytes=block_bytes,
            fixed_kv=fixed_kv,
            kv_floor=kv_floor,
        )
        if slots < 1:
            raise RuntimeError(
                f"not enough device memory: the budget {gib(budget)} ({cc.gpu_memory_utilization:.2f} of "
                f"{gib(total)}) holds {gib(used)} in use, {gib(pending)} of step workspace and graphs and "
                f"{gib(fixed_kv or kv_floor)} of KV, leaving no room for a {gib(slot_bytes)} GDN state slot"
            )
        if slots < sc.max_num_seqs:
            log.warning(
                "GDN state slots: %d of --max-num-seqs %d fit the memory budget", slots, sc.max_num_seqs
            )
        if blocks < 1:
            raise RuntimeError(f"not enough device memory for the KV cache under the budget {gib(budget)}")
        return slots + 1, blocks + 1

    def _settled_use(self) -> int:
        """Device memory in use once queued work is done and torch's free cached blocks are released."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        return self._used()

    def _graph_pool(self) -> PoolHandle | None:
        """The pool the decode graphs capture into: the piecewise graphs' when they exist (one pool for
        both, as vLLM shares one), else a pool of their own."""
        return self.piecewise.pool if self.piecewise is not None else None

    def _graph_logits(self, max_seqs: int) -> torch.Tensor | None:
        """The decode graphs' logits buffer, lent by the piecewise graphs when it fits their scratch."""
        pw = self.piecewise
        return pw.logits_buffer(max_seqs, self.vocab_size) if pw is not None else None

    def _prefill_graphs(self, cache: ModelCache, max_blocks: int, every: bool) -> PrefillGraphs | None:
        """Arms graphs.prefill / graphs.mixed over ``cache``: every key captured (``every``) or one."""
        if self.piecewise is None or "graphs.prefill" not in self.model_config.kernel_arms:
            return None
        mixed = self._max_seqs - 1 if "graphs.mixed" in self.model_config.kernel_arms else 0
        pg = PrefillGraphs(self.piecewise, cache, max_blocks, pdl=self.pdl, max_decodes=mixed)
        pg.capture_all() if every else pg.capture((0, pg.buckets[-1]))
        return pg

    def _probe_graphs(self, max_seqs: int, max_blocks: int, every: bool) -> int:
        """Device bytes the decode graphs will hold, measured on the profile pool: the graphs the
        server captures at start-up (``every``: all of them; lazy: the largest) captured here and
        released again, counted device-wide (the shared logits buffer, the graph pool, each graph's
        static inputs, the driver's executable graphs). A probe of the largest graph alone, plus a
        mid-size one per further bucket, under-counted by 40-200 MiB (session 17 run 8); counting the
        capture's growth instead of what release frees over-counted by 150 MiB (run 9). In the
        piecewise graphs' pool, what the probe grew stays reserved after release (those graphs hold the
        pool), so it is in the memory in use the plan reads, and the real captures reuse it."""
        pool, logits = self._graph_pool(), self._graph_logits(max_seqs)
        probe = DecodeGraphs(self.model, self.cache, max_seqs, max_blocks, self.pdl, pool, logits)
        probe.capture_all() if every else probe.capture_largest()
        prefill = self._prefill_graphs(self.cache, max_blocks, every)
        self._prefill_pool = prefill.reserved_bytes if prefill is not None else 0
        held = self._settled_use()
        del probe, prefill
        # what releasing them frees: first-use costs that stay (the capture stream's cuBLAS
        # workspace, loaded modules) are already in the plan's reading of the memory in use
        return max(0, held - self._settled_use())

    def _measure(self) -> MemorySplit:
        torch.cuda.synchronize(self.device)
        itemsize = torch.tensor([], dtype=self.dtype).element_size()  # every parameter is in the model dtype
        graphs = 0
        if self.graphs is not None:  # a lent logits buffer is the piecewise graphs' (counted below)
            lg = self.graphs.logits
            graphs = self.graphs.reserved_bytes + self.graphs.owns_logits * lg.numel() * lg.element_size()
        graphs += self.piecewise.reserved_bytes if self.piecewise else 0
        graphs += max(self._prefill_pool, self.prefill_graphs.reserved_bytes) if self.prefill_graphs else 0
        return measure_split(
            weights=self.model.num_parameters() * itemsize,
            kv_cache=self.num_kv_blocks * kv_bytes_per_block(self.cache_spec, self.block_size, self.dtype),
            state_pool=self.cache.state_bytes,
            state_outside_torch=self.cache.grown.mapped_bytes if self.cache.grown else 0,
            state_pool_full=self.cache.state_reserved_bytes,
            cuda_graphs=graphs,
            activation_peak=self._activation_peak,
            torch_reserved=torch.cuda.memory_reserved(self.device),
            device_used=self._used(),
            total=self._total,
        )

    def _on_stream(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream)

    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]`` in fp32."""
        self._ensure_slots(batch.max_state_slot)
        with self._on_stream():
            return self.model(batch, self.cache)

    def execute_model(self, seqs: list[ScheduledSeq]) -> SamplerOutput:
        return self.launch(seqs).result()

    def launch(self, seqs: list[ScheduledSeq], prev: PendingStep | None = None) -> Launched:
        """Queue one step on the device and return before its tokens reach the host. Rows with
        ``prev_row >= 0`` read their input token from ``prev``'s sampled tokens on the device."""
        with self._on_stream():
            if self.profiler is not None:
                self.profiler.on_launch(seqs)  # --profile-steps: the step's start mark, on this stream
            return self._launch(seqs, prev)

    def _launch(self, seqs: list[ScheduledSeq], prev: PendingStep | None) -> Launched:
        self._ensure_slots(max((s.state_slot for s in seqs), default=0))  # the scheduler asked already
        sampled = [s for s in seqs if s.sample]
        # The sampling tensors go to the device ahead of the forward, once per step.
        batch = self.sampler.prepare(
            [s.params for s in sampled],
            [s.num_output for s in sampled],
            self.vocab_size,
            [s.history for s in sampled],
            [s.num_prompt for s in sampled],
        )
        feed = self._feed(seqs, prev)
        scored: list = []
        scoring = wants_prompt_logprobs(seqs)
        # A scoring step reads every prompt row's hidden state: never a decode graph; a whole-step
        # graph only for a lone prompt (behind decodes its rows would not start at row 0)
        key = self.graphs.bucket(seqs) if self.graphs is not None and not scoring else None
        pg = self.prefill_graphs
        whole = pg.bucket(seqs) if pg is not None and key is None else None
        whole = None if scoring and whole is not None and whole[0] else whole
        if key is not None:
            logits = self.graphs.run(seqs, key, lambda ids: patch_inputs(ids, feed))  # type: ignore[union-attr]
        elif whole is not None:
            logits = pg.run(seqs, whole, lambda ids: patch_inputs(ids, feed))  # type: ignore[union-attr]
            if scoring:
                hidden = pg.hidden_states(len(seqs[0].token_ids))  # type: ignore[union-attr]
                scored = prompt_logprobs(self.model.raw_logits, hidden, seqs, (0,), self.ops.logprobs)
        else:
            fb = ForwardBatch.build(seqs, self.block_size, self.device)
            patch_inputs(fb.input_ids, feed)
            pw = self.piecewise
            if pw is not None and pw.bucket(fb.num_tokens) is None:
                pw = None  # beyond the largest bucket: eager
            if scoring:
                model = self.model if pw is None else pw
                hidden = model.hidden_states(fb, self.cache)
                logits = self.model.compute_logits(hidden[fb.logits_indices])
                qsl = fb.query_start_loc_cpu
                scored = prompt_logprobs(self.model.raw_logits, hidden, seqs, qsl, self.ops.logprobs)
            elif pw is not None:
                logits = pw.run(fb, self.cache)
            else:
                logits = self.execute(fb)
        if not sampled:
            return Launched(None, scored)
        return Launched(self.sampler.sample_async(logits, batch), scored)

    def _feed(self, seqs: list[ScheduledSeq], prev: PendingStep | None) -> tuple | None:
        """(prev's device tokens, source rows, destination token rows) for the rows scheduled ahead."""
        rows = [(s.prev_row, i) for i, s in enumerate(seqs) if s.prev_row >= 0]
        if not rows:
            return None
        if not isinstance(prev, Launched) or prev.tokens is None:
            raise RuntimeError("a step scheduled ahead needs the previous launch's sampled tokens")
        # decodes come first, one token each, so a decode's batch row is its token row
        assert all(seqs[i].is_decode for _, i in rows)
        return prev.tokens.tokens, [r for r, _ in rows], [i for _, i in rows]

    def ensure_state_slot(self, slot: int) -> bool:
        """Map ``slot``'s state memory before the scheduler hands the slot out (on-demand pools; always
        True otherwise); False when the device has no memory for it now."""
        return self.cache.ensure_slot(slot)

    def _ensure_slots(self, top: int) -> None:
        """No step may touch an on-demand state slot that has no memory (it would fault the device)."""
        if not self.cache.ensure_slot(top):
            raise torch.OutOfMemoryError(f"no device memory for GDN state slot {top}")

    @property
    def state_pool_bytes(self) -> int:
        """Device memory the GDN state pools hold now."""
        return self.cache.state_bytes

    def device_memory(self) -> tuple[int, int]:
        """(bytes in use on the device now, peak seen at step ends); includes CuPy and the CUDA context.

        EngineCore reads this at the end of every step, which is where the peak is sampled."""
        if self.device.type != "cuda":
            return 0, 0
        free, total = torch.cuda.mem_get_info(self.device)
        self._peak = max(self._peak, total - free)
        return total - free, self._peak

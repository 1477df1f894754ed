"""Kernel arms: compile-time variants of the CUDA ops, each registered with its op, its default, the
model shapes it can run and the evidence that set the default (docs/kernels.md lists them in prose).

``cuda_overrides(arms)`` maps op names to callables with the exact reference signatures of
:mod:`engine.ops`; the arm set is bound only into the wrappers that read it. Which arms a model gets is
settled once, when its config is resolved (``engine.worker.resolve``), so the logged config is the truth.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

EVIDENCE = "docs/bench-evidence/2026-11-29-s2-gdn-kernels.md"
FUSED_EVIDENCE = "docs/bench-evidence/2026-12-01-fused-elementwise.md"
# The end-to-end A/B that made norm.fused, attention.qk_fused and attention.paged defaults.
HOT_PATH_EVIDENCE = "docs/bench-evidence/2026-12-01-gpu-hot-path.md"
GEMM_EVIDENCE = "docs/bench-evidence/2026-12-01-skinny-gemm.md"
ASYNC_EVIDENCE = "docs/bench-evidence/2026-12-01-async-scheduling.md"
PDL_EVIDENCE = "docs/bench-evidence/2026-12-01-pdl.md"
PIECEWISE_EVIDENCE = "docs/bench-evidence/2026-12-01-piecewise.md"
SPLIT_EVIDENCE = "docs/bench-evidence/2026-12-01-chunk-split.md"
LAZY_EVIDENCE = "docs/bench-evidence/2026-12-02-s28.md"
ARGMAX_EVIDENCE = VEC4_EVIDENCE = "docs/bench-evidence/2026-12-02-s30.md"
PREFILL_GRAPH_EVIDENCE = "docs/bench-evidence/2026-12-03-s31.md"
MIXED_GRAPH_EVIDENCE = "docs/bench-evidence/2026-12-03-s33.md"
LOGPROBS_EVIDENCE = "docs/bench-evidence/2026-12-04-s35.md"
SPLIT_NORM_EVIDENCE = "docs/bench-evidence/2026-12-04-s39.md"


# the "op" of an arm that changes how steps launch kernels (CUDA graphs) rather than an op's kernel
LAUNCH_MODE = "graphs"


@dataclass(frozen=True)
class KernelShapes:
    """What an arm's feasibility depends on, read from the model's config (the ops know no model)."""

    conv_width: int
    key_head_dim: int
    value_head_dim: int
    dtype: str
    attention_head_dim: int = 256
    hidden_size: int = 2560


def _any_shape(s: KernelShapes) -> str | None:
    return None


def _conv_width_4(s: KernelShapes) -> str | None:
    # K4 unrolls a width-4 conv; the unfused kernels take any width up to 8
    return None if s.conv_width == 4 else f"needs conv width 4, not {s.conv_width}"


def _attention_head_dim(s: KernelShapes) -> str | None:
    # cuda/attention/paged_attention.cu instantiates D = 64, 128, 256 (the tiny model's 32 is not built)
    ok = s.attention_head_dim in (64, 128, 256)
    return None if ok else f"is built for attention head dims 64/128/256, not {s.attention_head_dim}"


def _pow2_eighths(n: int, most: int) -> bool:
    return n % 8 == 0 and 0 < n // 8 <= most and (n // 8) & (n // 8 - 1) == 0


def _norm_rows(s: KernelShapes) -> str | None:
    # add_rms_norm takes rows of 8 x a power of two below 256 elements, any multiple of 8 above
    ok = s.hidden_size % 8 == 0 and (s.hidden_size >= 256 or _pow2_eighths(s.hidden_size, 32))
    return None if ok else f"takes hidden sizes of 8 x 2^k below 256 or multiples of 8, not {s.hidden_size}"


def _qk_head_dim(s: KernelShapes) -> str | None:
    ok = _pow2_eighths(s.attention_head_dim, 32)
    return None if ok else f"takes head dims of 8 x 2^k up to 256, not {s.attention_head_dim}"


def _skinny_gemm(s: KernelShapes) -> str | None:
    # 16-byte rows of bf16 x and w; the wrapper still falls back to F.linear per call when a K is odd
    if s.dtype != "bfloat16":
        return f"takes bfloat16 weights, not {s.dtype}"
    ok = s.hidden_size % 8 == 0
    return None if ok else f"needs a hidden size that is a multiple of 8, not {s.hidden_size}"


def _split_norm(s: KernelShapes) -> str | None:
    # bf16 GEMM partials into add_rms_norm_kernel (its row layouts)
    if s.dtype != "bfloat16":
        return f"takes bfloat16 weights, not {s.dtype}"
    return _norm_rows(s)


@dataclass(frozen=True)
class Arm:
    name: str
    op: str
    """The Ops entry whose CUDA implementation the arm changes."""
    summary: str
    default: bool
    evidence: str
    """Where the measurement that set ``default`` is recorded."""
    unsupported: Callable[[KernelShapes], str | None] = _any_shape
    """Why the arm cannot run a model of these shapes (None when it can)."""


ARM_LIST = (
    Arm("conv.chunk8", "causal_conv1d_prefill", "8 tokens per thread in the conv prefill", True, EVIDENCE),
    Arm("conv.k4", "causal_conv1d_prefill", "width-4 conv with every tap unrolled", True, EVIDENCE),
    # The next two with conv.k4 won the end-to-end A/B (run 2): W1 5% faster, TTFT -7%, TPOT -4.5%.
    Arm(
        "decode.fused",
        "gdn_decode",
        "K4: a GDN layer's decode step in one launch (Ops.gdn_decode)",
        True,
        EVIDENCE,
        _conv_width_4,
    ),
    Arm(
        "prefill.tensorcore",
        "chunk_gated_delta_rule",
        "K2+K3: the chunked delta rule on tensor cores (off: the fp32 token-recurrent kernel)",
        True,
        EVIDENCE,
    ),
    # The split path (engine/ops/gdn/chunk_split.py): every chunk's dk-side work in a parallel pass,
    # then a state pass with only the state-side products on its chunk-serial chain; for few-sequence
    # prefills only (use_split). End to end (4 pairs + A/A): W2 TTFT mean 0.900x, p99 0.917x, TPOT
    # equal; W1 duration 0.988x, median TTFT 0.826x, the rest within noise (SPLIT_EVIDENCE).
    Arm(
        "prefill.split",
        "chunk_gated_delta_rule",
        "few-sequence prefills: the chunks' dk-side work in a parallel pass before the state pass",
        True,
        SPLIT_EVIDENCE,
    ),
    # Bit-identical to the 8-channel kernel. End to end within the A/A noise twice (EVIDENCE, run 3;
    # W2 in session 23), as a ~0.1 ms prefill gain must be; a default since session 30, whose step
    # A/B (B C C B, one device call) put prefill 2 x 1,024 at 25.27 / 25.27 ms against 25.38 / 25.43
    # and the kernel at 29.0 vs 34.4 us (VEC4_EVIDENCE).
    Arm(
        "conv.vec4",
        "causal_conv1d_prefill",
        "4 channels per thread in the conv prefill",
        True,
        VEC4_EVIDENCE,
    ),
    # bf16 kernels of cuda/norm/fused.cu (kernel and model-forward numbers in FUSED_EVIDENCE) and the
    # tensor-core paged attention: together 4.35x W1 throughput end to end, every metric outside the
    # A/A band (HOT_PATH_EVIDENCE). Without them the reference compositions run.
    Arm(
        "norm.fused",
        "add_rms_norm",
        "bf16 residual add + RMSNorm and SiLU-mul kernels (add_rms_norm, silu_mul)",
        True,
        HOT_PATH_EVIDENCE,
        _norm_rows,
    ),
    Arm(
        "attention.qk_fused",
        "qk_norm_rope_kv",
        "q/k RMSNorm, partial RoPE and the paged KV write in one bf16 kernel",
        True,
        HOT_PATH_EVIDENCE,
        _qk_head_dim,
    ),
    Arm(
        "attention.paged",
        "paged_attention",
        "paged causal attention on tensor cores, one launch per mixed batch, split-KV decode, gate fused",
        True,
        HOT_PATH_EVIDENCE,
        _attention_head_dim,
    ),
    # The attention kernel's O rescale only when a row's max passes its reference by more than
    # LAZY_RESCALE_SLACK (log2 units) instead of whenever it rises: not bit-equal to the plain online
    # softmax, equal in real arithmetic. Needs attention.paged (the kernel it tunes).
    Arm(
        "attention.lazy_rescale",
        "paged_attention",
        "the paged attention kernel rescales O only when a row's max rises by more than 2^8",
        False,
        LAZY_EVIDENCE,
        _attention_head_dim,
    ),
    # Kernel-level numbers in GEMM_EVIDENCE; the end-to-end A/B (W2 TPOT 0.975x, W1 within noise) in
    # ASYNC_EVIDENCE.
    Arm(
        "linear.skinny",
        "linear",
        "projections and lm_head at M <= 8 rows: a bf16 tensor-core skinny GEMM, no split-K (else F.linear)",
        True,
        GEMM_EVIDENCE,
        _skinny_gemm,
    ),
    # The output projections and the MLP's down at 9-64 rows as an explicit split-K GEMM whose fp32
    # partials the next norm sums (engine/ops/gemm/split_norm.py): no cuBLAS reduce launch. Decode b32
    # 4.71 -> 4.59 ms device (A B B A); W7 (32 x 128 / 512, decode-bound; 3 pairs + A/A) TPOT mean
    # 0.986x, outside the band; W1 and W3 within noise (TPOT 0.990x / 0.994x) (SPLIT_NORM_EVIDENCE).
    Arm(
        "linear.split_norm",
        "linear_add_rms_norm",
        "2,560-row projections at 9-64 rows: split-K GEMM partials summed inside the next norm (no reduce)",
        True,
        SPLIT_NORM_EVIDENCE,
        _split_norm,
    ),
    # The sampler's greedy argmax over about two CTAs per multiprocessor instead of one per row:
    # exactly torch's token, 0.57-0.71x its time per call, below what a decode step A/B resolves.
    Arm(
        "sample.argmax",
        "argmax",
        "greedy argmax split over the whole device, then one warp per row (else torch's argmax)",
        False,
        ARGMAX_EVIDENCE,
    ),
    # Prompt scoring and the sampler's logprobs from one read of the raw bf16 logits instead of an fp32
    # log-softmax written and reread (gather, rank count, top-k): 200 rows 1,374 -> 97 us; a scored
    # 200-token prompt's step 8.5-8.8 -> 6.7-6.8 ms; W5 (lm-eval-style scoring, concurrency 1, 3 pairs
    # + A/A) duration 0.843x, TTFT 0.831x, outside the band (LOGPROBS_EVIDENCE, run 1).
    Arm(
        "sample.logprobs",
        "logprobs",
        "logprob, rank and top-1 of each row from one read of the bf16 logits (else torch's log_softmax)",
        True,
        LOGPROBS_EVIDENCE,
    ),
    # Not an op variant but a launch mode of the decode graphs (engine/worker/cuda_graphs.py); the
    # kernels that support it are marked in cuda/common/pdl.cuh. sm_90 and newer, else ignored.
    # W2 TPOT 0.935x (2.98 / 2.97 -> 2.78 / 2.78 ms, alternated, A/A equal) in PDL_EVIDENCE.
    Arm(
        "graphs.pdl",
        LAUNCH_MODE,
        "programmatic dependent launch in captured decode graphs (skinny GEMM, fused norms, attention, K4)",
        True,
        PDL_EVIDENCE,
    ),
    # A launch mode too: mixed and prefill steps replay their per-token dense work from graphs captured
    # per token bucket and run only the varlen ops eagerly (engine/worker/piecewise.py). W2 TTFT 0.723x
    # and duration 0.973x (3 pairs, outside the A/A band), W1 within noise (0.985x), the servers' peak
    # memory equal in PIECEWISE_EVIDENCE.
    Arm(
        "graphs.piecewise",
        LAUNCH_MODE,
        "piecewise CUDA graphs for mixed and prefill steps (dense parts per token bucket, varlen ops eager)",
        True,
        PIECEWISE_EVIDENCE,
    ),
    # A launch mode on top of graphs.piecewise: a step of one prefill sequence replays one whole-step
    # graph per token bucket (engine/worker/prefill_graphs.py) instead of the pieces with eager cores.
    # W2 TTFT mean 0.896x, p99 0.876x (3 pairs, outside the A/A band), TPOT equal; the 1 x 1,024 step
    # queued in 1.4-1.6 ms instead of 9.5-16.6 (PREFILL_GRAPH_EVIDENCE).
    Arm(
        "graphs.prefill",
        LAUNCH_MODE,
        "whole-step CUDA graphs for prefill steps of one sequence (needs graphs.piecewise, attention.paged)",
        True,
        PREFILL_GRAPH_EVIDENCE,
        _attention_head_dim,
    ),
    # And on top of graphs.prefill: a step of decodes and one prefill sequence of up to 1,024 rows
    # replays one whole-step graph per (decode bucket, token bucket) too (engine/worker/prefill_graphs.py).
    # Interactive load (W4: natural ShareGPT prompts, Poisson arrivals at 8/s; 3 pairs): TTFT mean
    # 0.746x, p99 ITL 0.491x (outside the A/A band); W3 within noise (MIXED_GRAPH_EVIDENCE, 512 rows).
    # Up to 1,024 rows instead of 512 (session 38, W6: 768-token prompts at 4/s; 3 pairs): TTFT mean
    # 0.811x, p99 0.669x, TPOT 0.982x (outside the band; docs/bench-evidence/2026-12-04-s38.md).
    Arm(
        "graphs.mixed",
        LAUNCH_MODE,
        "whole-step CUDA graphs for decodes + one prefill of up to 1,024 rows (needs graphs.prefill)",
        True,
        MIXED_GRAPH_EVIDENCE,
        _attention_head_dim,
    ),
)
ARMS: dict[str, Arm] = {a.name: a for a in ARM_LIST}
# Arms that only work on top of others: the whole-step prefill graphs use the piecewise graphs' buffers
# and pool, and their grids need the paged attention kernel (the reference attention pads every row's
# KV to the bound the graph is planned for, the longest block table).
NEEDS: dict[str, frozenset[str]] = {
    "graphs.prefill": frozenset({"graphs.piecewise", "attention.paged"}),
    "graphs.mixed": frozenset({"graphs.prefill"}),  # after it: dropped when it is
}
DEFAULT_ARMS = frozenset(a.name for a in ARM_LIST if a.default)


def check_known(arms: frozenset[str]) -> None:
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown kernel arms {sorted(unknown)}; known: {sorted(ARMS)}")


def cuda_overrides(arms: frozenset[str] = DEFAULT_ARMS) -> dict[str, Callable]:
    """Op name -> CUDA implementation. Unknown arm names are an error, not silently ignored."""
    arms = frozenset(arms)
    check_known(arms)
    from engine.ops.conv import cuda as conv
    from engine.ops.gdn import chunk, decode, gating
    from engine.ops.gdn import recurrent as delta
    from engine.ops.norm import cuda as norm

    fused: dict[str, Callable] = {}
    if "decode.fused" in arms:
        fused["gdn_decode"] = decode.gdn_decode
    if arms & {"norm.fused", "attention.qk_fused"}:
        from engine.ops.norm import fused_cuda

        if "norm.fused" in arms:
            fused |= {"add_rms_norm": fused_cuda.add_rms_norm, "silu_mul": fused_cuda.silu_mul}
        if "attention.qk_fused" in arms:
            fused["qk_norm_rope_kv"] = fused_cuda.qk_norm_rope_kv
    if "attention.lazy_rescale" in arms and "attention.paged" not in arms:
        raise ValueError("kernel arm attention.lazy_rescale tunes attention.paged: name both or neither")
    if "attention.paged" in arms:
        from engine.ops.attention import cuda as attention

        fused["paged_attention"] = attention.paged_attention
        if "attention.lazy_rescale" in arms:
            slack = attention.LAZY_RESCALE_SLACK
            fused["paged_attention"] = functools.partial(attention.paged_attention, rescale_slack=slack)
    if "linear.skinny" in arms:
        from engine.ops.gemm import cuda as gemm

        fused["linear"] = gemm.linear
    if "sample.argmax" in arms:
        from engine.ops.sample import cuda as sample

        fused["argmax"] = sample.argmax
    if "sample.logprobs" in arms:
        from engine.ops.sample import logprobs

        fused["logprobs"] = logprobs.logprobs
    if "prefill.tensorcore" in arms:
        prefill: Callable = functools.partial(chunk.chunk_gated_delta_rule, arms=arms)
    else:
        prefill = delta.chunk_gated_delta_rule
    table = fused | {
        "causal_conv1d_prefill": functools.partial(conv.causal_conv1d_prefill, arms=arms),
        "causal_conv1d_decode": functools.partial(conv.causal_conv1d_decode, arms=arms),
        "gdn_gating": gating.gdn_gating,
        "chunk_gated_delta_rule": prefill,
        "recurrent_gated_delta_rule": delta.recurrent_gated_delta_rule,
        "gated_rms_norm": norm.gated_rms_norm,
    }
    if "linear.split_norm" in arms:  # composes this table's linear and add_rms_norm where it does not split
        from engine.ops import reference
        from engine.ops.gemm import split_norm

        table["linear_add_rms_norm"] = functools.partial(
            split_norm.linear_add_rms_norm,
            linear=table.get("linear", reference.linear),
            add_rms_norm=table.get("add_rms_norm", reference.add_rms_norm),
        )
    return table


def usable_arms(arms: frozenset[str], shapes: KernelShapes) -> tuple[frozenset[str], list[str]]:
    """``arms`` minus those this model's shapes rule out and those whose base arms are missing (after
    the shapes' rule), and one note per dropped arm."""
    check_known(arms)
    notes, keep = [], set()
    for name in sorted(arms):
        why = ARMS[name].unsupported(shapes)
        if why is None:
            keep.add(name)
        else:
            notes.append(f"kernel arm {name} {why}: running without it")
    for name, base in NEEDS.items():
        if name in keep and not base <= keep:
            keep.discard(name)
            notes.append(f"kernel arm {name} builds on {' and '.join(sorted(base))}: running without it")
    return frozenset(keep), notes


def pads_attention(paged_attention: Callable) -> bool:
    """Whether this attention op materialises every row's KV up to the padded length (the torch
    reference does; the paged kernel reads the block table in place), which bounds graph buckets."""
    from engine.ops.attention import reference

    return paged_attention is reference.paged_attention


def unsupported_reason(shapes: KernelShapes) -> str | None:
    """Why the CUDA kernels cannot run a model of these shapes at all (None when they can)."""
    if shapes.key_head_dim != 128 or shapes.value_head_dim != 128:
        return f"GDN head dims {shapes.key_head_dim}/{shapes.value_head_dim} (kernels are built for 128/128)"
    if shapes.dtype != "bfloat16":
        return f"dtype {shapes.dtype} (kernels take bfloat16 activations)"
    return None

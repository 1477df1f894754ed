"""The per-architecture tuning rows the CUDA wrappers read from the .cu sources, and which arms a
model's shapes allow (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.ops.compile import arch_table, tuning_row, tuning_table

TABLES = [
    ("gdn/chunk.cu", "GDN_CHUNK_TABLE"),
    ("gdn/chunk_state.cu", "GDN_STATE_TABLE"),
    ("gdn/decode.cu", "DS_DECODE_TABLE"),
    ("gemm/skinny.cu", "SKINNY_TABLE"),
]


def test_every_family_has_rows_for_sm80_sm90_sm120():
    assert set(arch_table()) == {80, 90, 120}
    for src, macro in TABLES:
        assert set(tuning_table(src, macro)) == {80, 90, 120}, macro


@pytest.mark.parametrize(("src", "macro"), TABLES)
def test_row_is_the_newest_not_newer_than_the_device(src, macro):
    rows = tuning_table(src, macro)
    assert tuning_row(src, macro, 89) == rows[80]  # Ada takes the Ampere row
    assert tuning_row(src, macro, 100) == rows[90]
    assert tuning_row(src, macro, 121) == rows[120]
    with pytest.raises(RuntimeError, match="older than every"):
        tuning_row(src, macro, 75)


def test_unknown_macro_is_an_error():
    with pytest.raises(RuntimeError, match="no NOPE rows"):
        tuning_table("gdn/chunk.cu", "NOPE")


def test_fused_decode_dropped_for_conv_widths_it_cannot_run():
    from engine.ops.arms import DEFAULT_ARMS, KernelShapes, usable_arms

    width4 = KernelShapes(conv_width=4, key_head_dim=128, value_head_dim=128, dtype="bfloat16")
    width3 = KernelShapes(conv_width=3, key_head_dim=128, value_head_dim=128, dtype="bfloat16")
    assert usable_arms(DEFAULT_ARMS, width4) == (DEFAULT_ARMS, [])
    arms, notes = usable_arms(DEFAULT_ARMS, width3)
    assert arms == DEFAULT_ARMS - {"decode.fused"} and len(notes) == 1 and "width 4" in notes[0]
    assert usable_arms(frozenset({"conv.chunk8"}), width3) == (frozenset({"conv.chunk8"}), [])
    # the tiny model (attention head dim 32, hidden 64) keeps the reference attention and norms
    tiny = KernelShapes(4, 128, 128, "bfloat16", attention_head_dim=32, hidden_size=48)
    arms, notes = usable_arms(DEFAULT_ARMS, tiny)
    assert arms == DEFAULT_ARMS - {
        "attention.paged",
        "norm.fused",
        "linear.split_norm",
        "graphs.prefill",
        "graphs.mixed",
    }
    assert any("attention.paged" in n and "32" in n for n in notes)
    assert any("norm.fused" in n and "48" in n for n in notes)


def test_arm_registry_entries_are_complete():
    from engine.ops import OP_NAMES
    from engine.ops.arms import ARM_LIST, ARMS, DEFAULT_ARMS, LAUNCH_MODE

    root = Path(__file__).resolve().parents[2]
    assert len(ARMS) == len(ARM_LIST)  # no name registered twice
    assert DEFAULT_ARMS == {
        "conv.chunk8",
        "conv.k4",
        "conv.vec4",
        "decode.fused",
        "prefill.tensorcore",
        "prefill.split",
        "norm.fused",
        "attention.qk_fused",
        "attention.paged",
        "linear.skinny",
        "linear.split_norm",
        "graphs.pdl",
        "graphs.piecewise",
        "graphs.prefill",
        "graphs.mixed",
        "sample.logprobs",
    }
    for arm in ARM_LIST:
        assert arm.op in (*OP_NAMES, "gdn_decode", "linear_add_rms_norm", LAUNCH_MODE), arm
        assert (root / arm.evidence).is_file(), arm


def test_lazy_rescale_binds_the_slack_into_paged_attention():
    """attention.lazy_rescale is a setting of attention.paged's kernel: bound as its rescale_slack,
    refused by name without it, and dropped with it where the head dim rules the kernel out."""
    from engine.ops.arms import DEFAULT_ARMS, KernelShapes, cuda_overrides, usable_arms
    from engine.ops.attention import cuda as attention

    ops = cuda_overrides(DEFAULT_ARMS | {"attention.lazy_rescale"})
    bound = ops["paged_attention"]
    assert bound.func is attention.paged_attention
    assert bound.keywords == {"rescale_slack": attention.LAZY_RESCALE_SLACK}
    assert cuda_overrides(DEFAULT_ARMS)["paged_attention"] is attention.paged_attention
    with pytest.raises(ValueError, match="attention.lazy_rescale tunes attention.paged"):
        cuda_overrides(DEFAULT_ARMS - {"attention.paged"} | {"attention.lazy_rescale"})
    tiny = KernelShapes(
        conv_width=4, key_head_dim=128, value_head_dim=128, dtype="bfloat16", attention_head_dim=32
    )
    arms, _ = usable_arms(DEFAULT_ARMS | {"attention.lazy_rescale"}, tiny)
    assert "attention.lazy_rescale" not in arms and "attention.paged" not in arms

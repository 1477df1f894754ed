"""The step bench's op-family attribution (engine/bench/steps.py) on real kernel names of a 4B step."""

from __future__ import annotations

import pytest

from engine.bench.steps import family


@pytest.mark.parametrize(
    "kernel,expected",
    [
        ("paged_attn_kernel<256, 32, 4, 2>", "attention"),
        ("paged_attn_combine_kernel<256>", "attention"),
        ("gdn_chunk_kernel<128, 64>", "gdn"),
        ("gdn_decode_kernel<8>", "gdn"),
        ("conv_prefill_kernel<4, true>", "gdn"),
        ("conv_state_update_kernel<4>", "gdn"),
        ("add_rms_norm_kernel<2560, 8>", "norm/elementwise"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::sigmoid_kernel_cuda>",
            "norm/elementwise",
        ),
        ("nvjet_tst_192x128_64x4_2x1_v_bz_coopA_TNT", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float>", "sampling/other"),
    ],
)
def test_kernel_families(kernel, expected):
    assert family(kernel) == expected


def test_idle_split_counts_the_device_gaps_once_whatever_overlaps():
    from engine.bench.steps import idle_split

    # a call from 100 to 1,000 us; 160-200 lies inside 150-300; gaps of 50, 20 and 100 us between
    spans = [(400.0, 500.0), (150.0, 300.0), (160.0, 200.0), (350.0, 380.0), (600.0, 900.0)]
    assert idle_split((100.0, 1000.0), spans) == pytest.approx((0.05, 0.17, 0.1))
    assert idle_split(None, spans) == (0.0, 0.0, 0.0)
    assert idle_split((0.0, 1.0), []) == (0.0, 0.0, 0.0)


def test_gaps_are_the_idle_stretches_between_kernels_whatever_overlaps():
    from engine.bench.steps import gaps_between

    kernels = [
        (400.0, 500.0, "d"),
        (150.0, 300.0, "a"),
        (160.0, 200.0, "inside a"),  # ends before a: no gap after it
        (350.0, 380.0, "c"),
        (600.0, 900.0, "e"),
        (880.0, 950.0, "f"),  # overlaps e: no gap between them
    ]
    assert gaps_between(kernels) == [(50.0, "a", "c"), (20.0, "c", "d"), (100.0, "d", "e")]
    assert gaps_between([]) == []
    assert gaps_between([(0.0, 1.0, "only")]) == []


def test_print_gaps_buckets_every_gap_once(capsys):
    from engine.bench.steps import print_gaps

    gaps = [(0.5, "gemm_a", "conv_prefill"), (1.5, "rms_norm", "gemm_b"), (60.0, "gdn_gating", "chunk_prep")]
    print_gaps("step", gaps, top=1)
    out = capsys.readouterr().out
    assert "3 gaps between kernels, 0.06 ms" in out
    assert "<1: 1, 0.00  <2: 1, 0.00" in out and "<inf: 1, 0.06" in out
    assert "gdn -> gdn: 1, 0.06, 60.0" in out
    assert out.count(" us  ") == 1 and "60.0 us  gdn_gating  ->  chunk_prep" in out

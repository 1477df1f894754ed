"""Metric definitions on synthetic traces with hand-computed values."""

from __future__ import annotations

import random

import pytest

from loadgen.ab import ratio_stats, run_order
from loadgen.metrics import (
    RequestTrace,
    compute_metrics,
    first_token_stages_ms,
    parse_prometheus,
    percentile,
    summarize,
)
from loadgen.report import format_run_table, markdown_summary, throughput_series
from loadgen.runner import arrival_offsets


def _traces() -> list[RequestTrace]:
    a = RequestTrace(100, 3, start=10.0, chunk_times=[10.5, 10.6, 10.8], end=10.85, usage_output_tokens=3)
    b = RequestTrace(50, 1, start=10.2, chunk_times=[11.2], end=11.3, usage_output_tokens=1)
    c = RequestTrace(
        20, 5, start=10.1, chunk_times=[10.4, 10.7, 11.0, 11.3, 11.6], end=12.0, usage_output_tokens=5
    )
    # A failure that had streamed one token: it must not leak into any latency figure.
    d = RequestTrace(999, 7, start=10.3, chunk_times=[10.32], end=10.35, error="server error: boom")
    for t in (a, b, c):
        t.success = True
    return [a, b, c, d]


def test_hand_computed_metrics() -> None:
    r = compute_metrics(_traces(), percentiles=(90, 99))
    ap = pytest.approx
    # Wall window: first send 10.0 to last receive 12.0 (the usage/[DONE] of c), not sum of latencies.
    assert r["duration"] == ap(2.0)
    assert (r["completed"], r["failed"]) == (3, 1)
    assert r["total_input_tokens"] == 170  # the failure's 999 prompt tokens are excluded
    assert r["total_output_tokens"] == 9
    assert r["request_throughput"] == ap(1.5)
    assert r["output_throughput"] == ap(4.5)
    assert r["total_token_throughput"] == ap(89.5)
    # TTFT [0.5, 1.0, 0.3] s
    assert r["mean_ttft_ms"] == ap(600.0)
    assert r["median_ttft_ms"] == ap(500.0)
    assert r["std_ttft_ms"] == ap((0.26 / 3) ** 0.5 * 1000)  # population std, as numpy
    assert r["p90_ttft_ms"] == ap(900.0)
    assert r["p99_ttft_ms"] == ap(990.0)
    # TPOT: a (0.8-0.5)/2 = 0.15, c (1.5-0.3)/4 = 0.3; b has 1 token and is excluded.
    assert r["mean_tpot_ms"] == ap(225.0)
    assert r["median_tpot_ms"] == ap(225.0)
    # ITL pooled over requests: [0.1, 0.2, 0.3, 0.3, 0.3, 0.3]
    assert r["mean_itl_ms"] == ap(250.0)
    assert r["median_itl_ms"] == ap(300.0)
    # E2E = last token chunk - send: [0.8, 1.0, 1.5]
    assert r["mean_e2el_ms"] == ap(1100.0)
    assert r["median_e2el_ms"] == ap(1000.0)
    assert r["output_lens"] == [3, 1, 5, 0]
    assert r["errors"] == ["", "", "", "server error: boom"]
    assert r["start_times"] == ap([0.0, 0.2, 0.1, 0.3])
    assert r["max_concurrent_requests"] == 3
    assert r["usage_chunk_mismatches"] == 0 and r["output_len_mismatches"] == 0


def test_usage_is_authoritative_and_mismatches_are_counted() -> None:
    t = RequestTrace(10, 4, start=1.0, chunk_times=[1.1, 1.3], end=1.4, usage_output_tokens=4, success=True)
    r = compute_metrics([t])
    assert r["total_output_tokens"] == 4
    assert r["mean_tpot_ms"] == pytest.approx((0.3 - 0.1) / 3 * 1000)
    assert r["usage_chunk_mismatches"] == 1
    t2 = RequestTrace(10, 8, start=1.0, chunk_times=[1.1, 1.3], end=1.4, success=True)  # no usage chunk
    r2 = compute_metrics([t2])
    assert r2["total_output_tokens"] == 2 and r2["output_len_mismatches"] == 1


def test_all_failed_gives_zeros_not_errors() -> None:
    r = compute_metrics([RequestTrace(5, 5, start=1.0, end=1.5, error="HTTP 503")])
    assert r["completed"] == 0 and r["failed"] == 1
    assert r["mean_ttft_ms"] == 0.0 and r["request_throughput"] == 0.0
    assert r["duration"] == pytest.approx(0.5)


def test_percentile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(0)
    for n in (1, 2, 5, 101):
        xs = [rng.random() for _ in range(n)]
        for p in (0, 50, 90, 99, 99.9, 100):
            assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
        s = summarize(xs, (99.9,))
        assert s["std"] == pytest.approx(float(np.std(xs)))
        assert "p99.9" in s


def test_parse_prometheus() -> None:
    text = (
        "# HELP deltaserve_peak_device_memory_bytes peak\n"
        "# TYPE deltaserve_peak_device_memory_bytes gauge\n"
        'deltaserve_peak_device_memory_bytes{device="0"} 1.5e+10\n'
        'deltaserve_peak_device_memory_bytes{device="1"} 2.0e+09\n'
        'deltaserve_device_info{index="0",name="NVIDIA H200 \\"SXM\\""} 1.0\n'
        "deltaserve_peak_device_memory_bytes_other 99\n"
    )
    assert parse_prometheus(text) == (15_000_000_000, 'NVIDIA H200 "SXM"')
    assert parse_prometheus("other_metric 1\n") == (None, None)


def _ttft_scrape(ttft: tuple[float, int], stages: dict[str, tuple[float, int]]) -> str:
    m = 'model_name="m"'
    lines = [
        "# TYPE deltaserve_time_to_first_token_seconds histogram",
        f'deltaserve_time_to_first_token_seconds_bucket{{{m},le="+Inf"}} {ttft[1]}',
        f"deltaserve_time_to_first_token_seconds_count{{{m}}} {ttft[1]}",
        f"deltaserve_time_to_first_token_seconds_sum{{{m}}} {ttft[0]}",
        "# TYPE deltaserve_first_token_stage_seconds histogram",
    ]
    for stage, (total, n) in stages.items():
        lab = f'{m},stage="{stage}"'
        lines += [
            f'deltaserve_first_token_stage_seconds_bucket{{{lab},le="+Inf"}} {n}',
            f"deltaserve_first_token_stage_seconds_count{{{lab}}} {n}",
            f"deltaserve_first_token_stage_seconds_sum{{{lab}}} {total}",
        ]
    return "\n".join(lines) + "\n"


def test_first_token_stages_between_two_scrapes() -> None:
    before = _ttft_scrape((1.0, 2), {"queue": (0.25, 2), "prefill": (0.75, 2)})
    after = _ttft_scrape((1.5, 6), {"queue": (0.29, 6), "prefill": (1.21, 6)})
    got = first_token_stages_ms(before, after)
    assert got is not None and set(got) == {"ttft", "queue", "prefill"}
    assert got["ttft"] == pytest.approx(125.0) and got["queue"] == pytest.approx(10.0)
    assert got["prefill"] == pytest.approx(115.0)
    assert first_token_stages_ms(before, before) is None  # no first token in between
    assert first_token_stages_ms(None, after) is None
    assert first_token_stages_ms("other_metric 1\n", "other_metric 2\n") is None  # vLLM: no such histograms


def test_arrival_offsets_seeded_and_scaled() -> None:
    a = arrival_offsets(50, 10.0, 1.0, seed=7)
    assert a == arrival_offsets(50, 10.0, 1.0, seed=7)
    assert a != arrival_offsets(50, 10.0, 1.0, seed=8)
    assert a[-1] == pytest.approx(5.0)  # n / rate, as vLLM normalises
    assert all(x < y for x, y in zip(a, a[1:], strict=False))
    assert arrival_offsets(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]

    # Burstier (shape < 1) arrivals have a larger spread of gaps than Poisson.
    def cv(xs: list[float]) -> float:
        gaps = [y - x for x, y in zip([0.0] + xs, xs, strict=False)]
        s = summarize(gaps, ())
        return s["std"] / s["mean"]

    assert cv(arrival_offsets(2000, 10.0, 0.25, 1)) > cv(arrival_offsets(2000, 10.0, 1.0, 1)) > 0.8


def test_ab_order_and_ratio_stats() -> None:
    assert run_order(3) == ["A", "B", "B", "A", "A", "B", "A", "A"]

    def res(tput: float) -> dict:
        return {"output_throughput": tput, "mean_ttft_ms": 10.0}

    runs = [
        ("A", res(100)),
        ("B", res(110)),
        ("B", res(120)),
        ("A", res(100)),
        ("A", res(100)),
        ("B", res(105)),
    ]
    runs += [("A", res(100)), ("A", res(102))]
    s = ratio_stats(runs)
    o = s["output_throughput"]
    assert o["ratios"] == pytest.approx([1.1, 1.2, 1.05])
    assert (o["median"], o["min"], o["max"]) == pytest.approx((1.1, 1.05, 1.2))
    assert (o["noise_lo"], o["noise_hi"]) == pytest.approx((1 / 1.02, 1.02))
    assert o["within_noise"] is False
    t = s["mean_ttft_ms"]
    assert t["median"] == pytest.approx(1.0) and t["within_noise"] is True


def test_report_renders_without_matplotlib_features() -> None:
    r = compute_metrics(_traces())
    table = format_run_table(r)
    assert "Successful requests:" in table and "P99 TTFT (ms):" in table
    assert "Mean TTFT (ms):" in table and "server error: boom" in table
    md = markdown_summary({"run1": r})
    assert "| mean_ttft_ms | 600.00 |" in md
    xs, ys = throughput_series(r)
    assert sum(ys) == 9  # every successful token, one-second buckets


def test_plots_when_matplotlib_is_installed(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="plots are an optional extra (pip install .[plot])")
    from loadgen.report import plot

    files = plot({"run": compute_metrics(_traces())}, tmp_path)
    assert sorted(p.name for p in files) == ["itl_cdf.png", "throughput.png", "ttft_cdf.png"]
    assert all(p.stat().st_size > 1000 for p in files)

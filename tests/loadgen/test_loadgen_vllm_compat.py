"""Issue 13 for loadgen: vLLM's random dataset and flag names, and an A/B verdict only from 3 pairs
with the noise band built from the A runs."""

from __future__ import annotations

import pytest

from loadgen.__main__ import _records, build_parser
from loadgen.ab import ratio_stats, run_order
from loadgen.random_dataset import random_records
from loadgen.report import ab_table


def test_random_dataset_lengths_vocab_and_seed() -> None:
    recs = random_records(50, 64, 16, range_ratio=0.25, seed=3, vocab_size=400)
    assert len(recs) == 50 and len({r["id"] for r in recs}) == 50
    assert all(48 <= len(r["prompt_token_ids"]) <= 80 for r in recs)
    assert all(12 <= r["output_len"] <= 20 for r in recs)
    assert all(0 <= t < 400 for r in recs for t in r["prompt_token_ids"])
    assert len({len(r["prompt_token_ids"]) for r in recs}) > 5  # the range ratio varies them
    assert recs == random_records(50, 64, 16, range_ratio=0.25, seed=3, vocab_size=400)
    assert recs != random_records(50, 64, 16, range_ratio=0.25, seed=4, vocab_size=400)
    fixed = random_records(4, 10, 5, seed=0)
    assert [len(r["prompt_token_ids"]) for r in fixed] == [10] * 4 and {r["output_len"] for r in fixed} == {5}


def test_vllm_flag_names_are_aliases() -> None:
    vllm = build_parser().parse_args(
        "run --dataset-name random --max-concurrency 4 --num-prompts 6 --random-input-len 12 "
        "--random-output-len 3".split()
    )
    ours = build_parser().parse_args("run --dataset-name random --concurrency 4 --num-prompts 6".split())
    assert vllm.concurrency == ours.concurrency == 4
    recs = _records(vllm)
    assert len(recs) == 6 and all(len(r["prompt_token_ids"]) == 12 and r["output_len"] == 3 for r in recs)
    p = build_parser().parse_args(["run", "--dataset-path", "x.jsonl"])
    assert str(p.dataset) == "x.jsonl"


def test_no_dataset_is_a_clear_error() -> None:
    from loadgen.jsonstream import DatasetError

    with pytest.raises(DatasetError, match="--dataset-name random"):
        _records(build_parser().parse_args(["run"]))


def _runs(order: list[str], a: list[float], b: list[float]) -> list[tuple[str, dict]]:
    ai, bi = iter(a), iter(b)
    return [(arm, {"output_throughput": next(ai) if arm == "A" else next(bi)}) for arm in order]


def test_one_pair_gives_no_verdict() -> None:
    # A/A by construction, with ordinary run-to-run noise: one pair must not claim a difference.
    runs = _runs(run_order(1), a=[100, 100, 101], b=[104])
    r = ratio_stats(runs)["output_throughput"]
    assert r["median"] == pytest.approx(1.04) and r["within_noise"] is None
    assert "n/a (< 3 pairs)" in ab_table({"output_throughput": r})
    two = ratio_stats(_runs(run_order(2), a=[100, 100, 100, 100], b=[150, 150]))["output_throughput"]
    assert two["within_noise"] is None


def test_noise_band_from_every_a_run() -> None:
    order = run_order(3)  # A B B A A B A A: five A runs
    # The closing A/A pair alone is quiet (1.00) but the A runs drift by up to 5%: the band says so.
    runs = _runs(order, a=[100, 105, 100, 100, 100], b=[103, 104, 103])
    r = ratio_stats(runs)["output_throughput"]
    assert r["aa_ratio"] == pytest.approx(1.0)
    assert (r["noise_lo"], r["noise_hi"]) == pytest.approx((1 / 1.05, 1.05))
    assert r["within_noise"] is True  # 1.03 is inside what A alone wanders
    runs = _runs(order, a=[100, 101, 100, 100, 100], b=[110, 111, 110])
    assert ratio_stats(runs)["output_throughput"]["within_noise"] is False

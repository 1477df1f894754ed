"""Cached oracle gate: HF transformers' outputs stored in hf_cache.json, checked on every run
(also where transformers is not installed). Regenerate with ``python -m tests.oracle.make_hf_cache``."""

from __future__ import annotations

import json

import pytest
import torch

from tests.oracle import harness
from tests.oracle.cases import CASES, NUM_TOKENS, PROMPTS, write_case

CACHE = json.loads(harness.CACHE_FILE.read_text())
STATS = harness.STATS


@pytest.mark.parametrize("name", list(CASES))
def test_cached_oracle(name, tmp_path):
    entry = CACHE[name]
    _, ds_dir, digest = write_case(name, tmp_path)
    assert digest == entry["weights_sha256"], (
        "the seeded weights changed (torch RNG or cases.py); regenerate hf_cache.json with transformers"
    )
    runner = harness.ds_runner(ds_dir)
    for p in entry["prompts"]:
        ours = harness.ds_prefill_logits(runner, p["prompt"])[p["logit_rows"]]
        ok, diff, bound = harness.close(ours, torch.tensor(p["logits"]))
        assert ok, f"{name}: logits differ from cached HF by {diff:.3g} > {bound:.3g}"
        STATS["assertions"] += 1
    outs = harness.ds_greedy(runner, PROMPTS, NUM_TOKENS)
    for p, o in zip(entry["prompts"], outs, strict=True):
        assert o == p["greedy"], f"{name}: {o} != cached HF {p['greedy']}"
        STATS["assertions"] += 1
    STATS["cases"].add(("cached", name))

"""Shared test configuration: the gpu marker skips cleanly without CUDA; oracle counters are printed."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    try:
        from tests.oracle.harness import STATS
    except Exception:
        return
    if STATS["assertions"]:
        live = sorted(n for k, n in STATS["cases"] if k == "live")
        cached = sorted(n for k, n in STATS["cases"] if k == "cached")
        terminalreporter.write_line(
            f"oracle: {len(live)} live HF cases {live}, {len(cached)} cached cases {cached}, "
            f"{STATS['assertions']} assertions passed"
        )

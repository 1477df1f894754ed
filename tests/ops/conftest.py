"""gpu-marked kernel tests sit beside their op's CPU tests; without CuPy they skip (the root conftest
already skips them without CUDA)."""

from __future__ import annotations

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        pytest.importorskip("cupy")

"""The cached oracle must hold on any CPU: run it in subprocesses with torch's kernels forced to the
scalar (``default``) and ``avx2`` paths. Before the oracle's weights came from numpy, torch's CPU RNG
produced different weights per instruction set and the cached sha256 matched only on some CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["default", "avx2"])
def test_cached_oracle_under_isa(isa: str) -> None:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": isa}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/oracle/test_oracle_cached.py",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout, proc.stdout[-1000:]

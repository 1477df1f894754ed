"""deploy/gpu-tests.sh: the GPU test tier one pytest per file, its table and its exit status.

The files it runs here are real pytest files written to a temporary directory (outside the repository,
so tests/conftest.py's skip-without-CUDA does not apply and the outcome is the same on any machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy" / "gpu-tests.sh"
GPU_MARK = "pytest.mark." + "gpu"  # spelled apart so the script's file list does not take this file

BODIES = {
    "test_pass.py": """
        import pytest

        @GPU
        def test_ok():
            assert 1 + 1 == 2

        @GPU
        def test_ok_too():
            assert "gpu"

        def test_cpu_only():  # not GPU-marked: deselected by -m gpu
            raise AssertionError("must not run")
    """,
    "test_fail.py": """
        import pytest

        @GPU
        def test_wrong():
            assert 1 + 1 == 3
    """,
    "test_skip.py": """
        import pytest

        @GPU
        def test_needs_cuda():
            pytest.skip("needs a CUDA GPU")
    """,
    "test_no_gpu.py": """
        def test_cpu():
            assert True
    """,
    "test_hang.py": """
        import time

        import pytest

        @GPU
        def test_hangs():
            time.sleep(600)
    """,
}


def _run(tmp_path: Path, names: list[str], timeout_s: int = 300) -> tuple[int, str, str]:
    for name in names:
        body = textwrap.dedent(BODIES[name]).replace("@GPU", "@" + GPU_MARK)
        (tmp_path / name).write_text(body, encoding="utf-8")
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "PER_FILE_TIMEOUT": str(timeout_s)}
    p = subprocess.run(
        ["bash", str(SCRIPT), str(out), *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    summary = (out / "summary.txt").read_text(encoding="utf-8")
    assert p.stdout == summary, "the table on stdout is the one written to summary.txt"
    return p.returncode, summary, p.stderr


def _row(summary: str, name: str) -> str:
    rows = [line for line in summary.splitlines() if line.split(" ", 1)[0].endswith(name)]
    assert len(rows) == 1, summary
    return rows[0]


def test_all_passing_files_exit_0_and_count_the_passes(tmp_path):
    rc, summary, _ = _run(tmp_path, ["test_pass.py", "test_no_gpu.py"])
    assert rc == 0, summary
    assert "2 passed, 1 deselected" in _row(summary, "test_pass.py")
    assert "1 deselected" in _row(summary, "test_no_gpu.py")  # pytest's 5 (nothing selected) is fine
    assert summary.rstrip().endswith("GPU tests: 2 passed")
    assert len(list((tmp_path / "out").glob("*.log"))) == 2  # one log per file


def test_a_failing_file_fails_the_tier_and_the_others_still_run(tmp_path):
    rc, summary, _ = _run(tmp_path, ["test_fail.py", "test_pass.py"])
    assert rc == 1, summary
    assert "1 failed" in _row(summary, "test_fail.py")
    assert "2 passed" in _row(summary, "test_pass.py")
    assert "GPU tests: FAILED" in summary
    logs = list((tmp_path / "out").glob("*test_fail.log"))
    assert len(logs) == 1 and "assert 1 + 1 == 3" in logs[0].read_text(encoding="utf-8")


def test_every_gpu_test_skipped_exits_2(tmp_path):
    rc, summary, _ = _run(tmp_path, ["test_skip.py", "test_no_gpu.py"])
    assert rc == 2, summary
    assert "1 skipped" in _row(summary, "test_skip.py")
    assert "none ran" in summary and "no CUDA device" in summary


def test_a_file_past_its_limit_is_named_and_fails_the_tier(tmp_path):
    rc, summary, _ = _run(tmp_path, ["test_hang.py", "test_pass.py"], timeout_s=8)
    assert rc == 1, summary
    row = _row(summary, "test_hang.py")
    assert row.split()[1] == "124" and "ran past 8 s" in row
    assert "2 passed" in _row(summary, "test_pass.py")


def test_default_file_list_is_every_file_with_gpu_tests():
    """``--list``: without file arguments the script runs every tests/**/test_*.py that marks GPU
    tests (read from the files here, not run)."""
    files = (ROOT / "tests").rglob("test_*.py")
    marked = sorted(str(f.relative_to(ROOT)) for f in files if GPU_MARK in f.read_text(encoding="utf-8"))
    p = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True)
    assert p.stdout.split() == marked
    assert "tests/ops/test_attention_cuda.py" in marked and "tests/test_gpu_tests_script.py" not in marked

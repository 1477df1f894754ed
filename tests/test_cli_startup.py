"""Issue 13, the first minutes with the CLI: bad flags fail at once with a usage message, --log-level
works after the subcommand, a busy port is reported before the model loads, --help shows defaults
and choices."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    return proc, time.monotonic() - t0


def test_bad_flag_values_fail_fast_with_usage() -> None:
    for args in (
        ["--dtype", "foo"],
        ["--device", "tpu"],
        ["--gdn-backend", "x"],
        ["--log-level", "loud"],
        ["--kv-cache-memory", "lots"],
        ["--device-memory-limit", "16 GiBs"],
        ["--mamba-ssm-cache-dtype", "float16"],
        ["--cuda-graph-capture", "eager"],
    ):
        proc, took = _run("serve", *args)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr[-500:])
        assert proc.stderr.startswith("usage: deltaserve serve") and "Traceback" not in proc.stderr
        assert took < 1.0 + 1.0, f"{args} took {took:.2f} s"  # < 1 s of our own, plus interpreter start


def test_log_level_after_subcommand_and_busy_port_before_model_load() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, took = _run("serve", "--log-level", "debug", "--port", str(port), timeout=30)
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert f"127.0.0.1:{port}" in proc.stderr and "in use" in proc.stderr.lower()
    assert "engine ready" not in proc.stderr  # found before the model was loaded
    assert took < 5.0


def test_help_shows_defaults_and_choices() -> None:
    proc, _ = _run("serve", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "(default: 8000)" in text and "(default: 127.0.0.1)" in text
    assert "{auto,bfloat16,float16,float32}" in text and "{debug,info,warning,error,critical}" in text
    assert "--mamba-ssm-cache-dtype {auto,float32,bfloat16}" in text
    assert "--cuda-graph-capture {lazy,startup}" in text

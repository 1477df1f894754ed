"""RELIABILITY 18: schemathesis fuzzes every route of /openapi.json on the real server (tiny model,
real ZeroMQ engine process) for a bounded number of cases; no request may produce a 5xx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.loadgen.test_e2e_server import server  # noqa: F401  (the real-server fixture)

pytestmark = pytest.mark.slow


def test_no_server_errors_under_schema_fuzzing(server: str, tmp_path: Path) -> None:  # noqa: F811
    cli = Path(sys.executable).with_name("schemathesis")
    assert cli.exists(), "schemathesis is part of the test extra"
    out = subprocess.run(
        [
            str(cli),
            "run",
            f"{server}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "25",
            "--workers",
            "1",
            "--seed",
            "1",
            # The check is "no 5xx", not latency: a body like {"prompt": "!"} gets the default
            # max_tokens (the context's room, 4,095 on the tiny model), several seconds of decoding
            # on a 2-core host when sampling draws no EOS for long, and more on a loaded one;
            # schemathesis' default 10 s read timeout turns that into a network error.
            "--request-timeout",
            "120",
        ],
        cwd=tmp_path,  # schemathesis keeps a run cache in the working directory
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "passed" in out.stdout

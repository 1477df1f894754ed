"""loadgen against the REAL deltaserve server on the embedded tiny model (CPU).

Starts `python -m engine.cli serve` with no --model (the tiny model), pretokenizes the shipped
ShareGPT sample with the tiny checkpoint's tokenizer, runs 16 requests at concurrency 4 and checks
that every request succeeded and that loadgen's token counts equal the server's usage.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.ab import stop_process, wait_for_health
from tests.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "loadgen" / "data" / "sample_sharegpt.json"
REQUIRED_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "errors",
    "server_peak_memory_bytes",
    "gpu_name",
    "git_commit",
    "flags",
    "usage_input_lens",
) + tuple(
    f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p90", "p99")
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "serve", "--port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_health(url, 120, proc)
        except (RuntimeError, TimeoutError) as e:
            pytest.fail(f"{e}:\n{log_path.read_text(errors='replace')[-4000:]}")
        yield url
    finally:
        stop_process(proc)  # the server's process group: the API process forks an engine process


def _make_tiny(ckpt: Path) -> Path:
    """The tiny checkpoint through the CLI, as a user would make it."""
    mk = subprocess.run(
        [sys.executable, "-m", "engine.cli", "make-checkpoint", str(ckpt), "--preset", "tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert mk.returncode == 0, mk.stdout + mk.stderr
    return ckpt


def _pretokenize(ckpt: Path, out: Path, num: int, input_len: int, output_len: int) -> None:
    """The shipped ShareGPT sample at fixed lengths, with the checkpoint's tokenizer."""
    _loadgen(
        "pretokenize",
        "--dataset",
        str(SAMPLE),
        "--tokenizer",
        str(ckpt),
        "-o",
        str(out),
        "--num-prompts",
        str(num),
        "--input-len",
        str(input_len),
        "--output-len",
        str(output_len),
        "--seed",
        "0",
    )


def _loadgen(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "loadgen", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_loadgen_against_real_server(server: str, tmp_path: Path) -> None:
    ckpt = _make_tiny(tmp_path / "tiny")
    assert (ckpt / "tokenizer.json").is_file()

    reqs = tmp_path / "req.jsonl"
    _pretokenize(ckpt, reqs, num=16, input_len=64, output_len=16)
    lines = [json.loads(x) for x in reqs.read_text().splitlines()]
    assert len(lines) == 16 and all(len(x["prompt_token_ids"]) == 64 for x in lines)

    result_file = tmp_path / "result.json"
    _loadgen(
        "run",
        "--base-url",
        server,
        "--dataset",
        str(reqs),
        "--concurrency",
        "4",
        "--result-file",
        str(result_file),
        "--no-progress",
    )
    r = json.loads(result_file.read_text())
    missing = [k for k in REQUIRED_KEYS if k not in r]
    assert not missing, missing
    assert (r["completed"], r["failed"]) == (16, 0), r["errors"]
    assert all(e == "" for e in r["errors"])
    # Output counts come from the server's usage chunk; with ignore_eos they are exactly max_tokens.
    # The server streams one chunk per generated token (also while a token's text is an incomplete
    # UTF-8 sequence), so ITL sees every token.
    assert r["output_lens"] == [16] * 16 and r["total_output_tokens"] == 256
    assert r["output_len_mismatches"] == 0
    assert all(len(itl) == 15 for itl in r["itls"])
    assert r["usage_chunk_mismatches"] == 0
    # Prompt counts: what loadgen sent equals what the server says it received.
    assert r["input_lens"] == [64] * 16 and r["usage_input_lens"] == r["input_lens"]
    assert r["total_input_tokens"] == 1024
    assert r["duration"] > 0 and r["mean_ttft_ms"] > 0 and r["mean_tpot_ms"] > 0
    # the server's own TTFT by stage over exactly these 16 requests (warm-ups excluded): the stages
    # add up to the server's mean TTFT, which the client's includes
    stages = r["server_first_token_stages_ms"]
    from server.metrics import FIRST_TOKEN_STAGES

    assert set(stages) == {"ttft", *FIRST_TOKEN_STAGES} and len(FIRST_TOKEN_STAGES) == 7
    assert sum(v for k, v in stages.items() if k != "ttft") == pytest.approx(stages["ttft"], rel=1e-6)
    assert 0 < stages["ttft"] <= r["mean_ttft_ms"] and stages["prefill"] > 0


def test_ab_on_two_real_tiny_servers(tmp_path: Path) -> None:
    """`loadgen ab --a-cmd/--b-cmd` starts and stops two deltaserve configurations (different token
    budgets) one at a time, A B then the A/A pair, and prints B/A ratios with the A/A noise band."""
    ckpt = _make_tiny(tmp_path / "tiny")
    reqs = tmp_path / "req.jsonl"
    _pretokenize(ckpt, reqs, num=8, input_len=32, output_len=8)
    port = free_port()
    serve = f"{sys.executable} -m engine.cli serve --model {ckpt} --port {port}"
    out_dir = tmp_path / "ab"
    res = _loadgen(
        "ab",
        "--dataset",
        str(reqs),
        "--a-cmd",
        serve + " --max-num-batched-tokens 2048",
        "--b-cmd",
        serve + " --max-num-batched-tokens 64",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--pairs",
        "1",
        "--concurrency",
        "4",
        "--startup-timeout",
        "120",
        "--out-dir",
        str(out_dir),
        "--no-progress",
    )
    summary = json.loads((out_dir / "ab.json").read_text())
    assert summary["order"] == ["A", "B", "A", "A"]
    assert all(n == 0 for n in summary["failed"].values()), summary["failed"]
    tput = summary["ratios"]["output_throughput"]
    assert tput["median"] > 0 and tput["noise_lo"] is not None and tput["noise_hi"] is not None
    assert "A/A noise band" in res.stdout and "output_throughput" in res.stdout


def test_benchmarks_md_first_command_as_written(server: str) -> None:
    """docs/BENCHMARKS.md's first loadgen command runs from a fresh clone as written (only the port
    is this test server's): vLLM's flag names, the random dataset, no file."""
    doc = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    block = doc.split("## First run", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [" ".join(ln.split()) for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    assert lines[0].startswith("deltaserve serve --port 8000")  # what the fixture runs
    line = lines[1]
    assert line.startswith("loadgen run --base-url http://127.0.0.1:8000 --dataset-name random")
    args = line.split()[1:]
    args[args.index("--base-url") + 1] = server
    out = _loadgen(*args, "--no-progress")
    table = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in out.stdout.splitlines())}
    assert table["Successful requests"] == "32" and table["Failed requests"] == "0", out.stdout

"""lm-evaluation-harness (``local-completions``) against the real server over real HTTP, offline.

Two tasks defined here (YAML + jsonl beside this file, no download): a multiple-choice task, which
lm-eval scores with ``echo`` + ``logprobs`` loglikelihood requests, and a generate-until task. Every
loglikelihood lm-eval reports must equal deltaserve's own offline prompt logprobs of the same tokens
(engine.generate.score_prompts on the CPU fp32 path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import EngineConfig, ModelConfig
from engine.frontend.tokenizer import Tokenizer
from engine.generate import score_prompts
from engine.worker.model_runner import ModelRunner
from engine.worker.resolve import resolve_model
from tests.server.realserver import Server

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    srv = Server(tmp_path_factory.mktemp("lm_eval_server"), env=OFFLINE)
    try:
        yield srv.url
    finally:
        srv.stop()


def _encode_pair(tok: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """How lm-eval splits a (context, continuation) pair into tokens for a causal model."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    return ctx, whole[len(ctx) :]


def _samples(out: Path, task: str) -> list[dict]:
    (path,) = out.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_lm_eval_loglikelihood_and_generate_until(server: str, tmp_path: Path) -> None:
    model_dir = resolve_model(ModelConfig()).model
    out = tmp_path / "lm_eval"
    args = (
        f"model=qwen3.5-tiny,base_url={server}/v1/completions,tokenizer={model_dir},"
        "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1"
    )
    cmd = [
        sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args,
        "--tasks", "deltaserve_tiny_choice,deltaserve_tiny_gen", "--include_path", str(HERE),
        "--output_path", str(out), "--log_samples",
    ]  # fmt: skip
    run = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    assert "acc,none" in results["deltaserve_tiny_choice"]
    assert "exact_match,none" in results["deltaserve_tiny_gen"]

    tok = Tokenizer.from_dir(model_dir)
    runner = ModelRunner(EngineConfig(model=resolve_model(ModelConfig())))
    checked, worst = 0, 0.0
    for sample in _samples(out, "deltaserve_tiny_choice"):
        for i, resp in enumerate(sample["resps"]):
            arg = sample["arguments"][f"gen_args_{i}"]
            ctx, cont = _encode_pair(tok, arg["arg_0"], arg["arg_1"])
            (scored,) = score_prompts(runner, [ctx + cont])
            ours = sum(s.logprob for s in scored[len(ctx) - 1 :])
            theirs = float(resp[0][0])
            assert abs(theirs - ours) <= 1e-4, (arg, theirs, ours)
            checked, worst = checked + 1, max(worst, abs(theirs - ours))
    assert checked == 11
    print(f"lm-eval vs offline prompt logprobs: {checked} loglikelihoods, max |diff| {worst:.3g}")
    gens = _samples(out, "deltaserve_tiny_gen")
    assert len(gens) == 3 and all(isinstance(g["filtered_resps"][0], str) for g in gens)

"""Regenerate tests/oracle/hf_cache.json from HF transformers (run after changing cases.py).

python -m tests.oracle.make_hf_cache
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from tests.oracle.cases import CASES, NUM_TOKENS, PROMPTS, write_case
from tests.oracle.harness import CACHE_FILE, logit_rows


def hf_run(hf_dir: Path) -> dict:
    import transformers
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out: dict = {"transformers": transformers.__version__, "prompts": []}
    for p in PROMPTS:
        ids = torch.tensor([p])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
            gen = model.generate(
                ids,
                max_new_tokens=NUM_TOKENS,
                min_new_tokens=NUM_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        rows = logit_rows(len(p))
        out["prompts"].append(
            {
                "prompt": p,
                "greedy": gen[0, len(p) :].tolist(),
                "logit_rows": rows,
                "logits": [logits[r].tolist() for r in rows],
                "all_logits": logits,  # kept in memory for the live test, dropped before saving
            }
        )
    return out


def main() -> None:
    cache = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            hf_dir, _, digest = write_case(case, Path(tmp) / case)
            res = hf_run(hf_dir)
            for p in res["prompts"]:
                p.pop("all_logits")
            cache[case] = {"weights_sha256": digest, **res}
    CACHE_FILE.write_text(json.dumps(cache))
    print(f"wrote {CACHE_FILE} ({len(cache)} cases)")


if __name__ == "__main__":
    main()

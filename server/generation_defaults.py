"""Sampling defaults from the checkpoint's generation_config.json (``--generation-config``).

``auto``: the model directory's file; ``vllm``: none (the API's own defaults); any other value: a
directory holding a generation_config.json. Only the fields vLLM takes are used; a request that sets
a field always wins over the default.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("deltaserve.server")

# generation_config.json name -> request field
FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def load_defaults(mode: str, model_dir: str) -> dict[str, Any]:
    """The request-field defaults, logged once; {} for ``vllm`` or a checkpoint without the file."""
    if mode == "vllm":
        logger.info("generation config: ignored (--generation-config vllm)")
        return {}
    root = Path(model_dir) if mode == "auto" else Path(mode)
    path = root / "generation_config.json"
    if not path.is_file():
        if mode != "auto":
            raise ValueError(f"--generation-config {mode}: no generation_config.json there")
        logger.info("generation config: none in %s; the API defaults apply", root)
        return {}
    raw = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, Any] = {}
    for key, field in FIELDS.items():
        value = raw.get(key) if isinstance(raw, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[field] = value
    logger.info("generation config: defaults for requests that omit them: %s (from %s)", out or "none", path)
    return out


def default(body: Any, field: str, defaults: dict[str, Any]) -> Any:
    """The request's value if it set the field, else the checkpoint default, else the API default."""
    if field in body.model_fields_set or field not in defaults:
        return getattr(body, field)
    return defaults[field]

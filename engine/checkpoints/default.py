"""The embedded default model: a tiny seeded Qwen3.5 checkpoint written to the cache dir on first use."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TINY_NAME = "qwen3.5-tiny"
_VERSION = "v3"  # bump when the tiny preset changes so stale caches are rewritten


def ensure_default_model(cache_dir: Path) -> Path:
    """Return the tiny checkpoint's directory, writing it atomically if it is not there yet."""
    from engine.checkpoints.presets import make_checkpoint

    target = Path(cache_dir) / f"{TINY_NAME}-{_VERSION}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temp dir and rename, so concurrent first starts never see half a checkpoint.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    make_checkpoint(tmp, preset="tiny", seed=0)
    try:
        os.replace(tmp, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    return target

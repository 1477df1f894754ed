"""Make the repository root importable (engine/, tests.engine.fake_runner for the spawned engine)."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

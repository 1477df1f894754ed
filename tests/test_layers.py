"""The import layers of docs/ARCHITECTURE.md: a module may import its own layer and the layers below it,
never one above. Walks every ``import`` in engine/ and server/ (function-local ones too: a lazy import
is still a dependency) with the ast module, so the check needs no third-party tool."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module belongs to the longest prefix listed; engine/ modules not listed are an error
# (a new top-level module must choose its layer here).
LAYERS: tuple[tuple[str, ...], ...] = (
    # the wire and the log format: both processes read them
    ("engine.config", "engine.messages", "engine.sampling_params", "engine.logs"),
    ("engine.ops",),
    ("engine.model",),
    ("engine.checkpoints",),  # writes model directories (presets, the embedded default model)
    ("engine.worker",),
    ("engine.core",),
    ("engine.frontend",),
    ("server",),  # state, serving, protocol, errors, streaming, metrics, auth
    ("server.routes",),  # thin: HTTP in, server.serving, HTTP out
    ("server.app", "server.launch"),  # the app factory imports the routes, never the reverse
    ("engine.cli", "engine.generate", "engine.bench"),  # entry points: may use everything
)


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for rank, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), rank)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import of a project module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            # `from engine.ops import conv` imports engine.ops.conv when that is a module
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return [(n, m) for n, m in out if m.split(".")[0] in ("engine", "server")]


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    own = layer_of(module)
    if own is None:
        return [f"{module}: in no layer of tests/test_layers.py"]
    found = []
    for line, target in imported(ast.parse(source), module, is_package):
        rank = layer_of(target)
        if rank is None:  # `from engine.ops import Ops` names a class, not a module: use the package
            rank = layer_of(target.rsplit(".", 1)[0])
        if rank is not None and rank > own:
            found.append(f"{module}:{line} imports {target} (layer {rank} above {own})")
    return found


def project_modules() -> list[Path]:
    """Every non-empty module (an empty ``__init__.py`` imports nothing and belongs nowhere)."""
    paths = (p for d in ("engine", "server") for p in (ROOT / d).rglob("*.py"))
    return sorted(p for p in paths if p.read_text().strip())


def test_no_upward_imports() -> None:
    found = []
    for path in project_modules():
        found += violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source", "bad"),
    [
        ("engine.ops.gdn.chunk", "from engine.model.qwen3_5.config import Qwen35Config\n", True),
        ("engine.core.scheduler", "def f():\n    from engine.frontend import async_llm\n", True),
        ("engine.worker.sampler", "import server.app\n", True),
        ("engine.config", "from engine.checkpoints.default import TINY_NAME\n", True),
        ("engine.model.loader", "from ..worker import step\n", True),
        ("engine.frontend.core_client", "from engine.core.engine_core import EngineCore\n", False),
        ("engine.model.qwen3_5.model", "from engine.ops import Ops\nfrom . import layers\n", False),
        ("server.serving", "from engine.sampling_params import SamplingParams\n", False),
        ("server.routes.chat", "from server.app import build_app\n", True),
        ("server.routes.chat", "from server.serving import submit\n", False),
    ],
)
def test_the_walker_sees_upward_imports(module: str, source: str, bad: bool) -> None:
    assert bool(violations(source, module)) is bad


def test_every_module_has_a_layer() -> None:
    assert all(layer_of(module_name(p)) is not None for p in project_modules())

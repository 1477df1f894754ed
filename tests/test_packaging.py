"""A non-editable install (the Docker image, the offline wheelhouse) carries every kernel source.

The op wrappers compile cuda/**/*.cu at run time (NVRTC through CuPy). Outside a checkout they find
the sources under <prefix>/share/deltaserve/cuda, which pyproject's data-files fill folder by folder
(setuptools takes no recursive globs there). Until session 35 cuda/gemm and cuda/sample were missing,
so the Docker image could not compile its default arm linear.skinny. Checked twice: the patterns
against the tree, and a wheel built from a copy of the tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUDA = ROOT / "cuda"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _kernel_files() -> list[Path]:
    files = sorted(p.relative_to(ROOT) for p in CUDA.rglob("*") if p.is_file() and p.suffix != ".pyc")
    assert any(p.suffix == ".cu" for p in files) and any(p.suffix == ".cuh" for p in files)
    return files


def test_data_files_cover_every_kernel_source() -> None:
    shipped: dict[Path, str] = {}
    for dest, patterns in _pyproject()["tool"]["setuptools"]["data-files"].items():
        for pattern in patterns:
            for f in ROOT.glob(pattern):
                shipped[f.relative_to(ROOT)] = dest
    for rel in _kernel_files():
        assert rel in shipped, f"{rel} is in no data-files pattern of pyproject.toml"
        assert shipped[rel] == f"share/deltaserve/{rel.parent.as_posix()}", rel


def test_the_wheel_carries_the_kernel_sources(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} is older than the build backend needs (77)")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("engine", "server", "client", "loadgen", "cuda"):
        shutil.copytree(ROOT / d, src / d, ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    out = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
    cmd.append(str(src))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = out.glob("deltaserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"deltaserve-{_pyproject()['project']['version']}.data/data/share/deltaserve"
    missing = [str(rel) for rel in _kernel_files() if f"{data}/{rel.as_posix()}" not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert "engine/ops/compile.py" in names and "cuda/__init__.py" not in names  # no top-level cuda package


def test_the_scripts_the_docs_run_are_executable() -> None:
    # docs/ run them as deploy/<name>.sh; deploy/bench-workloads.sh was committed without its x bit
    scripts = [*sorted((ROOT / "deploy").glob("*.sh")), ROOT / ".ci" / "run"]
    assert len(scripts) > 5
    for s in scripts:
        assert s.stat().st_mode & 0o111 == 0o111, f"{s.relative_to(ROOT)} is not executable"
        assert s.read_text().startswith("#!/usr/bin/env bash"), s

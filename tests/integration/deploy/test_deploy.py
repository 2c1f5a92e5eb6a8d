"""The deployment files: KServe manifests valid against the `kserve` package's models, and the
images' and the runtime's command lines ones that `dlscale serve` accepts.

The images themselves are not built here (no container engine); deploy/docker is linted with
hadolint when it is on the PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlscale.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kserve").glob("*.yaml"))
CHECKER = Path(__file__).with_name("kserve_schema.py")
#: KServe's and Kubernetes' generated models, installed without their dependencies: the whole
#: `kserve` package in a venv of its own took over two minutes of a fresh clone's run. The
#: Makefile's dev install puts them there (a `pip install` here took 18-35 s of the suite);
#: installed here only where that install did not run.
KSERVE_MODELS = ROOT / ".bench" / "kserve-models"
KSERVE_PINS = Path(__file__).with_name("kserve-models.txt")

BROKEN = """apiVersion: serving.kserve.io/v1alpha1
kind: ServingRuntime
metadata: {name: broken}
spec:
  protocolVersions: v2
  supportedModelFormats: [{name: onnx, autoselect: true}]
"""


def _kserve_models() -> Path:
    if not all((KSERVE_MODELS / p).is_dir() for p in ("kserve", "kubernetes")):
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]
        try:
            subprocess.run([*pip, str(KSERVE_MODELS), "-r", str(KSERVE_PINS)], check=True)
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(KSERVE_MODELS, ignore_errors=True)
            pytest.skip(f"kserve cannot be installed here: {exc}")
    return KSERVE_MODELS


def _check(*paths: Path) -> dict[str, list[str]]:
    out = subprocess.run(
        [sys.executable, str(CHECKER), *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(_kserve_models())},
    )
    return dict(json.loads(out.stdout))


def test_the_manifests_match_kserves_schema(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN)
    problems = _check(*MANIFESTS, broken)
    assert {Path(p).name for p in problems} == {"servingruntime.yaml", "inferenceservice.yaml"} | {
        "broken.yaml"
    }
    assert all(problems[str(m)] == [] for m in MANIFESTS), problems
    # The check does find what is wrong.
    assert problems[str(broken)] == [
        "ServingRuntime.spec.protocolVersions: expected a list, got 'v2'",
        "ServingRuntime.spec.supportedModelFormats[0].autoselect: not a field of "
        "V1alpha1SupportedModelFormat",
        "ServingRuntime.spec: Invalid value for `containers`, must not be `None`",
    ]


def _documents() -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml")
    return [d for m in MANIFESTS for d in yaml.safe_load_all(m.read_text()) if d]


def test_the_runtime_runs_dlscale_serve_on_its_ports() -> None:
    runtime = next(d for d in _documents() if d["kind"] == "ServingRuntime")
    spec = runtime["spec"]
    (container,) = spec["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.repo == Path("/mnt/models") and args.host == "0.0.0.0"
    assert container["ports"][0]["containerPort"] == args.http_port == 8080
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(args.metrics_port)
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"} and args.grpc_port == 9000
    service = next(d for d in _documents() if d["kind"] == "InferenceService")
    assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_the_images_run_dlscale_serve(name: str) -> None:
    text = (DEPLOY / "docker" / name).read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    command = json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert entrypoint == ["dlscale"]
    args = build_parser().parse_args(command)
    assert (args.repo, args.host) == (Path("/models"), "0.0.0.0")
    exposed = re.search(r"^EXPOSE (.*)$", text, re.M).group(1).split()  # type: ignore[union-attr]
    assert [int(p) for p in exposed] == [args.http_port, args.grpc_port, args.metrics_port]
    assert re.search(r"^USER 1000$", text, re.M), "the image runs as root"
    hadolint = shutil.which("hadolint")
    if hadolint is not None:
        lint = subprocess.run([hadolint, str(DEPLOY / "docker" / name)], capture_output=True)
        assert lint.returncode == 0, lint.stdout.decode()

"""`make demo` on a fresh machine: the torch build it takes, and the client the README uses."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _demo_steps(tmp_path: Path, build: str) -> str:
    # The recipe as make would run it for a fresh venv (nothing is executed).
    target = f"{tmp_path}/venv/.demo-installed"
    done = subprocess.run(
        ["make", "-n", target, f"VENV={tmp_path}/venv", f"TORCH_BUILD={build}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def test_a_machine_without_a_gpu_takes_torch_from_the_cpu_index_with_a_fallback(
    tmp_path: Path,
) -> None:
    steps = _demo_steps(tmp_path, "cpu")
    install = next(line for line in steps.splitlines() if "torch==" in line)
    # PyPI's torch is the CUDA build: the CPU index comes first, pip's usual sources after.
    assert f"--index-url https://{CPU_INDEX} torch==2.13.0" in install
    assert "else" in install and install.rstrip("; fi").endswith("install -q torch==2.13.0")


def test_a_gpu_machine_takes_the_cuda_build(tmp_path: Path) -> None:
    steps = _demo_steps(tmp_path, "cuda")
    assert CPU_INDEX not in steps and "install -q torch==2.13.0" in steps


def test_make_demo_installs_the_client_the_readme_snippet_imports(tmp_path: Path) -> None:
    assert "-e '.[torch,client]'" in _demo_steps(tmp_path, "cpu")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = extras["optional-dependencies"]["client"]
    assert any(req.startswith("tritonclient[http,grpc]") for req in client)
    assert "tritonclient.http" in (ROOT / "README.md").read_text()


def test_make_demo_installs_openai_and_the_readme_names_the_llm_extra(tmp_path: Path) -> None:
    # The README's tour imports `openai` and builds llama-tiny: the first comes with `make
    # demo` (the [client] extra), the second needs [llm], which the README says how to install.
    assert "-e '.[torch,client]'" in _demo_steps(tmp_path, "cpu")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(req.startswith("openai") for req in extras["optional-dependencies"]["client"])
    readme = (ROOT / "README.md").read_text()
    assert "from openai import OpenAI" in readme
    tour = readme[readme.index("--models llama-tiny") - 400 :]
    assert "pip install -e '.[llm]'" in tour
    bench = next(ln for ln in readme.splitlines() if "--tokenizer models/llama-tiny/1" in ln)
    following = readme.splitlines()[readme.splitlines().index(bench) + 1]
    assert "--api-key KEY" in bench + following  # the server of the line above has a key

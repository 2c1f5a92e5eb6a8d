"""`dlscale models check` and `models convert` typed as users type them (the command, a child
process): check without --load says what it checked and what it did not, and finds what it can
without loading; convert takes --dry-run before or after the model names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tests.toolkit.cli import child_env, dlscale_command, run_cli
from tests.toolkit.python_models import ADD_SUB, triton_config, write_triton_python_model

BROKEN_SYNTAX = ADD_SUB.replace("def execute(self, requests):", "def execute(self, requests)")
MISSING_IMPORT = "import no_such_package_here\n" + ADD_SUB
#: A compile error ast.parse lets through: `return` outside a function.
OUTSIDE = ADD_SUB + "\nreturn 1\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("habits-cli")
    for name, code in (
        ("good", ADD_SUB), ("syntax", BROKEN_SYNTAX), ("imports", MISSING_IMPORT),
        ("outside", OUTSIDE),
    ):  # fmt: skip
        write_triton_python_model(root, name, code, triton_config(name))
    return root


def test_check_without_load_finds_code_errors_and_says_what_it_did_not_check(repo: Path) -> None:
    done = run_cli("models", "check", str(repo), timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "ok     good (versions [1])" in lines
    failed = {ln.split(":")[0].split()[1]: ln for ln in lines if ln.startswith("FAILED")}
    assert set(failed) == {"syntax", "imports", "outside"}, done.stdout
    assert "imports 'no_such_package_here', which is not installed here" in failed["imports"]
    assert "does not compile" in failed["outside"]
    assert "not checked: that each runtime loads its model" in done.stdout
    assert "add --load" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("order", ["flag first", "flag last"])
def test_convert_dry_run_before_or_after_the_names(repo: Path, order: str) -> None:
    names = ["good"]
    args = ["--dry-run", *names] if order == "flag first" else [*names, "--dry-run"]
    done = run_cli("models", "convert", str(repo), *args, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"# {repo / 'good' / 'config.toml'}" in done.stdout
    assert "# Converted from config.pbtxt" in done.stdout
    assert "syntax" not in done.stdout  # only the model named
    assert not (repo / "good" / "config.toml").exists()  # a dry run writes nothing


#: A sitecustomize that makes these packages absent, as on a machine where `make demo` alone
#: ran (the [llm] extra not installed): found by neither import nor importlib.util.find_spec.
HIDE = """
import sys

class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
"""


@pytest.mark.parametrize(
    ("model", "module", "extra"),
    [("llama-tiny", "transformers", "llm"), ("tf-image-e2e", "tensorflow", "tensorflow")],
)
def test_zoo_build_without_its_extra_names_it(
    tmp_path: Path, model: str, module: str, extra: str
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE.format(hidden={module}))
    paths = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    done = subprocess.run(
        [*dlscale_command(), "zoo", "build", str(tmp_path / "models"), "--models", model],
        capture_output=True, text=True, timeout=300, check=False,
        env=child_env(PYTHONPATH=os.pathsep.join(paths)),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr
    assert f"zoo model {model!r} needs {module}, from dlscale's [{extra}] extra" in done.stderr
    assert f"pip install 'dlscale[{extra}]'" in done.stderr
    assert not (tmp_path / "models" / model).exists()  # nothing half-built

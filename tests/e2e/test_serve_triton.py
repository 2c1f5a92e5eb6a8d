"""`dlscale serve` started with Triton's habits: its flag spellings work, its other flags get a
message naming dlscale's, and a model folder given as the repository is refused at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tests.toolkit.cli import run_cli, served
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import NULL_TENSORS

ECHO = "max_batch_size = 8\n" + NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two null models, `first` and `second`."""
    root = tmp_path_factory.mktemp("serve-triton")
    for name in ("first", "second"):
        write_null_model(root, name, ECHO)
    return root


def test_a_triton_command_line_serves(repo: Path) -> None:
    triton = [
        f"--model-repository={repo}", "--model-control-mode=explicit", "--load-model=second",
        "--strict-readiness=true", "--exit-on-error=false", "--exit-timeout-secs=5",
        "--log-verbose=1", "--allow-grpc=true", "--strict-model-config=false",
    ]  # fmt: skip
    with served(None, *triton) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_server_ready()
        assert client.is_model_ready("second") and not client.is_model_ready("first")
        client.load_model("first")  # explicit control: loads over the API are allowed
        assert client.is_model_ready("first")
        assert client.get_log_settings()["log_verbose_level"] == 1  # --log-verbose=1


@pytest.mark.parametrize("what", ["version folders", "config.pbtxt"])
def test_a_model_folder_is_refused_at_once(tmp_path: Path, what: str) -> None:
    model = tmp_path / "repo" / "model"
    if what == "version folders":
        (model / "1").mkdir(parents=True)
    else:
        model.mkdir(parents=True)
        (model / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    done = run_cli("serve", str(model), "--http-port", "0", "--grpc-port", "0", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{model} is a model folder (it holds {what}), not a repository" in done.stderr
    assert f"serve its parent ({model.parent})" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("triton", "advice"),
    [
        (["--http-thread-count", "8"], "--http-workers"),
        (["--grpc-use-ssl=true"], "--tls-cert"),
        (["--http-address", "0.0.0.0"], "--host"),
        (["--rate-limit=execution_count"], "[qos]"),
    ],
)
def test_a_triton_flag_dlscale_lacks_names_its_equivalent(
    repo: Path, triton: list[str], advice: str
) -> None:
    done = run_cli("serve", str(repo), *triton, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    flag = triton[0].split("=")[0]
    assert f"{flag} is Triton's flag, which dlscale does not have" in done.stderr
    assert advice in done.stderr and "Traceback" not in done.stderr


def test_strict_model_config_true_is_refused_with_the_reason(repo: Path) -> None:
    done = run_cli("serve", str(repo), "--strict-model-config=true", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--strict-model-config=true is not offered by dlscale" in done.stderr
    assert "always completed from the model file" in done.stderr

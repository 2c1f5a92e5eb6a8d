"""Access control: restricted API groups (Triton's flags) and TLS, with real clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tests.toolkit.models import write_null_model
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.tls import self_signed
from tritonclient.utils import InferenceServerException

from dlscale.frontends.access import Restriction
from dlscale.frontends.tls import TlsFiles

ECHO = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
ADMIN = Restriction.parse("model-repository,statistics,model-config:admin-key=s3cret")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("access")
    write_null_model(root, "echo", ECHO)
    return root


@pytest.fixture(scope="module")
def restricted(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, http_restricted=(ADMIN,), grpc_restricted=(ADMIN,)) as running:
        yield running


def _rest_input() -> triton_http.InferInput:
    x = triton_http.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    return x


def _grpc_input() -> triton_grpc.InferInput:
    x = triton_grpc.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    return x


def test_rest_restricted_groups_need_the_header(restricted: LocalServer) -> None:
    client = triton_http.InferenceServerClient(restricted.http_url)
    try:
        assert client.is_server_ready()  # health and inference stay open
        assert client.infer("echo", [_rest_input()]).as_numpy("y").shape == (1, 2)
        for call in (
            client.get_model_repository_index,
            lambda: client.get_inference_statistics("echo"),
            lambda: client.get_model_config("echo"),
            lambda: client.get_model_repository_index(headers={"admin-key": "wrong"}),
        ):
            with pytest.raises(InferenceServerException, match="'admin-key'") as caught:
                call()
            assert caught.value.status() == "403"
        index = client.get_model_repository_index(headers={"admin-key": "s3cret"})
        assert index[0]["name"] == "echo"
    finally:
        client.close()


def test_grpc_restricted_groups_need_the_prefixed_header(restricted: LocalServer) -> None:
    client = triton_grpc.InferenceServerClient(restricted.grpc_url)
    try:
        assert client.is_server_ready()
        assert client.infer("echo", [_grpc_input()]).as_numpy("y").shape == (1, 2)
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key") as e:
            client.unload_model("echo")
        assert e.value.status() == "StatusCode.PERMISSION_DENIED"
        with pytest.raises(InferenceServerException) as e:
            client.get_model_config("echo", headers={"triton-grpc-protocol-admin-key": "no"})
        assert e.value.status() == "StatusCode.PERMISSION_DENIED"
        admin = {"triton-grpc-protocol-admin-key": "s3cret"}
        assert client.get_model_config("echo", headers=admin).config.name == "echo"
        assert client.get_model_repository_index(headers=admin).models[0].name == "echo"
    finally:
        client.close()


def test_restrictions_are_parsed_as_triton_writes_them() -> None:
    assert ADMIN.groups == {"model-repository", "statistics", "model-config"}
    assert (ADMIN.key, ADMIN.value) == ("admin-key", "s3cret")
    for bad in ("model-repository", "model-repository:key", ":k=v", "models:k=v"):
        with pytest.raises(ValueError, match="restricted API"):
            Restriction.parse(bad)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tls")
    server_cert, server_key = self_signed(folder, "server")
    client_cert, client_key = self_signed(folder, "client")
    return {
        "server_cert": server_cert,
        "server_key": server_key,
        "client_cert": client_cert,
        "client_key": client_key,
    }


def test_tls_for_rest_and_grpc(repo: Path, certificates: dict[str, Path]) -> None:
    tls = TlsFiles(certificates["server_cert"], certificates["server_key"])
    with serving(repo, tls=tls) as server:
        ca = str(certificates["server_cert"])
        http = triton_http.InferenceServerClient(
            server.http_url, ssl=True, ssl_options={"ca_certs": ca}
        )
        assert http.infer("echo", [_rest_input()]).as_numpy("y").shape == (1, 2)
        http.close()
        rpc = triton_grpc.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=ca)
        assert rpc.infer("echo", [_grpc_input()]).as_numpy("y").shape == (1, 2)
        rpc.close()
        with pytest.raises(httpx.HTTPError):  # plain text does not reach a TLS port
            httpx.get(f"http://{server.http_url}/v2/health/live", timeout=5)


def test_mutual_tls_wants_a_client_certificate(repo: Path, certificates: dict[str, Path]) -> None:
    tls = TlsFiles(
        certificates["server_cert"], certificates["server_key"], certificates["client_cert"]
    )
    with serving(repo, tls=tls) as server:
        url = f"https://{server.http_url}/v2/health/live"
        ca = str(certificates["server_cert"])
        mine = (str(certificates["client_cert"]), str(certificates["client_key"]))
        assert httpx.get(url, verify=_context(ca, mine)).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, verify=_context(ca, None), timeout=5).raise_for_status()
        rpc = triton_grpc.InferenceServerClient(
            server.grpc_url,
            ssl=True,
            root_certificates=ca,
            private_key=mine[1],
            certificate_chain=mine[0],
        )
        assert rpc.is_server_live()
        rpc.close()


def _context(ca: str, client: tuple[str, str] | None) -> object:
    import ssl

    context = ssl.create_default_context(cafile=ca)
    if client is not None:
        context.load_cert_chain(*client)
    return context

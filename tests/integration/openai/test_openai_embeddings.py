"""`/v1/embeddings` with the real `openai` client, against the zoo's bert-base served beside the
colours generative model: the vectors are the encoder's own pooled outputs, scaled to length 1;
bad inputs are 400s naming their field, and a generative model is no embedding model."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from tests.toolkit.generative import write_colours
from tests.toolkit.server import serving

pytest.importorskip("torch", reason="building the zoo needs the [torch] extra")
onnxruntime = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.slow  # bert-base is built (about 30 s, 400 MB)

MODEL = "bert-base"
SEQ_LEN = 16


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dlscale.models.zoo import build_zoo

    root = tmp_path_factory.mktemp("embed-repo")
    build_zoo(root, [MODEL], seq_len=SEQ_LEN)
    write_colours(root)
    return root


@pytest.fixture(scope="module")
def client(repo: Path) -> Iterator[openai.OpenAI]:
    with (
        serving(repo, grpc_port=None) as server,
        openai.OpenAI(
            base_url=f"http://{server.http_url}/v1", api_key="x", max_retries=0, timeout=120
        ) as c,
    ):
        yield c


def _pooled(repo: Path, rows: list[list[int]]) -> np.ndarray:
    """bert-base's pooled outputs for `rows` as ONNX Runtime computes them, at unit length."""
    session = onnxruntime.InferenceSession(str(repo / MODEL / "1" / "model.onnx"))
    ids = np.zeros((len(rows), SEQ_LEN), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    [pooled] = session.run(["pooler_output"], {"input_ids": ids, "attention_mask": mask})
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def test_token_rows_embed_as_the_encoder_computes(client: openai.OpenAI, repo: Path) -> None:
    rows = [[101, 2023, 2003, 102], [101, 7592, 102]]
    answer = client.embeddings.create(model=MODEL, input=rows)
    assert answer.object == "list" and answer.model == MODEL
    assert [e.index for e in answer.data] == [0, 1]
    got = np.array([e.embedding for e in answer.data])
    assert got.shape == (2, 768) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.allclose(got, _pooled(repo, rows), atol=1e-4)
    assert answer.usage.prompt_tokens == 7 == answer.usage.total_tokens


def test_one_row_and_base64(client: openai.OpenAI) -> None:
    floats = client.embeddings.create(model=MODEL, input=[101, 102]).data[0].embedding
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input=[101, 102], encoding_format="base64"
    )
    packed = raw.http_response.json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(packed), dtype="<f4")
    assert np.allclose(decoded, floats, atol=1e-6)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "some text"}, "input"),  # the zoo's encoder has no tokenizer
        ({"input": []}, "input"),
        ({"input": [[101, -1]]}, "input[0]"),
        ({"input": [[101] * (SEQ_LEN + 1)]}, "input[0]"),
        ({"input": [101], "encoding_format": "hex"}, "encoding_format"),
        ({"input": [101], "model": "colours"}, "model"),  # generative, not an encoder
    ],
)
def test_bad_inputs_are_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, object], param: str
) -> None:
    body: dict[str, object] = {"model": MODEL, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(**body)  # type: ignore[arg-type]
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param
    assert client.embeddings.create(model=MODEL, input=[101]).data  # still serving


def test_an_unknown_model_is_openais_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        client.embeddings.create(model="nope", input=[101])
